package admincli

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/greyrelay/greyrelay/relay/admin"
	"github.com/greyrelay/greyrelay/relay/admin/adminclient"
	"github.com/greyrelay/greyrelay/relay/config"
)

// destinationsUsage is the usage of `greyrelay destinations`.
const destinationsUsage = `usage:
  greyrelay destinations [-json] [DOMAIN]
  greyrelay destinations forget [-json] DOMAIN | -all
  greyrelay destinations suspend [-reason TEXT] [-for DURATION] [-json] DOMAIN
  greyrelay destinations resume [-json] DOMAIN`

// destinationsForget runs `greyrelay destinations forget [-json] DOMAIN | -all`.
func destinationsForget(args []string, c *adminclient.Client, stdout, stderr io.Writer) error {
	fs := newFlags("destinations forget", stderr)
	all := fs.Bool("all", false, "forget what was learned about every destination")
	asJSON := fs.Bool("json", false, "print the API's JSON")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if (len(pos) == 1) == *all || len(pos) > 1 {
		return fmt.Errorf("destinations forget: give exactly one of DOMAIN or -all\n%s", destinationsUsage)
	}
	domain := ""
	if len(pos) == 1 {
		domain = pos[0]
	}
	res, err := c.Forget(context.Background(), domain, *all)
	if err != nil {
		return err
	}
	if *asJSON {
		return admin.EncodeJSON(stdout, res)
	}
	_, err = fmt.Fprintf(stdout, "forget: %d destination(s) changed\n", res.Destinations)
	return err
}

// destinationsSuspend runs `greyrelay destinations suspend DOMAIN [-reason
// TEXT] [-for DURATION] [-json]`.
func destinationsSuspend(args []string, c *adminclient.Client, stdout, stderr io.Writer) error {
	fs := newFlags("destinations suspend", stderr)
	reason := fs.String("reason", "", "why, shown wherever the suspension is (at most 200 characters)")
	var d time.Duration
	fs.Func("for", "resume by itself after this long (e.g. 30m, 2h or 2d); without it, only resume ends it", func(v string) error {
		var err error
		d, err = config.ParseDuration(v)
		if err == nil && d <= 0 {
			err = fmt.Errorf("%q is not a positive duration like 30m, 2h or 2d", v)
		}
		return err
	})
	asJSON := fs.Bool("json", false, "print the API's JSON")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("destinations suspend: give exactly one DOMAIN\n%s", destinationsUsage)
	}
	res, err := c.Suspend(context.Background(), pos[0], *reason, d)
	if err != nil {
		return err
	}
	if *asJSON {
		return admin.EncodeJSON(stdout, res)
	}
	until := "until `greyrelay destinations resume " + res.Domain + "`"
	if s := res.Suspension; s != nil && s.Until != nil {
		until = "until " + s.Until.UTC().Format(time.RFC3339)
	}
	_, err = fmt.Fprintf(stdout, "suspend: delivery to %s stops %s; its mail stays queued\n", res.Domain, until)
	return err
}

// destinationsResume runs `greyrelay destinations resume DOMAIN [-json]`.
func destinationsResume(args []string, c *adminclient.Client, stdout, stderr io.Writer) error {
	fs := newFlags("destinations resume", stderr)
	asJSON := fs.Bool("json", false, "print the API's JSON")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("destinations resume: give exactly one DOMAIN\n%s", destinationsUsage)
	}
	res, err := c.Resume(context.Background(), pos[0])
	if err != nil {
		return err
	}
	if *asJSON {
		return admin.EncodeJSON(stdout, res)
	}
	if !res.WasSuspended {
		_, err = fmt.Fprintf(stdout, "resume: %s was not suspended; %d recipient(s) made due\n", res.Domain, res.Recipients)
		return err
	}
	_, err = fmt.Fprintf(stdout, "resume: delivery to %s goes on; %d recipient(s) made due\n", res.Domain, res.Recipients)
	return err
}

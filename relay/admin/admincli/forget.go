package admincli

import (
	"context"
	"fmt"
	"io"

	"github.com/greyrelay/greyrelay/relay/admin"
	"github.com/greyrelay/greyrelay/relay/admin/adminclient"
)

// destinationsUsage is the usage of `greyrelay destinations`.
const destinationsUsage = `usage:
  greyrelay destinations [-json] [DOMAIN]
  greyrelay destinations forget [-json] DOMAIN | -all`

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

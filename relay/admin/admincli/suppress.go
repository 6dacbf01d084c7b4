package admincli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/greyrelay/greyrelay/relay/admin"
	"github.com/greyrelay/greyrelay/relay/admin/adminclient"
)

const suppressionUsage = `usage:
  greyrelay suppression list [-json]
  greyrelay suppression add [-scope DOMAIN] [-reason R] [-ttl DUR] ADDRESS
  greyrelay suppression remove [-scope DOMAIN] ADDRESS
  greyrelay suppression import [-scope DOMAIN] [-reason R] [-ttl DUR] FILE
                                 one address a line ("-" reads standard input); # starts a comment`

// RunSuppression runs `greyrelay suppression list|add|remove`: the
// addresses refused at RCPT because mail to them failed permanently.
func RunSuppression(args []string, c *adminclient.Client, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New(suppressionUsage)
	}
	fs := newFlags("suppression "+args[0], stderr)
	asJSON := fs.Bool("json", false, "print the API's JSON")
	scope := fs.String("scope", "", "the sending domain whose list it is (suppression.scope: sender-domain); empty: every sender")
	reason := fs.String("reason", "", "why (default: operator)")
	ttl := fs.Duration("ttl", 0, "how long the entry lasts (default: suppression.ttl)")
	pos, err := parseArgs(fs, args[1:])
	if err != nil {
		return err
	}
	ctx := context.Background()
	var res admin.SuppressionResult
	switch {
	case args[0] == "list" && len(pos) == 0:
		l, err := c.Suppressions(ctx)
		if err != nil {
			return err
		}
		if *asJSON {
			return admin.EncodeJSON(stdout, l)
		}
		return printSuppressions(stdout, &l)
	case args[0] == "add" && len(pos) == 1:
		res, err = c.Suppress(ctx, pos[0], *scope, *reason, *ttl)
	case args[0] == "remove" && len(pos) == 1:
		res, err = c.Unsuppress(ctx, pos[0], *scope)
	case args[0] == "import" && len(pos) == 1:
		return importSuppressions(ctx, c, pos[0], *scope, *reason, *ttl, stdout)
	default:
		return errors.New(suppressionUsage)
	}
	if err != nil {
		return err
	}
	if *asJSON {
		return admin.EncodeJSON(stdout, res)
	}
	_, err = fmt.Fprintf(stdout, "%s: %s\n", res.Action, res.Entry.Address)
	return err
}

func printSuppressions(out io.Writer, l *admin.Suppressions) error {
	if len(l.Entries) == 0 {
		_, err := fmt.Fprintln(out, "no address is suppressed")
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ADDRESS\tSCOPE\tREASON\tSINCE\tEXPIRES\tREPLY")
	for _, e := range l.Entries {
		scope := e.Scope
		if scope == "" {
			scope = "*"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", admin.Cell(e.Address, 80), admin.Cell(scope, 60), admin.Cell(e.Reason, 30),
			e.Since.UTC().Format(time.RFC3339), admin.RelTime(e.Expires, l.Now), admin.Cell(e.Reply, 0))
	}
	return tw.Flush()
}

// importSuppressions adds every address of a file (another system's
// suppression list, say), one a line. It stops at the first address the
// relay refuses, naming its line; those before it stay added.
func importSuppressions(ctx context.Context, c *adminclient.Client, path, scope, reason string, ttl time.Duration, stdout io.Writer) error {
	var in io.Reader = os.Stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	}
	if reason == "" {
		reason = "import"
	}
	n := 0
	sc := bufio.NewScanner(in)
	for line := 1; sc.Scan(); line++ {
		addr, _, _ := strings.Cut(sc.Text(), "#")
		addr = strings.TrimSpace(addr)
		if addr == "" {
			continue
		}
		if _, err := c.Suppress(ctx, addr, scope, reason, ttl); err != nil {
			return fmt.Errorf("%s:%d: %w (%d imported before it)", path, line, err, n)
		}
		n++
	}
	if err := sc.Err(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(stdout, "import: %d addresses suppressed\n", n)
	return err
}

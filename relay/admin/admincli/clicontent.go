package admincli

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/greyrelay/greyrelay/internal/safetext"
	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/admin"
	"github.com/greyrelay/greyrelay/relay/admin/adminclient"
)

// `queue show -headers|-body` (postcat) and `queue shape` (qshape).

type contentOpts struct {
	headers, body, raw bool
	max                int64
}

// showContent prints the parts co asks for. Unless co.raw, it prints
// safetext.Text of them (lines end in LF; control characters other than
// tab, bidi formatting characters and invalid UTF-8 become '?'): the
// content came from a client and must not drive the terminal.
func showContent(c *adminclient.Client, id string, co contentOpts, stdout, stderr io.Writer) error {
	if co.max < 1 || co.max > admin.MaxContentMax {
		return fmt.Errorf("queue show: -max must be from 1 to %d", admin.MaxContentMax)
	}
	var parts []string
	if co.headers {
		parts = append(parts, "headers")
	}
	if co.body {
		parts = append(parts, "body")
	}
	for i, part := range parts {
		w := stdout
		var sw *safetext.Writer
		if !co.raw {
			sw = safetext.NewWriter(stdout)
			w = sw
		}
		info, err := c.Content(context.Background(), id, part, co.max, w)
		if err != nil {
			return err
		}
		if sw != nil {
			if err := sw.Flush(); err != nil {
				return err
			}
		}
		if info.Truncated() {
			fmt.Fprintf(stderr, "greyrelay: %s: showed the first %d of %d octets (raise -max to see more)\n",
				part, info.Sent, info.Size)
		}
		if i == 0 && len(parts) == 2 { // the empty line between header and body
			nl := "\n"
			if co.raw {
				nl = "\r\n"
			}
			if _, err := io.WriteString(stdout, nl); err != nil {
				return err
			}
		}
	}
	return nil
}

func queueShape(args []string, c *adminclient.Client, stdout, stderr io.Writer) error {
	fs := newFlags("queue shape", stderr)
	var sq admin.ShapeQuery
	fs.StringVar(&sq.By, "by", "domain", "rows by destination domain or by reason")
	fs.Func("status", "only recipients with this status (queued, deferred, active, held)", func(v string) error {
		sq.Status = queue.Status(v)
		return nil
	})
	fs.IntVar(&sq.Limit, "limit", admin.DefaultShapeRows, fmt.Sprintf("show at most this many rows (at most %d)", admin.MaxShapeRows))
	asJSON := fs.Bool("json", false, "print the API's JSON")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fmt.Errorf("queue shape: unexpected argument %q\n%s", pos[0], queueUsage)
	}
	if sq.Limit == 0 {
		return fmt.Errorf("queue shape: -limit must be from 1 to %d", admin.MaxShapeRows)
	}
	sh, err := c.Shape(context.Background(), sq)
	if err != nil {
		return err
	}
	if note := sh.Note("these counts"); note != "" { // a full disk: the counts lack accepted messages
		fmt.Fprintln(stderr, note)
	}
	if *asJSON {
		return admin.EncodeJSON(stdout, sh)
	}
	return printShape(stdout, &sh)
}

// printShape prints qshape's table: a TOTAL row, then one row per domain
// or reason, the total (T) and the count per age bucket, right-aligned.
func printShape(out io.Writer, sh *admin.Shape) error {
	tw := tabwriter.NewWriter(out, 0, 0, 1, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "\tT\t")
	for _, m := range sh.BucketMinutes {
		fmt.Fprintf(tw, "%d\t", m)
	}
	if n := len(sh.BucketMinutes); n > 0 {
		fmt.Fprintf(tw, "%d+\t", sh.BucketMinutes[n-1])
	}
	fmt.Fprintln(tw)
	for _, r := range append([]admin.ShapeRow{sh.Total}, sh.Rows...) {
		fmt.Fprintf(tw, "%s\t%d\t", admin.Cell(r.Name, 60), r.Total)
		for _, n := range r.Counts {
			fmt.Fprintf(tw, "%d\t", n)
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if sh.More > 0 {
		_, err := fmt.Fprintf(out, "(%d more rows; raise -limit to see them)\n", sh.More)
		return err
	}
	return nil
}

package admincli

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/greyrelay/greyrelay/classifier"
	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/admin"
	"github.com/greyrelay/greyrelay/relay/admin/adminclient"
	"github.com/greyrelay/greyrelay/relay/config"
)

// healthTimeout bounds `greyrelay health`, which container runtimes call
// often and expect to be quick.
const healthTimeout = 3 * time.Second

const queueUsage = `usage:
  greyrelay queue list [-status S] [-reason R] [-domain D] [-sender S] [-tag T] [-envid E] [-message-id M] [-older-than DUR] [-offset N] [-limit N] [-json]
  greyrelay queue show [-json] ID
  greyrelay queue show [-json] -tag T | -envid E | -message-id M   every message so named, queued or finished
  greyrelay queue show -headers|-body [-max BYTES] [-raw] ID
  greyrelay queue shape [-by domain|reason] [-status S] [-limit N] [-json]
  greyrelay queue retry|hold|release|delete|bounce|requeue [-dry-run] [-json] ID | SELECTION | -all
    SELECTION: any of -domain D, -status S, -reason R, -sender S, -tag T, -older-than DUR
    (every one given must match; -dry-run counts what would change and changes nothing)
statuses: queued, deferred, active, held, delivered, relayed, failed
(delivered, relayed and failed also list finished messages kept for history.retention)
durations: 90s, 30m, 2h, 2d
`

// RunQueue runs `greyrelay queue …`; args are the arguments after "queue".
func RunQueue(args []string, c *adminclient.Client, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("queue: missing subcommand\n%s", queueUsage)
	}
	switch cmd, rest := args[0], args[1:]; cmd {
	case "list":
		return queueList(rest, c, stdout, stderr)
	case "show":
		return queueShow(rest, c, stdout, stderr)
	case "shape":
		return queueShape(rest, c, stdout, stderr)
	case "retry", "hold", "release", "delete", "bounce", "requeue":
		return queueAction(cmd, rest, c, stdout, stderr)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, queueUsage)
		return nil
	default:
		return fmt.Errorf("queue: unknown subcommand %q\n%s", cmd, queueUsage)
	}
}

// parseArgs parses flags that may come before or after positional
// arguments ("show ID -json" and "show -json ID") and returns the
// positional ones.
//
// A parse error is returned, not printed: the caller prints it once, where
// the flag package alone would print it, the usage text, and then the
// caller would print it again. The flags are printed only for -h.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	out := fs.Output()
	var usage bytes.Buffer
	fs.SetOutput(&usage)
	defer fs.SetOutput(out)
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				_, _ = io.Copy(out, &usage)
			}
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

func newFlags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

func queueList(args []string, c *adminclient.Client, stdout, stderr io.Writer) error {
	fs := newFlags("queue list", stderr)
	var lq admin.ListQuery
	filterFlags(fs, &lq.Status, &lq.Reason, &lq.OlderThan)
	fs.StringVar(&lq.Domain, "domain", "", "only recipients with this domain")
	fs.StringVar(&lq.Sender, "sender", "", "only recipients with this sender")
	fs.StringVar(&lq.Tag, "tag", "", "only messages with this X-Greyrelay-Tag (finished ones too, without -status)")
	fs.StringVar(&lq.EnvID, "envid", "", "only messages with this ENVID (finished ones too, without -status)")
	fs.StringVar(&lq.MessageID, "message-id", "", "only messages with this Message-ID (finished ones too, without -status)")
	fs.IntVar(&lq.Offset, "offset", 0, "skip this many matching recipients")
	fs.IntVar(&lq.Limit, "limit", admin.DefaultLimit, fmt.Sprintf("show at most this many recipients (at most %d)", admin.MaxLimit))
	asJSON := fs.Bool("json", false, "print the API's JSON")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fmt.Errorf("queue list: unexpected argument %q\n%s", pos[0], queueUsage)
	}
	if lq.Limit == 0 { // would mean the API's default
		return fmt.Errorf("queue list: -limit must be from 1 to %d", admin.MaxLimit)
	}
	l, err := c.List(context.Background(), lq)
	if err != nil {
		return err
	}
	if note := l.Note("this list"); note != "" { // a full disk: the list lacks accepted messages
		fmt.Fprintln(stderr, note)
	}
	if *asJSON {
		return admin.EncodeJSON(stdout, l)
	}
	return printList(stdout, &l)
}

// filterFlags defines -status, -reason and -older-than, each refusing a
// value the API would refuse with the list of valid ones: a typo must not
// select nothing (or, for an action, something else) in silence.
func filterFlags(fs *flag.FlagSet, status *queue.Status, reason *string, olderThan *time.Duration) {
	fs.Func("status", "only recipients with this status ("+statusNames()+")", func(v string) error {
		if !slices.Contains(admin.Statuses(), queue.Status(v)) {
			return fmt.Errorf("unknown status %q (want one of %s)", v, statusNames())
		}
		*status = queue.Status(v)
		return nil
	})
	fs.Func("reason", "only recipients with this reason ("+reasonNames()+")", func(v string) error {
		if !slices.Contains(classifier.Reasons(), classifier.Reason(v)) {
			return fmt.Errorf("unknown reason %q (want one of %s)", v, reasonNames())
		}
		*reason = v
		return nil
	})
	fs.Func("older-than", "only messages that arrived at least this long ago (e.g. 90s, 30m, 2h or 2d)", func(v string) error {
		d, err := config.ParseDuration(v)
		if err == nil && d <= 0 {
			err = fmt.Errorf("%q is not a positive duration like 30m, 2h or 2d", v)
		}
		*olderThan = d
		return err
	})
}

// statusNames lists every status, for the flag's help and its error.
func statusNames() string {
	var names []string
	for _, st := range admin.Statuses() {
		names = append(names, string(st))
	}
	return strings.Join(names, ", ")
}

// reasonNames lists every reason, for the flag's help and its error.
func reasonNames() string {
	var names []string
	for _, r := range classifier.Reasons() {
		names = append(names, string(r))
	}
	return strings.Join(names, ", ")
}

func printList(out io.Writer, l *admin.ListResult) error {
	if len(l.Rows) == 0 {
		_, err := fmt.Fprintf(out, "no recipients match (%d in total)\n", l.Total)
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "QUEUE ID\tSTATUS\tREASON\tATT\tNEXT\tAGE\tSENDER\tRECIPIENT\tSOURCE IP\tMX\tLAST REPLY")
	for _, r := range l.Rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Key, admin.Cell(r.Status, 0),
			admin.Cell(r.Reason, 0), r.Attempts, nextOf(&r, l.Now), admin.HumanDuration(l.Now.Sub(r.Arrival)),
			admin.Cell(admin.Sender(r.Sender), 60), admin.Cell(r.Recipient, 60), admin.Cell(r.SourceIP, 0), admin.Cell(r.MXHost, 40),
			admin.Cell(admin.ReplyText(r.LastReply), 70))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	first, last := l.Offset+1, l.Offset+len(l.Rows)
	fmt.Fprintf(out, "recipients %d-%d of %d", first, last, l.Total)
	if last < l.Total {
		fmt.Fprintf(out, " (next page: -offset %d)", last)
	}
	_, err := fmt.Fprintln(out)
	return err
}

func relPtr(t *time.Time, now time.Time) string {
	if t == nil {
		return "-"
	}
	return admin.RelTime(*t, now)
}

func nextOf(r *admin.Row, now time.Time) string {
	if s := r.Suspended; s != nil && r.Status != string(queue.Held) && r.Status != string(queue.Active) {
		return admin.SuspendedText(s, now)
	}
	var t time.Time
	if r.NextAttempt != nil {
		t = *r.NextAttempt
	}
	return admin.NextText(r.Status, t, now)
}

func queueShow(args []string, c *adminclient.Client, stdout, stderr io.Writer) error {
	fs := newFlags("queue show", stderr)
	asJSON := fs.Bool("json", false, "print the API's JSON")
	var co contentOpts
	fs.BoolVar(&co.headers, "headers", false, "print the message's header section (postcat -h)")
	fs.BoolVar(&co.body, "body", false, "print the message's body (postcat -b); with -headers, the whole message")
	fs.Int64Var(&co.max, "max", admin.DefaultContentMax, "print at most this many octets of each part")
	fs.BoolVar(&co.raw, "raw", false, "print the octets as stored (CRLF, control characters), e.g. to save them")
	var by admin.ListQuery
	fs.StringVar(&by.Tag, "tag", "", "show the messages with this X-Greyrelay-Tag instead of one ID")
	fs.StringVar(&by.EnvID, "envid", "", "show the messages with this ENVID instead of one ID")
	fs.StringVar(&by.MessageID, "message-id", "", "show the messages with this Message-ID instead of one ID")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if by.Tag != "" || by.EnvID != "" || by.MessageID != "" {
		if len(pos) != 0 || co.headers || co.body {
			return fmt.Errorf("queue show: -tag, -envid and -message-id replace the queue id and show records only\n%s", queueUsage)
		}
		return showFound(c, by, *asJSON, stdout)
	}
	if len(pos) != 1 {
		return fmt.Errorf("queue show: want exactly one queue id\n%s", queueUsage)
	}
	id, _, _ := strings.Cut(pos[0], "/") // accept the id/n form queue list prints
	if co.headers || co.body {
		if *asJSON {
			return fmt.Errorf("queue show: -json shows the record; -headers and -body print the content\n%s", queueUsage)
		}
		return showContent(c, id, co, stdout, stderr)
	}
	m, err := c.Message(context.Background(), id)
	if err != nil {
		return err
	}
	if *asJSON {
		return admin.EncodeJSON(stdout, m)
	}
	return printMessage(stdout, &m)
}

// showFound shows every message the application's names in by select,
// queued or finished (history): one JSON array with -json.
func showFound(c *adminclient.Client, by admin.ListQuery, asJSON bool, stdout io.Writer) error {
	by.Limit = admin.MaxLimit
	l, err := c.List(context.Background(), by)
	if err != nil {
		return err
	}
	var ids []string
	for _, r := range l.Rows {
		if !slices.Contains(ids, r.ID) {
			ids = append(ids, r.ID)
		}
	}
	if len(ids) == 0 {
		return errors.New("queue show: no message, queued or kept in the history, matches")
	}
	msgs := make([]admin.Message, 0, len(ids))
	for _, id := range ids {
		m, err := c.Message(context.Background(), id)
		if err != nil {
			return err
		}
		msgs = append(msgs, m)
	}
	if asJSON {
		return admin.EncodeJSON(stdout, msgs)
	}
	for i := range msgs {
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		if err := printMessage(stdout, &msgs[i]); err != nil {
			return err
		}
	}
	return nil
}

func printMessage(out io.Writer, m *admin.Message) error {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "message\t%s\n", m.ID)
	if m.Node != "" {
		fmt.Fprintf(tw, "node\t%s\n", m.Node)
	}
	fmt.Fprintf(tw, "sender\t%s\n", admin.Cell(admin.Sender(m.Sender), 0))
	fmt.Fprintf(tw, "arrived\t%s (%s)\n", m.Arrival.UTC().Format(time.RFC3339), admin.RelTime(m.Arrival, m.Now))
	fmt.Fprintf(tw, "size\t%s\n", admin.HumanBytes(m.Size))
	client := admin.Cell(m.ClientAddr, 0) + " helo " + admin.Cell(m.Helo, 80)
	if m.AuthUser != "" {
		client += " auth " + admin.Cell(m.AuthUser, 0)
	}
	fmt.Fprintf(tw, "client\t%s\n", client)
	for _, f := range [][2]string{{"tag", m.Tag}, {"message-id", m.MessageID}, {"envid", m.EnvID}} {
		if f[1] != "" {
			fmt.Fprintf(tw, "%s\t%s\n", f[0], admin.Cell(f[1], 0))
		}
	}
	if m.DSN {
		fmt.Fprintf(tw, "dsn\tthis message is a delivery status notification\n")
	}
	if m.Finished != nil {
		fmt.Fprintf(tw, "finished\t%s (%s): no longer in the queue; its content is not kept\n",
			m.Finished.UTC().Format(time.RFC3339), admin.RelTime(*m.Finished, m.Now))
	}
	for i := range m.Recipients {
		printRecipient(tw, &m.Recipients[i], m.Now)
	}
	return tw.Flush()
}

func printRecipient(tw *tabwriter.Writer, r *admin.Recipient, now time.Time) {
	fmt.Fprintf(tw, "\nrecipient %d\t%s\n", r.Rcpt, admin.Cell(r.Recipient, 0))
	status := admin.Cell(r.Status, 0)
	if r.Reason != "" {
		status += " (" + admin.Cell(r.Reason, 0) + ")"
	}
	fmt.Fprintf(tw, "  status\t%s\n", status)
	fmt.Fprintf(tw, "  attempts\t%d, last %s, next %s\n", r.Attempts, relPtr(r.LastAttempt, now), nextOf(&r.Row, now))
	if r.SourceIP != "" || r.MXHost != "" {
		fmt.Fprintf(tw, "  route\tfrom %s to %s [%s]\n", admin.Cell(r.SourceIP, 0), admin.Cell(r.MXHost, 0), admin.Cell(r.MXAddr, 0))
	}
	if r.FirstGreylisted != nil {
		fmt.Fprintf(tw, "  greylisted\tfirst %s, %d tries\n", admin.RelTime(*r.FirstGreylisted, now), r.GreylistTries)
	}
	if r.LastReply != nil {
		fmt.Fprintf(tw, "  last reply\t%s\n", admin.Cell(admin.ReplyText(r.LastReply), 0))
	}
	if e := r.Explanation; e != nil {
		fmt.Fprintf(tw, "  meaning\t%s\n  usually at fault\t%s\n  what to do\t%s\n", e.Meaning, e.Fault, e.Action)
	}
	if g := r.GreyLike; g != nil {
		fmt.Fprintf(tw, "  greylisting by behaviour\tnot by its text: at %s, %d recipient(s) deferred with %q passed at their first retry "+
			"(same address, same source) and %d were refused again (greyrelay destinations)\n",
			admin.Cell(g.Host, 0), g.Passed, admin.Cell(g.Reply, 100), g.Refused)
	}
	if r.Salvaged != nil {
		fmt.Fprintf(tw, "  salvaged\t%s from an older copy of its record: it may already have been delivered, "+
			"so delivering it may make a duplicate\n", admin.RelTime(*r.Salvaged, now))
	}
	if len(r.History) == 0 {
		return
	}
	fmt.Fprintf(tw, "  attempts:\n")
	fmt.Fprintf(tw, "    START\tTOOK\tSOURCE IP\tMX\tTLS POLICY\tSTAGE\tOUTCOME\tREASON\tREPLY\n")
	for _, a := range r.History {
		took := "-"
		if a.End != nil {
			took = admin.HumanDuration(a.End.Sub(a.Start))
		}
		fmt.Fprintf(tw, "    %s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.Start.UTC().Format(time.RFC3339), took,
			admin.Cell(a.SourceIP, 0), admin.Cell(a.MXHost, 40), admin.Cell(a.TLS, 0), admin.Cell(a.Stage, 0), admin.Cell(a.Outcome, 0), admin.Cell(a.Reason, 0),
			admin.Cell(admin.ReplyText(a.Reply), 70))
	}
}

func queueAction(action string, args []string, c *adminclient.Client, stdout, stderr io.Writer) error {
	fs := newFlags("queue "+action, stderr)
	var t adminclient.Target
	fs.StringVar(&t.Domain, "domain", "", "act on the recipients at this destination domain")
	filterFlags(fs, &t.Status, &t.Reason, &t.OlderThan)
	fs.StringVar(&t.Sender, "sender", "", "act on the recipients of messages from this sender (<> for the null sender)")
	fs.StringVar(&t.Tag, "tag", "", "act on the messages with this X-Greyrelay-Tag")
	fs.BoolVar(&t.All, "all", false, "act on the whole queue")
	fs.BoolVar(&t.DryRun, "dry-run", false, "count the recipients the action would change, and change nothing")
	asJSON := fs.Bool("json", false, "print the API's JSON")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return fmt.Errorf("queue %s: want at most one queue id\n%s", action, queueUsage)
	}
	if len(pos) == 1 {
		t.ID, _, _ = strings.Cut(pos[0], "/")
	}
	filtered := t.Domain != "" || t.Status != "" || t.Reason != "" || t.Sender != "" || t.Tag != "" || t.OlderThan != 0
	switch {
	case t.All && (t.ID != "" || filtered):
		return fmt.Errorf("queue %s: -all acts on the whole queue and takes no ID or other selection\n%s", action, queueUsage)
	case !t.All && t.ID == "" && !filtered:
		return fmt.Errorf("queue %s: give an ID, a selection (-domain, -status, -reason, -sender, -tag, -older-than) or -all\n%s", action, queueUsage)
	}
	res, err := c.Act(context.Background(), action, t)
	if err != nil {
		return err
	}
	if *asJSON {
		return admin.EncodeJSON(stdout, res)
	}
	if note := res.Unsettled.Note("the recipients it reached"); note != "" { // a full disk
		fmt.Fprintln(stderr, note)
	}
	if res.DryRun {
		_, err = fmt.Fprintf(stdout, "%s (dry run): %d recipient(s) would change; nothing was changed\n", res.Action, res.Recipients)
		return err
	}
	if _, err = fmt.Fprintf(stdout, "%s: %d recipient(s) changed\n", res.Action, res.Recipients); err != nil {
		return err
	}
	if action == "hold" && t.Domain != "" {
		// The operator who holds a domain usually means "stop sending
		// there", new mail included, which hold (on what is queued now)
		// does not do; a suspension does.
		_, err = fmt.Fprintf(stdout, "hold acts on the recipients queued now; to stop delivery to %s, new mail included, "+
			"run: greyrelay destinations suspend %s\n", t.Domain, t.Domain)
	}
	return err
}

// RunDestinations runs `greyrelay destinations [-json] [DOMAIN]`: what the
// relay learned per destination (greylisting, throttling, dead hosts).
func RunDestinations(args []string, c *adminclient.Client, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "forget":
			return destinationsForget(args[1:], c, stdout, stderr)
		case "suspend":
			return destinationsSuspend(args[1:], c, stdout, stderr)
		case "resume":
			return destinationsResume(args[1:], c, stdout, stderr)
		}
	}
	fs := newFlags("destinations", stderr)
	asJSON := fs.Bool("json", false, "print the API's JSON")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	var d admin.Destinations
	switch len(pos) {
	case 0:
		d, err = c.Destinations(context.Background())
	case 1:
		d, err = c.DestinationsOf(context.Background(), pos[0])
	default:
		return errors.New(destinationsUsage)
	}
	if err != nil {
		return err
	}
	if *asJSON {
		return admin.EncodeJSON(stdout, d)
	}
	return printDestinations(stdout, &d)
}

func printDestinations(out io.Writer, d *admin.Destinations) error {
	if len(d.Destinations) == 0 {
		_, err := fmt.Fprintln(out, "nothing learned about any destination yet")
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DOMAIN\tSUSPENDED\tGREYLISTS\tLEARNED DELAY\tGREYLISTED/PASSED\tTHROTTLE\tTHROTTLED FOR\tDEAD HOSTS\tUPDATED\tLAST REPLY")
	for _, x := range d.Destinations {
		grey, delay, throttled := "no", "-", "-"
		if x.Greylists {
			grey = "yes"
		}
		reply := admin.ReplyText(x.LastReply)
		if x.GreyLike != "" {
			// An MX host's record: a reply without a greylisting text,
			// with how it behaved at the first retry (passed/refused).
			grey = fmt.Sprintf("%s, by behaviour %d/%d", grey, x.GreyLikePassed, x.GreyLikeRefused)
			reply = x.GreyLike
		}
		if x.LearnedDelaySeconds > 0 {
			delay = admin.HumanDuration(time.Duration(x.LearnedDelaySeconds * float64(time.Second)))
		}
		if x.ThrottledUntil != nil && x.ThrottledUntil.After(d.Now) {
			throttled = admin.HumanDuration(x.ThrottledUntil.Sub(d.Now))
		}
		var dead []string
		for _, h := range x.DeadHosts {
			dead = append(dead, fmt.Sprintf("%s (%s)", h.Host, admin.RelTime(h.Until, d.Now)))
		}
		susp := "no"
		if x.Suspended != nil {
			susp = admin.Cell(admin.SuspendedText(x.Suspended, d.Now), 80)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d/%d\t%d\t%s\t%s\t%s\t%s\n", admin.Cell(x.Domain, 60), susp, grey, delay,
			x.GreylistSeen, x.GreylistPassed, x.ThrottleLevel, throttled, admin.Cell(strings.Join(dead, ", "), 80),
			relPtr(x.Updated, d.Now), admin.Cell(reply, 70))
	}
	return tw.Flush()
}

// RunHealth runs `greyrelay health`: nil (exit 0) when GET /readyz answers
// 200 within a few seconds, an error (exit 1) otherwise. It is meant for
// container health checks (Docker HEALTHCHECK, Kubernetes exec probes).
func RunHealth(c *adminclient.Client, stdout io.Writer) error {
	ctx, cancel := context.WithTimeout(context.Background(), healthTimeout)
	defer cancel()
	body, err := c.Ready(ctx)
	if err != nil {
		return fmt.Errorf("not healthy: %w", err)
	}
	_, err = fmt.Fprintln(stdout, body)
	return err
}

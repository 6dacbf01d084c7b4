package tlsrpt

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/greyrelay/greyrelay/classifier"
	"github.com/greyrelay/greyrelay/relay/tlspolicy"
)

// TXTResolver finds TXT records (mx.Resolver fits).
type TXTResolver interface {
	LookupTXT(ctx context.Context, name string) ([]string, error)
}

// Mail is a report to be sent by mail through the relay's own queue.
type Mail struct {
	From string   // envelope sender
	To   []string // envelope recipients
	Body []byte   // the whole message, CRLF lines
}

// Enqueuer puts a generated message into the relay's queue.
type Enqueuer interface {
	EnqueueReport(m Mail) error
}

// Sender delivers the reports of an Aggregator.
type Sender struct {
	Submitter Submitter
	From      string       // the reports' From and envelope sender
	TXT       TXTResolver  // for "_smtp._tls" records
	Queue     Enqueuer     // mailto: reports
	HTTP      *http.Client // https: reports; it must have a timeout
	Rand      io.Reader    // for MIME boundaries
}

// Result says what became of the report of one domain.
type Result struct {
	Domain string   `json:"domain"`
	Sent   []string `json:"sent,omitempty"`   // the rua URIs the report went to
	Errors []string `json:"errors,omitempty"` // why a rua, or the domain, got nothing
}

// Deliver sends the reports of days, and of the reports in owed whose
// time has come; it returns one Result per report tried and the reports
// still owed: those that failed, to be tried again later with a growing
// wait, until a day after their period ended.
func (s *Sender) Deliver(ctx context.Context, days []Day, owed []Owed, now time.Time) ([]Result, []Owed) {
	for _, d := range days {
		owed = append(owed, Owed{Day: d, Next: now})
	}
	var out []Result
	var left []Owed
	for _, o := range owed {
		if o.Next.After(now) {
			left = append(left, o)
			continue
		}
		res, retry := s.sendDay(ctx, o.Day, o.RUAs, now)
		if retry != nil {
			o.RUAs, o.Tries = retry.ruas, o.Tries+1
			o.Next = now.Add(retryAfter(o.Tries))
			if o.Next.After(o.Day.End.Add(retryFor)) {
				res.Errors = append(res.Errors, fmt.Sprintf("given up after %d tries", o.Tries))
			} else {
				left = append(left, o)
			}
		}
		out = append(out, res)
	}
	return out, left
}

// retry is what of a report failed in a way that may pass: the rua
// URIs that failed, or none when the rua lookup itself failed.
type retry struct{ ruas []string }

// sendDay sends d's report to the ruas of its domain (only those in only,
// if set). retry is nil when nothing failed that may pass later.
func (s *Sender) sendDay(ctx context.Context, d Day, only []string, now time.Time) (Result, *retry) {
	res := Result{Domain: d.Domain}
	ruas, err := s.lookup(ctx, d.Domain)
	if err != nil {
		res.Errors = append(res.Errors, err.Error())
		var le *lookupError
		if errors.As(err, &le) {
			return res, &retry{ruas: only} // DNS trouble: look again later
		}
		return res, nil
	}
	r := BuildReport(s.Submitter, d)
	gz, err := r.Gzip()
	if err != nil {
		res.Errors = append(res.Errors, err.Error())
		return res, nil
	}
	var failed []string
	for _, u := range ruas {
		if only != nil && !slices.Contains(only, u.String()) {
			continue // delivered at an earlier try
		}
		var err error
		if u.Scheme == "mailto" {
			err = s.mail(u, d, r, gz, now)
		} else {
			err = s.post(ctx, u, gz)
		}
		if err != nil {
			res.Errors = append(res.Errors, fmt.Sprintf("%s: %v", u, err))
			if !errors.Is(err, errBadRUA) {
				failed = append(failed, u.String())
			}
			continue
		}
		res.Sent = append(res.Sent, u.String())
	}
	if failed == nil {
		return res, nil
	}
	return res, &retry{ruas: failed}
}

// errBadRUA: a rua that no retry can send to.
var errBadRUA = errors.New("unusable rua")

// lookupError is a failed DNS lookup of the TLSRPT record (not a missing
// or invalid record), which may pass.
type lookupError struct{ err error }

func (e *lookupError) Error() string { return e.err.Error() }
func (e *lookupError) Unwrap() error { return e.err }

// lookup returns the rua of domain's single TLSRPT record (RFC 8460 §3:
// none, or more than one, means no reports).
func (s *Sender) lookup(ctx context.Context, domain string) ([]*url.URL, error) {
	txts, err := s.TXT.LookupTXT(ctx, "_smtp._tls."+domain)
	var nx *classifier.DNSError
	switch {
	case errors.As(err, &nx) && nx.Kind == classifier.DNSNXDomain:
		return nil, fmt.Errorf("_smtp._tls.%s: %w", domain, err) // no record: nothing to retry
	case err != nil:
		return nil, &lookupError{fmt.Errorf("_smtp._tls.%s: %w", domain, err)}
	}
	var recs []string
	for _, t := range txts {
		if strings.HasPrefix(t, "v=TLSRPTv1") {
			recs = append(recs, t)
		}
	}
	if len(recs) != 1 {
		return nil, fmt.Errorf("_smtp._tls.%s: %d TLSRPT records, want 1", domain, len(recs))
	}
	return tlspolicy.ParseTLSRPT(recs[0])
}

// post sends gz to an https: rua (RFC 8460 §5.2). A 2xx answer is success.
func (s *Sender) post(ctx context.Context, u *url.URL, gz []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(gz))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/tlsrpt+gzip")
	resp, err := s.HTTP.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return nil
}

// mail enqueues the report for a mailto: rua (RFC 8460 §5.3).
func (s *Sender) mail(u *url.URL, d Day, r Report, gz []byte, now time.Time) error {
	to, err := url.PathUnescape(u.Opaque)
	if err != nil {
		return fmt.Errorf("%w: %v", errBadRUA, err)
	}
	to, _, _ = strings.Cut(to, "?") // RFC 6068 header fields are not used
	if !strings.Contains(to, "@") {
		return fmt.Errorf("%w: no address", errBadRUA)
	}
	body, err := s.Message(to, d, r, gz, now)
	if err != nil {
		return err
	}
	return s.Queue.EnqueueReport(Mail{From: s.From, To: []string{to}, Body: body})
}

// Message builds the report mail of RFC 8460 §5.3: multipart/report with
// report-type "tlsrpt", a text part, and the gzip report as an
// application/tlsrpt+gzip attachment.
func (s *Sender) Message(to string, d Day, r Report, gz []byte, now time.Time) ([]byte, error) {
	var rb [12]byte
	if _, err := io.ReadFull(s.Rand, rb[:]); err != nil {
		return nil, fmt.Errorf("tls report: %w", err)
	}
	boundary := fmt.Sprintf("tlsrpt-%x", rb)
	name := fmt.Sprintf("%s!%s!%d!%d.json.gz", s.Submitter.Host, d.Domain, d.Start.Unix(), d.End.Unix()) // §5.3 file name
	var b strings.Builder
	h := func(k, v string) { b.WriteString(k + ": " + v + "\r\n") }
	h("From", s.From)
	h("To", to)
	h("Date", now.UTC().Format(time.RFC1123Z))
	h("Message-ID", "<"+r.ReportID+">")
	// §5.3: the subject names the domain, the submitter and the report id.
	h("Subject", fmt.Sprintf("Report Domain: %s Submitter: %s Report-ID: <%s>", d.Domain, s.Submitter.Host, r.ReportID))
	h("TLS-Report-Domain", d.Domain)
	h("TLS-Report-Submitter", s.Submitter.Host)
	h("MIME-Version", "1.0")
	h("Content-Type", mime.FormatMediaType("multipart/report", map[string]string{"report-type": "tlsrpt", "boundary": boundary}))
	b.WriteString("\r\n")
	b.WriteString("--" + boundary + "\r\n")
	h("Content-Type", "text/plain; charset=us-ascii")
	b.WriteString("\r\n")
	fmt.Fprintf(&b, "This is an aggregate TLS report from %s for %s, %s to %s (RFC 8460).\r\n\r\n",
		s.Submitter.Host, d.Domain, d.Start.UTC().Format(time.RFC3339), d.End.UTC().Format(time.RFC3339))
	b.WriteString("--" + boundary + "\r\n")
	h("Content-Type", "application/tlsrpt+gzip")
	h("Content-Transfer-Encoding", "base64")
	h("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": name}))
	b.WriteString("\r\n")
	enc := base64.StdEncoding.EncodeToString(gz)
	for len(enc) > 76 {
		b.WriteString(enc[:76] + "\r\n")
		enc = enc[76:]
	}
	b.WriteString(enc + "\r\n")
	b.WriteString("--" + boundary + "--\r\n")
	return []byte(b.String()), nil
}

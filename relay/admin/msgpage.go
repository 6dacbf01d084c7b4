package admin

import (
	"bytes"
	_ "embed"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/greyrelay/greyrelay/queue"
)

// The message page, GET /message/{id}: what `queue show` and GET
// /api/queue/{id} say about one message (envelope, every recipient with
// its attempts and the explanation of its last reply), with the header
// section as GET /api/queue/{id}/headers serves it, on a page the status
// page's queue IDs link to. Like the status page it is built from the
// API's views (Local.Message), rendered with html/template, which escapes
// whatever a client or a remote server put into the message or a reply,
// and has no script. It only reads: the actions stay POSTs of the API and
// the CLI, which the page names rather than offering as links or forms.

//go:embed message.html
var messageHTML string

// pageHeaderMax is how much of a header section the page shows.
const pageHeaderMax = 16 << 10

type msgPage struct {
	Hostname string
	Now      string
	Message
	Arrived, Age, Size, Finished string
	Client                       string
	Headers                      string // "" with HeadersWhy
	HeadersWhy                   string // why the headers are not shown
	HeadersCut                   int    // octets of the header section not shown
	Rcpts                        []msgRcpt
	Live                         bool // some recipient can still be acted on
}

type msgRcpt struct {
	Recipient
	Last, Next, Reply string
	FirstGreylisted   string
	Salvaged          string
	Tries             []msgAttempt // History, formatted
}

type msgAttempt struct {
	Start, Took                               string
	SourceIP, MX, TLS, Stage, Outcome, Reason string
	Reply                                     string
}

func (s *Server) messagePage(w http.ResponseWriter, r *http.Request) {
	m, err := s.local.Message(r.Context(), r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	d := msgPageOf(&m, s.opt.Config.Hostname)
	d.Headers, d.HeadersCut, d.HeadersWhy = s.pageHeaders(&m)
	var buf bytes.Buffer
	if err := s.page.ExecuteTemplate(&buf, "message", d); err != nil {
		s.fail(w, r, err)
		return
	}
	writePage(w, buf.Bytes())
}

// writePage answers an HTML page of the admin server: never cached, and
// inert (no script, nothing loaded from elsewhere).
func writePage(w http.ResponseWriter, b []byte) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write(b)
}

// pageHeaders returns the message's header section as text (control
// characters replaced), how many octets of it were left out, or why it
// cannot be shown.
func (s *Server) pageHeaders(m *Message) (string, int, string) {
	if m.Finished != nil {
		return "", 0, "The message has left the queue; its content is not kept."
	}
	id, err := parseID(m.ID)
	if err != nil {
		return "", 0, err.Error()
	}
	c, err := s.opt.Queue.OpenBody(id)
	if errors.Is(err, queue.ErrNotFound) {
		return "", 0, "The message's content is not in the queue."
	}
	if err != nil {
		return "", 0, "The content cannot be read: " + err.Error()
	}
	defer c.Close()
	h, _ := splitMessage(c.Bytes())
	shown := h[:min(len(h), pageHeaderMax)]
	lines := strings.Split(strings.TrimSuffix(string(shown), "\r\n"), "\r\n")
	for i, l := range lines {
		lines[i] = Clean(l) // a folded line keeps its leading space
	}
	return strings.Join(lines, "\n"), len(h) - len(shown), ""
}

func msgPageOf(m *Message, hostname string) *msgPage {
	now := m.Now
	d := &msgPage{Hostname: hostname, Now: now.UTC().Format(time.RFC3339), Message: *m,
		Arrived: m.Arrival.UTC().Format(time.RFC3339), Age: HumanDuration(now.Sub(m.Arrival)),
		Size: HumanBytes(m.Size), Client: Clean(m.ClientAddr)}
	d.Sender = Clean(Sender(m.Sender))
	if m.Finished != nil {
		d.Finished = m.Finished.UTC().Format(time.RFC3339) + " (" + RelTime(*m.Finished, now) + ")"
	}
	for i := range m.Recipients {
		rc := &m.Recipients[i]
		x := msgRcpt{Recipient: *rc, Last: relPtr(rc.LastAttempt, now), Next: NextText(rc.Status, deref(rc.NextAttempt), now),
			Reply: Clean(ReplyText(rc.LastReply))}
		x.Recipient.Recipient = Clean(rc.Recipient)
		if rc.FirstGreylisted != nil {
			x.FirstGreylisted = RelTime(*rc.FirstGreylisted, now)
		}
		if rc.Salvaged != nil {
			x.Salvaged = RelTime(*rc.Salvaged, now)
		}
		d.Live = d.Live || !queue.Status(rc.Status).Final()
		for _, a := range rc.History {
			took := "-"
			if a.End != nil {
				took = HumanDuration(a.End.Sub(a.Start))
			}
			x.Tries = append(x.Tries, msgAttempt{Start: a.Start.UTC().Format("2006-01-02 15:04:05"), Took: took,
				SourceIP: a.SourceIP, MX: Clean(a.MXHost), TLS: a.TLS, Stage: a.Stage, Outcome: a.Outcome,
				Reason: a.Reason, Reply: Clean(ReplyText(a.Reply))})
		}
		d.Rcpts = append(d.Rcpts, x)
	}
	return d
}

func relPtr(t *time.Time, now time.Time) string {
	if t == nil {
		return "-"
	}
	return RelTime(*t, now)
}

func deref(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}

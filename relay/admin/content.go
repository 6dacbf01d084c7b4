package admin

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/greyrelay/greyrelay/queue"
)

// A queued message's content, as Postfix's postcat -h and -b show it:
// GET /api/queue/{id}/headers and /body. The part is streamed from the
// queue's copy (a spooled body is mapped, not read onto the heap) and cut
// at max octets, so that a 50 MB message cannot flood a terminal by
// accident; the X-Greyrelay-Size header says how large the whole part is.
// It is served as text/plain with nosniff: a browser shows it, never
// renders it.

// Bounds of one content answer: 1 MiB by default, as much as asked up to
// 2 GiB.
const (
	DefaultContentMax = 1 << 20
	MaxContentMax     = 1<<31 - 1
)

// ContentSizeHeader carries the size of the whole part of a content answer.
const ContentSizeHeader = "X-Greyrelay-Size"

// ContentInfo says how much of a part Client.Content received.
type ContentInfo struct {
	Size int64 // octets in the whole part (-1: not told)
	Sent int64 // octets received
}

// Truncated reports whether less than the whole part was received.
func (ci ContentInfo) Truncated() bool { return ci.Size >= 0 && ci.Sent < ci.Size }

// splitMessage returns the header section (with the CRLF ending its last
// field, without the empty line) and the body. A message without an empty
// line is all header (RFC 5322 §3.5: the body is optional).
func splitMessage(b []byte) (header, body []byte) {
	if bytes.HasPrefix(b, []byte("\r\n")) {
		return nil, b[2:]
	}
	if i := bytes.Index(b, []byte("\r\n\r\n")); i >= 0 {
		return b[:i+2], b[i+4:]
	}
	return b, nil
}

// content serves one part ("headers" or "body") of a message.
func (s *Server) content(part string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) { s.serveContent(w, r, part) }
}

func (s *Server) serveContent(w http.ResponseWriter, r *http.Request, part string) {
	id, err := parseID(r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	max, err := intParam(r.URL.Query(), "max", DefaultContentMax, 1, MaxContentMax)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	c, err := s.opt.Queue.OpenBody(id)
	if errors.Is(err, queue.ErrNotFound) {
		err = s.noContent(id)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	defer c.Close()
	header, body := splitMessage(c.Bytes())
	b := header
	if part == "body" {
		b = body
	}
	size := len(b)
	b = b[:min(len(b), max)]
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	h.Set(ContentSizeHeader, strconv.Itoa(size))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b) // the client went away; nothing to do
}

// noContent explains a missing body: a finished message's is not kept.
func (s *Server) noContent(id queue.ID) error {
	m, serr := s.opt.Queue.Show(id)
	if serr != nil || m.Finished.IsZero() {
		return fmt.Errorf("message %s is not in the queue: %w", id, queue.ErrNotFound)
	}
	return fmt.Errorf("message %s finished at %s and left the queue; its content is not kept (queue show %s has its record): %w",
		id, m.Finished.UTC().Format("2006-01-02 15:04:05Z"), id, queue.ErrNotFound)
}

package admin

import (
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The probe is the one admin action that reaches outside the relay: it
// opens SMTP sessions (EHLO, MAIL, RCPT) from the relay's pinned address.
// So it is a POST, which the cross-origin guard covers (a web page cannot
// make the browser send it), and it is bounded twice, since every probe
// costs outbound connections and a slow destination holds them for the
// probe's whole timeout (300 concurrent probes of a tarpit were 300
// sessions):
//
//   - admin.probe_concurrency probes run at once, in all; one more is
//     refused at once rather than queued (a waiting request holds its HTTP
//     connection as long);
//   - each client address may start admin.probe_per_minute probes a
//     minute, as a token bucket of that size refilled over a minute.
//
// Either refusal is 429 Too Many Requests with Retry-After (RFC 6585 §4,
// RFC 9110 §10.2.3) in seconds.

// Defaults for a Config built without the embedded defaults (tests).
const (
	defaultProbeConcurrency = 2
	defaultProbePerMinute   = 10
)

// probeGate admits probes under both limits.
type probeGate struct {
	running chan struct{} // one value per probe running
	rate    float64       // tokens per second
	burst   float64
	now     func() time.Time

	mu      sync.Mutex
	clients map[string]*bucket
}

type bucket struct {
	tokens float64
	at     time.Time
}

// maxProbeClients bounds the buckets kept; past it, full ones are dropped.
const maxProbeClients = 1024

func newProbeGate(concurrency, perMinute int, now func() time.Time) *probeGate {
	if concurrency <= 0 {
		concurrency = defaultProbeConcurrency
	}
	if perMinute <= 0 {
		perMinute = defaultProbePerMinute
	}
	return &probeGate{running: make(chan struct{}, concurrency), rate: float64(perMinute) / 60,
		burst: float64(perMinute), now: now, clients: make(map[string]*bucket)}
}

// enter admits a probe for client, or returns how long to wait. A probe
// admitted must call the returned leave.
func (g *probeGate) enter(client string) (leave func(), wait time.Duration) {
	if wait := g.take(client); wait > 0 {
		return nil, wait
	}
	select {
	case g.running <- struct{}{}:
		return func() { <-g.running }, 0
	default:
		g.refund(client)
		return nil, time.Second
	}
}

// take spends one of client's tokens, or says when the next one comes.
func (g *probeGate) take(client string) time.Duration {
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	b := g.refill(client, now)
	if b.tokens < 1 {
		return time.Duration((1 - b.tokens) / g.rate * float64(time.Second))
	}
	b.tokens--
	return 0
}

// refund gives back a token spent on a probe that did not run.
func (g *probeGate) refund(client string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if b := g.clients[client]; b != nil {
		b.tokens = math.Min(g.burst, b.tokens+1)
	}
}

// refill brings client's bucket up to now, creating it full.
func (g *probeGate) refill(client string, now time.Time) *bucket {
	b := g.clients[client]
	if b == nil {
		if len(g.clients) >= maxProbeClients {
			g.sweep(now)
		}
		b = &bucket{tokens: g.burst, at: now}
		g.clients[client] = b
		return b
	}
	if d := now.Sub(b.at); d > 0 {
		b.tokens = math.Min(g.burst, b.tokens+d.Seconds()*g.rate)
		b.at = now
	}
	return b
}

// sweep forgets the buckets that are full again: a new one starts full.
func (g *probeGate) sweep(now time.Time) {
	for k, b := range g.clients {
		if b.tokens+now.Sub(b.at).Seconds()*g.rate >= g.burst {
			delete(g.clients, k)
		}
	}
}

// clientOf is the address a request came from, without its port.
func clientOf(r *http.Request) string {
	if h, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return h
	}
	return r.RemoteAddr
}

// probe handles POST /api/probe: target in the query or a form body.
func (s *Server) probe(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 4096)
	target := strings.TrimSpace(r.FormValue("target"))
	if target == "" {
		s.fail(w, r, badf("target is required (an address or a domain)"))
		return
	}
	leave, wait := s.probes.enter(clientOf(r))
	if leave == nil {
		secs := int(math.Ceil(wait.Seconds()))
		w.Header().Set("Retry-After", strconv.Itoa(max(1, secs)))
		writeError(w, http.StatusTooManyRequests, fmt.Errorf(
			"too many probes: at most admin.probe_concurrency at once and admin.probe_per_minute per client; retry in %ds", max(1, secs)))
		return
	}
	defer leave()
	res, err := s.opt.Probe(r.Context(), target)
	if err != nil {
		writeError(w, http.StatusBadGateway, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// Package integration runs the real greyrelay binary against real peers:
// swaks as the submitting client, private Postfix instances (with postgrey)
// and recording go-smtp sinks as destinations, and a test DNS server that
// gives every destination its MX. Programs are started by integration/peers.
//
// Design notes for the end-to-end tests (intake, delivery, greylist, dsn,
// ops, probe):
//
//   - Each test builds its own small internet (mailNet): its own DNS server,
//     its own loopback addresses (127.0.0.100-199, handed out in turn so that
//     parallel tests never share a "host"), and one SMTP port that every MX
//     host of the test listens on, because delivery.port is one number for
//     all MX delivery.
//   - Relay configs are written from a base with short retry timings plus
//     per-test overrides ("retry.lifetime=10s"), so a test states only what
//     it is about. The relay always logs JSON, which the tests parse.
//   - Nothing sleeps a fixed time: every wait polls what an operator could
//     see (the admin API, the relay's log, a sink's record) until a deadline.
//   - Operator commands are run as the binary, as an operator would
//     (`greyrelay queue -config FILE list -json`); the admin API is read
//     directly only where the test needs a value a command prints for humans.
package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net"
	"net/http"
	"net/mail"
	"net/textproto"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.yaml.in/yaml/v3"

	"github.com/greyrelay/greyrelay/integration/peers"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// mailNet is one test's small internet.
type mailNet struct {
	t    *testing.T
	dns  *peers.DNS
	port int // delivery.port: every MX host of this test listens on it
}

func newMailNet(t *testing.T) *mailNet {
	t.Helper()
	return &mailNet{t: t, dns: peers.StartDNS(t), port: peers.FreePort(t, "127.0.0.1")}
}

// host allocates a loopback address no other running test uses (a
// distinct "host" for greylisting and logs) and, if name is not empty,
// publishes an A record for it.
func (n *mailNet) host(name string) string {
	ip := relaytest.Loopback(n.t)
	if name != "" {
		n.dns.A(name, ip)
	}
	return ip
}

// mxAddr allocates the address of domain's only MX host, mx.<domain>, and
// publishes the MX and A records. It returns host:port, where nothing
// listens yet.
func (n *mailNet) mxAddr(domain string) string {
	ip := n.host("mx." + domain)
	n.dns.MX(domain, 10, "mx."+domain)
	return net.JoinHostPort(ip, strconv.Itoa(n.port))
}

// sink starts a recording SMTP server as the MX of domain.
func (n *mailNet) sink(domain string, opts peers.SinkOptions) *peers.Sink {
	n.t.Helper()
	if opts.Domain == "" {
		opts.Domain = "mx." + domain
	}
	return peers.StartSink(n.t, n.mxAddr(domain), opts)
}

// postfix starts a private Postfix as the MX of domain, accepting mail for
// it (unless c says otherwise).
func (n *mailNet) postfix(domain string, c peers.PostfixConfig) *peers.Postfix {
	n.t.Helper()
	c.Listen = n.mxAddr(domain)
	if c.Hostname == "" {
		c.Hostname = "mx." + domain
	}
	if len(c.RelayDomains) == 0 {
		c.RelayDomains = []string{domain}
	}
	return peers.StartPostfix(n.t, c)
}

// testRelay is a running greyrelay with the address it listens on, sends
// from and serves its admin API on.
type testRelay struct {
	*peers.Relay
	t  *testing.T
	IP string
}

// relayYAML renders the base test configuration for a relay on ip, with
// overrides "dotted.key=YAML value" applied on top ("retry.lifetime=10s",
// "trusted_networks=[]").
func (n *mailNet) relayYAML(ip string, overrides ...string) string {
	n.t.Helper()
	cfg := map[string]any{
		"hostname":  "relay.test",
		"listeners": []any{map[string]any{"address": peers.FreeAddr(n.t, ip), "mode": "smtp"}},
		"admin":     map[string]any{"address": peers.FreeAddr(n.t, ip)},
		"queue":     map[string]any{"path": "queue.db"},
		"log":       map[string]any{"format": "json", "level": "info"},
		"delivery": map[string]any{
			"source_ipv4": ip, "port": n.port, "resolver": n.dns.Addr(),
			"allow_private_destinations": true, "tls": "may",
			"connect_timeout": "5s", "greeting_timeout": "10s", "command_timeout": "10s", "data_timeout": "20s",
		},
		"retry": map[string]any{
			"initial_interval": "1s", "max_interval": "4s", "factor": 2, "jitter": 0.1,
			"greylist_first_retry": "4s", "greylist_second_retry": "4s", "hint_min": "1s", "hint_max": "1m",
			"lifetime": "10m", "delay_warnings": []any{},
		},
	}
	for _, o := range overrides {
		key, val, ok := strings.Cut(o, "=")
		if !ok {
			n.t.Fatalf("override %q is not key=value", o)
		}
		var v any
		if err := yaml.Unmarshal([]byte(val), &v); err != nil {
			n.t.Fatalf("override %q: %v", o, err)
		}
		setPath(cfg, strings.Split(key, "."), v)
	}
	out, err := yaml.Marshal(cfg)
	if err != nil {
		n.t.Fatal(err)
	}
	return string(out)
}

func setPath(m map[string]any, path []string, v any) {
	for _, k := range path[:len(path)-1] {
		sub, ok := m[k].(map[string]any)
		if !ok {
			sub = map[string]any{}
			m[k] = sub
		}
		m = sub
	}
	m[path[len(path)-1]] = v
}

// relay starts greyrelay on a fresh address with the base configuration
// and the overrides.
func (n *mailNet) relay(overrides ...string) *testRelay {
	n.t.Helper()
	ip := n.host("")
	r := peers.StartRelay(n.t, n.relayYAML(ip, overrides...))
	return &testRelay{Relay: r, t: n.t, IP: ip}
}

var queuedAs = regexp.MustCompile(`250 2\.0\.0 OK queued as ([0-9a-f]{16})`)

// send submits m with swaks (to the relay unless m.Server is set), requires
// success, and returns the queue id from the 250 reply.
func (r *testRelay) send(m peers.SwaksMessage) string {
	r.t.Helper()
	if m.Server == "" {
		m.Server = r.SMTPAddr
	}
	out, code := m.Send(r.t)
	if code != 0 {
		r.t.Fatalf("swaks exit %d:\n%s", code, out)
	}
	mm := queuedAs.FindStringSubmatch(out)
	if mm == nil {
		r.t.Fatalf("no \"250 2.0.0 OK queued as ID\" in swaks output:\n%s", out)
	}
	return mm[1]
}

// sendBurst submits ms with up to clients swaks processes at once and
// returns their queue IDs in the order of ms: a burst that arrives as a
// busy application submits it, not paced by one swaks process after
// another (0.3-1 s each on a loaded two-core machine).
func (r *testRelay) sendBurst(ms []peers.SwaksMessage, clients int) []string {
	r.t.Helper()
	ids, outs := make([]string, len(ms)), make([]string, len(ms))
	codes := make([]int, len(ms))
	var wg sync.WaitGroup
	sem := make(chan struct{}, clients)
	for i, m := range ms {
		if m.Server == "" {
			m.Server = r.SMTPAddr
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			outs[i], codes[i] = m.Send(r.t)
		}()
	}
	wg.Wait()
	for i, out := range outs {
		mm := queuedAs.FindStringSubmatch(out)
		if codes[i] != 0 || mm == nil {
			r.t.Fatalf("swaks exit %d, no \"250 2.0.0 OK queued as ID\":\n%s", codes[i], out)
		}
		ids[i] = mm[1]
	}
	return ids
}

// message returns a complete RFC 5322 message with the given subject and
// a body that exercises transparency: a leading dot, trailing blanks, a
// tab, an empty line, a long line. It does not end with CRLF because swaks
// always sends CRLF before the final dot: onWire(m) is what the server
// receives.
func message(from, to, subject string) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "From: Sender <%s>\r\nTo: <%s>\r\nSubject: %s\r\n", from, to, subject)
	fmt.Fprintf(&b, "Date: Mon, 01 Jan 2024 10:00:00 +0000\r\nMessage-ID: <%d.%s@src.test>\r\n", time.Now().UnixNano(), strings.ReplaceAll(subject, " ", "-"))
	b.WriteString("MIME-Version: 1.0\r\nContent-Type: text/plain; charset=us-ascii\r\nX-Test: kept  as is \r\n\r\n")
	b.WriteString("Hello,\r\n.a line that starts with a dot\r\n..and one with two\r\ntrailing blanks   \r\n\tindented\r\n\r\n")
	b.WriteString(strings.Repeat("0123456789", 90) + "\r\n.\r\nend")
	return b.Bytes()
}

// onWire is msg as an SMTP server stores it after DATA from swaks.
func onWire(msg []byte) []byte { return append(bytes.Clone(msg), "\r\n"...) }

// withoutTrace drops the header fields MTAs add in transit (Received with
// its continuation lines, Return-Path, Delivered-To, X-Greylist), so that
// what remains must equal what the client sent.
func withoutTrace(msg []byte) []byte {
	head, body, ok := bytes.Cut(msg, []byte("\r\n\r\n"))
	if !ok {
		return msg
	}
	var out bytes.Buffer
	skipping := false
	for _, line := range strings.SplitAfter(string(head)+"\r\n", "\r\n") {
		if line == "" {
			continue
		}
		if line[0] == ' ' || line[0] == '\t' {
			if !skipping {
				out.WriteString(line)
			}
			continue
		}
		name, _, _ := strings.Cut(line, ":")
		switch strings.ToLower(strings.TrimSpace(name)) {
		case "received", "return-path", "delivered-to", "x-greylist":
			skipping = true
		default:
			skipping = false
			out.WriteString(line)
		}
	}
	out.WriteString("\r\n")
	out.Write(body)
	return out.Bytes()
}

// cliResult is one run of the greyrelay binary.
type cliResult struct {
	Stdout, Stderr string
	Code           int
}

func (c cliResult) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", c.Code, c.Stdout, c.Stderr)
}

// runGreyrelay runs the binary in dir with stdin and extra environment
// (the inherited environment loses its GREYRELAY_* variables, and
// GREYRELAY_CONFIG is empty unless env sets it: a command without -config
// reads the embedded default, not a file that happens to be at
// /etc/greyrelay/greyrelay.yaml on the test machine).
func runGreyrelay(t *testing.T, dir, stdin string, env []string, args ...string) cliResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, peers.Binary(t), args...)
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GREYRELAY_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(append(cmd.Env, "GREYRELAY_CONFIG="), env...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	res := cliResult{Stdout: stdout.String(), Stderr: stderr.String()}
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit) && ctx.Err() == nil:
		res.Code = exit.ExitCode()
	default:
		t.Fatalf("greyrelay %v: %v\n%s", args, err, res)
	}
	return res
}

// cli runs `greyrelay CMD -config FILE ARGS...` against this relay.
func (r *testRelay) cli(cmd string, args ...string) cliResult {
	r.t.Helper()
	return runGreyrelay(r.t, r.Dir, "", nil, append([]string{cmd, "-config", r.ConfigPath}, args...)...)
}

// logEntry is one JSON line of the relay's log.
type logEntry map[string]any

func (e logEntry) str(k string) string { s, _ := e[k].(string); return s }
func (e logEntry) num(k string) float64 {
	f, _ := e[k].(float64)
	return f
}

// zapTime is the layout of zapcore.ISO8601TimeEncoder.
const zapTime = "2006-01-02T15:04:05.000Z0700"

func (e logEntry) time(k string) time.Time {
	t, _ := time.Parse(zapTime, e.str(k))
	return t
}

// logEntries parses every JSON line the relay wrote so far; lines that are
// not JSON (the harness's start markers) are skipped, and any other line
// that is not JSON fails the test. What follows the last newline is a line
// still being written (the log reaches the harness through a pipe, in
// pieces) and is left for the next call.
func (r *testRelay) logEntries() []logEntry {
	r.t.Helper()
	var out []logEntry
	lines := strings.Split(r.Log(), "\n")
	for _, line := range lines[:len(lines)-1] {
		if line == "" || strings.HasPrefix(line, "--- peers:") {
			continue
		}
		var e logEntry
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			r.t.Errorf("log line is not JSON (log.format json): %q", line)
			continue
		}
		out = append(out, e)
	}
	return out
}

// attempts returns the relay's "delivery attempt" lines for queue id, in
// order.
func (r *testRelay) attempts(id string) []logEntry {
	var out []logEntry
	for _, e := range r.logEntries() {
		if strings.HasPrefix(e.str("msg"), "delivery attempt") && e.str("queue_id") == id {
			out = append(out, e)
		}
	}
	return out
}

// waitAttempts waits until the log has a delivery attempt line for id with
// the given outcome and returns all of id's attempt lines.
func (r *testRelay) waitAttempts(id, outcome string, timeout time.Duration) []logEntry {
	r.t.Helper()
	var got []logEntry
	relaytest.Eventually(r.t, timeout, "attempt with outcome "+outcome+" for "+id, func() error {
		got = r.attempts(id)
		for _, e := range got {
			if e.str("outcome") == outcome {
				return nil
			}
		}
		return fmt.Errorf("attempt outcomes so far: %v", outcomes(got))
	})
	return got
}

func outcomes(es []logEntry) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.str("outcome")+"/"+e.str("reason"))
	}
	return out
}

// The admin API's JSON, as far as the tests read it.
type (
	apiReply struct {
		Code     int    `json:"code"`
		Enhanced string `json:"enhanced"`
		Text     string `json:"text"`
	}
	apiRow struct {
		ID          string     `json:"id"`
		Key         string     `json:"key"`
		Status      string     `json:"status"`
		Reason      string     `json:"reason"`
		Attempts    int        `json:"attempts"`
		NextAttempt *time.Time `json:"next_attempt"`
		LastReply   *apiReply  `json:"last_reply"`
		SourceIP    string     `json:"source_ip"`
		MXHost      string     `json:"mx_host"`
		MXAddr      string     `json:"mx_addr"`
		Sender      string     `json:"sender"`
		Recipient   string     `json:"recipient"`
		Domain      string     `json:"domain"`
	}
	apiList struct {
		Total int      `json:"total"`
		Rows  []apiRow `json:"rows"`
	}
	apiAttempt struct {
		Start    time.Time `json:"start"`
		SourceIP string    `json:"source_ip"`
		MXAddr   string    `json:"mx_addr"`
		Outcome  string    `json:"outcome"`
		Reason   string    `json:"reason"`
	}
	apiRecipient struct {
		apiRow
		History []apiAttempt `json:"history"`
	}
	apiMessage struct {
		ID         string         `json:"id"`
		Sender     string         `json:"sender"`
		DSN        bool           `json:"dsn"`
		Recipients []apiRecipient `json:"recipients"`
	}
	apiDestination struct {
		Domain              string     `json:"domain"`
		Greylists           bool       `json:"greylists"`
		GreylistSeen        int        `json:"greylist_seen"`
		GreylistPassed      int        `json:"greylist_passed"`
		LearnedDelaySeconds float64    `json:"learned_delay_seconds"`
		GreylistLowSeconds  float64    `json:"greylist_low_seconds"`
		ThrottleLevel       int        `json:"throttle_level"`
		PaceSeconds         float64    `json:"pace_seconds"`
		ThrottledUntil      *time.Time `json:"throttled_until"`
		LastReply           *apiReply  `json:"last_reply"`
	}
	apiDestinations struct {
		Destinations []apiDestination `json:"destinations"`
	}
)

// api GETs path from the admin server and decodes a 200 answer into out.
// It returns the status code.
func (r *testRelay) api(path string, out any) int {
	r.t.Helper()
	code, body := r.Get(r.t, path)
	if code == http.StatusOK && out != nil {
		if err := json.Unmarshal([]byte(body), out); err != nil {
			r.t.Fatalf("admin %s: %v\n%s", path, err, body)
		}
	}
	return code
}

// rows returns every recipient in the queue.
func (r *testRelay) rows() []apiRow {
	r.t.Helper()
	var l apiList
	if code := r.api("/api/queue?limit=10000", &l); code != http.StatusOK {
		r.t.Fatalf("admin /api/queue: HTTP %d", code)
	}
	return l.Rows
}

// rowsOf returns the recipients of message id.
func (r *testRelay) rowsOf(id string) []apiRow {
	var out []apiRow
	for _, row := range r.rows() {
		if row.ID == id {
			out = append(out, row)
		}
	}
	return out
}

// waitQueueEmpty waits until no recipient is left in the queue (delivered
// and failed messages are removed once every recipient is final).
func (r *testRelay) waitQueueEmpty(timeout time.Duration) {
	r.t.Helper()
	relaytest.Eventually(r.t, timeout, "an empty queue", func() error {
		if rows := r.rows(); len(rows) > 0 {
			return fmt.Errorf("%d recipients left, first %s %s %s", len(rows), rows[0].Key, rows[0].Status, rows[0].Reason)
		}
		return nil
	})
}

// destination returns what the relay learned about domain.
func (r *testRelay) destination(domain string) (apiDestination, bool) {
	r.t.Helper()
	var d apiDestinations
	if r.api("/api/destinations/"+domain, &d) != http.StatusOK || len(d.Destinations) != 1 {
		return apiDestination{}, false
	}
	return d.Destinations[0], true
}

// metrics scrapes /metrics and parses it as Prometheus text exposition.
func (r *testRelay) metrics() map[string]*dto.MetricFamily {
	r.t.Helper()
	code, body := r.Get(r.t, "/metrics")
	if code != http.StatusOK {
		r.t.Fatalf("/metrics: HTTP %d", code)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		r.t.Fatalf("/metrics does not parse: %v", err)
	}
	return mfs
}

// metricValue sums the samples of a counter or gauge whose labels include
// want; a family that is missing counts as 0.
func metricValue(mfs map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	mf := mfs[name]
	if mf == nil {
		return 0
	}
	sum := 0.0
	for _, m := range mf.GetMetric() {
		labels := map[string]string{}
		for _, lp := range m.GetLabel() {
			labels[lp.GetName()] = lp.GetValue()
		}
		match := true
		for k, v := range want {
			if labels[k] != v {
				match = false
			}
		}
		if !match {
			continue
		}
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Untyped != nil:
			sum += m.GetUntyped().GetValue()
		}
	}
	return sum
}

// dsnReport is a parsed RFC 3464 delivery status notification.
type dsnReport struct {
	Header     mail.Header
	ReportType string
	Human      string                 // the text/plain part
	PerMessage textproto.MIMEHeader   // Reporting-MTA, Arrival-Date...
	Recipients []textproto.MIMEHeader // one per recipient: Final-Recipient, Action, Status...
	Original   string                 // the message/rfc822 or text/rfc822-headers part
}

// parseDSN parses data as multipart/report; report-type=delivery-status.
func parseDSN(t *testing.T, data []byte) dsnReport {
	t.Helper()
	msg, err := mail.ReadMessage(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("DSN is not a message: %v\n%s", err, data)
	}
	mt, params, err := mime.ParseMediaType(msg.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/report" {
		t.Fatalf("DSN Content-Type %q (%v), want multipart/report\n%s", msg.Header.Get("Content-Type"), err, data)
	}
	rep := dsnReport{Header: msg.Header, ReportType: params["report-type"]}
	mr := multipart.NewReader(msg.Body, params["boundary"])
	for {
		p, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("DSN multipart: %v\n%s", err, data)
		}
		body, err := io.ReadAll(p)
		if err != nil {
			t.Fatalf("DSN part: %v", err)
		}
		ct, _, _ := mime.ParseMediaType(p.Header.Get("Content-Type"))
		switch ct {
		case "text/plain":
			rep.Human = string(body)
		case "message/delivery-status", "message/global-delivery-status":
			rep.PerMessage, rep.Recipients = parseStatusFields(t, body)
		case "message/rfc822", "text/rfc822-headers", "message/global", "message/global-headers":
			rep.Original = string(body)
		}
	}
	if rep.PerMessage == nil {
		t.Fatalf("DSN has no message/delivery-status part\n%s", data)
	}
	return rep
}

// parseStatusFields reads the per-message group and the per-recipient
// groups of a delivery-status body (RFC 3464 §2.1).
func parseStatusFields(t *testing.T, body []byte) (textproto.MIMEHeader, []textproto.MIMEHeader) {
	t.Helper()
	r := textproto.NewReader(bufio.NewReader(bytes.NewReader(body)))
	var groups []textproto.MIMEHeader
	for {
		h, err := r.ReadMIMEHeader()
		if len(h) > 0 {
			groups = append(groups, h)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("delivery-status fields: %v\n%s", err, body)
		}
	}
	if len(groups) == 0 {
		t.Fatalf("empty delivery-status part")
	}
	return groups[0], groups[1:]
}

// recipient returns the per-recipient group whose Final-Recipient is addr.
func (d dsnReport) recipient(addr string) textproto.MIMEHeader {
	for _, g := range d.Recipients {
		if strings.EqualFold(finalAddr(g), addr) {
			return g
		}
	}
	return nil
}

// finalAddr is the address of a Final-Recipient field ("rfc822; a@b").
func finalAddr(g textproto.MIMEHeader) string {
	_, a, _ := strings.Cut(g.Get("Final-Recipient"), ";")
	return strings.TrimSpace(a)
}

// oneSpace collapses runs of white space, for comparing folded fields.
func oneSpace(s string) string { return strings.Join(strings.Fields(s), " ") }

package relaytest

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Step is one move of a transcript peer: read the lines the client must
// send (if any), then act. A script ([]Step) reads like the server's side
// of a transcript: Step{Expect: "MAIL FROM:", Send: "250 2.1.0 ok\r\n"}.
type Step struct {
	Expect string        // the client must send a line starting with this; "" reads nothing
	Pipe   []string      // then these lines (prefixes), all before any reply: a pipelined group
	Send   string        // raw bytes to write
	Data   bool          // before sending, read message data up to CRLF.CRLF
	TLS    bool          // after sending, run a server-side TLS handshake
	Hang   bool          // stop answering; read on until the client leaves
	Close  bool          // after sending, close the connection
	Drip   time.Duration // write Send one byte at a time, this far apart
	Flood  string        // write this line again and again until the client leaves
}

// PeerOptions configures a Peer.
type PeerOptions struct {
	TLS     *tls.Config   // the server side of a Step with TLS set
	Timeout time.Duration // each connection's deadline; default 5 s
}

// Peer is an SMTP server that plays scripts byte for byte: connection i
// follows scripts[i], and a client that strays from it fails the test. It
// records every line and every message payload (DATA, BDAT chunks)
// received, so tests can inspect the raw bytes a client puts on the wire,
// and it can misbehave in ways a real server library will not (replies cut
// short, dripped, flooded, a connection closed mid-dialogue).
type Peer struct {
	t     testing.TB
	o     PeerOptions
	ln    net.Listener
	mu    sync.Mutex
	lines [][]string // per connection, without line ends
	data  [][]byte
	wg    sync.WaitGroup
}

// StartPeer listens on addr ("ip:port", port 0 for any) and plays one
// script per accepted connection; after the last script it accepts no
// more. It stops, and waits for its connections to end, when the test ends.
func StartPeer(t testing.TB, addr string, o PeerOptions, scripts ...[]Step) *Peer {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("relaytest: peer on %s: %v", addr, err)
	}
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Second
	}
	p := &Peer{t: t, o: o, ln: ln}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for _, s := range scripts {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			n := len(p.lines)
			p.lines = append(p.lines, nil)
			p.mu.Unlock()
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				defer conn.Close()
				p.run(conn, n, s)
			}()
		}
	}()
	t.Cleanup(p.Close)
	return p
}

// Close stops accepting and waits until every connection has ended (the
// client has left, or its deadline passed), so that what Received returns
// afterwards is complete. It is also done when the test ends.
func (p *Peer) Close() {
	p.ln.Close()
	p.wg.Wait()
}

// Addr is the address the peer listens on.
func (p *Peer) Addr() netip.AddrPort { return p.ln.Addr().(*net.TCPAddr).AddrPort() }

// Received returns every line received so far (all connections, in
// order per connection), the payloads and the number of connections.
func (p *Peer) Received() (lines []string, data [][]byte, conns int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.lines {
		lines = append(lines, c...)
	}
	return lines, append([][]byte(nil), p.data...), len(p.lines)
}

// Conns returns the lines received on each connection.
func (p *Peer) Conns() [][]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([][]string, len(p.lines))
	for i, c := range p.lines {
		out[i] = append([]string(nil), c...)
	}
	return out
}

// run plays one script on connection n, then drains until the client
// goes away.
func (p *Peer) run(conn net.Conn, n int, script []Step) {
	_ = conn.SetDeadline(time.Now().Add(p.o.Timeout))
	br := bufio.NewReader(conn)
	for _, s := range script {
		if !p.expect(br, n, s) {
			return
		}
		if s.Data && !p.readData(br) {
			return
		}
		if !p.write(conn, s) || s.Close {
			return
		}
		if s.Hang {
			break
		}
		if s.TLS {
			tc := tls.Server(conn, p.o.TLS)
			if err := tc.Handshake(); err != nil {
				p.t.Errorf("peer: TLS handshake: %v", err)
				return
			}
			conn, br = tc, bufio.NewReader(tc)
		}
	}
	for { // drain (QUIT and anything else) until EOF
		line, err := br.ReadString('\n')
		if line != "" {
			p.record(n, line)
		}
		if err != nil {
			return
		}
	}
}

// expect reads the lines s expects, and after a BDAT line its chunk (RFC
// 3030 §2: the size on the command line, then exactly that many octets),
// which is recorded as a payload.
func (p *Peer) expect(br *bufio.Reader, n int, s Step) bool {
	want := s.Pipe
	if s.Expect != "" {
		want = append([]string{s.Expect}, want...)
	}
	for _, w := range want {
		line, err := br.ReadString('\n')
		p.record(n, line)
		if err != nil || !strings.HasPrefix(line, w) {
			p.t.Errorf("peer: got %q (%v), want %q", line, err, w)
			return false
		}
		if f := strings.Fields(line); len(f) > 1 && f[0] == "BDAT" && !p.readChunk(br, f[1]) {
			return false
		}
	}
	return true
}

// readChunk reads a BDAT chunk of size octets.
func (p *Peer) readChunk(br *bufio.Reader, size string) bool {
	n, err := strconv.Atoi(size)
	if err != nil {
		p.t.Errorf("peer: BDAT size %q: %v", size, err)
		return false
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(br, buf); err != nil {
		p.t.Errorf("peer: reading a chunk of %d octets: %v", n, err)
		return false
	}
	p.mu.Lock()
	p.data = append(p.data, buf)
	p.mu.Unlock()
	return true
}

func (p *Peer) write(conn net.Conn, s Step) bool {
	switch {
	case s.Flood != "":
		for {
			if _, err := io.WriteString(conn, s.Flood); err != nil {
				return false
			}
		}
	case s.Drip > 0:
		for i := range len(s.Send) {
			if _, err := conn.Write([]byte{s.Send[i]}); err != nil {
				return false
			}
			time.Sleep(s.Drip)
		}
	case s.Send != "":
		if _, err := io.WriteString(conn, s.Send); err != nil {
			return false
		}
	}
	return true
}

func (p *Peer) readData(br *bufio.Reader) bool {
	var buf []byte
	for !bytes.HasSuffix(buf, []byte("\r\n.\r\n")) && !bytes.Equal(buf, []byte(".\r\n")) {
		b, err := br.ReadByte()
		if err != nil {
			p.t.Errorf("peer: reading data: %v", err)
			return false
		}
		buf = append(buf, b)
	}
	p.mu.Lock()
	p.data = append(p.data, buf)
	p.mu.Unlock()
	return true
}

func (p *Peer) record(n int, line string) {
	p.mu.Lock()
	p.lines[n] = append(p.lines[n], strings.TrimRight(line, "\r\n"))
	p.mu.Unlock()
}

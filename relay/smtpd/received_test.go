package smtpd

import (
	"crypto/tls"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// refReceived is the Received header built the plain way, with string
// concatenation: the specification appendReceived is held to.
func refReceived(helo string, ip netip.Addr, host string, ts *tls.ConnectionState, auth, utf8 bool, rcpt string, date time.Time) string {
	lit := "[" + ip.String() + "]"
	if ip.Is6() {
		lit = "[IPv6:" + ip.String() + "]"
	}
	s := "Received: from "
	if h, ok := validHelo(helo); ok {
		s += h + " (" + lit + ")"
	} else {
		s += "unknown (" + lit + ") (helo=" + sanitizeHelo(helo) + ")"
	}
	if ts != nil {
		s += "\r\n\t(using " + tls.VersionName(ts.Version) + " with cipher " + tls.CipherSuiteName(ts.CipherSuite) + ")"
	}
	proto := "ESMTP"
	if utf8 {
		proto = "UTF8SMTP"
	}
	if ts != nil {
		proto += "S"
	}
	if auth {
		proto += "A"
	}
	s += "\r\n\tby " + sanitizeHelo(host) + " (greyrelay) with " + proto
	if rcpt != "" {
		s += "\r\n\tfor <" + rcpt + ">"
	}
	return s + "; " + date.Format("Mon, 02 Jan 2006 15:04:05 -0700") + "\r\n"
}

func TestAppendReceived_MatchesReference(t *testing.T) {
	date := time.Date(2026, 3, 4, 5, 6, 7, 0, time.FixedZone("", -5*3600))
	ts := &tls.ConnectionState{Version: tls.VersionTLS13, CipherSuite: tls.TLS_AES_128_GCM_SHA256}
	for _, helo := range []string{"client.example", "[127.0.0.1]", "", "a\rb", "bad name!", strings.Repeat("h", 300)} {
		for _, ip := range []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1"), {}} {
			for _, host := range []string{"relay.test", "not a host"} {
				for i := range 16 {
					tlsState := ts
					if i&1 == 0 {
						tlsState = nil
					}
					auth, utf8, rcpt := i&2 != 0, i&4 != 0, ""
					if i&8 != 0 {
						rcpt = "b@y.example"
					}
					_, valid := validHelo(helo)
					s := &session{}
					heloOK, heloSafe := s.checkHelo(helo)
					if heloOK != valid || heloSafe != sanitizeHelo(helo) {
						t.Fatalf("checkHelo(%q) = %v, %q", helo, heloOK, heloSafe)
					}
					ri := receivedInfo{helo: helo, heloOK: heloOK, heloSafe: heloSafe, ip: ip, host: sanitizeHelo(host),
						tls: tlsState, auth: auth, smtputf8: utf8, rcpt: rcpt, date: date}
					got := string(appendReceived([]byte("prefix"), ri))
					want := "prefix" + refReceived(helo, ip, host, tlsState, auth, utf8, rcpt, date)
					if got != want {
						t.Fatalf("got  %q\nwant %q", got, want)
					}
				}
			}
		}
	}
}

// TestCheckHelo_FollowsEHLO: the remembered answer is for the name last
// asked about.
func TestCheckHelo_FollowsEHLO(t *testing.T) {
	s := &session{}
	for _, tc := range []struct {
		helo string
		ok   bool
		safe string
	}{
		{"good.example", true, "good.example"},
		{"good.example", true, "good.example"},
		{"bad name", false, "bad_name"},
		{"", false, "unknown"},
		{"good.example", true, "good.example"},
	} {
		if ok, safe := s.checkHelo(tc.helo); ok != tc.ok || safe != tc.safe {
			t.Errorf("checkHelo(%q) = %v, %q", tc.helo, ok, safe)
		}
	}
}

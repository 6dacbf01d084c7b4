package tlspolicy

import (
	"strings"
	"testing"
)

func TestParseSTSRecord(t *testing.T) {
	for _, c := range []struct {
		in, id string
		ok     bool
	}{
		{"v=STSv1; id=20261201;", "20261201", true},
		{"v=STSv1;id=abc", "abc", true},
		{"v=STSv1; id=abc; ext=1", "abc", true},
		{"v=STSv1; ", "", false},
		{"v=STSv2; id=abc", "", false},
		{"id=abc; v=STSv1", "", false},
		{"v=STSv1; id=" + strings.Repeat("a", 33), "", false},
		{"v=STSv1; id=a-b", "", false},
		{"v=STSv1; id=a; id=b", "", false},
		{"v=STSv1; bogus", "", false},
	} {
		id, err := ParseSTSRecord(c.in)
		if (err == nil) != c.ok || id != c.id {
			t.Errorf("ParseSTSRecord(%q) = %q, %v; want %q ok=%v", c.in, id, err, c.id, c.ok)
		}
	}
}

func TestParseSTSPolicy(t *testing.T) {
	good := "version: STSv1\r\nmode: enforce\r\nmx: mx1.example.com\r\nmx: *.example.net\r\nmax_age: 86400\r\n"
	p, err := ParseSTSPolicy(good)
	if err != nil || p.Mode != ModeEnforce || p.MaxAge != 86400 || len(p.MX) != 2 {
		t.Fatalf("ParseSTSPolicy(good) = %+v, %v", p, err)
	}
	for _, c := range []struct {
		host string
		want bool
	}{
		{"mx1.example.com", true}, {"MX1.example.com.", true}, {"a.example.net", true},
		{"example.net", false}, {"a.b.example.net", false}, {"mx2.example.com", false},
	} {
		if got := p.Allows(c.host); got != c.want {
			t.Errorf("Allows(%q) = %v, want %v", c.host, got, c.want)
		}
	}
	for _, bad := range []string{
		"mode: enforce\nmx: a.b\nmax_age: 1\n",                  // no version
		"version: STSv1\nmx: a.b\nmax_age: 1\n",                 // no mode
		"version: STSv1\nmode: enforce\nmx: a.b\n",              // no max_age
		"version: STSv1\nmode: enforce\nmax_age: 1\n",           // no mx
		"version: STSv1\nmode: strict\nmx: a.b\nmax_age: 1\n",   // bad mode
		"version: STSv1\nmode: enforce\nmx: a b\nmax_age: 1\n",  // bad pattern
		"version: STSv1\nmode: enforce\nmx: a.b\nmax_age: -1\n", // bad age
		"version: STSv1\nmode enforce\n",                        // no colon
	} {
		if _, err := ParseSTSPolicy(bad); err == nil {
			t.Errorf("ParseSTSPolicy(%q) accepted", bad)
		}
	}
	if p, err := ParseSTSPolicy("version: STSv1\nmode: none\nmax_age: 9999999999\n"); err != nil || p.MaxAge != maxMaxAge {
		t.Errorf("mode none with large max_age = %+v, %v", p, err)
	}
}

func FuzzParseSTSRecord(f *testing.F) {
	f.Add("v=STSv1; id=20261201;")
	f.Add("v=STSv1;id=;")
	f.Fuzz(func(t *testing.T, s string) {
		id, err := ParseSTSRecord(s)
		if err == nil && !validID(id) {
			t.Fatalf("accepted invalid id %q", id)
		}
	})
}

func FuzzParseSTSPolicy(f *testing.F) {
	f.Add("version: STSv1\nmode: enforce\nmx: mx.example.com\nmax_age: 86400\n")
	f.Add("version: STSv1\r\nmode: testing\r\nmx: *.example.com\r\nmax_age: 1\r\n")
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParseSTSPolicy(s)
		if err != nil {
			return
		}
		if p.MaxAge < 0 || p.MaxAge > maxMaxAge || (p.Mode != ModeNone && len(p.MX) == 0) {
			t.Fatalf("accepted bad policy %+v", p)
		}
		for _, m := range p.MX {
			p.Allows(m)
		}
	})
}

func TestParseTLSRPT(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int
	}{
		{"v=TLSRPTv1; rua=mailto:tlsrpt@example.com", 1},
		{"v=TLSRPTv1;rua=mailto:a@example.com,https://r.example.com/tls;ext=1", 2},
		{"v=TLSRPTv1; rua=http://r.example.com/", 0},
		{"v=TLSRPTv1; rua=mailto:nobody", 0},
		{"v=TLSRPTv1; rua=mailto:a@b; rua=mailto:c@d", 0},
		{"v=TLSRPTv1;", 0},
		{"v=TLSRPTv2; rua=mailto:a@b", 0},
	} {
		got, err := ParseTLSRPT(c.in)
		if len(got) != c.want || (err == nil) != (c.want > 0) {
			t.Errorf("ParseTLSRPT(%q) = %v, %v; want %d destinations", c.in, got, err, c.want)
		}
	}
}

func FuzzParseTLSRPT(f *testing.F) {
	f.Add("v=TLSRPTv1; rua=mailto:tlsrpt@example.com,https://r.example.com/x")
	f.Fuzz(func(t *testing.T, s string) {
		us, err := ParseTLSRPT(s)
		if err != nil {
			return
		}
		for _, u := range us {
			if u.Scheme != "mailto" && u.Scheme != "https" {
				t.Fatalf("accepted rua scheme %q", u.Scheme)
			}
		}
	})
}

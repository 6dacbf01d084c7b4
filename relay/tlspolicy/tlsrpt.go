package tlspolicy

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// ParseTLSRPT parses a "_smtp._tls" TXT record (RFC 8460 §3) and returns
// its rua destinations: mailto: and https: URIs, in order; relay/tlsrpt sends
// the reports there.
func ParseTLSRPT(txt string) ([]*url.URL, error) {
	fields := strings.Split(txt, ";")
	if strings.TrimSpace(fields[0]) != "v=TLSRPTv1" {
		return nil, errors.New("tls-rpt record: does not start with v=TLSRPTv1")
	}
	var out []*url.URL
	seen := false
	for _, f := range fields[1:] {
		f = strings.Trim(f, " \t")
		if f == "" {
			continue
		}
		k, v, ok := strings.Cut(f, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("tls-rpt record: bad field %q", f)
		}
		if k != "rua" {
			continue // §3: extension fields are ignored
		}
		if seen {
			return nil, errors.New("tls-rpt record: rua repeated")
		}
		seen = true
		for _, s := range strings.Split(v, ",") {
			u, err := url.Parse(strings.TrimSpace(s))
			// §3: "mailto:" (RFC 6068) or "https:" only.
			if err != nil || (u.Scheme != "mailto" && u.Scheme != "https") ||
				(u.Scheme == "mailto" && !strings.Contains(u.Opaque, "@")) || (u.Scheme == "https" && u.Host == "") {
				return nil, fmt.Errorf("tls-rpt record: bad rua %q", s)
			}
			out = append(out, u)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("tls-rpt record: no rua")
	}
	return out, nil
}

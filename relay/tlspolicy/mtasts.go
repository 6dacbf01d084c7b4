package tlspolicy

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// STS modes (RFC 8461 §3.2).
const (
	ModeEnforce = "enforce"
	ModeTesting = "testing"
	ModeNone    = "none"
)

// maxMaxAge is the largest max_age a policy may carry (RFC 8461 §3.2:
// "up to 31557600").
const maxMaxAge = 31557600

// ParseSTSRecord parses the "_mta-sts" TXT record (RFC 8461 §3.1) and
// returns its id. Extension fields are allowed and ignored.
func ParseSTSRecord(txt string) (string, error) {
	fields := strings.Split(txt, ";")
	if strings.TrimSpace(fields[0]) != "v=STSv1" {
		return "", errors.New("mta-sts record: does not start with v=STSv1")
	}
	id := ""
	for _, f := range fields[1:] {
		f = strings.Trim(f, " \t")
		if f == "" {
			continue
		}
		k, v, ok := strings.Cut(f, "=")
		if !ok || k == "" {
			return "", fmt.Errorf("mta-sts record: bad field %q", f)
		}
		if k == "id" {
			if id != "" || !validID(v) {
				return "", fmt.Errorf("mta-sts record: bad or repeated id %q", v)
			}
			id = v
		}
	}
	if id == "" {
		return "", errors.New("mta-sts record: no id")
	}
	return id, nil
}

// validID: sts-id = 1*32(ALPHA / DIGIT) (RFC 8461 §3.1).
func validID(s string) bool {
	if len(s) < 1 || len(s) > 32 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// STSPolicy is a parsed MTA-STS policy (RFC 8461 §3.2).
type STSPolicy struct {
	Mode   string
	MX     []string // patterns, lower case: "mx.example.com" or "*.example.com"
	MaxAge int64    // seconds
}

// ParseSTSPolicy parses a policy body. Lines end in LF or CRLF; unknown
// keys are ignored; version, mode and max_age are required, and mx unless
// the mode is none (§3.2).
func ParseSTSPolicy(body string) (STSPolicy, error) {
	var p STSPolicy
	seen := map[string]bool{}
	for _, line := range strings.Split(body, "\n") {
		line = strings.TrimSuffix(line, "\r")
		if strings.TrimSpace(line) == "" {
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			return p, fmt.Errorf("mta-sts policy: line without colon: %q", line)
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if seen[k] && k != "mx" {
			continue // §3.2: "only the first ... field is used"
		}
		seen[k] = true
		switch k {
		case "version":
			if v != "STSv1" {
				return p, fmt.Errorf("mta-sts policy: version %q", v)
			}
		case "mode":
			if v != ModeEnforce && v != ModeTesting && v != ModeNone {
				return p, fmt.Errorf("mta-sts policy: mode %q", v)
			}
			p.Mode = v
		case "max_age":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 || len(v) > 10 {
				return p, fmt.Errorf("mta-sts policy: max_age %q", v)
			}
			p.MaxAge = min(n, maxMaxAge)
		case "mx":
			if !validPattern(v) {
				return p, fmt.Errorf("mta-sts policy: mx %q", v)
			}
			p.MX = append(p.MX, strings.ToLower(strings.TrimSuffix(v, ".")))
		}
	}
	switch {
	case !seen["version"]:
		return p, errors.New("mta-sts policy: no version")
	case p.Mode == "":
		return p, errors.New("mta-sts policy: no mode")
	case !seen["max_age"]:
		return p, errors.New("mta-sts policy: no max_age")
	case p.Mode != ModeNone && len(p.MX) == 0:
		return p, errors.New("mta-sts policy: no mx")
	}
	return p, nil
}

// validPattern: a host name, or "*." and a host name (§3.2).
func validPattern(p string) bool {
	p = strings.TrimPrefix(p, "*.")
	if p == "" || len(p) > 253 {
		return false
	}
	for _, l := range strings.Split(strings.TrimSuffix(p, "."), ".") {
		if l == "" || len(l) > 63 || strings.ContainsFunc(l, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_')
		}) {
			return false
		}
	}
	return true
}

// Allows reports whether host matches one of the policy's mx patterns. A
// wildcard matches exactly one leftmost label (RFC 8461 §4.1).
func (p STSPolicy) Allows(host string) bool {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	for _, pat := range p.MX {
		if rest, ok := strings.CutPrefix(pat, "*."); ok {
			if label, suffix, ok := strings.Cut(host, "."); ok && label != "" && suffix == rest {
				return true
			}
		} else if host == pat {
			return true
		}
	}
	return false
}

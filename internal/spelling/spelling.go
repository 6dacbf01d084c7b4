// Package spelling writes one domain name the ways mail and configuration
// files write it, for tests that hold every spelling of a domain to be the
// same domain wherever greyrelay compares domains.
package spelling

import (
	"strings"

	"golang.org/x/net/idna"
)

// Of returns spellings of the domain d (any spelling): its A-label form
// and its U-label form, each in lower, upper and title case, with and
// without the root's final dot (case variants only where they lower back
// to the same name). A name that does not convert keeps only
// its case and dot variants.
func Of(d string) []string {
	d = strings.ToLower(strings.TrimSuffix(d, "."))
	forms := []string{d}
	if a, err := idna.Registration.ToASCII(d); err == nil && a != d {
		forms = append(forms, a)
	}
	if u, err := idna.Registration.ToUnicode(d); err == nil && u != d {
		forms = append(forms, u)
	}
	var out []string
	for _, f := range forms {
		for _, c := range []string{f, strings.ToUpper(f), strings.ToTitle(f), mixed(f)} {
			// A case spelling is one only if it lowers back: upper-case
			// dotless ı is I, which lowers to another letter.
			if strings.ToLower(c) == f {
				out = append(out, c, c+".")
			}
		}
	}
	return out
}

// mixed upper-cases every other letter.
func mixed(s string) string {
	var b strings.Builder
	i := 0
	for _, r := range s {
		if i%2 == 1 {
			r = []rune(strings.ToUpper(string(r)))[0]
		}
		b.WriteRune(r)
		i++
	}
	return b.String()
}

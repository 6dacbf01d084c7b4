package config

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// days matches a number followed by the unit d. No unit of Go's duration
// syntax contains a d, so every such match is a count of days.
var days = regexp.MustCompile(`([0-9]+(?:\.[0-9]*)?|\.[0-9]+)d`)

// durationHint is what an operator needs after writing "5 minutes".
const durationHint = "write a number and a unit without spaces, e.g. 90s, 5m, 1h30m or 2d (units: ms, s, m, h, d)"

// ParseDuration reads a duration as the configuration writes it: Go's
// syntax (300ms, 5m30s, 1h) plus d for days of 24 hours (2d, 1d12h), which
// retention and lifetime settings are naturally given in. The error says how
// to write one, since "5 minutes" or a bare "300" are the usual mistakes.
func ParseDuration(s string) (time.Duration, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, fmt.Errorf("empty duration: %s", durationHint)
	}
	conv := days.ReplaceAllStringFunc(t, func(m string) string {
		n, err := strconv.ParseFloat(strings.TrimSuffix(m, "d"), 64)
		if err != nil {
			return m // left for time.ParseDuration to refuse
		}
		return strconv.FormatFloat(n*24, 'f', -1, 64) + "h"
	})
	d, err := time.ParseDuration(conv)
	if err != nil || strings.ContainsAny(t, " \t") {
		return 0, fmt.Errorf("%q is not a duration: %s", s, durationHint)
	}
	return d, nil
}

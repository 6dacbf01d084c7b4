package backoff

import "time"

// DefaultPolicy is the retry section of configs/default.yaml, for the
// tests; TestDefaultPolicyIsDefaultYAML keeps the two equal.
func DefaultPolicy() Policy {
	return Policy{
		Initial:        5 * time.Minute,
		Factor:         2,
		Max:            time.Hour,
		Jitter:         0.1,
		GreylistFirst:  30 * time.Second, // then 63 s, 2m12s, 4m38s, QuickEnd (5m), then doubling
		GreylistSecond: 33 * time.Second,
		HintMin:        time.Minute,
		HintMax:        4 * time.Hour,
		Lifetime:       120 * time.Hour, // RFC 5321 §4.5.4.1: "at least 4-5 days"
	}
}

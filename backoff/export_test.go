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
		GreylistFirst:  5*time.Minute + 30*time.Second, // postgrey --delay=300 plus margin
		GreylistSecond: 10 * time.Minute,
		HintMin:        time.Minute,
		HintMax:        4 * time.Hour,
		Lifetime:       120 * time.Hour, // RFC 5321 §4.5.4.1: "at least 4-5 days"
	}
}

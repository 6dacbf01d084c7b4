package classifier

import (
	"strings"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/internal/smtpvocab"
)

// hintCases are reply texts as greylisters and rate limiters send them,
// with the hint each carries (0: none).
var hintCases = []struct {
	name, text string
	want       time.Duration
}{
	{"milter-greylist", "Greylisting in action, please come back in 00:05:00", 5 * time.Minute},
	{"milter-greylist short", "Greylisting in action, please come back in 0:04:59", 4*time.Minute + 59*time.Second},
	{"milter-greylist words", "Greylisting in action, please come back in 4 minutes and 59 seconds", 4*time.Minute + 59*time.Second},
	{"postgrey custom text", "Greylisted for 300 seconds (see http://postgrey.schweikert.ch/help/dest.test.html)", 300 * time.Second},
	{"postgrey default", "Greylisted, see http://postgrey.schweikert.ch/help/dest.test.html", 0},
	{"sqlgrey", "Greylisted for 5 minutes (sqlgrey)", 5 * time.Minute},
	{"exim try again", "Deferred: greylisted, please try again in 5 minutes", 5 * time.Minute},
	{"exim seconds", "greylisted. please try again in 300 seconds", 300 * time.Second},
	{"retry in minutes", "Greylisted, retry in 5 minutes", 5 * time.Minute},
	{"retry after compact", "Temporarily rejected, retry after 4m59s", 4*time.Minute + 59*time.Second},
	{"comma joined", "try again in 1 hour, 30 minutes", 90 * time.Minute},
	{"upper case", "TRY AGAIN IN 30 SECONDS", 30 * time.Second},
	{"abbreviated", "Please wait 10 min.", 10 * time.Minute},
	{"hours", "try again in 2 hrs", 2 * time.Hour},
	{"within", "Rate limit exceeded, retry within 60s", time.Minute},
	{"rspamd", "Try again later", 0},
	{"gmail", "Try again later, closing connection. (TLS) d75a77b69052e-4c4", 0},
	{"microsoft", "Server busy. Please try again later from [192.0.2.1]. (S77714) [AM0PR.eurprd04.prod.outlook.com 2026-12-02T05:30:00.000Z 08DC]", 0},
	{"yahoo", "[TSS04] Messages from 192.0.2.1 temporarily deferred due to unexpected volume or user complaints - 4.16.55.1; see https://postmaster.yahooinc.com/error-codes", 0},
	{"counter not a hint", "sent 5 messages in 60 minutes", time.Hour},
	{"not a unit", "in 2 messages", 0},
	{"zero", "in 0 seconds", 0},
	{"no space after trigger", "in5 minutes", 0},
	{"trigger inside a word", "within5 seconds, login 5 minutes", 0},
	{"capped", "retry in 48 hours", MaxHint},
	{"capped clock", "retry in 99:99:99", MaxHint},
	{"huge number", "Greylisted for 9999999 hours", MaxHint},
	{"too many digits", "retry in 12345678 seconds", 0},
	{"kelvin sign before", "\u212a\u212a\u212a try again in 5 minutes", 5 * time.Minute},
	{"invalid utf-8 before", "\xff\xfe\xfd retry in 5 minutes", 5 * time.Minute},
	{"kelvin sign as unit", "retry in 5 \u212a", 0},
}

func TestHint(t *testing.T) {
	for _, tc := range hintCases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Hint(tc.text); got != tc.want {
				t.Errorf("Hint(%q) = %v, want %v", tc.text, got, tc.want)
			}
		})
	}
}

// TestHintReachesVerdict checks that a deferral's verdict carries the hint
// and a failure's does not.
func TestHintReachesVerdict(t *testing.T) {
	c := newClassifier(t)
	v := c.Classify(smtpvocab.StageRCPT, &smtpvocab.Reply{Code: 451, Enhanced: "4.7.1", Text: "Greylisting in action, please come back in 00:05:00"})
	if v.Reason != Greylisted || v.Hint != 5*time.Minute {
		t.Errorf("milter-greylist reply: reason %v hint %v, want greylisted 5m", v.Reason, v.Hint)
	}
}

func FuzzHint(f *testing.F) {
	for _, tc := range hintCases {
		f.Add(tc.text)
	}
	f.Add("\u212a in 5 m")
	f.Add("in 1:00:0\xff")
	f.Fuzz(func(t *testing.T, text string) {
		h := Hint(text)
		if h < 0 || h > MaxHint || h%time.Second != 0 {
			t.Fatalf("Hint(%q) = %v", text, h)
		}
		// A hint needs a trigger word and a digit.
		if h > 0 && !strings.ContainsAny(text, "0123456789") {
			t.Fatalf("Hint(%q) = %v without a number", text, h)
		}
	})
}

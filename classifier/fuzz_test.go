package classifier

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/emersion/go-smtp"
)

func FuzzParseReply(f *testing.F) {
	for _, tc := range replyCases {
		f.Add(tc.reply)
	}
	f.Add("451-4.7.1 a\r\n451 4.7.1 b\r\n")
	f.Add("\x00\r\n\xff")
	f.Fuzz(func(t *testing.T, line string) {
		r, err := ParseReply(line)
		// The text is kept as sent, but lines were split at their CRLF.
		if strings.Contains(r.Text, "\r\n") || strings.ContainsAny(r.Error(), "\r\n\x00") {
			t.Fatalf("unsanitized reply %+v", r)
		}
		if err == nil && (r.Code < 200 || r.Code > 599) {
			t.Fatalf("code %d", r.Code)
		}
		if err != nil && r.Code != 0 {
			t.Fatalf("error with code %d", r.Code)
		}
		if r.Enhanced != "" && !validEnhanced(r.Enhanced) {
			t.Fatalf("bad enhanced %q", r.Enhanced)
		}
	})
}

func FuzzClassify(f *testing.F) {
	for _, tc := range replyCases {
		f.Add(uint8(tc.stage), 0, "", tc.reply)
	}
	f.Add(uint8(StageRCPT), 552, "5.2.2", "mailbox full, try again in 5 minutes")
	f.Add(uint8(200), -1, "4.7.1.1", "\r\n\x00")
	c := newClassifier(f)
	f.Fuzz(func(t *testing.T, stage uint8, code int, enhanced, text string) {
		var errs []error
		if r, err := ParseReply(text); err == nil {
			errs = append(errs, &r)
		}
		e, _ := parseEnhanced(enhanced)
		errs = append(errs, &Reply{Code: code, Enhanced: enhanced, Text: text},
			&smtp.SMTPError{Code: code, EnhancedCode: smtp.EnhancedCode(e), Message: text},
			&TLSError{Err: &Reply{Code: code, Text: text}}, errors.New(text))
		for _, err := range errs {
			check(t, c.Classify(Stage(stage%12), err), code)
		}
	})
}

func check(t *testing.T, v Verdict, code int) {
	t.Helper()
	if strings.ContainsAny(v.Text, "\r\n\x00") || len(v.Text) > maxText || !utf8.ValidString(v.Text) {
		t.Fatalf("unsanitized text %q", v.Text)
	}
	if v.Outcome == Failed && (v.Code < 500 || v.Code > 599 || (v.Code == 552 && v.Stage == StageRCPT)) {
		t.Fatalf("failed verdict without a permanent code: %+v", v)
	}
	if v.Code >= 400 && v.Code <= 499 && v.Outcome != Deferred {
		t.Fatalf("4xx not deferred: %+v", v)
	}
	if v.Hint < 0 || v.Hint > maxHint || (v.Hint != 0 && v.Outcome != Deferred) {
		t.Fatalf("bad hint: %+v", v)
	}
	if v.Enhanced != "" && normEnhanced(v.Enhanced) != v.Enhanced {
		t.Fatalf("enhanced not canonical: %+v", v)
	}
	if !validEnhanced(v.Status()) || v.Status()[0] != "45"[v.Outcome] {
		t.Fatalf("bad status %q for %+v", v.Status(), v)
	}
	_ = Explain(v.Reason, v.Status()).String()
}

func validEnhanced(s string) bool { _, ok := parseEnhanced(s); return ok }

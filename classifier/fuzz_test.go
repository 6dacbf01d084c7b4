package classifier

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/emersion/go-smtp"

	"github.com/greyrelay/greyrelay/internal/smtpvocab"
)

func FuzzClassify(f *testing.F) {
	for _, tc := range replyCases {
		f.Add(uint8(tc.stage), 0, "", tc.reply)
	}
	f.Add(uint8(smtpvocab.StageRCPT), 552, "5.2.2", "mailbox full, try again in 5 minutes")
	f.Add(uint8(200), -1, "4.7.1.1", "\r\n\x00")
	c := newClassifier(f)
	f.Fuzz(func(t *testing.T, stage uint8, code int, enhanced, text string) {
		var errs []error
		if r, err := parseReply(text); err == nil {
			errs = append(errs, &r)
		}
		e, _ := smtpvocab.ParseEnhanced(enhanced)
		errs = append(errs, &smtpvocab.Reply{Code: code, Enhanced: enhanced, Text: text},
			&smtp.SMTPError{Code: code, EnhancedCode: smtp.EnhancedCode(e), Message: text},
			&smtpvocab.TLSError{Err: &smtpvocab.Reply{Code: code, Text: text}}, errors.New(text))
		for _, err := range errs {
			check(t, c.Classify(smtpvocab.Stage(stage%12), err), code)
		}
	})
}

func check(t *testing.T, v Verdict, code int) {
	t.Helper()
	if strings.ContainsAny(v.Text, "\r\n\x00") || len(v.Text) > maxText || !utf8.ValidString(v.Text) {
		t.Fatalf("unsanitized text %q", v.Text)
	}
	if v.Outcome == Failed && (v.Code < 500 || v.Code > 599 || (v.Code == 552 && v.Stage == smtpvocab.StageRCPT)) {
		t.Fatalf("failed verdict without a permanent code: %+v", v)
	}
	if v.Code >= 400 && v.Code <= 499 && v.Outcome != Deferred {
		t.Fatalf("4xx not deferred: %+v", v)
	}
	if v.Hint < 0 || v.Hint > maxHint || (v.Hint != 0 && v.Outcome != Deferred) {
		t.Fatalf("bad hint: %+v", v)
	}
	if v.Enhanced != "" && smtpvocab.NormEnhanced(v.Enhanced) != v.Enhanced {
		t.Fatalf("enhanced not canonical: %+v", v)
	}
	if !validEnhanced(v.Status()) || v.Status()[0] != "45"[v.Outcome] {
		t.Fatalf("bad status %q for %+v", v.Status(), v)
	}
	_ = Explain(v.Reason, v.Status()).String()
}

func validEnhanced(s string) bool { _, ok := smtpvocab.ParseEnhanced(s); return ok }

package smtpd

import (
	"net/netip"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/greyrelay/greyrelay/internal/safetext"
)

func TestMessageNames(t *testing.T) {
	for _, tc := range []struct{ in, tag, id string }{
		{"Received: x\r\nX-Greyrelay-Tag: welcome\r\nMessage-ID: <a@b>\r\n\r\nbody", "welcome", "<a@b>"},
		{"message-id:\r\n <folded@b>\r\nx-greyrelay-tag : t\r\n\r\n", "t", "<folded@b>"},
		{"Message-ID: <first@b>\r\nMessage-ID: <second@b>\r\n\r\n", "", "<first@b>"},
		{"Subject: x\r\n\r\nMessage-ID: <in-body@b>\r\n", "", ""},
		{"X-Greyrelay-Tag: a\x01b\r\n\r\n", "a b", ""},
		{"X-Greyrelay-Tag: " + strings.Repeat("x", 300) + "\r\n\r\n", strings.Repeat("x", maxNameField), ""},
		{"", "", ""},
	} {
		tag, id := messageNames([]byte(tc.in))
		if tag != tc.tag || id != tc.id {
			t.Errorf("messageNames(%q) = %q, %q; want %q, %q", tc.in, tag, id, tc.tag, tc.id)
		}
	}
}

func FuzzMessageNames(f *testing.F) {
	f.Add([]byte("X-Greyrelay-Tag: t\r\n\tmore\r\nMessage-ID: <a@b>\r\n\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		tag, id := messageNames(b)
		for _, s := range []string{tag, id} {
			if len(s) > maxNameField || !utf8.ValidString(s) || strings.ContainsFunc(s, safetext.IsControl) {
				t.Fatalf("unclean name %q", s)
			}
		}
	})
}

// TestSubmitKeepsNames: the queue gets the message's tag and Message-ID.
func TestSubmitKeepsNames(t *testing.T) {
	e := startServer(t, testConfig(t))
	_, err := e.srv.Submit(Submission{Client: netip.MustParseAddrPort("127.0.0.1:1"), User: "app", From: "a@shop.example",
		To: []string{"b@dest.example"}, Body: strings.NewReader("X-Greyrelay-Tag: invoice\r\nMessage-ID: <i1@shop.example>\r\n\r\nx\r\n")})
	if err != nil {
		t.Fatal(err)
	}
	if m := e.q.messages()[0]; m.Tag != "invoice" || m.MessageID != "<i1@shop.example>" {
		t.Errorf("queued tag %q, Message-ID %q", m.Tag, m.MessageID)
	}
}

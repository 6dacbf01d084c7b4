package events

import (
	"bytes"
	"strings"
	"testing"
)

func TestScanHeaderAndStripTag(t *testing.T) {
	tests := []struct {
		name, msg  string
		msgID, tag string
		stripped   string
	}{
		{"none", "Subject: x\r\n\r\nbody\r\n", "", "", "Subject: x\r\n\r\nbody\r\n"},
		{"both", "Message-ID: <a@b>\r\nX-Greyrelay-Tag: order-42\r\nSubject: x\r\n\r\nbody\r\n",
			"<a@b>", "order-42", "Message-ID: <a@b>\r\nSubject: x\r\n\r\nbody\r\n"},
		{"case and folding", "x-greyrelay-tag: a\r\n  b\r\nmessage-id:\r\n <c@d>\r\n\r\n",
			"<c@d>", "a  b", "message-id:\r\n <c@d>\r\n\r\n"},
		{"first of several; all stripped", "X-Greyrelay-Tag: one\r\nTo: a@b\r\nX-Greyrelay-Tag: two\r\n\r\nX-Greyrelay-Tag: body\r\n",
			"", "one", "To: a@b\r\n\r\nX-Greyrelay-Tag: body\r\n"},
		{"only in the body", "Subject: x\r\n\r\nX-Greyrelay-Tag: body\r\n", "", "", "Subject: x\r\n\r\nX-Greyrelay-Tag: body\r\n"},
		{"LF only", "X-Greyrelay-Tag: t\nSubject: x\n\nb\n", "", "t", "Subject: x\n\nb\n"},
		{"no header section", "not a header\r\nX-Greyrelay-Tag: t\r\n", "", "", "not a header\r\nX-Greyrelay-Tag: t\r\n"},
		{"truncated head", "Subject: x\r\nX-Greyrelay-Tag: cut", "", "cut", "Subject: x\r\n"},
		{"empty", "", "", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, tag := scanHeader([]byte(tt.msg))
			if id != tt.msgID || tag != tt.tag {
				t.Errorf("scanHeader = %q, %q; want %q, %q", id, tag, tt.msgID, tt.tag)
			}
			if got := string(stripTag([]byte(tt.msg))); got != tt.stripped {
				t.Errorf("stripTag = %q, want %q", got, tt.stripped)
			}
		})
	}
}

// A message without the tag is sent as it is, not copied.
func TestStripTagNoCopy(t *testing.T) {
	msg := []byte("Subject: x\r\n\r\nbody\r\n")
	if got := stripTag(msg); &got[0] != &msg[0] {
		t.Error("stripTag copied a message without the tag")
	}
	if got := (&Events{}).Wire(msg); !bytes.Equal(got, msg) {
		t.Error("Wire changed a message while keeping tags")
	}
}

// FuzzHeader: scanning and stripping never panic, values stay bounded,
// stripping only removes bytes, removes every tag field of the header
// section, and leaves the body alone.
func FuzzHeader(f *testing.F) {
	f.Add([]byte("Message-ID: <a@b>\r\nX-Greyrelay-Tag: t\r\n folded\r\n\r\nbody"))
	f.Add([]byte("X-Greyrelay-Tag:\n\nX-Greyrelay-Tag: b"))
	f.Add([]byte(":\r\n"))
	f.Fuzz(func(t *testing.T, msg []byte) {
		id, tag := scanHeader(msg)
		if len(id) > maxValue || len(tag) > maxValue {
			t.Fatalf("value longer than %d", maxValue)
		}
		out := stripTag(msg)
		if len(out) > len(msg) {
			t.Fatal("stripping grew the message")
		}
		if _, tag := scanHeader(out); tag != "" {
			// The first field after a removed one may only be a tag if
			// the removal joined lines; it never does.
			t.Fatalf("tag %q left after stripping %q", tag, msg)
		}
		for _, f := range fields(out) {
			if strings.EqualFold(f.name, TagHeader) {
				t.Fatalf("tag field left in %q", out)
			}
		}
	})
}

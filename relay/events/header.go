package events

import (
	"bytes"
	"strings"
)

// TagHeader is the header field an application sets to tag its message.
const TagHeader = "X-Greyrelay-Tag"

// maxValue bounds a Message-ID or tag copied into an event.
const maxValue = 998 // RFC 5322 §2.1.1: the longest line

// field is one header field of the header section: its name and the byte
// range of the whole field, continuation lines included.
type field struct {
	name       string
	start, end int
}

// fields lists the header fields of msg (RFC 5322 §2.2), up to the empty
// line that ends the header section or the end of msg. A line that is not
// a field (no colon) ends the section too, as a body would.
func fields(msg []byte) []field {
	var out []field
	for i := 0; i < len(msg); {
		line := lineAt(msg, i)
		if len(bytes.TrimRight(msg[i:i+line], "\r\n")) == 0 {
			return out
		}
		name, _, ok := bytes.Cut(msg[i:i+line], []byte(":"))
		if !ok || len(name) == 0 || bytes.ContainsAny(name, " \t\r\n") {
			return out
		}
		f := field{name: string(name), start: i}
		i += line
		for i < len(msg) && (msg[i] == ' ' || msg[i] == '\t') { // RFC 5322 §2.2.3 folding
			i += lineAt(msg, i)
		}
		f.end = i
		out = append(out, f)
	}
	return out
}

// lineAt is the length of the line starting at i, its LF included.
func lineAt(msg []byte, i int) int {
	if n := bytes.IndexByte(msg[i:], '\n'); n >= 0 {
		return n + 1
	}
	return len(msg) - i
}

// value is f's unfolded body, trimmed.
func (f field) value(msg []byte) string {
	_, v, _ := bytes.Cut(msg[f.start:f.end], []byte(":"))
	v = bytes.ReplaceAll(v, []byte("\r\n"), nil)
	v = bytes.ReplaceAll(v, []byte("\n"), nil)
	s := strings.TrimSpace(string(v))
	if len(s) > maxValue {
		s = s[:maxValue]
	}
	return s
}

// scanHeader returns the Message-ID and the X-Greyrelay-Tag of a message
// from the start of its body (the first of each, "" if absent).
func scanHeader(head []byte) (msgID, tag string) {
	for _, f := range fields(head) {
		switch {
		case msgID == "" && strings.EqualFold(f.name, "Message-ID"):
			msgID = f.value(head)
		case tag == "" && strings.EqualFold(f.name, TagHeader):
			tag = f.value(head)
		}
	}
	return msgID, tag
}

// stripTag returns msg without its X-Greyrelay-Tag header fields; msg
// itself (not a copy) when it has none.
func stripTag(msg []byte) []byte {
	var tags []field
	for _, f := range fields(msg) {
		if strings.EqualFold(f.name, TagHeader) {
			tags = append(tags, f)
		}
	}
	if len(tags) == 0 {
		return msg
	}
	out := make([]byte, 0, len(msg))
	at := 0
	for _, f := range tags {
		out = append(out, msg[at:f.start]...)
		at = f.end
	}
	return append(out, msg[at:]...)
}

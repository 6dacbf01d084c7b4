package smtpd

import (
	"bytes"
	"errors"
	"io"
	"strings"

	"github.com/greyrelay/greyrelay/internal/safetext"
	"github.com/greyrelay/greyrelay/queue"
)

// The application's own names for a message, X-Greyrelay-Tag and
// Message-ID (RFC 5322 §3.6.4), are read from its header section at intake
// and kept with the message, so the queue finds it by them while queued
// and after (history). They are only names to look for: nothing here
// refuses a message.

// tagField is the header field an application tags its mail with.
const tagField = "X-Greyrelay-Tag"

// maxNameField bounds a kept tag or Message-ID.
const maxNameField = 250

// maxNamesHead is how much of a spooled body is read to find them.
const maxNamesHead = 64 << 10

// messageNames finds the first X-Greyrelay-Tag and Message-ID fields of
// msg's header section, unfolded, with control characters replaced and
// cut to maxNameField octets.
func messageNames(msg []byte) (tag, messageID string) {
	var cur *string
	var tagSet, idSet bool
	for len(msg) > 0 {
		line := msg
		if i := bytes.Index(msg, []byte("\r\n")); i >= 0 {
			line, msg = msg[:i], msg[i+2:]
		} else {
			msg = nil
		}
		if len(line) == 0 {
			break // the end of the header section
		}
		if line[0] == ' ' || line[0] == '\t' {
			if cur != nil { // RFC 5322 §2.2.3: unfolding
				*cur += string(line)
			}
			continue
		}
		cur = nil
		name, value, ok := bytes.Cut(line, []byte(":"))
		name = bytes.TrimRight(name, " \t")
		switch {
		case !ok:
		case !tagSet && bytes.EqualFold(name, []byte(tagField)):
			tag, tagSet, cur = string(value), true, &tag
		case !idSet && bytes.EqualFold(name, []byte("Message-ID")):
			messageID, idSet, cur = string(value), true, &messageID
		}
	}
	return cleanName(tag), cleanName(messageID)
}

func cleanName(s string) string {
	return strings.TrimSpace(safetext.Cut(safetext.Replace(strings.TrimSpace(s), ' '), maxNameField))
}

// headOf returns the start of rb's message, which holds its header
// section (after our Received header).
func headOf(rb readResult) ([]byte, error) {
	if rb.file == nil {
		return rb.body, nil
	}
	b := make([]byte, min(rb.file.Len(), maxNamesHead))
	n, err := rb.file.ReadAt(b, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return b[:n], nil
}

// withNames sets m's Tag and MessageID from its header section; a spool
// file that cannot be read leaves them empty (the commit will report the
// file's trouble).
func withNames(m *queue.NewMessage, rb readResult) {
	if head, err := headOf(rb); err == nil {
		m.Tag, m.MessageID = messageNames(head)
	}
}

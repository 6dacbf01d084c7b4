package smtpvocab

import (
	"bufio"
	"errors"
	"io"
	"net/textproto"
	"strings"
)

// Limits on what we read from a peer, which may be hostile. RFC 5321 §4.5.3.1.5
// allows 512 octets per reply line; real servers exceed that in EHLO and
// error texts, so we are generous, but never unbounded: textproto.Reader's
// ReadLine would buffer an endless line, which is why replies are read here.
const (
	maxLine  = 4096     // octets per line, without CRLF
	maxLines = 100      // lines per reply
	maxBytes = 64 << 10 // octets per reply
)

// Read reads one possibly multi-line reply (RFC 5321 §4.2.1) under the
// limits above and parses it with Parser; it also returns
// the text of each line (after "ddd-"), which EHLO parsing needs. Malformed
// replies are textproto.ProtocolError; the classifier treats them as
// temporary.
func Read(br *bufio.Reader) (*Reply, []string, error) {
	var p Parser
	total := 0
	for {
		line, err := readLine(br)
		if err != nil {
			return nil, nil, err
		}
		total += len(line) + 2
		if total > maxBytes || len(p.Lines()) >= maxLines {
			return nil, nil, textproto.ProtocolError("reply longer than allowed")
		}
		r, err := p.Add(line)
		if err != nil {
			return nil, nil, err
		}
		if r != nil {
			return r, p.Lines(), nil
		}
	}
}

// readLine reads one line ending in LF (CRLF expected, bare LF tolerated)
// of at most maxLine octets.
func readLine(br *bufio.Reader) (string, error) {
	var buf []byte
	for {
		frag, err := br.ReadSlice('\n')
		if len(buf)+len(frag) > maxLine+2 {
			return "", textproto.ProtocolError("reply line too long")
		}
		buf = append(buf, frag...)
		switch {
		case err == nil:
			s := strings.TrimSuffix(string(buf), "\n")
			return strings.TrimSuffix(s, "\r"), nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(buf) > 0:
			return "", io.ErrUnexpectedEOF
		default:
			return "", err
		}
	}
}

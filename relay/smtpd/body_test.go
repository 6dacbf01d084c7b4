package smtpd

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/emersion/go-smtp"
)

// refDataReader is go-smtp v0.26's dataReader (data.go), which bodyReader
// must match octet for octet: it reads one octet at a time from go-smtp's
// bufio.Reader.
type refDataReader struct {
	r       *bufio.Reader
	state   int
	limited bool
	n       int64
}

func (r *refDataReader) Read(b []byte) (n int, err error) {
	if r.limited {
		if r.n <= 0 {
			return 0, smtp.ErrDataTooLarge
		}
		if int64(len(b)) > r.n {
			b = b[0:r.n]
		}
	}
	for n < len(b) && r.state != stateEOF {
		var c byte
		c, err = r.r.ReadByte()
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			break
		}
		switch r.state {
		case stateBeginLine:
			if c == '.' {
				r.state = stateDot
				continue
			}
			if c == '\r' {
				r.state = stateCR
				break
			}
			r.state = stateData
		case stateDot:
			if c == '\r' {
				r.state = stateDotCR
				continue
			}
			r.state = stateData
		case stateDotCR:
			if c == '\n' {
				r.state = stateEOF
				continue
			}
			r.state = stateData
		case stateCR:
			if c == '\n' {
				r.state = stateBeginLine
				break
			}
			r.state = stateData
		case stateData:
			if c == '\r' {
				r.state = stateCR
			}
		}
		b[n] = c
		n++
	}
	if err == nil && r.state == stateEOF {
		err = io.EOF
	}
	if r.limited {
		r.n -= int64(n)
	}
	return
}

// chunky hands out its data in reads of the sizes in steps (cycled), as
// the network would.
type chunky struct {
	data  []byte
	steps []byte
	i     int
}

func (c *chunky) Read(b []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	k := len(c.data)
	if len(c.steps) > 0 {
		k = int(c.steps[c.i%len(c.steps)]) + 1
		c.i++
	}
	k = min(k, len(b), len(c.data))
	copy(b, c.data[:k])
	c.data = c.data[k:]
	return k, nil
}

// readAllBody reads r as Data does, with reads of size bufSize, and
// returns what it read and the error it stopped at.
func readAllBody(r io.Reader, bufSize int) ([]byte, error) {
	var out []byte
	buf := make([]byte, bufSize)
	for {
		k, err := r.Read(buf)
		out = append(out, buf[:k]...)
		if err != nil {
			return out, err
		}
	}
}

// bodyConn is a plaintext connection that just read "DATA\r\n" from src,
// as Data sees it.
func bodyConn(src io.Reader) *conn {
	c := &conn{in: bufio.NewReaderSize(src, readBuffer), reads: 1, inData: true}
	c.lines.scan([]byte("DATA\r\n"))
	c.lines.beginBody()
	return c
}

// FuzzBodyReader checks bodyReader against go-smtp's own reader: the same
// body, the same error, the same limit, and the same octets left for the
// next command, whatever the chunking of the input, the size of Data's
// reads and the size limit; after a refusal (the limit), both consume the
// rest of the body as go-smtp does before its reply.
func FuzzBodyReader(f *testing.F) {
	seeds := []string{
		"Subject: x\r\n\r\nbody\r\n.\r\nQUIT\r\n",
		".\r\nMAIL FROM:<a@b>\r\n",
		"..dot\r\n...\r\n.\r\n",
		"body\r\r\n.\r\nMAIL FROM:<s@x>\r\n.\r\nRSET\r\n",
		"a\r\n.\rX\r\n.x\r\n.\r\n",
		"bare\nlf\n.\nstill body\r\n.\r\nNOOP\r\n",
		"no end at all\r\n",
		"\r\n.\r",
		"x\r\n..\r\n.\r\n",
		string(bytes.Repeat([]byte("0123456789abcdef\r\n"), 600)) + ".\r\nQUIT\r\n",
	}
	for _, s := range seeds {
		f.Add([]byte(s), []byte{3, 200, 0, 17}, uint16(4096), uint16(0))
		f.Add([]byte(s), []byte{}, uint16(1), uint16(7))
		f.Add([]byte(s), []byte{0}, uint16(100), uint16(5000))
	}
	f.Fuzz(func(t *testing.T, data, steps []byte, readSize, limit uint16) {
		if readSize == 0 {
			readSize = 1
		}
		ref := &refDataReader{r: bufio.NewReader(&chunky{data: data, steps: steps}), limited: limit > 0, n: int64(limit)}
		c := bodyConn(&chunky{data: data, steps: steps})
		got := c.fastBody(int64(limit))
		if got == nil {
			t.Fatal("fastBody refused a plaintext DATA with nothing pending")
		}
		wantBody, wantErr := readAllBody(ref, int(readSize))
		gotBody, gotErr := readAllBody(got, int(readSize))
		if !bytes.Equal(gotBody, wantBody) {
			t.Fatalf("body %q, go-smtp reads %q", gotBody, wantBody)
		}
		if !errors.Is(gotErr, wantErr) {
			t.Fatalf("error %v, go-smtp's %v", gotErr, wantErr)
		}
		// What go-smtp does after Data returns: read the rest of the body
		// without the limit, then the next command.
		c.inData = false // endData
		ref.limited = false
		_, wantDrain := io.Copy(io.Discard, ref)
		wantRest, _ := io.ReadAll(ref.r)
		var drain [512]byte
		_, gotDrain := c.Read(drain[:]) // the rest of the body, then the end of data
		if (gotDrain == nil) != (wantDrain == nil) {
			t.Fatalf("draining: %v, go-smtp's %v", gotDrain, wantDrain)
		}
		if wantDrain != nil {
			return // the client went away inside the body: nothing follows
		}
		gotRest, restErr := io.ReadAll(c)
		if errors.Is(restErr, smtp.ErrTooLongLine) {
			// The framer cut a command line over the limit after the body,
			// as go-smtp's own command reader would (500): what came before
			// the cut must still be what go-smtp leaves.
			if !bytes.HasPrefix(wantRest, gotRest) || len(wantRest)-len(gotRest) == 0 {
				t.Fatalf("after the body %q (cut: %v), go-smtp leaves %q", gotRest, restErr, wantRest)
			}
			return
		}
		if !bytes.Equal(gotRest, wantRest) {
			t.Fatalf("after the body %q, go-smtp leaves %q", gotRest, wantRest)
		}
	})
}

// TestFastBodyOnlyWhenGoSMTPHoldsNothing: the body is read past go-smtp's
// buffer only when that buffer is empty: every line handed to go-smtp was
// read by it as a command, the last one DATA, in plaintext.
func TestFastBodyOnlyWhenGoSMTPHoldsNothing(t *testing.T) {
	tests := []struct {
		name   string
		handed string // what the connection handed go-smtp
		reads  int    // command lines go-smtp read
		tls    bool
		want   bool
	}{
		{"pipelined envelope", "MAIL FROM:<a@b>\r\nRCPT TO:<c@d>\r\nDATA\r\n", 3, false, true},
		{"lower case", "data\r\n", 1, false, true},
		{"body sent before the 354", "DATA\r\nSubject: early\r\n", 1, false, false},
		{"part of the body sent early", "DATA\r\nSubj", 1, false, false},
		{"lines go-smtp has not read", "MAIL FROM:<a@b>\r\nDATA\r\n", 1, false, false},
		{"last line not DATA", "DATA\r\nNOOP\r\n", 2, false, false},
		{"a BDAT chunk pending", "BDAT 10\r\nDATA\r\n", 2, false, false},
		{"TLS", "DATA\r\n", 1, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &conn{in: bufio.NewReader(bytes.NewReader(nil)), reads: tt.reads}
			c.lines.tls = tt.tls
			c.lines.scan([]byte(tt.handed))
			c.lines.beginBody()
			if got := c.fastBody(0) != nil; got != tt.want {
				t.Fatalf("fastBody: %v, want %v", got, tt.want)
			}
		})
	}
}

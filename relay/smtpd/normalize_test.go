package smtpd

import (
	"bytes"
	"testing"
)

// refNormalizer is the body policy of data.go written the obvious way,
// one byte at a time: the specification the run-based normalizer is held
// to.
type refNormalizer struct {
	out       []byte
	max       int64
	rejectCR  bool
	pendingCR bool
	eightBit  bool
	fault     string
}

func (n *refNormalizer) write(p []byte) {
	for _, c := range p {
		if n.pendingCR {
			n.pendingCR = false
			if c == '\n' {
				n.emit('\r', '\n')
				continue
			}
			n.strayCR()
		}
		switch c {
		case '\r':
			n.pendingCR = true
		case '\n':
			n.emit('\r', '\n')
		case 0:
			n.setFault(faultNUL)
		default:
			n.eightBit = n.eightBit || c >= 0x80
			n.emit(c)
		}
	}
}

func (n *refNormalizer) strayCR() {
	if n.rejectCR {
		n.setFault(faultBareCR)
		return
	}
	n.emit(' ')
}

func (n *refNormalizer) emit(b ...byte) {
	if n.fault != "" {
		return
	}
	n.out = append(n.out, b...)
	if int64(len(n.out)) > n.max {
		n.setFault(faultSize)
	}
}

func (n *refNormalizer) setFault(f string) {
	if n.fault == "" {
		n.fault = f
		n.out = nil
	}
}

func (n *refNormalizer) finish() {
	if n.pendingCR {
		n.pendingCR = false
		n.strayCR()
	}
	if len(n.out) > 0 && n.out[len(n.out)-1] != '\n' {
		n.emit('\r', '\n')
	}
}

// normalizeBoth runs data through both normalizers, cut into pieces of
// the given sizes (cycled; 0 is skipped), and reports any difference in
// what Data would use: the body, the fault, and the 8-bit flag.
func normalizeBoth(t *testing.T, data []byte, cuts []byte, rejectCR bool, max int64) {
	t.Helper()
	hdr := []byte("Received: x\r\n")
	fast := normalizer{out: append([]byte(nil), hdr...), base: len(hdr), max: max, rejectCR: rejectCR}
	ref := refNormalizer{max: max, rejectCR: rejectCR}
	rest := data
	for i := 0; len(rest) > 0; i++ {
		k := len(rest)
		if len(cuts) > 0 {
			k = min(k, int(cuts[i%len(cuts)]))
		}
		fast.write(rest[:k])
		ref.write(rest[:k])
		rest = rest[k:]
		if k == 0 {
			fast.write(nil) // an empty read
			ref.write(nil)
			cuts = cuts[:0]
		}
	}
	fast.finish()
	ref.finish()
	if fast.fault != ref.fault {
		t.Fatalf("%q (cuts %v, reject %v, max %d): fault %q, want %q", data, cuts, rejectCR, max, fast.fault, ref.fault)
	}
	if !bytes.HasPrefix(fast.out, hdr) || !bytes.Equal(fast.out[len(hdr):], ref.out) {
		t.Fatalf("%q (cuts %v, reject %v, max %d): body %q, want %q", data, cuts, rejectCR, max, fast.out[len(hdr):], ref.out)
	}
	if fast.fault == "" && fast.eightBit != ref.eightBit {
		t.Fatalf("%q: eightBit %v, want %v", data, fast.eightBit, ref.eightBit)
	}
}

func TestNormalizer_MatchesReference(t *testing.T) {
	inputs := []string{"", "a", "\r", "\n", "\x00", "\r\n", "\n\r", "\r\r\n", "\r\n\r", "a\rb\r\n",
		"a\nb", "a\r\r\r\nb\r", "\xff\r\n", "abc\x00\r\n\xff", "é\r\ná\n", "\r.\r\n", "\n.\n",
		"12345678\x8012345678\r\n", "line one\r\nline two\nline\rthree\r"}
	for _, smug := range smuggling {
		inputs = append(inputs, "Subject: t\r\n\r\nbody"+smug.seq+"MAIL FROM:<s@x>\r\n")
	}
	for _, in := range inputs {
		for _, reject := range []bool{false, true} {
			for _, max := range []int64{0, 1, 2, 3, 5, 8, 1000} {
				for _, cuts := range [][]byte{nil, {1}, {2}, {3}, {1, 4}, {7}} {
					normalizeBoth(t, []byte(in), cuts, reject, max)
				}
			}
		}
	}
}

// FuzzNormalizer holds the run-based normalizer to the byte-by-byte
// reference on any input cut into any pieces.
func FuzzNormalizer(f *testing.F) {
	for _, smug := range smuggling {
		f.Add([]byte("a"+smug.seq+"b\r\n"), []byte{1, 3}, false, int64(100))
		f.Add([]byte("a"+smug.seq+"b\r\n"), []byte{2}, true, int64(6))
	}
	f.Add([]byte("\xffx\r\r\n\x00"), []byte{}, false, int64(1<<20))
	f.Fuzz(func(t *testing.T, data, cuts []byte, rejectCR bool, max int64) {
		normalizeBoth(t, data, cuts, rejectCR, max)
	})
}

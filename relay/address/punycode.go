package address

import "strings"

// Punycode decoding (RFC 3492 §6.2), only to check that an "xn--" label is
// a real A-label. Bootstring parameters from RFC 3492 §5.
const (
	pcBase        = 36
	pcTMin        = 1
	pcTMax        = 26
	pcSkew        = 38
	pcDamp        = 700
	pcInitialBias = 72
	pcInitialN    = 128
	pcMaxInt      = 1<<31 - 1 // RFC 3492 §6.4: overflow is checked against 32 bits
)

func pcAdapt(delta, numPoints int, first bool) int {
	if first {
		delta /= pcDamp
	} else {
		delta /= 2
	}
	delta += delta / numPoints
	k := 0
	for delta > ((pcBase-pcTMin)*pcTMax)/2 {
		delta /= pcBase - pcTMin
		k += pcBase
	}
	return k + (pcBase-pcTMin+1)*delta/(delta+pcSkew)
}

func pcDigit(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c-'0') + 26
	case c >= 'a' && c <= 'z':
		return int(c - 'a')
	case c >= 'A' && c <= 'Z':
		return int(c - 'A')
	}
	return -1
}

// punyDecode decodes the part of an A-label after "xn--". It reports false
// for anything that is not valid Punycode.
func punyDecode(s string) (string, bool) {
	var out []rune
	start := 0
	if b := strings.LastIndexByte(s, '-'); b > 0 {
		for i := 0; i < b; i++ {
			if s[i] >= 0x80 {
				return "", false
			}
			out = append(out, rune(s[i]))
		}
		start = b + 1
	}
	n, i, bias := pcInitialN, 0, pcInitialBias
	for pos := start; pos < len(s); {
		oldi, w := i, 1
		for k := pcBase; ; k += pcBase {
			if pos >= len(s) {
				return "", false
			}
			d := pcDigit(s[pos])
			pos++
			if d < 0 || d > (pcMaxInt-i)/w {
				return "", false
			}
			i += d * w
			t := min(max(k-bias, pcTMin), pcTMax)
			if d < t {
				break
			}
			if w > pcMaxInt/(pcBase-t) {
				return "", false
			}
			w *= pcBase - t
		}
		count := len(out) + 1
		bias = pcAdapt(i-oldi, count, oldi == 0)
		if i/count > pcMaxInt-n {
			return "", false
		}
		n += i / count
		i %= count
		if n > 0x10FFFF || n >= 0xD800 && n <= 0xDFFF {
			return "", false
		}
		out = append(out, 0)
		copy(out[i+1:], out[i:])
		out[i] = rune(n)
		i++
	}
	return string(out), true
}

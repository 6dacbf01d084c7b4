package classifier

import "time"

// Retry hints. Many greylisters and rate limiters say in their reply how
// long to wait, in many spellings: milter-greylist "please come back in
// 00:05:00", sqlgrey and postgrey custom texts "Greylisted for 300
// seconds", Exim setups "try again in 5 minutes", "retry in 4 minutes and
// 59 seconds", "retry after 4m59s". RFC 6647 §4 leaves the text to the
// receiver, so the parser looks for a duration right after one of the
// words that introduce one (in, after, for, wait, within) and ignores
// every other number in the text (addresses, codes, counters).
//
// The parser reads the original bytes and folds ASCII letters itself:
// lower-casing a copy first would change its length for invalid UTF-8 or
// for U+212A (the Kelvin sign, whose lower case is a one-byte "k"), and
// positions found in the copy would then index the original wrongly.

// MaxHint caps a hint: a longer wait asked by a server is taken as 4 hours.
// The backoff policy applies retry.hint_min and retry.hint_max on top.
const MaxHint = 4 * time.Hour

// maxHint is the cap used by the package.
const maxHint = MaxHint

// hintTriggers are the words a duration must follow to count as a hint.
var hintTriggers = []string{"in", "after", "for", "wait", "within"}

// hintUnits maps a unit word to its length in seconds.
var hintUnits = map[string]int64{
	"s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
	"m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
	"h": 3600, "hr": 3600, "hrs": 3600, "hour": 3600, "hours": 3600,
}

// Hint returns the first retry hint in a reply's text, at most MaxHint, or
// 0 if it has none.
func Hint(text string) time.Duration {
	for i := 0; i < len(text); i++ {
		if i > 0 && isAlnum(text[i-1]) {
			continue
		}
		w := wordAt(text, i)
		if !isTrigger(text[i : i+w]) {
			continue
		}
		at := skipSpace(text, i+w)
		if at == i+w {
			continue // the duration must follow after a space
		}
		if secs, ok := durationAt(text, at); ok && secs > 0 {
			return time.Duration(min(secs, int64(maxHint/time.Second))) * time.Second
		}
	}
	return 0
}

// isTrigger reports whether w is one of hintTriggers, ASCII case-insensitively.
func isTrigger(w string) bool {
	for _, t := range hintTriggers {
		if equalFold(w, t) {
			return true
		}
	}
	return false
}

// durationAt parses a duration starting at text[i]: H:MM:SS, or one or more
// "number unit" parts joined by spaces, commas or "and" ("4 minutes and 59
// seconds", "4m59s"). It returns the total in seconds.
func durationAt(text string, i int) (int64, bool) {
	if secs, ok := clockAt(text, i); ok {
		return secs, true
	}
	var total int64
	parts := 0
	for {
		n, j := numberAt(text, i, 7)
		if j == i {
			break
		}
		k := skipSpace(text, j)
		w := letters(text, k)
		unit, ok := hintUnits[lowerASCII(text[k:k+w])]
		if !ok || (k+w < len(text) && isAlnum(text[k+w]) && !isDigit(text[k+w])) {
			break
		}
		total += n * unit
		parts++
		i = skipJoin(text, k+w)
	}
	return total, parts > 0
}

// clockAt parses H:MM:SS or HH:MM:SS at text[i] (milter-greylist's form).
func clockAt(text string, i int) (int64, bool) {
	h, j := numberAt(text, i, 2)
	if j == i || j >= len(text) || text[j] != ':' {
		return 0, false
	}
	m, k := numberAt(text, j+1, 2)
	if k != j+3 || k >= len(text) || text[k] != ':' {
		return 0, false
	}
	s, l := numberAt(text, k+1, 2)
	if l != k+3 || (l < len(text) && isAlnum(text[l])) {
		return 0, false
	}
	return h*3600 + m*60 + s, true
}

// numberAt reads up to maxDigits decimal digits at text[i]; it returns the
// value and the index after them (i if there are none, or too many).
func numberAt(text string, i, maxDigits int) (int64, int) {
	var n int64
	j := i
	for j < len(text) && isDigit(text[j]) {
		if j-i == maxDigits {
			return 0, i
		}
		n = n*10 + int64(text[j]-'0')
		j++
	}
	return n, j
}

// skipJoin skips what may join two parts of a duration: spaces, a comma,
// "and".
func skipJoin(text string, i int) int {
	i = skipSpace(text, i)
	if i < len(text) && text[i] == ',' {
		i = skipSpace(text, i+1)
	}
	if w := letters(text, i); w == 3 && equalFold(text[i:i+3], "and") {
		i = skipSpace(text, i+3)
	}
	return i
}

func skipSpace(text string, i int) int {
	for i < len(text) && (text[i] == ' ' || text[i] == '\t') {
		i++
	}
	return i
}

// wordAt returns the length of the run of ASCII letters at text[i].
func wordAt(text string, i int) int { return letters(text, i) }

func letters(text string, i int) int {
	j := i
	for j < len(text) && isLetter(text[j]) {
		j++
	}
	return j - i
}

// lowerASCII lower-cases ASCII letters only; its result has s's length.
func lowerASCII(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// equalFold compares ASCII case-insensitively, byte by byte.
func equalFold(a, b string) bool {
	return len(a) == len(b) && lowerASCII(a) == lowerASCII(b)
}

func isDigit(c byte) bool  { return '0' <= c && c <= '9' }
func isLetter(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }
func isAlnum(c byte) bool  { return isDigit(c) || isLetter(c) }

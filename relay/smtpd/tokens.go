package smtpd

import (
	"bufio"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// Application tokens for the HTTP sending API.
//
// A token is 32 random octets, written "grt_" and base64url. The tokens
// file keeps one line per application, "name:sha256$HEX[:sender,...]",
// with the senders as in the users file. Only the token's SHA-256 is
// stored: unlike a password a token has 256 bits of entropy, so a fast
// hash is enough to make a stolen file useless, and a request costs one
// hash and one map lookup instead of a bcrypt comparison (which takes
// tens of milliseconds on purpose). Lookup by the hash leaks nothing an
// attacker could use: finding a token from timing would mean inverting
// SHA-256.

// tokenPrefix marks greyrelay tokens (secret scanners can find them).
const tokenPrefix = "grt_"

// tokenHashPrefix introduces the hash field of a tokens-file line.
const tokenHashPrefix = "sha256$"

type tokenAccount struct {
	name    string
	allowed []string
}

// LoadDirectory reads the users file and the tokens file into one
// directory; either path may be empty.
func LoadDirectory(usersFile, tokensFile string) (*Users, error) {
	var u *Users
	var err error
	if usersFile != "" {
		u, err = LoadUsers(usersFile)
	} else {
		u, err = ParseUsers(strings.NewReader(""))
	}
	if err != nil || tokensFile == "" {
		return u, err
	}
	f, err := os.Open(tokensFile)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := u.tab.Load().addTokens(f); err != nil {
		return nil, fmt.Errorf("%s: %w", tokensFile, err)
	}
	return u, nil
}

// ParseTokens reads tokens-file lines from r into a directory without
// users (for tests and `greyrelay token add`). Errors name the line.
func ParseTokens(r io.Reader) (*Users, error) {
	u, err := ParseUsers(strings.NewReader(""))
	if err != nil {
		return nil, err
	}
	return u, u.tab.Load().addTokens(r)
}

func (t *userTable) addTokens(r io.Reader) error {
	t.tokens = make(map[[sha256.Size]byte]tokenAccount)
	names := make(map[string]bool)
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		sum, acc, err := parseTokenLine(line)
		if err != nil {
			return fmt.Errorf("line %d: %w", n, err)
		}
		if names[acc.name] {
			return fmt.Errorf("line %d: token %q listed twice", n, acc.name)
		}
		if _, dup := t.tokens[sum]; dup {
			return fmt.Errorf("line %d: token %q has the hash of another token", n, acc.name)
		}
		names[acc.name] = true
		t.tokens[sum] = acc
		for _, e := range acc.allowed {
			if e != "<>" {
				k := entryKey(e)
				t.owners[k] = append(t.owners[k], acc.name)
			}
		}
	}
	return sc.Err()
}

func parseTokenLine(line string) ([sha256.Size]byte, tokenAccount, error) {
	var sum [sha256.Size]byte
	fields := strings.SplitN(line, ":", 3)
	if len(fields) < 2 {
		return sum, tokenAccount{}, errors.New(`want "name:sha256$HEX[:sender,...]"`)
	}
	acc := tokenAccount{name: fields[0]}
	if err := checkName(acc.name); err != nil {
		return sum, tokenAccount{}, err
	}
	h, ok := strings.CutPrefix(fields[1], tokenHashPrefix)
	b, err := hex.DecodeString(h)
	if !ok || err != nil || len(b) != sha256.Size {
		return sum, tokenAccount{}, fmt.Errorf("token %q: not a sha256$ hash", acc.name)
	}
	copy(sum[:], b)
	if len(fields) == 3 {
		allowed, err := parseSenders(strings.Split(fields[2], ","))
		if err != nil {
			return sum, tokenAccount{}, fmt.Errorf("token %q: %w", acc.name, err)
		}
		acc.allowed = allowed
	}
	return sum, acc, nil
}

// NewToken makes a token for name: the secret to give the application,
// and the tokens-file line that admits it (what `greyrelay token add`
// writes).
func NewToken(name string, allowedSenders []string) (token, line string, err error) {
	if err := checkName(name); err != nil {
		return "", "", err
	}
	allowed, err := parseSenders(allowedSenders)
	if err != nil {
		return "", "", err
	}
	secret := make([]byte, 32)
	rand.Read(secret)
	token = tokenPrefix + base64.RawURLEncoding.EncodeToString(secret)
	sum := sha256.Sum256([]byte(token))
	line = name + ":" + tokenHashPrefix + hex.EncodeToString(sum[:])
	if len(allowed) > 0 {
		line += ":" + strings.Join(allowed, ",")
	}
	return token, line, nil
}

// AuthenticateToken finds the application a bearer token belongs to, and
// its allowed senders (nil: any sender no other identity lists).
func (u *Users) AuthenticateToken(token string) (name string, allowed []string, ok bool) {
	acc, ok := u.tab.Load().tokens[sha256.Sum256([]byte(token))]
	if !ok {
		return "", nil, false
	}
	return acc.name, append([]string(nil), acc.allowed...), true
}

// Counts returns how many users and tokens the directory holds.
func (u *Users) Counts() (users, tokens int) {
	t := u.tab.Load()
	return len(t.byName), len(t.tokens)
}

// HasLogins reports whether the directory holds any user, so that AUTH is
// offered: with the sending API's tokens alone (no users_file) it is not.
// A nil directory has none.
func (u *Users) HasLogins() bool { return u != nil && len(u.tab.Load().byName) > 0 }

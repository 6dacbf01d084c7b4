package smtpd

import (
	"bufio"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync/atomic"

	"golang.org/x/crypto/bcrypt"

	"github.com/greyrelay/greyrelay/internal/safetext"
	"github.com/greyrelay/greyrelay/relay/address"
)

// Users is the set of accounts allowed to AUTH, read from the users file.
//
// The file has one account per line, "name:bcrypt-hash[:sender,...]";
// blank lines and lines starting with "#" are ignored. A sender entry is a
// full address, "@domain" (or "*@domain") for any address at that domain,
// or "<>" for the null sender; with no entries the account may use any
// sender (so give every credential its list, and "<>" only to a smarthost
// that sends its own bounces).
//
// A listed address also has an owner: like Postfix's
// reject_known_sender_login_mismatch, no other user may send as it, not
// even one without a list. The most specific entry decides, as in
// Postfix's smtpd_sender_login_maps lookups: an address listed for a user
// belongs to that user alone, even inside a domain another user lists.
//
// The same directory holds the sending API's application tokens
// (AddTokens): a token is an identity like a user, with its own sender
// list, and a token and a user of the same name are one identity for
// sender ownership.
//
// Reload replaces the contents at once (SIGHUP), so every session and
// request sees either the old files or the new ones, never a mixture.
type Users struct {
	tab atomic.Pointer[userTable]
}

// userTable is one reading of the users (and tokens) file.
type userTable struct {
	byName map[string]account
	owners map[string][]string // ownerKey of an entry → the users listing it
	dummy  []byte              // compared against for unknown names, for similar timing
	tokens map[[sha256.Size]byte]tokenAccount
}

type account struct {
	hash    []byte
	allowed []string
}

// maxNameLen bounds user names (they end up in logs and the queue).
const maxNameLen = 256

// LoadUsers reads a users file.
func LoadUsers(path string) (*Users, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	u, err := ParseUsers(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return u, nil
}

// ParseUsers reads users-file lines from r. Errors name the line.
func ParseUsers(r io.Reader) (*Users, error) {
	u := &userTable{byName: make(map[string]account), owners: make(map[string][]string)}
	cost := bcrypt.MinCost
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, acc, err := parseUserLine(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		if _, dup := u.byName[name]; dup {
			return nil, fmt.Errorf("line %d: user %q listed twice", n, name)
		}
		u.byName[name] = acc
		for _, e := range acc.allowed {
			if e != "<>" {
				k := entryKey(e)
				u.owners[k] = append(u.owners[k], name)
			}
		}
		c, _ := bcrypt.Cost(acc.hash)
		cost = max(cost, c)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	// The dummy hash has the highest cost in the file, so that an unknown
	// name costs as much time as a known one.
	secret := make([]byte, 16)
	rand.Read(secret)
	dummy, err := bcrypt.GenerateFromPassword(secret, cost)
	if err != nil {
		return nil, err
	}
	u.dummy = dummy
	users := &Users{}
	users.tab.Store(u)
	return users, nil
}

// Replace makes u answer as n does from now on (n is not used after).
// Sessions already authenticated keep their identity and sender list.
func (u *Users) Replace(n *Users) { u.tab.Store(n.tab.Load()) }

func parseUserLine(line string) (string, account, error) {
	fields := strings.SplitN(line, ":", 3)
	if len(fields) < 2 {
		return "", account{}, errors.New(`want "name:bcrypt-hash[:sender,...]"`)
	}
	name, hash := fields[0], []byte(fields[1])
	if err := checkName(name); err != nil {
		return "", account{}, err
	}
	if _, err := bcrypt.Cost(hash); err != nil {
		return "", account{}, fmt.Errorf("user %q: not a bcrypt hash", name)
	}
	acc := account{hash: hash}
	if len(fields) == 3 {
		allowed, err := parseSenders(strings.Split(fields[2], ","))
		if err != nil {
			return "", account{}, fmt.Errorf("user %q: %w", name, err)
		}
		acc.allowed = allowed
	}
	return name, acc, nil
}

// checkName allows printable, non-space ASCII and UTF-8 without ':'.
func checkName(name string) error {
	if name == "" || len(name) > maxNameLen {
		return fmt.Errorf("user name must be 1 to %d octets", maxNameLen)
	}
	if strings.ContainsAny(name, ": \t") || strings.ContainsFunc(name, safetext.IsControl) {
		return fmt.Errorf("user name %q contains ':', a space or a control character", name)
	}
	return nil
}

// parseSenders normalises allowed-sender entries: addresses in the form
// address.Address.String gives, domains lowercased after "@" ("*@domain"
// is written "@domain"), without a final dot. Domains keep the spelling
// given (U-labels stay readable); they are compared canonically.
func parseSenders(list []string) ([]string, error) {
	var out []string
	opt := address.Options{SMTPUTF8: true, Sender: true}
	for _, e := range list {
		e = strings.TrimSuffix(strings.TrimSpace(e), ".")
		switch {
		case e == "":
			continue
		case e == "<>":
			out = append(out, e)
		case strings.HasPrefix(e, "@") || strings.HasPrefix(e, "*@"):
			d, err := address.ParseDomain(e[strings.IndexByte(e, '@')+1:], opt)
			if err != nil {
				return nil, fmt.Errorf("allowed sender %q: %w", e, err)
			}
			out = append(out, "@"+d)
		default:
			a, err := address.Parse(e, opt)
			if err != nil {
				return nil, fmt.Errorf("allowed sender %q: %w", e, err)
			}
			out = append(out, a.String())
		}
	}
	return out, nil
}

// UserLine makes a users-file line for name with a bcrypt hash of password
// (what `greyrelay user add NAME` prints).
func UserLine(name, password string, allowedSenders []string) (string, error) {
	return userLine(name, password, allowedSenders, bcrypt.DefaultCost)
}

func userLine(name, password string, allowedSenders []string, cost int) (string, error) {
	if err := checkName(name); err != nil {
		return "", err
	}
	if password == "" {
		return "", errors.New("empty password")
	}
	allowed, err := parseSenders(allowedSenders)
	if err != nil {
		return "", err
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(password), cost)
	if err != nil {
		return "", err // ErrPasswordTooLong past 72 octets
	}
	line := name + ":" + string(hash)
	if len(allowed) > 0 {
		line += ":" + strings.Join(allowed, ",")
	}
	return line, nil
}

// Authenticate checks name and password. An unknown name is compared
// against a dummy hash, so it takes about as long as a wrong password and
// the caller gives the same reply for both. allowed is the account's
// allowed-sender list (nil: any sender that ownedByOther does not refuse).
func (u *Users) Authenticate(name, password string) (ok bool, allowed []string) {
	t := u.tab.Load()
	acc, known := t.byName[name]
	hash := acc.hash
	if !known {
		hash = t.dummy
	}
	err := bcrypt.CompareHashAndPassword(hash, []byte(password))
	if err != nil || !known {
		return false, nil
	}
	return true, append([]string(nil), acc.allowed...)
}

// ownerKey is the form in which sender entries and MAIL FROM addresses are
// compared for ownership: the local part as address.Address.String writes
// it, without case (mail systems hardly ever distinguish the local part's),
// and the domain in its one canonical form (address.DomainKey), so that
// neither U-label against A-label nor case nor a final dot makes two
// spellings of one address two addresses.
func ownerKey(a address.Address) string {
	return strings.ToLower(address.Address{Local: a.Local}.String()) + "@" + address.DomainKey(a.Domain)
}

// domainOwnerKey is the key of the "@domain" entry covering domain.
func domainOwnerKey(domain string) string { return "@" + address.DomainKey(domain) }

// entryKey is the key of a sender entry as parseSenders wrote it (not <>).
func entryKey(e string) string {
	if d, ok := strings.CutPrefix(e, "@"); ok {
		return domainOwnerKey(d)
	}
	local, domain, _ := cutLast(e, "@")
	// parseSenders wrote the local part as Address.String does: quoted
	// when it is not a dot-string, which is already ownerKey's form.
	return strings.ToLower(local) + "@" + address.DomainKey(domain)
}

// ownedByOther reports whether from, a MAIL FROM address other than <>, is
// listed in the users file for users that do not include name, and so may
// not be used by name. The address's own entry decides when there is one,
// its domain's "@domain" entry otherwise; an address nobody lists is owned
// by nobody.
func (u *Users) ownedByOther(name string, from address.Address) bool {
	t := u.tab.Load()
	owners, ok := t.owners[ownerKey(from)]
	if !ok {
		owners, ok = t.owners[domainOwnerKey(from.Domain)]
	}
	return ok && !slices.Contains(owners, name)
}

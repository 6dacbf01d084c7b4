// Package suppress keeps the suppression list: recipient addresses whose
// mail failed permanently for a reason about the address itself (an
// unknown user, a disabled mailbox), so that mail to them is refused at
// RCPT instead of being sent again. Mailbox providers count repeated mail
// to unknown users against the sending address's reputation; Amazon SES
// and Postal suppress such addresses the same way.
//
// Entries are kept in a bbolt file beside the queue, per address and
// scope: the whole relay (scope "") or one sending domain (the scope key's
// choice), with the reason, the reply that caused it and the date, and
// expire after a configured time, so an address that comes back to life
// is tried again. The delivery engine adds entries; the operator lists,
// adds and removes them through the admin API.
//
// In a cluster the nodes share the list through a Shared store (Redis,
// relay/cluster); shared.go tells how. Check reads only the local file,
// so a RCPT never waits for the network.
package suppress

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
)

var (
	bucket  = []byte("suppressed")
	pending = []byte("pending") // keys changed here that the shared store has not taken yet
	meta    = []byte("meta")    // the shared list's epoch and the last change applied
)

// Scope modes (suppression.scope).
const (
	ScopeGlobal       = "global"        // one list for every sender
	ScopeSenderDomain = "sender-domain" // a list per sending domain
)

// Entry is one suppressed address.
type Entry struct {
	Address string    `json:"address"`
	Scope   string    `json:"scope,omitempty"` // the sending domain; "" for every sender
	Reason  string    `json:"reason"`          // the classifier's reason, or "operator"
	Reply   string    `json:"reply,omitempty"` // the reply that caused it
	Since   time.Time `json:"since"`
	Expires time.Time `json:"expires"`
	// Source is the file of suppression.imports the entry comes from; it
	// lasts while the file lists it (imports.go).
	Source string `json:"source,omitempty"`
}

// Options configure Open.
type Options struct {
	Scope string        // ScopeGlobal or ScopeSenderDomain
	TTL   time.Duration // how long an entry lasts
	Now   func() time.Time
	// Shared, if set, is the store the nodes of a cluster share the list
	// through (shared.go).
	Shared Shared
}

// List is the suppression list. Its methods are safe for concurrent use.
type List struct {
	db    *bolt.DB
	opt   Options
	pubMu sync.Mutex // one publication or sync at a time (shared.go)
}

// Open opens (or creates) the list's file.
func Open(path string, opt Options) (*List, error) {
	if opt.Now == nil {
		opt.Now = time.Now
	}
	if opt.Scope != ScopeGlobal && opt.Scope != ScopeSenderDomain {
		return nil, fmt.Errorf("suppress: scope %q is not %s or %s", opt.Scope, ScopeGlobal, ScopeSenderDomain)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("suppression list %s: %w", path, err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucket, pending, meta} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		db.Close()
		return nil, fmt.Errorf("suppression list %s: %w", path, err)
	}
	return &List{db: db, opt: opt}, nil
}

// Close closes the file.
func (l *List) Close() error { return l.db.Close() }

// ScopeOf is the scope an entry for mail from sender falls in.
func (l *List) ScopeOf(sender string) string {
	if l.opt.Scope == ScopeGlobal {
		return ""
	}
	_, domain, _ := cutLast(sender, "@")
	return strings.ToLower(domain)
}

// key is an entry's key: scope NUL address, both without case (mail
// systems hardly ever tell local parts apart by case, and an address in
// two spellings must not escape the list).
func key(scope, addr string) []byte {
	return []byte(strings.ToLower(scope) + "\x00" + strings.ToLower(addr))
}

// Check returns the entry that suppresses mail from sender to rcpt, if
// one is in force. With the sender-domain scope an entry for every sender
// (scope "": the operator's or an import's) counts too.
func (l *List) Check(sender, rcpt string) (Entry, bool) {
	var e Entry
	found := false
	now := l.opt.Now()
	scopes := []string{l.ScopeOf(sender)}
	if scopes[0] != "" {
		scopes = append(scopes, "")
	}
	l.db.View(func(tx *bolt.Tx) error {
		for _, sc := range scopes {
			v := tx.Bucket(bucket).Get(key(sc, rcpt))
			if v != nil && json.Unmarshal(v, &e) == nil && now.Before(e.Expires) {
				found = true
				return nil
			}
		}
		return nil
	})
	return e, found
}

// Suppress adds (or renews) the entry for a permanent failure of mail
// from sender to rcpt.
func (l *List) Suppress(sender, rcpt, reason, reply string, at time.Time) (Entry, error) {
	e := Entry{Address: strings.ToLower(rcpt), Scope: l.ScopeOf(sender), Reason: reason, Reply: reply,
		Since: at.UTC(), Expires: at.Add(l.opt.TTL).UTC()}
	return e, l.Put(e)
}

// Put stores e as it is (an operator's entry or an import). A zero
// Expires means the configured TTL from Since.
func (l *List) Put(e Entry) error {
	if e.Address == "" || strings.ContainsAny(e.Address, "\x00\r\n") || !strings.Contains(e.Address, "@") {
		return fmt.Errorf("suppress: %q is not an address", e.Address)
	}
	e.Address, e.Scope = strings.ToLower(e.Address), strings.ToLower(e.Scope)
	if e.Since.IsZero() {
		e.Since = l.opt.Now().UTC()
	}
	if e.Expires.IsZero() {
		e.Expires = e.Since.Add(l.opt.TTL).UTC()
	}
	v, err := json.Marshal(e)
	if err != nil {
		return err
	}
	k := key(e.Scope, e.Address)
	if err := l.db.Update(func(tx *bolt.Tx) error {
		return l.markPending(tx, k, tx.Bucket(bucket).Put(k, v))
	}); err != nil {
		return err
	}
	l.publish(k)
	return nil
}

// ErrNotFound is Remove's answer for an address not on the list.
var ErrNotFound = errors.New("suppress: not on the suppression list")

// Remove takes an address off the list, in one scope ("" for the global
// scope).
func (l *List) Remove(scope, addr string) error {
	k := key(scope, addr)
	if err := l.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucket)
		if b.Get(k) == nil {
			return ErrNotFound
		}
		return l.markPending(tx, k, b.Delete(k))
	}); err != nil {
		return err
	}
	l.publish(k)
	return nil
}

// List returns the entries in force, by scope and address.
func (l *List) List() ([]Entry, error) {
	out := []Entry{}
	now := l.opt.Now()
	err := l.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucket).ForEach(func(_, v []byte) error {
			var e Entry
			if json.Unmarshal(v, &e) == nil && now.Before(e.Expires) {
				out = append(out, e)
			}
			return nil
		})
	})
	return out, err
}

// Prune deletes expired entries and returns how many. With a shared
// store it removes them there too, unless another node renewed them: every
// node expires an entry by its own clock, so no change is announced.
func (l *List) Prune() (int, error) {
	now := l.opt.Now()
	old := map[string][]byte{}
	err := l.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucket)
		b.ForEach(func(k, v []byte) error {
			var e Entry
			if json.Unmarshal(v, &e) != nil || !now.Before(e.Expires) {
				old[string(k)] = bytes.Clone(v)
			}
			return nil
		})
		for k := range old {
			if err := b.Delete([]byte(k)); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil && l.opt.Shared != nil {
		for k, v := range old {
			l.opt.Shared.ForgetSuppression(k, v)
		}
	}
	return len(old), err
}

func cutLast(s, sep string) (before, after string, found bool) {
	if i := strings.LastIndex(s, sep); i >= 0 {
		return s[:i], s[i+len(sep):], true
	}
	return s, "", false
}

// Suppressed is Check in the form the SMTP server asks it.
func (l *List) Suppressed(sender, rcpt string) (time.Time, string, bool) {
	e, ok := l.Check(sender, rcpt)
	return e.Since, e.Reply, ok
}

// Why is Check in the form the delivery engine asks it: when mail from
// sender to rcpt was suppressed, why (the classifier's reason, or the
// operator's) and the reply that caused it.
func (l *List) Why(sender, rcpt string) (since time.Time, reason, reply string, ok bool) {
	e, ok := l.Check(sender, rcpt)
	return e.Since, e.Reason, e.Reply, ok
}

package suppress

import (
	"errors"
	"path/filepath"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)

func open(t *testing.T, scope string, now *time.Time) *List {
	t.Helper()
	l, err := Open(filepath.Join(t.TempDir(), "s.db"), Options{Scope: scope, TTL: 24 * time.Hour, Now: func() time.Time { return *now }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func TestScopes(t *testing.T) {
	for _, tc := range []struct {
		scope        string
		sender, rcpt string
		want         bool
	}{
		{ScopeGlobal, "a@shop.example", "gone@dest.example", true},
		{ScopeGlobal, "b@other.example", "Gone@Dest.Example", true}, // any sender, any case
		{ScopeGlobal, "", "gone@dest.example", true},
		{ScopeGlobal, "a@shop.example", "alive@dest.example", false},
		{ScopeSenderDomain, "b@SHOP.example", "gone@dest.example", true},
		{ScopeSenderDomain, "b@other.example", "gone@dest.example", false},
	} {
		now := t0
		l := open(t, tc.scope, &now)
		if _, err := l.Suppress("a@shop.example", "gone@dest.example", "no-such-user", "550 5.1.1 unknown", t0); err != nil {
			t.Fatal(err)
		}
		e, ok := l.Check(tc.sender, tc.rcpt)
		if ok != tc.want || ok && (e.Reply != "550 5.1.1 unknown" || !e.Since.Equal(t0)) {
			t.Errorf("%s: Check(%q, %q) = %+v, %v; want %v", tc.scope, tc.sender, tc.rcpt, e, ok, tc.want)
		}
	}
}

func TestExpiryRemoveAndPut(t *testing.T) {
	now := t0
	l := open(t, ScopeGlobal, &now)
	l.Suppress("", "gone@dest.example", "no-such-user", "550 5.1.1", t0)
	if err := l.Put(Entry{Address: "op@dest.example", Reason: "operator"}); err != nil {
		t.Fatal(err)
	}
	if es, _ := l.List(); len(es) != 2 {
		t.Fatalf("List = %+v", es)
	}
	if err := l.Remove("", "OP@dest.example"); err != nil {
		t.Errorf("Remove: %v", err)
	}
	if err := l.Remove("", "op@dest.example"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Remove again: %v", err)
	}
	now = t0.Add(24 * time.Hour)
	if _, ok := l.Check("", "gone@dest.example"); ok {
		t.Error("an expired entry still suppresses")
	}
	if es, _ := l.List(); len(es) != 0 {
		t.Errorf("List shows expired entries: %+v", es)
	}
	if n, err := l.Prune(); n != 1 || err != nil {
		t.Errorf("Prune = %d, %v", n, err)
	}
	for _, bad := range []string{"", "no-at-sign", "a@b\r\nc"} {
		if err := l.Put(Entry{Address: bad}); err == nil {
			t.Errorf("Put(%q) accepted", bad)
		}
	}
	if _, err := Open(filepath.Join(t.TempDir(), "x.db"), Options{Scope: "per-user"}); err == nil {
		t.Error("an unknown scope was accepted")
	}
}

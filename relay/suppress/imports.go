package suppress

import (
	"bufio"
	"fmt"
	"io"
	"strings"
	"time"
)

// Imports (suppression.imports): files of addresses, one a line, that the
// operator keeps (another system's list, a list of role addresses). Their
// entries are for every sender and have no end: they last while their
// file lists them, and Import removes those its file no longer lists. An
// address already on the list for another reason keeps its entry (and
// its reply).

// noEnd is the end of an imported entry: it lasts while its file lists it.
var noEnd = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)

// ParseAddresses reads one address a line; "#" starts a comment and blank
// lines are skipped. Errors name the line.
func ParseAddresses(r io.Reader) ([]string, error) {
	var out []string
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		addr, _, _ := strings.Cut(sc.Text(), "#")
		addr = strings.TrimSpace(addr)
		if addr == "" {
			continue
		}
		if strings.ContainsAny(addr, " \t\r\x00") || !strings.Contains(addr, "@") {
			return nil, fmt.Errorf("line %d: %q is not an address", line, addr)
		}
		out = append(out, strings.ToLower(addr))
	}
	return out, sc.Err()
}

// Import makes the list hold addrs for source: it adds those that are not
// suppressed yet and removes source's entries for addresses no longer in
// addrs. It returns how many it added and removed.
func (l *List) Import(source string, addrs []string) (added, removed int, err error) {
	want := map[string]bool{}
	for _, a := range addrs {
		want[strings.ToLower(a)] = true
	}
	es, err := l.List()
	if err != nil {
		return 0, 0, err
	}
	have := map[string]bool{} // global entries in force
	for _, e := range es {
		if e.Scope != "" {
			continue
		}
		have[e.Address] = true
		if e.Source == source && !want[e.Address] {
			if err := l.Remove("", e.Address); err != nil && err != ErrNotFound {
				return added, removed, err
			}
			removed++
		}
	}
	now := l.opt.Now().UTC()
	for a := range want {
		if have[a] {
			continue
		}
		if err := l.Put(Entry{Address: a, Reason: "import", Since: now, Expires: noEnd, Source: source}); err != nil {
			return added, removed, err
		}
		added++
	}
	return added, removed, nil
}

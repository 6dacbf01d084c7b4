// Package clustertest holds an in-memory cluster.Store for tests, so that
// the unit tests of relay/cluster and of the packages built on it run
// without a Redis server. The Redis store itself is tested against real
// redis-server instances in the integration package.
//
// Memory keeps the same state the Redis store does (leases with expiries,
// records, the pace, the registry) with the same atomic operations, on
// this process's clock, and can stand in for the failures a real Redis
// has: it can be taken down and brought back, and it can lose everything
// (a restart without persistence).
package clustertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/greyrelay/greyrelay/relay/suppress"
)

// ErrDown is every call's error while a Memory is down.
var ErrDown = errors.New("clustertest: store down")

// Memory is an in-memory cluster.Store, shared by the nodes of a test the
// way they share a Redis. It is safe for concurrent use.
type Memory struct {
	mu      sync.Mutex
	down    bool
	leases  map[string]map[string]time.Time // domain → member → expiry
	records map[string]entry
	pace    map[string]time.Time        // domain → last start reserved
	runs    map[string]map[string]entry // domain → node → run
	nodes   map[string]entry
	susp    map[string][]byte // the operator's suspensions, by domain
	subs    map[int]func(string)
	nsub    int
	supp    suppressions
	usage   map[string]map[int64][2]int64 // user_limits counts by identity
	// SuppressionLogLen is how many changes the suppression log keeps
	// (NewMemory: 10000).
	SuppressionLogLen int
}

type entry struct {
	b   []byte
	exp time.Time
	// A record's version (SetRecord): when a refusal last slowed its
	// pace, then when it last changed.
	refused, updated time.Time
}

func (e entry) live(now time.Time) bool { return e.b != nil && now.Before(e.exp) }

// NewMemory returns an empty store that answers.
func NewMemory() *Memory {
	m := &Memory{subs: map[int]func(string){}, SuppressionLogLen: 10000}
	m.Flush()
	return m
}

// SetDown makes every call fail with ErrDown (true), as a killed Redis,
// or answer again (false) with the state it had.
func (m *Memory) SetDown(down bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.down = down
}

// Flush forgets every lease, record, pace and registry entry, as a Redis
// that restarted without persistence (FLUSHALL).
func (m *Memory) Flush() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.leases = map[string]map[string]time.Time{}
	m.records = map[string]entry{}
	m.pace = map[string]time.Time{}
	m.runs = map[string]map[string]entry{}
	m.nodes = map[string]entry{}
	m.susp = map[string][]byte{}
	m.supp = suppressions{entries: map[string][]byte{}, seq: m.supp.seq}
	m.usage = nil
}

// Leases returns domain's unexpired leases: member → expiry.
func (m *Memory) Leases(domain string) map[string]time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expire(domain, time.Now())
	return maps.Clone(m.leases[domain])
}

// Subscribers is the number of running Subscribe calls.
func (m *Memory) Subscribers() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.subs)
}

// Entry returns name's unexpired registry entry, nil if there is none.
func (m *Memory) Entry(name string) []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.nodes[name]; e.live(time.Now()) {
		return e.b
	}
	return nil
}

// SetEntry writes name's registry entry for ttl, as another process
// (an older version, say) would.
func (m *Memory) SetEntry(name string, b []byte, ttl time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.nodes[name] = entry{b: b, exp: time.Now().Add(ttl)}
}

// call takes the lock for one operation, or fails while down.
func (m *Memory) call() error {
	m.mu.Lock()
	if m.down {
		m.mu.Unlock()
		return ErrDown
	}
	return nil
}

// expire drops domain's expired leases; m.mu is held.
func (m *Memory) expire(domain string, now time.Time) {
	for member, exp := range m.leases[domain] {
		if !now.Before(exp) {
			delete(m.leases[domain], member)
		}
	}
}

// Ping implements cluster.Store.
func (m *Memory) Ping(context.Context) error {
	if err := m.call(); err != nil {
		return err
	}
	m.mu.Unlock()
	return nil
}

// Acquire implements cluster.Store.
func (m *Memory) Acquire(_ context.Context, domain, member string, limit int, ttl time.Duration) (bool, error) {
	if err := m.call(); err != nil {
		return false, err
	}
	defer m.mu.Unlock()
	now := time.Now()
	m.expire(domain, now)
	if len(m.leases[domain]) >= limit {
		return false, nil
	}
	if m.leases[domain] == nil {
		m.leases[domain] = map[string]time.Time{}
	}
	m.leases[domain][member] = now.Add(ttl)
	return true, nil
}

// Renew implements cluster.Store.
func (m *Memory) Renew(_ context.Context, ttl time.Duration, held map[string]map[string]int) (added, refused map[string][]string, err error) {
	if err := m.call(); err != nil {
		return nil, nil, err
	}
	defer m.mu.Unlock()
	now := time.Now()
	added, refused = map[string][]string{}, map[string][]string{}
	for domain, members := range held {
		m.expire(domain, now)
		if m.leases[domain] == nil {
			m.leases[domain] = map[string]time.Time{}
		}
		set := m.leases[domain]
		var absent []string
		for member := range members {
			if _, ok := set[member]; ok {
				set[member] = now.Add(ttl)
			} else {
				absent = append(absent, member)
			}
		}
		for _, member := range absent {
			if len(set) < members[member] {
				set[member] = now.Add(ttl)
				added[domain] = append(added[domain], member)
			} else {
				refused[domain] = append(refused[domain], member)
			}
		}
	}
	return added, refused, nil
}

// Release implements cluster.Store.
func (m *Memory) Release(_ context.Context, domain, member string) error {
	if err := m.call(); err != nil {
		return err
	}
	_, held := m.leases[domain][member]
	delete(m.leases[domain], member)
	var subs []func(string)
	if held {
		subs = make([]func(string), 0, len(m.subs))
		for _, f := range m.subs {
			subs = append(subs, f)
		}
	}
	m.mu.Unlock()
	for _, f := range subs {
		f(domain)
	}
	return nil
}

// Drop implements cluster.Store.
func (m *Memory) Drop(_ context.Context, domain, member string) error {
	if err := m.call(); err != nil {
		return err
	}
	defer m.mu.Unlock()
	delete(m.leases[domain], member)
	return nil
}

// Subscribe implements cluster.Store.
func (m *Memory) Subscribe(ctx context.Context, freed func(string)) {
	m.mu.Lock()
	id := m.nsub
	m.nsub++
	m.subs[id] = freed
	m.mu.Unlock()
	<-ctx.Done()
	m.mu.Lock()
	delete(m.subs, id)
	m.mu.Unlock()
}

// Record implements cluster.Store.
func (m *Memory) Record(_ context.Context, domain string) ([]byte, error) {
	if err := m.call(); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	if e := m.records[domain]; e.live(time.Now()) {
		return e.b, nil
	}
	return nil, nil
}

// Runs implements cluster.Store.
func (m *Memory) Runs(_ context.Context, domain string) (map[string][]byte, error) {
	if err := m.call(); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	out := map[string][]byte{}
	for node, e := range m.runs[domain] {
		if e.live(time.Now()) {
			out[node] = e.b
		}
	}
	return out, nil
}

// SetRun implements cluster.Store. As Redis does, the ttl is the whole
// hash's.
func (m *Memory) SetRun(_ context.Context, domain, node string, v []byte, ttl time.Duration) error {
	if err := m.call(); err != nil {
		return err
	}
	defer m.mu.Unlock()
	if m.runs[domain] == nil {
		m.runs[domain] = map[string]entry{}
	}
	exp := time.Now().Add(ttl)
	m.runs[domain][node] = entry{b: v, exp: exp}
	for n, e := range m.runs[domain] {
		m.runs[domain][n] = entry{b: e.b, exp: exp}
	}
	return nil
}

// Suspensions implements cluster.Store.
func (m *Memory) Suspensions(context.Context) (map[string][]byte, error) {
	if err := m.call(); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	return maps.Clone(m.susp), nil
}

// SetSuspension implements cluster.Store.
func (m *Memory) SetSuspension(_ context.Context, domain string, v []byte) error {
	if err := m.call(); err != nil {
		return err
	}
	defer m.mu.Unlock()
	m.susp[domain] = v
	return nil
}

// DeleteSuspension implements cluster.Store.
func (m *Memory) DeleteSuspension(_ context.Context, domain string) error {
	if err := m.call(); err != nil {
		return err
	}
	defer m.mu.Unlock()
	delete(m.susp, domain)
	return nil
}

// SetRecord implements cluster.Store.
func (m *Memory) SetRecord(_ context.Context, domain string, rec []byte, refused, updated time.Time, ttl time.Duration) error {
	if err := m.call(); err != nil {
		return err
	}
	defer m.mu.Unlock()
	if e := m.records[domain]; e.live(time.Now()) &&
		(e.refused.After(refused) || e.refused.Equal(refused) && e.updated.After(updated)) {
		return nil // a later version stands, as in the Redis script
	}
	m.records[domain] = entry{b: rec, exp: time.Now().Add(ttl), refused: refused, updated: updated}
	return nil
}

// Pace implements cluster.Store.
func (m *Memory) Pace(_ context.Context, domain string, interval, ahead time.Duration) (time.Duration, error) {
	if err := m.call(); err != nil {
		return 0, err
	}
	defer m.mu.Unlock()
	now := time.Now()
	at := now
	if last, ok := m.pace[domain]; ok && last.Add(interval).After(now) {
		at = last.Add(interval)
	}
	if at.Sub(now) <= ahead {
		m.pace[domain] = at
	}
	return at.Sub(now), nil
}

// Heartbeat implements cluster.Store.
func (m *Memory) Heartbeat(_ context.Context, name string, b []byte, ttl time.Duration) ([]byte, error) {
	if err := m.call(); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	now := time.Now()
	var prev []byte
	if e := m.nodes[name]; e.live(now) {
		prev = e.b
	}
	m.nodes[name] = entry{b: b, exp: now.Add(ttl)}
	return prev, nil
}

// Unregister implements cluster.Store.
func (m *Memory) Unregister(_ context.Context, name, instance string) error {
	if err := m.call(); err != nil {
		return err
	}
	defer m.mu.Unlock()
	var n struct {
		Instance string `json:"instance"`
	}
	if e := m.nodes[name]; e.live(time.Now()) && json.Unmarshal(e.b, &n) == nil && n.Instance == instance {
		delete(m.nodes, name)
	}
	return nil
}

// Nodes implements cluster.Store.
func (m *Memory) Nodes(context.Context) ([][]byte, error) {
	if err := m.call(); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	var out [][]byte
	now := time.Now()
	for _, e := range m.nodes {
		if e.live(now) {
			out = append(out, e.b)
		}
	}
	return out, nil
}

// Close implements cluster.Store: the store outlives the nodes using it.
func (m *Memory) Close() error { return nil }

// suppressions is the suppression list's shared copy, as the Redis
// store keeps it: entries, a log of changes with increasing IDs, an epoch.
type suppressions struct {
	entries map[string][]byte
	log     []suppress.Change
	seq     int
	epoch   string
}

// SuppressionPut implements cluster.Store.
func (m *Memory) SuppressionPut(_ context.Context, key string, v []byte) error {
	if err := m.call(); err != nil {
		return err
	}
	defer m.mu.Unlock()
	if v == nil {
		delete(m.supp.entries, key)
	} else {
		m.supp.entries[key] = v
	}
	m.logSuppression(key, v)
	return nil
}

func (m *Memory) logSuppression(key string, v []byte) string {
	m.supp.seq++
	id := fmt.Sprintf("%d-0", m.supp.seq)
	m.supp.log = append(m.supp.log, suppress.Change{ID: id, Key: key, Value: v})
	if len(m.supp.log) > m.SuppressionLogLen {
		m.supp.log = slices.Clone(m.supp.log[len(m.supp.log)-m.SuppressionLogLen:])
	}
	return id
}

func (m *Memory) suppressionEpoch(newEpoch string) string {
	if m.supp.epoch == "" {
		m.supp.epoch = newEpoch
	}
	return m.supp.epoch
}

// SuppressionLog implements cluster.Store.
func (m *Memory) SuppressionLog(_ context.Context, newEpoch, after string, limit int) (string, []suppress.Change, error) {
	if err := m.call(); err != nil {
		return "", nil, err
	}
	defer m.mu.Unlock()
	var a int
	fmt.Sscanf(after, "%d-", &a)
	var out []suppress.Change
	for _, e := range m.supp.log {
		var n int
		fmt.Sscanf(e.ID, "%d-", &n)
		if n >= a && len(out) < limit {
			out = append(out, e)
		}
	}
	return m.suppressionEpoch(newEpoch), out, nil
}

// SuppressionSnapshot implements cluster.Store.
func (m *Memory) SuppressionSnapshot(_ context.Context, newEpoch string) (string, string, map[string][]byte, error) {
	if err := m.call(); err != nil {
		return "", "", nil, err
	}
	defer m.mu.Unlock()
	last := ""
	if len(m.supp.log) == 0 {
		last = m.logSuppression("", nil)
	} else {
		last = m.supp.log[len(m.supp.log)-1].ID
	}
	return m.suppressionEpoch(newEpoch), last, maps.Clone(m.supp.entries), nil
}

// SuppressionForget implements cluster.Store.
func (m *Memory) SuppressionForget(_ context.Context, key string, v []byte) error {
	if err := m.call(); err != nil {
		return err
	}
	defer m.mu.Unlock()
	if string(m.supp.entries[key]) == string(v) {
		delete(m.supp.entries, key)
	}
	return nil
}

// AddUsage implements cluster.Store.
func (m *Memory) AddUsage(_ context.Context, id string, add map[int64][2]int64, since int64) (map[int64][2]int64, error) {
	if err := m.call(); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	if m.usage == nil {
		m.usage = map[string]map[int64][2]int64{}
	}
	u := m.usage[id]
	if u == nil {
		u = map[int64][2]int64{}
		m.usage[id] = u
	}
	for minute, c := range add {
		o := u[minute]
		u[minute] = [2]int64{o[0] + c[0], o[1] + c[1]}
	}
	for minute := range u {
		if minute < since {
			delete(u, minute)
		}
	}
	return maps.Clone(u), nil
}

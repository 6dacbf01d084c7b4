// Package salvage copies what can be read of a damaged queue file into a
// fresh one (greyrelay queue salvage).
//
// The daemon is stopped (a file another process holds is refused). The
// damaged file is read with the bounds-checked reader (queue/boltfile),
// never with bbolt: first the tree from the newest valid meta page, which
// knows which record is current; every key range under a page it cannot
// read is noted as lost. Then page by page: every page that parses as a
// leaf gives its records, and a record is taken only for a key in a lost
// range of its bucket (everywhere when no meta page is valid), only when
// its seal proves its bucket and key (unsealed records of older formats
// are taken from the tree only), and of several versions of a recipient
// the most advanced. A message is copied when its envelope, its body
// (matching the envelope's body checksum, in the database or its spool
// file) and at least one live recipient are all intact, with its
// recipients' state and histories; a message with a finished record is
// not (it left the queue). Destination records, finished records, the
// intake journal's state (so that Open replays what it holds), the
// queue's stores (queue.Store: the TLS policy cache and report counts,
// whoever owns them), and the nested buckets (the quarantine, and the
// events outbox with its sequences, so that events not yet passed on
// still go out) come along from the tree. The damaged file is renamed
// path.damaged-TIMESTAMP and kept.
//
// The queue's file layout (its buckets, keys and records) is the queue's:
// this package reads and writes it through what the queue exports for
// it, and the queue knows nothing of salvage.
//
// Limits: a recipient whose current record was on a lost page comes back
// in the state of an older copy, so it may be delivered again (never lost
// or altered): it is marked (queue.BucketSalvaged) so that Show says so
// (queue.Recipient.Salvaged); messages that had left the queue can come back
// only when both their envelope and their recipients lie in lost ranges
// and no finished record names them. Records of nested buckets under a
// lost page are lost (no seal proves where a page-scan copy belongs).
package salvage

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/queue/boltfile"
)

// Report is what Salvage recovered and what it could not.
type Report struct {
	DamagedPath string   // where the damaged file was kept
	Messages    int      // messages copied
	Recipients  int      // live recipients copied
	Damage      []string // what the walk of the damaged file could not read
	Lost        []string // messages seen but not copied, with the reason
}

// subtree is a nested bucket as the damaged file's tree gave it.
type subtree struct {
	path [][]byte
	kv   map[string][]byte
	seq  uint64
}

// salvaged is what the damaged file gave for one bucket.
type salvaged struct {
	tree  map[string][]byte // from the tree: current
	lost  [][2][]byte       // key ranges under unreadable pages
	pages map[string][]byte // from the page scan, for keys in lost ranges
}

func (s *salvaged) inLost(k []byte) bool {
	for _, r := range s.lost {
		if (r[0] == nil || bytes.Compare(k, r[0]) >= 0) && (r[1] == nil || bytes.Compare(k, r[1]) < 0) {
			return true
		}
	}
	return false
}

// Salvage copies every intact message of the damaged queue file at path
// into a fresh file at path, keeping the damaged one aside; now names it.
// The relay must be stopped.
func Salvage(path string, now time.Time) (*Report, error) {
	held, err := queue.InUse(path)
	if err != nil {
		return nil, fmt.Errorf("queue: salvage: %w", err)
	}
	if held {
		return nil, fmt.Errorf("queue: salvage: %w: %s; stop greyrelay first", queue.ErrLocked, path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("queue: salvage: %w", err)
	}
	rep := &Report{DamagedPath: path + ".damaged-" + now.UTC().Format("20060102T150405Z")}
	bs, subs, seq := readDamaged(b, rep)
	fresh := path + ".salvage-tmp"
	os.Remove(fresh)
	if err := writeSalvaged(fresh, path, bs, subs, seq, now, rep); err != nil {
		os.Remove(fresh)
		return nil, fmt.Errorf("queue: salvage: %w", err)
	}
	queue.CopyOwner(path, fresh)
	if err := os.Rename(path, rep.DamagedPath); err != nil {
		return nil, fmt.Errorf("queue: salvage: %w", err)
	}
	if err := os.Rename(fresh, path); err != nil {
		return nil, fmt.Errorf("queue: salvage: %w", err)
	}
	if err := syncDir(filepath.Dir(path)); err != nil { // the renames
		return nil, fmt.Errorf("queue: salvage: %w", err)
	}
	// Open replays the journal into the fresh file and checks it opens.
	q, err := queue.Open(path, queue.Options{})
	if err != nil {
		return rep, fmt.Errorf("queue: salvage: the fresh queue does not open: %w", err)
	}
	return rep, q.Close()
}

// readDamaged walks the damaged file's tree, then its pages. Nested
// buckets come from the tree only, as subtrees by path.
func readDamaged(b []byte, rep *Report) (map[string]*salvaged, map[string]*subtree, uint64) {
	bs := map[string]*salvaged{}
	subs := map[string]*subtree{}
	sub := func(path [][]byte) *subtree {
		k := string(bytes.Join(path, []byte{0}))
		st := subs[k]
		if st == nil {
			st = &subtree{path: clonePath(path), kv: map[string][]byte{}}
			subs[k] = st
		}
		return st
	}
	get := func(name string) *salvaged {
		s := bs[name]
		if s == nil {
			s = &salvaged{tree: map[string][]byte{}, pages: map[string][]byte{}}
			bs[name] = s
		}
		return s
	}
	var seq uint64
	pf := boltfile.New(b, os.Getpagesize())
	pf.Walk(boltfile.Visitor{
		KV: func(path [][]byte, k, v []byte) {
			switch {
			case len(path) == 1:
				get(string(path[0])).tree[string(k)] = v
			case len(path) > 1:
				sub(path).kv[string(k)] = v
			}
		},
		Lost: func(path [][]byte, lo, hi []byte, err error) {
			rep.Damage = append(rep.Damage, err.Error())
			if len(path) == 0 { // the root itself: every bucket
				for _, n := range queue.Buckets() {
					get(n).lost = append(get(n).lost, [2][]byte{nil, nil})
				}
			} else if len(path) == 1 {
				get(string(path[0])).lost = append(get(string(path[0])).lost, [2][]byte{lo, hi})
			}
		},
		Seq: func(path [][]byte, s uint64) {
			if len(path) == 1 && string(path[0]) == queue.BucketMessages {
				seq = s
			}
			if len(path) > 1 {
				sub(path).seq = s
			}
		},
	})
	pf.ScanPages(func(_ []byte, k, v []byte) { pickPaged(get, k, v) })
	return bs, subs, seq
}

func clonePath(path [][]byte) [][]byte {
	out := make([][]byte, len(path))
	for i, p := range path {
		out[i] = bytes.Clone(p)
	}
	return out
}

// pickPaged files a record found by the page scan under the bucket its
// seal proves, if its key lies in a lost range there, keeping the most
// advanced version. Bodies and spool names cannot be proved: they are
// kept as candidates and checked against their envelope later.
func pickPaged(get func(string) *salvaged, k, v []byte) {
	switch len(k) {
	case 8:
		id := queue.ID(binary.BigEndian.Uint64(k))
		if queue.Sealed(v) {
			if _, err := queue.DecodeMessageRecord(id, v); err == nil {
				keepPaged(get(queue.BucketMessages), k, v, nil)
			}
			return
		}
		for _, n := range []string{queue.BucketBodies, queue.BucketSpool} {
			keepPaged(get(n), k, v, func(old, v []byte) bool { return false })
		}
	case 16: // time(8)|id(8), queue.BucketFinished
		// Perhaps a finished-message record (time|id): used only to keep a
		// message that left the queue from coming back, so an unproved
		// one costs at most a message not recovered, never a duplicate.
		get(queue.BucketFinished).pages[string(k)] = nil
	default:
		key, ok := queue.ParseRecipientKey(k)
		if !ok || !queue.Sealed(v) {
			return
		}
		if r, err := queue.DecodeRecipientRecord(key, v); err == nil {
			keepPaged(get(queue.BucketRecipients), k, v, func(old, _ []byte) bool {
				o, _ := queue.DecodeRecipientRecord(key, old)
				return ahead(&r, &o)
			})
		} else if h, err := queue.DecodeHistoryRecord(key, v, nil); err == nil {
			keepPaged(get(queue.BucketHistory), k, v, func(old, _ []byte) bool {
				o, _ := queue.DecodeHistoryRecord(key, old, nil)
				return len(h) > len(o)
			})
		}
	}
}

// keepPaged keeps v for k in s when k lies in a lost range and no version
// is kept yet, or better says v is ahead of the kept one.
func keepPaged(s *salvaged, k, v []byte, better func(old, v []byte) bool) {
	if _, ok := s.tree[string(k)]; ok || !s.inLost(k) {
		return
	}
	if old, ok := s.pages[string(k)]; ok && (better == nil || !better(old, v)) {
		return
	}
	s.pages[string(k)] = bytes.Clone(v)
}

// ahead reports whether recipient a is a later state than b.
func ahead(a, b *queue.Recipient) bool {
	if a.Status.Final() != b.Status.Final() {
		return a.Status.Final()
	}
	if a.Attempts != b.Attempts {
		return a.Attempts > b.Attempts
	}
	return a.LastAttempt.After(b.LastAttempt)
}

// value returns the current value of k in bucket: the tree's, else the
// page scan's.
func (s *salvaged) value(k []byte) []byte {
	if s == nil {
		return nil
	}
	if v, ok := s.tree[string(k)]; ok {
		return v
	}
	return s.pages[string(k)]
}

// writeSalvaged builds the fresh file at fresh.
func writeSalvaged(fresh, path string, bs map[string]*salvaged, subs map[string]*subtree, seq uint64, now time.Time, rep *Report) error {
	db, err := bolt.Open(fresh, 0o600, &bolt.Options{Timeout: queue.DefaultLockTimeout})
	if err != nil {
		return err
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, n := range queue.Buckets() {
			if _, err := tx.CreateBucketIfNotExists([]byte(n)); err != nil {
				return err
			}
		}
		c := &salvageCopy{tx: tx, bs: bs, spoolDir: queue.SpoolDir(path), rep: rep, seq: seq, now: now}
		if err := c.run(); err != nil {
			return err
		}
		return c.copySubtrees(subs)
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	return err
}

type salvageCopy struct {
	tx       *bolt.Tx
	bs       map[string]*salvaged
	spoolDir string
	rep      *Report
	seq      uint64
	now      time.Time
}

func (c *salvageCopy) run() error {
	ids := c.messageIDs()
	for _, id := range ids {
		if why, err := c.message(id); err != nil {
			return err
		} else if why != "" {
			c.rep.Lost = append(c.rep.Lost, fmt.Sprintf("message %s: %s", id, why))
			c.keepSpoolName(id)
		}
		c.seq = max(c.seq, uint64(id))
	}
	if err := c.tx.Bucket([]byte(queue.BucketMessages)).SetSequence(c.seq); err != nil {
		return err
	}
	if err := c.copyTree(queue.BucketDests, func(k, v []byte) bool { _, err := queue.DecodeDestinationRecord(v); return err == nil }); err != nil {
		return err
	}
	if err := c.copyTree(queue.BucketFinished, func(k, v []byte) bool { _, ok := queue.FinishedID(k); return ok }); err != nil {
		return err
	}
	if err := c.copyStores(); err != nil { // what the TLS policies and reports learned
		return err
	}
	// The journal's salt and applied number, so that Open replays what
	// the database lacks; and the format, so that Open knows the records.
	return c.copyTree(queue.BucketJournal, func(k, v []byte) bool { return true })
}

// messageIDs lists every message queue.ID any recipient or envelope names.
func (c *salvageCopy) messageIDs() []queue.ID {
	seen := map[queue.ID]bool{}
	for _, n := range []string{queue.BucketMessages, queue.BucketRecipients} {
		s := c.bs[n]
		if s == nil {
			continue
		}
		for _, m := range []map[string][]byte{s.tree, s.pages} {
			for k := range m {
				if len(k) >= 8 { // a MessageKey starts both (big-endian)
					seen[queue.ID(binary.BigEndian.Uint64([]byte(k)))] = true
				}
			}
		}
	}
	ids := make([]queue.ID, 0, len(seen))
	for id := range seen {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids
}

func (c *salvageCopy) finished(id queue.ID) bool {
	s := c.bs[queue.BucketFinished]
	if s == nil {
		return false
	}
	for _, m := range []map[string][]byte{s.tree, s.pages} {
		for k := range m {
			if fid, ok := queue.FinishedID([]byte(k)); ok && fid == id {
				return true
			}
		}
	}
	return false
}

// message copies message id; it returns why it could not (and nil).
func (c *salvageCopy) message(id queue.ID) (string, error) {
	k := queue.MessageKey(id)
	mv := c.bs[queue.BucketMessages].value(k)
	if mv == nil {
		if c.finished(id) {
			return "", nil // recipients left behind by a finished message
		}
		return "envelope lost", nil
	}
	m, err := queue.DecodeMessageRecord(id, mv)
	if err != nil {
		return "envelope damaged: " + err.Error(), nil
	}
	if c.finished(id) {
		return "", nil
	}
	body, spool, why := c.body(&m)
	if why != "" {
		return why, nil
	}
	rs, hs := c.recipients(id)
	if len(rs) == 0 {
		return "no live recipient readable", nil
	}
	if err := c.tx.Bucket([]byte(queue.BucketMessages)).Put(k, mv); err != nil {
		return "", err
	}
	if spool != nil {
		err = c.tx.Bucket([]byte(queue.BucketSpool)).Put(k, spool)
	} else {
		err = c.tx.Bucket([]byte(queue.BucketBodies)).Put(k, body)
	}
	if err != nil {
		return "", err
	}
	for i := range rs {
		if err := c.putRcpt(&rs[i], hs[i]); err != nil {
			return "", err
		}
	}
	c.rep.Messages++
	c.rep.Recipients += len(rs)
	return "", nil
}

// body finds message m's body: in the database, or its spool file.
func (c *salvageCopy) body(m *queue.Message) (body, spool []byte, why string) {
	k := queue.MessageKey(m.ID)
	check := func(b []byte) bool { return m.CheckBody(b) == nil }
	if s := c.bs[queue.BucketBodies]; s != nil {
		if v, ok := s.tree[string(k)]; ok {
			if check(v) {
				return v, nil, ""
			}
			return nil, nil, "body fails its checksum"
		}
		if v, ok := s.pages[string(k)]; ok && m.BodySummed() && check(v) {
			return v, nil, ""
		}
	}
	name := c.bs[queue.BucketSpool].value(k)
	if name == nil || !queue.IsSpoolName(name) {
		return nil, nil, "body lost"
	}
	fb, err := os.ReadFile(filepath.Join(c.spoolDir, string(name)))
	if err != nil {
		return nil, nil, "spool file: " + err.Error()
	}
	if !check(fb) {
		return nil, nil, "spool file " + string(name) + " fails its checksum"
	}
	return nil, name, ""
}

// recipients returns the live recipients of id with their raw histories.
func (c *salvageCopy) recipients(id queue.ID) ([]queue.Recipient, [][]byte) {
	var rs []queue.Recipient
	var hs [][]byte
	s := c.bs[queue.BucketRecipients]
	if s == nil {
		return nil, nil
	}
	keys := map[string]bool{}
	for _, m := range []map[string][]byte{s.tree, s.pages} {
		for k := range m {
			if key, ok := queue.ParseRecipientKey([]byte(k)); ok && key.ID == id {
				keys[k] = true
			}
		}
	}
	for k := range keys {
		key, _ := queue.ParseRecipientKey([]byte(k))
		r, err := queue.DecodeRecipientRecord(key, s.value([]byte(k)))
		if err != nil {
			c.rep.Lost = append(c.rep.Lost, fmt.Sprintf("recipient %s: %v", key, err))
			continue
		}
		if r.Status.Final() {
			continue
		}
		h := c.bs[queue.BucketHistory].value([]byte(k))
		if h != nil {
			if _, err := queue.DecodeHistoryRecord(key, h, &r); err != nil {
				h = nil // the state is what matters; a history that does not fit is left out
			}
		}
		if _, current := s.tree[k]; !current {
			r.Salvaged = c.now // from the page scan: an older copy, perhaps
		}
		rs, hs = append(rs, r), append(hs, h)
	}
	return rs, hs
}

// putRcpt stores a recipient as it was, with its due entry and history.
func (c *salvageCopy) putRcpt(r *queue.Recipient, h []byte) error {
	k := queue.RecipientKey(r.Key)
	if err := c.tx.Bucket([]byte(queue.BucketRecipients)).Put(k, queue.EncodeRecipientRecord(r)); err != nil {
		return err
	}
	if h != nil {
		if err := c.tx.Bucket([]byte(queue.BucketHistory)).Put(k, h); err != nil {
			return err
		}
	}
	if !r.Salvaged.IsZero() {
		b, err := c.tx.CreateBucketIfNotExists([]byte(queue.BucketSalvaged))
		if err != nil {
			return err
		}
		if err := b.Put(k, queue.SalvagedMark(r.Salvaged)); err != nil {
			return err
		}
	}
	if dk, dv := queue.DueEntry(r); dk != nil {
		return c.tx.Bucket([]byte(queue.BucketDue)).Put(dk, dv)
	}
	return nil
}

// copyTree copies bucket's current records the tree gave that ok accepts.
func (c *salvageCopy) copyTree(bucket string, ok func(k, v []byte) bool) error {
	s := c.bs[bucket]
	if s == nil {
		return nil
	}
	for k, v := range s.tree {
		if ok([]byte(k), v) {
			if err := c.tx.Bucket([]byte(bucket)).Put([]byte(k), v); err != nil {
				return err
			}
		}
	}
	return nil
}

// copyStores copies the buckets of the queue's stores (queue.Store) the
// tree gave, whoever owns them.
func (c *salvageCopy) copyStores() error {
	names := make([]string, 0, len(c.bs))
	for n := range c.bs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if !queue.IsStoreName([]byte(n)) || len(c.bs[n].tree) == 0 {
			continue
		}
		if _, err := c.tx.CreateBucketIfNotExists([]byte(n)); err != nil {
			return err
		}
		if err := c.copyTree(n, func(k, v []byte) bool { return true }); err != nil {
			return err
		}
	}
	return nil
}

// copySubtrees copies the nested buckets the tree gave (the quarantine's,
// the outbox's sinks), with their sequences, so that a sink's next record
// never takes the key of one copied.
func (c *salvageCopy) copySubtrees(subs map[string]*subtree) error {
	keys := make([]string, 0, len(subs))
	for k := range subs {
		keys = append(keys, k)
	}
	sort.Strings(keys) // parents before children
	for _, key := range keys {
		st := subs[key]
		b, err := c.tx.CreateBucketIfNotExists(st.path[0])
		if err != nil {
			return err
		}
		for _, name := range st.path[1:] {
			if b, err = b.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		for k, v := range st.kv {
			if err := b.Put([]byte(k), v); err != nil {
				return err
			}
		}
		if st.seq > b.Sequence() {
			if err := b.SetSequence(st.seq); err != nil {
				return err
			}
		}
	}
	return nil
}

// keepSpoolName keeps the spool file of a message not copied (the sweep
// at Open would remove it otherwise), under the quarantine bucket.
func (c *salvageCopy) keepSpoolName(id queue.ID) {
	name := c.bs[queue.BucketSpool].value(queue.MessageKey(id))
	if name == nil {
		return
	}
	qb, err := c.tx.Bucket([]byte(queue.BucketQuarantine)).CreateBucketIfNotExists([]byte(queue.BucketSpool))
	if err == nil {
		_ = qb.Put(queue.MessageKey(id), name)
	}
}

// syncDir makes the renames in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

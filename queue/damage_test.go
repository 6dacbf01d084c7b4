package queue

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/queue/boltfile"
	"github.com/greyrelay/greyrelay/queue/journal"
)

// accepted is what a test queue was given: each message's body and the
// recipients still to deliver.
type accepted struct {
	bodies map[ID][]byte
	live   map[Key]string // key → address
}

// fillDamageQueue stores n messages with two recipients each and
// distinct bodies, delivers the first recipient of every third message,
// and leaves the queue open.
func fillDamageQueue(t *testing.T, path string, n int) (*Queue, accepted) {
	t.Helper()
	q := openAt(t, path, Options{})
	acc := accepted{bodies: map[ID][]byte{}, live: map[Key]string{}}
	for i := range n {
		m := msg("s@src.test", fmt.Sprintf("a%d@d%d.test", i, i%7), fmt.Sprintf("b%d@d%d.test", i, i%5))
		m.Body = fmt.Appendf(nil, "Subject: m%d\r\n\r\n%s\r\n", i, strings.Repeat(fmt.Sprintf("line of message %06d ", i), 20))
		id := mustEnqueue(t, q, m)
		acc.bodies[id] = m.Body
		for j, to := range m.To {
			acc.live[Key{id, j}] = to.Addr
		}
		if i%3 == 0 {
			k := Key{id, 0}
			if err := q.Begin(Start{Keys: []Key{k}, Time: t0, LeaseUntil: t0.Add(time.Hour)}); err != nil {
				t.Fatal(err)
			}
			if _, err := q.Apply(Update{Results: []Result{{Key: k, Status: Delivered, End: t0}}}); err != nil {
				t.Fatal(err)
			}
			delete(acc.live, k)
		}
	}
	if err := q.settle(); err != nil {
		t.Fatal(err)
	}
	return q, acc
}

// copyFile copies a queue file as a crash would leave it: an open queue's
// file has no freelist stored, so bbolt's Open walks every page.
func copyFile(t *testing.T, from string) string {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	to := dbPath(t)
	if err := os.MkdirAll(filepath.Dir(to), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return to
}

// bucketRoot returns the root page of a top-level bucket of the file b.
func bucketRoot(t *testing.T, b []byte, name []byte) (uint64, *boltfile.File) {
	t.Helper()
	f := boltfile.New(b, os.Getpagesize())
	p, err := f.Page(f.Meta().Root)
	if err != nil {
		t.Fatal(err)
	}
	_, es, err := boltfile.Elems(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		if bytes.Equal(e.Key, name) {
			return binary.LittleEndian.Uint64(e.Value), f
		}
	}
	t.Fatalf("no bucket %s", name)
	return 0, nil
}

// smashBranch overwrites the element array of the branch page at the
// root of bucket name with a pattern.
func smashBranch(t *testing.T, path string, name []byte) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	root, f := bucketRoot(t, b, name)
	p, err := f.Page(root)
	if err != nil {
		t.Fatal(err)
	}
	if binary.LittleEndian.Uint16(p[8:]) != boltfile.PageBranch {
		t.Fatalf("bucket %s: root page %d is not a branch page (fill more)", name, root)
	}
	off := int(root) * int(f.Meta().PageSize)
	n := int(binary.LittleEndian.Uint16(p[10:]))
	for i := off + boltfile.PageHeaderSize + 4; i < off+boltfile.PageHeaderSize+n*boltfile.PageElemSize; i++ {
		b[i] = byte(0xA5 ^ i)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// mustBeDamaged checks that err is a *DamagedError naming the file and
// the remedy.
func mustBeDamaged(t *testing.T, err error, path string) {
	t.Helper()
	var d *DamagedError
	if !errors.As(err, &d) {
		t.Fatalf("error %v is not a DamagedError", err)
	}
	if abs, _ := filepath.Abs(path); d.Path != abs || !strings.Contains(err.Error(), "greyrelay queue salvage -config") {
		t.Fatalf("error %q does not name %s and the remedy", err, abs)
	}
}

// readAll makes the reads the relay makes at start and by its operator.
func readAll(q *Queue) error {
	if _, err := q.Due(t0.Add(time.Hour), 0); err != nil {
		return err
	}
	if _, _, err := q.List(Filter{}); err != nil {
		return err
	}
	_, err := q.Select(Selector{All: true})
	return err
}

func TestBranchPageDamage(t *testing.T) {
	for _, bucket := range [][]byte{bRcpts, bDue, bMsgs} {
		for _, clean := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s clean=%v", bucket, clean), func(t *testing.T) {
				q, _ := fillDamageQueue(t, dbPath(t), 400)
				var path string
				if clean {
					path = q.path
					q.Close()
				} else {
					path = copyFile(t, q.path)
					q.Close()
				}
				smashBranch(t, path, bucket)
				q2, err := Open(path, Options{LockTimeout: 200 * time.Millisecond, JournalSize: -1})
				if err != nil {
					mustBeDamaged(t, err, path)
					if clean {
						t.Fatalf("a clean file's damage should be found when read, not at Open: %v", err)
					}
					return
				}
				defer q2.Close()
				err = readAll(q2)
				mustBeDamaged(t, err, path)
				select {
				case <-q2.Damaged():
				default:
					t.Fatal("Damaged not closed")
				}
				// Every call is refused from then on, Enqueue too (451).
				if _, err := q2.Enqueue(msg("s@src.test", "x@y.test")); err == nil {
					t.Fatal("Enqueue accepted by a damaged queue")
				}
				if _, err := q2.Stats(); err == nil {
					t.Fatal("Stats answered by a damaged queue")
				}
			})
		}
	}
}

// checkSalvaged opens the salvaged queue and checks that everything in it
// was accepted, unaltered, and that each message in want is there.
func checkSalvaged(t *testing.T, path string, acc accepted, want func(ID) bool) {
	t.Helper()
	q := openAt(t, path, Options{})
	if _, err := q.Recover(t0); err != nil {
		t.Fatal(err)
	}
	due, err := q.Due(t0.Add(48*time.Hour), 0)
	if err != nil {
		t.Fatal(err)
	}
	got := map[ID]bool{}
	for _, r := range due {
		addr, ok := acc.live[r.Key]
		if !ok {
			if _, known := acc.bodies[r.Key.ID]; !known {
				t.Fatalf("salvage made up recipient %s", r.Key)
			}
			// An older copy of a delivered recipient: delivered again,
			// never lost.
			continue
		}
		if r.Addr != addr {
			t.Fatalf("recipient %s: address %q, accepted %q", r.Key, r.Addr, addr)
		}
		got[r.Key.ID] = true
	}
	for id, body := range acc.bodies {
		if !got[id] {
			if want(id) {
				t.Errorf("message %s not recovered", id)
			}
			continue
		}
		b, err := q.Body(id)
		if err != nil || !bytes.Equal(b, body) {
			t.Fatalf("message %s: body differs from the accepted one (%v)", id, err)
		}
	}
	checkStats(t, q)
}

// zeroMeta zeroes meta page i (0 or 1).
func zeroMeta(t *testing.T, path string, i int) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ps := os.Getpagesize()
	if _, err := f.WriteAt(make([]byte, ps), int64(i*ps)); err != nil {
		t.Fatal(err)
	}
}

func TestMetaPagesZeroed(t *testing.T) {
	q, _ := fillDamageQueue(t, dbPath(t), 50)
	path := q.path
	before, err := q.Stats()
	if err != nil {
		t.Fatal(err)
	}
	q.Close()
	zeroMeta(t, path, 0)
	// bbolt keeps two meta pages for this: the other one still opens.
	q2 := openAt(t, path, Options{})
	if _, err := q2.Due(t0, 0); err != nil {
		t.Fatal(err)
	}
	if st, _ := q2.Stats(); st.Recipients != before.Recipients || st.ByStatus[Delivered] != before.ByStatus[Delivered] {
		t.Fatalf("after one meta page zeroed: %+v, before %+v", st, before)
	}
	q2.Close()
	zeroMeta(t, path, 0)
	zeroMeta(t, path, 1)
	_, err = Open(path, Options{LockTimeout: 200 * time.Millisecond})
	mustBeDamaged(t, err, path)
}

func TestTruncatedFileRefused(t *testing.T) {
	q, _ := fillDamageQueue(t, dbPath(t), 400)
	path := q.path
	q.Close()
	fi, _ := os.Stat(path)
	if err := os.Truncate(path, fi.Size()/2); err != nil {
		t.Fatal(err)
	}
	q2, err := Open(path, Options{LockTimeout: 200 * time.Millisecond})
	if err == nil {
		defer q2.Close()
		err = readAll(q2)
	}
	mustBeDamaged(t, err, path)
}

// flipIn flips one byte in every occurrence of needle in file (freed
// pages keep older copies of a page).
func flipIn(t *testing.T, file string, needle []byte) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, needle) {
		t.Fatalf("%q not in %s", needle, file)
	}
	for i := bytes.Index(b, needle); i >= 0; i = bytes.Index(b, needle) {
		b[i+len(needle)/2] ^= 0x20
	}
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestAlteredBodyNeverHandedOut(t *testing.T) {
	for _, spooled := range []bool{false, true} {
		t.Run(fmt.Sprintf("spooled=%v", spooled), func(t *testing.T) {
			q, path := newQ(t)
			body := []byte("Subject: pay\r\n\r\nto account 1234-5678\r\n")
			m := msg("s@src.test", "a@b.test")
			if spooled {
				body = append(bytes.Repeat([]byte("x"), SpoolThreshold), body...)
				m = spooledMsg(t, q, body, "a@b.test")
			} else {
				m.Body = body
			}
			id := mustEnqueue(t, q, m)
			other := mustEnqueue(t, q, msg("s@src.test", "c@d.test"))
			if err := q.settle(); err != nil {
				t.Fatal(err)
			}
			file := path
			if spooled {
				file = filepath.Join(q.spoolDir(), spoolNames(t, q)[0])
			}
			q.Close()
			flipIn(t, file, []byte("1234-5678"))
			var quarantined []string
			q = openAt(t, path, Options{OnQuarantine: func(b string, k []byte, err error) {
				quarantined = append(quarantined, b)
			}})
			if b, err := q.Body(id); !errors.Is(err, ErrNotFound) {
				t.Fatalf("altered body handed out (%d octets), %v", len(b), err)
			}
			if len(quarantined) == 0 {
				t.Fatal("altered body not quarantined")
			}
			due, err := q.Due(t0.Add(time.Hour), 0)
			if err != nil || len(due) != 1 || due[0].Key.ID != other {
				t.Fatalf("due after quarantine: %v %v", keysOf(due), err)
			}
			if _, err := q.Body(other); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestSealDetectsEveryBitFlip: CRC-32C catches every single-bit error in
// a sealed record, and a record moved to another key.
func TestSealDetectsEveryBitFlip(t *testing.T) {
	m, r, h, _ := sampleRecords()
	m.ID, r.Key = 7, Key{7, 1}
	recs := []struct {
		name   string
		b      []byte
		decode func([]byte) error
	}{
		{"message", encodeMessage(&m), func(b []byte) error { _, err := decodeMessage(7, b); return err }},
		{"recipient", encodeRecipient(&r), func(b []byte) error { _, err := decodeRecipient(r.Key, b); return err }},
		{"history", encodeHistory(r.Key, h, historyRef(&r)), func(b []byte) error {
			_, err := decodeHistory(r.Key, b, historyRef(&r))
			return err
		}},
	}
	for _, c := range recs {
		if err := c.decode(c.b); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		for i := range len(c.b) * 8 {
			b := bytes.Clone(c.b)
			b[i/8] ^= 1 << (i % 8)
			if err := c.decode(b); !errors.Is(err, errCorrupt) {
				t.Fatalf("%s: bit %d flipped: %v", c.name, i, err)
			}
		}
	}
	if _, err := decodeRecipient(Key{7, 2}, encodeRecipient(&r)); !errors.Is(err, errChecksum) {
		t.Fatalf("recipient under another key: %v", err)
	}
}

// TestUnsealedRecordsStillRead: records written before checksums decode.
func TestUnsealedRecordsStillRead(t *testing.T) {
	m, r, h, _ := sampleRecords()
	m.ID, r.Key = 7, Key{7, 1}
	unsealed := func(b []byte) []byte {
		b = bytes.Clone(b[:len(b)-sealSize])
		b[0] &^= sealedFlag
		return b
	}
	if got, err := decodeRecipient(r.Key, unsealed(encodeRecipient(&r))); err != nil || got.Addr != r.Addr {
		t.Fatalf("recipient: %+v %v", got, err)
	}
	if got, err := decodeHistory(r.Key, unsealed(encodeHistory(r.Key, h, historyRef(&r))), historyRef(&r)); err != nil || len(got) != len(h) {
		t.Fatalf("history: %+v %v", got, err)
	}
	// A version 1 message record: no body checksum, no seal.
	e := newEncV(1)
	e.s(m.From)
	e.t(m.Arrival)
	e.i(m.Size)
	for range 5 {
		e.s("")
	}
	e.u(0)
	got, err := decodeMessageRec(7, e.b)
	if err != nil || got.From != m.From || got.bodySummed {
		t.Fatalf("v1 message: %+v %v", got, err)
	}
	if err := checkBody(&got, []byte("anything")); err != nil {
		t.Fatalf("a body without a stored checksum is read as it is: %v", err)
	}
}

// TestJournalCarriesSpoolChecksum: a spooled body's checksum survives the
// intake journal; a record of an older greyrelay (body kind 1) has none,
// and its file is read as it is.
func TestJournalCarriesSpoolChecksum(t *testing.T) {
	m := msg("s@x.test", "r@a.test")
	m.Body, m.File = nil, &BodyFile{name: "body-1", n: 10, sum: 0xdeadbeef, summed: true}
	rec, _ := encodeRecord([8]byte{}, 1, []NewMessage{m}, []ID{3})
	out, _, err := decodeRecord(rec[journal.RecordHead:])
	if err != nil || !out[0].File.summed || out[0].File.sum != 0xdeadbeef {
		t.Fatalf("decoded %+v, %v", out[0].File, err)
	}
	e := &enc{b: []byte{journalVersion}}
	e.u(1)
	e.u(3)
	m.File = nil
	m.Body = []byte{}
	encodeNew(e, &m)
	e.b = e.b[:len(e.b)-2] // the inline body (kind 0, length 0) …
	e.u(1)                 // … becomes a kind 1 file without checksum
	e.s("body-2")
	e.i(10)
	out, _, err = decodeRecord(e.b)
	if err != nil || out[0].File == nil || out[0].File.summed {
		t.Fatalf("kind 1: %+v, %v", out, err)
	}
}

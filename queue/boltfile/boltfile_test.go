package boltfile

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// writeFile makes a bbolt file with a bucket large enough for branch
// pages ("big", n keys), a small one bbolt keeps inline ("small"), and a
// nested bucket with a sequence ("outer"/"inner"), and returns its bytes.
func writeFile(t testing.TB, n int) []byte {
	t.Helper()
	path := filepath.Join(t.TempDir(), "f.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		big, err := tx.CreateBucket([]byte("big"))
		if err != nil {
			return err
		}
		for i := range n {
			if err := big.Put(fmt.Appendf(nil, "k%06d", i), bytes.Repeat([]byte{byte(i)}, 100)); err != nil {
				return err
			}
		}
		small, err := tx.CreateBucket([]byte("small"))
		if err != nil {
			return err
		}
		if err := small.Put([]byte("a"), []byte("1")); err != nil {
			return err
		}
		outer, err := tx.CreateBucket([]byte("outer"))
		if err != nil {
			return err
		}
		inner, err := outer.CreateBucket([]byte("inner"))
		if err != nil {
			return err
		}
		if err := inner.SetSequence(42); err != nil {
			return err
		}
		return inner.Put([]byte("x"), []byte("y"))
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// collect walks b and returns every pair by "bucket/path key", the
// sequences by bucket path, and the problems met.
func collect(b []byte) (kv map[string]string, seqs map[string]uint64, lost []string, errs []error) {
	kv, seqs = map[string]string{}, map[string]uint64{}
	name := func(path [][]byte) string { return string(bytes.Join(path, []byte("/"))) }
	errs = New(b, os.Getpagesize()).Walk(Visitor{
		KV:   func(path [][]byte, k, v []byte) { kv[name(path)+" "+string(k)] = string(v) },
		Seq:  func(path [][]byte, s uint64) { seqs[name(path)] = s },
		Lost: func(path [][]byte, lo, hi []byte, err error) { lost = append(lost, name(path)) },
	})
	return kv, seqs, lost, errs
}

func TestWalkReadsEveryRecord(t *testing.T) {
	const n = 500
	b := writeFile(t, n)
	if err := Check(b, os.Getpagesize()); err != nil {
		t.Fatalf("a sound file: %v", err)
	}
	kv, seqs, lost, errs := collect(b)
	if len(errs) != 0 || len(lost) != 0 {
		t.Fatalf("a sound file: %v, lost %v", errs, lost)
	}
	if len(kv) != n+2 {
		t.Errorf("%d pairs, want %d", len(kv), n+2)
	}
	for k, want := range map[string]string{"small a": "1", "outer/inner x": "y",
		"big k000007": string(bytes.Repeat([]byte{7}, 100))} {
		if kv[k] != want {
			t.Errorf("%s: %q, want %q", k, kv[k], want)
		}
	}
	if seqs["outer/inner"] != 42 {
		t.Errorf("sequence of outer/inner: %d, want 42", seqs["outer/inner"])
	}
}

// A branch page whose elements are overwritten is found by Check before
// bbolt follows it; Walk notes the bucket's range as lost and reads the
// others; ScanPages still finds the records on the leaf pages it pointed
// to.
func TestDamagedBranchPage(t *testing.T) {
	b := writeFile(t, 500)
	f := New(b, os.Getpagesize())
	root, err := f.Page(f.Meta().Root)
	if err != nil {
		t.Fatal(err)
	}
	_, es, err := Elems(root)
	if err != nil {
		t.Fatal(err)
	}
	var big uint64
	for _, e := range es {
		if string(e.Key) == "big" {
			big = binary.LittleEndian.Uint64(e.Value)
		}
	}
	p, err := f.Page(big)
	if err != nil || binary.LittleEndian.Uint16(p[8:]) != PageBranch {
		t.Fatalf("bucket big: page %d is not a branch page (%v)", big, err)
	}
	off := int(big) * int(f.Meta().PageSize)
	for i := off + PageHeaderSize + 4; i < off+PageHeaderSize+int(binary.LittleEndian.Uint16(p[10:]))*PageElemSize; i++ {
		b[i] = byte(0xA5 ^ i)
	}
	if err := Check(b, os.Getpagesize()); err == nil {
		t.Fatal("Check passes a smashed branch page")
	}
	kv, _, lost, _ := collect(b)
	if len(lost) == 0 || lost[0] != "big" {
		t.Errorf("lost ranges in %v, want in big", lost)
	}
	if kv["small a"] != "1" || kv["outer/inner x"] != "y" {
		t.Errorf("the other buckets were not read: %v", kv)
	}
	scanned := 0
	New(b, os.Getpagesize()).ScanPages(func(bucket, k, v []byte) {
		if bytes.HasPrefix(k, []byte("k")) && len(v) == 100 {
			scanned++
		}
	})
	if scanned < 500 {
		t.Errorf("the page scan found %d of the 500 records of big", scanned)
	}
}

// FuzzFile: Check, Walk and ScanPages never panic and always end, whatever
// damage a bbolt file takes. The input is a damage script as in
// queue/salvage's FuzzPageFile.
func FuzzFile(f *testing.F) {
	seed := writeFile(f, 300)
	f.Add([]byte{})
	f.Add([]byte{0x20, 0x00, 0xff})
	f.Add([]byte{0x00, 0x10, 0xff, 0x00, 0x11, 0x0f})
	f.Add([]byte{0x80})
	f.Fuzz(func(t *testing.T, script []byte) {
		b := bytes.Clone(seed)
		for ; len(script) >= 3; script = script[3:] {
			b[int(binary.BigEndian.Uint16(script))*len(b)>>16] ^= script[2]
		}
		if len(script) > 0 {
			b = b[:len(b)*int(script[0])>>8]
		}
		_ = Check(b, 4096)
		collect(b)
		New(b, 4096).ScanPages(func(_, _, _ []byte) {})
	})
}

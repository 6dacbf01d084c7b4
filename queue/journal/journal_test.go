package journal

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// record seals payload as record seq of a file with salt.
func record(salt [8]byte, seq uint64, payload []byte) []byte {
	rec := append(make([]byte, RecordHead), payload...)
	Seal(rec, salt, seq)
	return rec
}

// journalImage builds a journal file of the given records.
func journalImage(salt [8]byte, recs ...[]byte) []byte {
	b := append([]byte(fileMagic), salt[:]...)
	b = append(b, 0, 0, 0, 0)
	for _, r := range recs {
		b = append(b, r...)
	}
	return b
}

// scanned is one record read back.
type scanned struct {
	seq     uint64
	payload []byte
}

// parse returns the records of a journal file image b numbered above
// applied, in order, up to the first one that is not whole, not valid, or
// not numbered one above the previous.
func parse(b []byte, salt [8]byte, applied uint64) ([]scanned, uint64) {
	var out []scanned
	last, _ := ScanImage(bytes.NewReader(b), int64(len(b)), salt, applied, func(seq uint64, payload []byte) error {
		out = append(out, scanned{seq, payload})
		return nil
	})
	return out, last
}

func TestScanImage(t *testing.T) {
	salt := [8]byte{1, 2, 3, 4, 5, 6, 7, 8}
	rec := func(seq uint64) []byte { return record(salt, seq, []byte("message of record "+string(rune('0'+seq)))) }
	flip := func(b []byte, i int) []byte { b = bytes.Clone(b); b[i] ^= 1; return b }
	r1, r2, r3 := rec(7), rec(8), rec(9)
	tests := []struct {
		name string
		img  []byte
		salt [8]byte
		want []uint64
	}{
		{"three", journalImage(salt, r1, r2, r3), salt, []uint64{7, 8, 9}},
		{"torn last", journalImage(salt, r1, r2, r3[:len(r3)-1]), salt, []uint64{7, 8}},
		{"bad CRC in the middle", journalImage(salt, r1, flip(r2, len(r2)-1), r3), salt, []uint64{7}},
		{"bad magic", journalImage(salt, flip(r1, 0)), salt, nil},
		{"gap in numbers", journalImage(salt, r1, r3), salt, []uint64{7}},
		{"older record behind the write position", journalImage(salt, r2, r3, r1), salt, []uint64{8, 9}},
		{"other file's salt", journalImage(salt, r1), [8]byte{9}, nil},
		{"zeros after", append(journalImage(salt, r1), make([]byte, 100)...), salt, []uint64{7}},
		{"header only", journalImage(salt), salt, nil},
		{"short", []byte("GRJ"), salt, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []uint64
			recs, _ := parse(tt.img, tt.salt, 0)
			for _, r := range recs {
				got = append(got, r.seq)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("records %v, want %v", got, tt.want)
			}
		})
	}
}

// Records up to applied are stepped over without their payload being
// checked (the database holds them); the walk still returns the last
// number and hands over only the later records.
func TestScanImageApplied(t *testing.T) {
	salt := [8]byte{3}
	bad := record(salt, 8, []byte("eight"))
	bad[len(bad)-1] ^= 1 // its CRC fails: never read when applied
	img := journalImage(salt, record(salt, 7, []byte("seven")), bad, record(salt, 9, []byte("nine")))
	recs, last := parse(img, salt, 8)
	if len(recs) != 1 || recs[0].seq != 9 || string(recs[0].payload) != "nine" || last != 9 {
		t.Errorf("records %+v, last %d; want record 9 only, last 9", recs, last)
	}
	if recs, last := parse(img, salt, 20); len(recs) != 0 || last != 20 {
		t.Errorf("all applied: records %+v, last %d; want none, 20", recs, last)
	}
	want := errors.New("stop")
	if _, err := ScanImage(bytes.NewReader(img), int64(len(img)), salt, 8, func(uint64, []byte) error { return want }); err != want {
		t.Errorf("ScanImage error %v, want fn's", err)
	}
}

// A file written by Append reads back with Scan, also after a reopen; the
// salt survives the reopen, Reset changes it, and a file that is not a
// journal is refused.
func TestFileAppendScan(t *testing.T) {
	path := filepath.Join(t.TempDir(), "j")
	j, created, err := Open(path, MinSize)
	if err != nil || !created {
		t.Fatalf("Open: %v, created %v", err, created)
	}
	for seq := uint64(1); seq <= 3; seq++ {
		if !j.Fits(RecordHead + 5) {
			t.Fatal("a small record does not fit an empty journal")
		}
		if err := j.Append(record(j.Salt(), seq, []byte("body"+string(rune('0'+seq))))); err != nil {
			t.Fatal(err)
		}
	}
	if j.AtFront() || j.Size() != MinSize {
		t.Errorf("after three records: at front %v, size %d; want false, %d", j.AtFront(), j.Size(), MinSize)
	}
	salt := j.Salt()
	j.Close()
	j, created, err = Open(path, MinSize)
	if err != nil || created || j.Salt() != salt {
		t.Fatalf("reopen: %v, created %v, same salt %v", err, created, j.Salt() == salt)
	}
	var got []string
	last, err := j.Scan(1, func(seq uint64, p []byte) error { got = append(got, string(p)); return nil })
	if err != nil || last != 3 || !reflect.DeepEqual(got, []string{"body2", "body3"}) {
		t.Errorf("Scan = %v, %d, %v; want body2 body3, 3", got, last, err)
	}
	if err := j.Reset(); err != nil || j.Salt() == salt {
		t.Fatalf("Reset: %v, salt changed %v", err, j.Salt() != salt)
	}
	if last, _ := j.Scan(0, func(uint64, []byte) error { t.Error("a record after Reset"); return nil }); last != 0 {
		t.Errorf("after Reset: last %d", last)
	}
	j.Close()
	other := filepath.Join(t.TempDir(), "other")
	if err := os.WriteFile(other, bytes.Repeat([]byte("x"), 64), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Open(other, MinSize); err == nil {
		t.Error("a file that is not a journal was opened")
	}
}

// The write position: records too large for the room left do not fit;
// Rewind starts again at the front; a record over half the room is too
// large for the journal at all.
func TestFileRoom(t *testing.T) {
	j, _, err := Open(filepath.Join(t.TempDir(), "j"), MinSize)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	half := int(MinSize-fileHead) / 2
	if j.TooLarge(half) || !j.TooLarge(half+1) {
		t.Errorf("TooLarge(%d) %v, TooLarge(%d) %v; want false, true", half, j.TooLarge(half), half+1, j.TooLarge(half+1))
	}
	rec := record(j.Salt(), 1, make([]byte, half-RecordHead))
	for seq := uint64(1); j.Fits(len(rec)); seq++ {
		Seal(rec, j.Salt(), seq)
		if err := j.Append(rec); err != nil {
			t.Fatal(err)
		}
	}
	if j.Offset() != fileHead+2*int64(len(rec)) {
		t.Errorf("offset %d after filling, want %d", j.Offset(), fileHead+2*int64(len(rec)))
	}
	if !j.FitsAtFront(len(rec)) {
		t.Error("a record written before does not fit at the front")
	}
	j.Rewind()
	if !j.AtFront() || !j.Fits(len(rec)) {
		t.Error("after Rewind the record does not fit")
	}
}

// FuzzScanImage: the reader never panics on any file, and every record it
// hands over is one it would read again, alone, at the front of a file.
func FuzzScanImage(f *testing.F) {
	salt := [8]byte{}
	f.Add(journalImage(salt, record(salt, 1, []byte("payload")), record(salt, 2, nil)))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		recs, _ := parse(b, salt, 0)
		for _, r := range recs {
			again, _ := parse(journalImage(salt, record(salt, r.seq, r.payload)), salt, 0)
			if len(again) != 1 || !bytes.Equal(again[0].payload, r.payload) {
				t.Fatalf("record %d does not read back alone", r.seq)
			}
		}
	})
}

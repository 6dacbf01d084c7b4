package salvage

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

	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/queue/boltfile"
)

// The salvage of damaged files is tested beside the queue
// (queue/salvage_test.go), against the queue's own invariants.

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// msg builds a message to addrs, arriving at t0.
func msg(from string, addrs ...string) queue.NewMessage {
	m := queue.NewMessage{From: from, Arrival: t0, Body: []byte("Subject: hi\r\n\r\nbody " + strings.Join(addrs, ",") + "\r\n")}
	for _, a := range addrs {
		m.To = append(m.To, queue.NewRecipient{Addr: a, Domain: a[strings.LastIndexByte(a, '@')+1:]})
	}
	return m
}

func TestSalvageRefusesAHeldQueue(t *testing.T) {
	path := filepath.Join(t.TempDir(), "q.db")
	q, err := queue.Open(path, queue.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if _, err := q.Enqueue(msg("s@src.test", "a@b.test")); err != nil {
		t.Fatal(err)
	}
	if _, err := Salvage(path, t0); !errors.Is(err, queue.ErrLocked) {
		t.Fatalf("Salvage of an open queue: %v", err)
	}
}

// FuzzPageFile: the page reader never panics and always ends, whatever
// damage a real queue file takes, nor does salvage's reading of it. The
// input is a damage script, not the file (a small input keeps the
// fuzzer's minimisation quick): each three bytes XOR one byte of the file
// at a position spread over its length, and a last byte left over cuts
// the file to that many 256ths.
func FuzzPageFile(f *testing.F) {
	path := filepath.Join(f.TempDir(), "q.db")
	q, err := queue.Open(path, queue.Options{JournalSize: -1})
	if err != nil {
		f.Fatal(err)
	}
	for i := range 40 {
		if _, err := q.Enqueue(msg("s@src.test", fmt.Sprintf("a%d@b.test", i), fmt.Sprintf("c%d@d.test", i))); err != nil {
			f.Fatal(err)
		}
	}
	q.Close()
	seed, err := os.ReadFile(path)
	if err != nil {
		f.Fatal(err)
	}
	f.Add([]byte{})
	f.Add([]byte{0x20, 0x00, 0xff})                   // a page header
	f.Add([]byte{0x00, 0x10, 0xff, 0x00, 0x11, 0x0f}) // meta page 0
	f.Add([]byte{0x80})                               // cut in half
	f.Fuzz(func(t *testing.T, script []byte) {
		b := bytes.Clone(seed)
		for ; len(script) >= 3; script = script[3:] {
			b[int(binary.BigEndian.Uint16(script))*len(b)>>16] ^= script[2]
		}
		if len(script) > 0 {
			b = b[:len(b)*int(script[0])>>8]
		}
		_ = boltfile.Check(b, 4096)
		boltfile.New(b, 4096).ScanPages(func(_, _, _ []byte) {})
		readDamaged(b, &Report{})
	})
}

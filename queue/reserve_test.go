package queue

import (
	"errors"
	"sync/atomic"
	"syscall"
	"testing"
)

// Enqueue keeps Options.Reserve free: a message that would leave less
// (counting the journal's growth and its copy in the database) is refused
// with an error matching ENOSPC before anything is written, and one that
// fits is taken.
func TestReserveKeptByEnqueue(t *testing.T) {
	const reserve = 1 << 20
	body := 64 << 10
	tests := []struct {
		name   string
		free   uint64
		wantOK bool
	}{
		{"plenty", 64 << 20, true},
		{"the reserve and the journal's first step and the copy", reserve + 1<<20 + uint64(body) + 16<<10, true},
		{"only the reserve", reserve, false},
		{"nothing", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var free atomic.Uint64
			free.Store(tt.free)
			q := openAt(t, dbPath(t), Options{Reserve: reserve, DiskFree: func() (uint64, error) { return free.Load(), nil }})
			m := msg("s@x.test", "a@a.test")
			m.Body = append(m.Body, make([]byte, body)...)
			off := q.jrnl.Offset()
			_, err := q.Enqueue(m)
			switch {
			case tt.wantOK && err != nil:
				t.Fatalf("Enqueue with %d free: %v", tt.free, err)
			case !tt.wantOK && !errors.Is(err, syscall.ENOSPC):
				t.Fatalf("Enqueue with %d free: %v, want an error matching ENOSPC", tt.free, err)
			case !tt.wantOK && q.jrnl.Offset() != off:
				t.Fatalf("a refused Enqueue wrote to the journal (%d → %d)", off, q.jrnl.Offset())
			}
			st, err := q.Stats()
			if err != nil {
				t.Fatal(err)
			}
			if want := map[bool]int{true: 1, false: 0}[tt.wantOK]; st.Messages != want {
				t.Errorf("%d messages stored, want %d", st.Messages, want)
			}
			if q.owed.Load() != 0 {
				t.Errorf("owed %d after the database took everything, want 0", q.owed.Load())
			}
		})
	}
}

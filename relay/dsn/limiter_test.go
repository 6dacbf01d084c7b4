package dsn

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

func TestLimiterWindow(t *testing.T) {
	l := NewLimiter(3)
	steps := []struct {
		sender string
		at     time.Duration
		want   bool
	}{
		{"a@x", 0, true},
		{"a@x", time.Minute, true},
		{"A@X", 2 * time.Minute, true}, // same sender, other case
		{"a@x", 3 * time.Minute, false},
		{"b@x", 3 * time.Minute, true}, // other senders are independent
		{"a@x", 59 * time.Minute, false},
		{"a@x", time.Hour, true}, // window opened at 0 has ended
		{"a@x", time.Hour + time.Second, true},
		{"a@x", time.Hour + 2*time.Second, true},
		{"a@x", time.Hour + 3*time.Second, false},
		{"a@x", 30 * time.Minute, false}, // clock went back: still capped
		{"a@x", 30*time.Minute + 59*time.Minute, false},
		{"a@x", 30*time.Minute + time.Hour, true},
	}
	for i, s := range steps {
		if got := l.Allow(s.sender, t0.Add(s.at)); got != s.want {
			t.Errorf("step %d: Allow(%q, +%v) = %v, want %v", i, s.sender, s.at, got, s.want)
		}
	}
}

func TestLimiterUncapped(t *testing.T) {
	var nilLimiter *Limiter
	for _, l := range []*Limiter{nilLimiter, NewLimiter(0), NewLimiter(-1)} {
		for i := range 100 {
			if !l.Allow("a@x", t0) {
				t.Fatalf("%v: call %d denied", l, i)
			}
		}
	}
}

func TestLimiterBoundedMemory(t *testing.T) {
	l := NewLimiter(1)
	for i := range maxSenders + 500 {
		l.Allow(fmt.Sprintf("s%d@x", i), t0.Add(time.Duration(i)*time.Millisecond))
	}
	if n := len(l.senders); n > maxSenders {
		t.Fatalf("%d senders kept, cap %d", n, maxSenders)
	}
	// The newest sender is still capped; the oldest was forgotten.
	if l.Allow(fmt.Sprintf("s%d@x", maxSenders+499), t0.Add(time.Hour/2)) {
		t.Error("newest sender not capped")
	}
	// Expired windows are swept in one go when the table is full.
	l.Allow("late@x", t0.Add(3*time.Hour))
	if n := len(l.senders); n != 1 {
		t.Errorf("%d senders after all windows expired, want 1", n)
	}
}

func TestLimiterConcurrent(t *testing.T) {
	l := NewLimiter(50)
	var wg sync.WaitGroup
	var mu sync.Mutex
	allowed := 0
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				if l.Allow("storm@x", t0.Add(time.Duration(g*100+i)*time.Millisecond)) {
					mu.Lock()
					allowed++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if allowed != 50 {
		t.Errorf("%d DSNs allowed under concurrent use, want 50", allowed)
	}
}

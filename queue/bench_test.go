package queue

import (
	"fmt"
	"testing"
	"time"
)

// Benchmarks measure; no unit test asserts timings.

func BenchmarkEnqueue4K(b *testing.B) {
	q := openAt(b, dbPath(b), Options{})
	m := msg("s@x.test", "r1@a.test", "r2@b.test")
	m.Body = make([]byte, 4096)
	b.SetParallelism(16) // many concurrent SMTP sessions: exercises group commit
	b.SetBytes(int64(len(m.Body)))
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := q.Enqueue(m); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// fill enqueues n small one-recipient messages in batches.
func fill(b *testing.B, q *Queue, n int) {
	b.Helper()
	const batch = 1000
	for done := 0; done < n; done += batch {
		ms := make([]NewMessage, min(batch, n-done))
		for i := range ms {
			ms[i] = msg(fmt.Sprintf("s%d@x.test", i%7), fmt.Sprintf("r%d@d%d.test", i, i%50))
			ms[i].NextAttempt = t0.Add(time.Duration(done+i) * time.Second)
		}
		if _, err := q.EnqueueBatch(ms); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkList100k(b *testing.B) {
	q := openAt(b, dbPath(b), Options{})
	fill(b, q, 100_000)
	b.ResetTimer()
	for b.Loop() {
		rows, total, err := q.List(Filter{Domain: "d7.test", Offset: 100, Limit: 50})
		if err != nil || total != 2000 || len(rows) != 50 {
			b.Fatalf("List: %d rows, total %d, %v", len(rows), total, err)
		}
	}
}

func BenchmarkOpenScan100k(b *testing.B) { benchmarkOpen(b, Options{FullScan: true}) }

// BenchmarkOpen100k is a normal start: the stored counters, no scan.
func BenchmarkOpen100k(b *testing.B) { benchmarkOpen(b, Options{}) }

func benchmarkOpen(b *testing.B, opt Options) {
	path := dbPath(b)
	q := openAt(b, path, Options{})
	fill(b, q, 100_000)
	q.Close()
	b.ResetTimer()
	for b.Loop() {
		q, err := Open(path, opt)
		if err != nil {
			b.Fatal(err)
		}
		q.Close()
	}
}

func BenchmarkDue100k(b *testing.B) {
	q := openAt(b, dbPath(b), Options{})
	fill(b, q, 100_000)
	now := t0.Add(50_000 * time.Second)
	b.ResetTimer()
	for b.Loop() {
		if rs, err := q.Due(now, 100); err != nil || len(rs) != 100 {
			b.Fatalf("Due: %d, %v", len(rs), err)
		}
	}
}

func BenchmarkStats(b *testing.B) {
	q := openAt(b, dbPath(b), Options{})
	fill(b, q, 10_000)
	b.ResetTimer()
	for b.Loop() {
		if _, err := q.Stats(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkList100kBySender filters on the message only: the recipients
// of messages that do not match are never decoded.
func BenchmarkList100kBySender(b *testing.B) {
	q := openAt(b, dbPath(b), Options{})
	fill(b, q, 100_000)
	b.ResetTimer()
	for b.Loop() {
		rows, total, err := q.List(Filter{Sender: "s3@x.test", Limit: 50})
		if err != nil || total < 14_000 || len(rows) != 50 {
			b.Fatalf("List: %d rows, total %d, %v", len(rows), total, err)
		}
	}
}

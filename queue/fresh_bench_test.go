//go:build unix

package queue

import (
	"syscall"
	"testing"
	"time"
)

// BenchmarkFreshCycle is the queue traffic of a message delivered from
// the journal's copy (Fresh): Enqueue, then the outcome with its start
// (Update.Starts) handed over with ApplyAsync, collected after the next
// Enqueue; finished records kept and commits delayed as by the relay's
// defaults. It reports the process's
// CPU time per message (cpu-µs/op), which a busy machine changes less
// than the time per message. Measure only; nothing is asserted.
func BenchmarkFreshCycle(b *testing.B) {
	q := openAt(b, dbPath(b), Options{History: keepWeek, CommitDelay: 10 * time.Millisecond})
	b.SetParallelism(10)
	before := cpuTime(b)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var p *Pending
		for pb.Next() {
			id, err := q.Enqueue(msg("s@x.test", "r@a.test"))
			if p != nil && err == nil {
				_, err = p.Wait()
			}
			if err != nil {
				b.Error(err)
				return
			}
			p = q.ApplyAsync(Update{
				Starts:  []Start{{Keys: []Key{{id, 0}}, Time: t0, MXHost: "mx.a.test", LeaseUntil: t0.Add(time.Hour)}},
				Results: []Result{{Key: Key{id, 0}, Status: Delivered, End: t0, Reply: Reply{Code: 250, Text: "ok"}}},
			})
		}
		if p != nil {
			_, _ = p.Wait()
		}
	})
	b.StopTimer()
	b.ReportMetric(float64((cpuTime(b)-before).Microseconds())/float64(b.N), "cpu-µs/op")
}

// cpuTime is the user and system CPU time the process has used.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

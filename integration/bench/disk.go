package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// runDisk is `bench disk`: the latency of one 4 KiB write plus fdatasync
// on the disk under $TMPDIR, where every benchmark keeps its queues. A
// durable queue can commit at most 1/latency times per second per writer;
// group commit is how greyrelay gets more messages than that through.
func runDisk(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("disk", flag.ContinueOnError)
	n := fs.Int("n", 500, "writes")
	if err := fs.Parse(args); err != nil {
		return err
	}
	e, err := newEnv("", false)
	if err != nil {
		return err
	}
	defer e.close()
	machine(os.Stdout, e.root)
	f, err := os.OpenFile(filepath.Join(e.root, "fsync-probe"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, 4096)
	var lat []time.Duration
	for i := 0; i < *n && ctx.Err() == nil; i++ {
		t0 := time.Now()
		if _, err := f.WriteAt(buf, int64(i%256)*4096); err != nil {
			return err
		}
		if err := f.Sync(); err != nil {
			return err
		}
		lat = append(lat, time.Since(t0))
	}
	s := sortDurations(lat)
	fmt.Printf("## disk: %d × (4 KiB write + fsync) in %s\n\n", len(s), e.root)
	t := &table{head: []string{"p50 ms", "p90 ms", "p99 ms", "max ms", "fsyncs/s one writer"}}
	t.add(ms(percentile(s, 50)), ms(percentile(s, 90)), ms(percentile(s, 99)), ms(s[len(s)-1]),
		f0(1/percentile(s, 50).Seconds()))
	t.write(os.Stdout)
	return nil
}

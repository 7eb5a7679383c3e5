package fleet

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/berthvm/berth/session/fleet/fleettest"
)

func pct(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// TestBenchPlacement: 1,000 placements on 50 hosts against an embedded
// member, one front door and then three at once, against a single etcd
// Put of a spec-sized value measured in the same run; and etcd writes
// (revisions) per placement.
func TestBenchPlacement(t *testing.T) {
	if os.Getenv("BERTH_BENCH") == "" {
		t.Skip("set BERTH_BENCH=1 (make bench)")
	}
	const n, hosts = 1000, 50
	eps := fleettest.Etcd(t)
	cli := dial(t, eps)
	ctx := context.Background()
	for i := range hosts {
		h, err := Join(ctx, cli, HostConfig{ID: fmt.Sprintf("h%d", i), TTL: time.Minute, Refresh: time.Hour,
			Facts: func(context.Context) (Facts, error) {
				return Facts{CPUs: 1 << 12, MemoryMiB: 1 << 30, DiskFree: 1 << 50, Images: []string{"mini"}}, nil
			}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.leaveOnce(ctx) })
	}
	spec := mustJSON(opts("baseline-spec-value", 2, 1024))
	put := make([]time.Duration, n)
	for i := range n {
		start := time.Now()
		if _, err := cli.Put(ctx, fmt.Sprintf("/bench/k%d", i), spec); err != nil {
			t.Fatal(err)
		}
		put[i] = time.Since(start)
	}
	rev := func() int64 {
		r, err := cli.Get(ctx, "/bench/k0")
		if err != nil {
			t.Fatal(err)
		}
		return r.Header.Revision
	}

	// One front door.
	before := rev()
	one := make([]time.Duration, n)
	tries := 0
	for i := range n {
		start := time.Now()
		p, err := Place(ctx, cli, Request{Opts: opts(fmt.Sprintf("s%d", i), 2, 1024)})
		if err != nil {
			t.Fatal(err)
		}
		one[i] = time.Since(start)
		tries += p.Tries
	}
	writes := float64(rev()-before) / n

	// Three front doors at once, 1,000 placements in all.
	doors := frontDoors(t, eps, 3)
	three := make([]time.Duration, n)
	var mu sync.Mutex
	var wg sync.WaitGroup
	tries3 := 0
	before = rev()
	for d, door := range doors {
		wg.Go(func() {
			for i := d; i < n; i += len(doors) {
				start := time.Now()
				p, err := Place(ctx, door, Request{Opts: opts(fmt.Sprintf("c%d", i), 2, 1024)})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				three[i] = time.Since(start)
				tries3 += p.Tries
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	writes3 := float64(rev()-before) / n
	base := pct(put, 0.5)
	t.Logf("BENCH %-40s p50 %8s p99 %8s", "etcd Put (baseline)", base.Round(time.Microsecond), pct(put, 0.99).Round(time.Microsecond))
	t.Logf("BENCH %-40s p50 %8s p99 %8s  ratio %.2fx p50 vs Put; %.2f etcd writes (revisions, 3 keys each) and %.2f transactions tried per placement",
		"placement, 1 front door, 50 hosts", pct(one, 0.5).Round(time.Microsecond), pct(one, 0.99).Round(time.Microsecond),
		float64(pct(one, 0.5))/float64(base), writes, float64(tries)/n)
	t.Logf("BENCH %-40s p50 %8s p99 %8s  ratio %.2fx p50 vs Put; %.2f etcd writes and %.2f transactions tried per placement",
		"placement, 3 front doors at once", pct(three, 0.5).Round(time.Microsecond), pct(three, 0.99).Round(time.Microsecond),
		float64(pct(three, 0.5))/float64(base), writes3, float64(tries3)/n)
}

package engine_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/vmm"
	"github.com/berthvm/berth/vmm/qemu"
	"github.com/berthvm/berth/vmm/vmmtest"
)

// TestBenchBulk prints issue 28's bulk figures (item 5): the raw channel
// each way (and what the host's write size does to host to guest), then
// put, get, cp of a 100 MB tree of 2,000 files in and out and 100 MB to
// a command's stdin, each against put of one 100 MB file in the same run,
// with the daemon's CPU per 100 MB moved. It runs only under `make bench`.
func TestBenchBulk(t *testing.T) {
	needBench(t)
	ctx := context.Background()
	const size = 100 << 20
	mbs := func(n int64, d time.Duration) float64 { return float64(n) / d.Seconds() / 1e6 }

	// The channel's limits, on a VM of its own.
	dir := t.TempDir()
	b := vmmtest.Boot(t, qemu.New(qemu.Options{}), filepath.Join(dir, "vm"), filepath.Join(dir, "ws.img"), vmm.NewUUID())
	b.Agent.Close()
	conn, err := b.VM.DialAgent(ctx)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReaderSize(conn, 256<<10)
	out, err := guest.RawBulk(ctx, conn, br, size)
	if err != nil {
		t.Fatal(err)
	}
	sink := map[int]time.Duration{}
	for _, w := range []int{4 << 10, 64 << 10, 1 << 20} {
		if sink[w], err = guest.RawSink(ctx, conn, br, size, w); err != nil {
			t.Fatal(err)
		}
	}
	conn.Close()
	b.VM.Kill(ctx)
	t.Logf("BENCH %-44s %7.0f MB/s vs guest to host %7.0f MB/s  ratio %.2fx  (report)", "raw channel host to guest, 1 MiB writes", mbs(size, sink[1<<20]), mbs(size, out), mbs(size, sink[1<<20])/mbs(size, out))
	t.Logf("BENCH %-44s %7.0f MB/s (4 KiB writes) %7.0f MB/s (64 KiB writes)  (report)", "raw channel host to guest, small writes", mbs(size, sink[4<<10]), mbs(size, sink[64<<10]))

	// The same 100 MB as one file and as a tree of 2,000 files in 40
	// directories.
	local := t.TempDir()
	tree := filepath.Join(local, "tree")
	for i := 0; i < 2000; i++ {
		d := filepath.Join(tree, fmt.Sprintf("d%02d", i%40))
		os.MkdirAll(d, 0o755)
		b := make([]byte, 50<<10)
		rand.Read(b)
		os.WriteFile(filepath.Join(d, fmt.Sprintf("f%04d", i)), b, 0o644)
	}
	one := make([]byte, 2000*50<<10)
	rand.Read(one)
	oneFile := filepath.Join(local, "one.bin")
	os.WriteFile(oneFile, one, 0o644)
	total := int64(len(one))

	e := newBenchEnv(t, "idle_timeout = \"0\"\n")
	e.OK("create", "bulk", "--disk", "1G")
	pid := e.Daemon.Process.Pid
	const n = 3
	// timed runs fn n times and returns the median and the daemon's CPU
	// per 100 MB (of total bytes moved per run).
	timed := func(fn func(i int), before ...func(i int)) (time.Duration, time.Duration) {
		var took []time.Duration
		var cpu time.Duration
		for i := 0; i < n; i++ {
			for _, b := range before {
				b(i)
			}
			c0 := daemonCPU(t, pid)
			start := time.Now()
			fn(i)
			took = append(took, time.Since(start))
			cpu += daemonCPU(t, pid) - c0
		}
		return median(took), cpu / n * time.Duration(size) / time.Duration(total)
	}
	put, putCPU := timed(func(int) { e.OK("put", "bulk", oneFile, "one.bin") })
	cpIn, cpInCPU := timed(func(i int) { e.OK("cp", tree, "bulk:t") }, func(i int) {
		if i > 0 {
			e.OK("rm", "bulk", "-r", "t")
		}
	})
	get, getCPU := timed(func(i int) { e.OK("get", "bulk", "one.bin", filepath.Join(local, fmt.Sprintf("get%d", i))) })
	cpOut, cpOutCPU := timed(func(i int) { e.OK("cp", "bulk:t", filepath.Join(local, fmt.Sprintf("out%d", i))) })
	zeros := string(make([]byte, total))
	stdin, stdinCPU := timed(func(int) { e.RunIn(zeros, "exec", "bulk", "--", "sh", "-c", "cat > /dev/null") })

	line := func(what string, d, cpu time.Duration, target string) {
		t.Logf("BENCH %-44s %8s (%4.0f MB/s) vs put of one file %8s  ratio %.2fx  daemon CPU %.2f s/100 MB  (%s)", what,
			d.Round(time.Millisecond), mbs(total, d), put.Round(time.Millisecond), float64(d)/float64(put), cpu.Seconds(), target)
	}
	line("put of one 100 MB file (median)", put, putCPU, "the reference")
	line("cp in of 100 MB in 2,000 files (median)", cpIn, cpInCPU, "target ≤ 1.5x")
	line("get of one 100 MB file (median)", get, getCPU, "report")
	line("cp out of 100 MB in 2,000 files (median)", cpOut, cpOutCPU, "target ≤ 1.5x")
	line("100 MB to a command's stdin (median)", stdin, stdinCPU, "report")
}

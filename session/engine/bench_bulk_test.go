package engine_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/berthvm/berth/guest"
	treepkg "github.com/berthvm/berth/guest/tree"
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

	// The channel's limits, on a VM of its own.
	dir := t.TempDir()
	b := vmmtest.Boot(t, qemu.New(qemu.Options{}), filepath.Join(dir, "vm"), filepath.Join(dir, "ws.img"), vmm.NewUUID())
	// Where put and cp in spend their time, at the agent (no daemon):
	// the guest's own write and flush of 100 MB, the same through the
	// channel as one file, and as the tree, with what the unpack spent
	// waiting for bytes and syncing.
	dd := func() time.Duration {
		start := time.Now()
		r := vmmtest.Run(t, b.Agent, "", "dd", "if=/dev/zero", "of=/workspace/dd", "bs=51200", "count=2000", "conv=fsync") // total bytes
		if r.Err != nil || r.Exit.ExitCode != 0 {
			t.Fatalf("dd: %v %s", r.Err, r.Stderr)
		}
		took := time.Since(start)
		b.Agent.Remove(ctx, "dd", false)
		return took
	}
	dd() // the first write to a fresh disk is no measure
	ddTook := dd()
	start := time.Now()
	if _, err := b.Agent.WriteFile(ctx, "one.bin", bytes.NewReader(one), 0); err != nil {
		t.Fatal(err)
	}
	wf := time.Since(start)
	b.Agent.Remove(ctx, "one.bin", false)
	root, err := os.OpenRoot(tree)
	if err != nil {
		t.Fatal(err)
	}
	var packed bytes.Buffer
	if _, err := treepkg.Pack(root, ".", &packed, nil); err != nil {
		t.Fatal(err)
	}
	root.Close()
	start = time.Now()
	upRes, err := b.Agent.Unpack(ctx, "t", &packed)
	if err != nil {
		t.Fatal(err)
	}
	up := time.Since(start)
	t.Logf("BENCH %-44s %8s vs the guest's own dd+fsync %8s  ratio %.2fx  (report)", "agent: write of one 100 MB file", wf.Round(time.Millisecond), ddTook.Round(time.Millisecond), float64(wf)/float64(ddTook))
	t.Logf("BENCH %-44s %8s vs one file %8s  ratio %.2fx  (waiting for bytes %s, syncing %s)", "agent: unpack of 100 MB in 2,000 files", up.Round(time.Millisecond), wf.Round(time.Millisecond), float64(up)/float64(wf), upRes.Waited.Round(time.Millisecond), upRes.Synced.Round(time.Millisecond))
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

	e := newBenchEnv(t, "idle_timeout = \"0\"\n")
	e.OK("create", "bulk", "--disk", "1G")
	pid := e.Daemon.Process.Pid
	zeros := string(make([]byte, total))
	// Each round runs every transfer once, in turn, so that the load
	// of this shared machine, which moves by a third within minutes,
	// weighs on each alike; the figures are medians of the rounds, and
	// the daemon's CPU is per 100 MB.
	type op struct {
		setup func(i int)
		run   func(i int)
		took  []time.Duration
		cpu   time.Duration
	}
	put := &op{run: func(int) { e.OK("put", "bulk", oneFile, "one.bin") }}
	cpIn := &op{setup: func(i int) {
		if i > 0 {
			e.OK("rm", "bulk", "-r", "t")
		}
	}, run: func(int) { e.OK("cp", tree, "bulk:t") }}
	get := &op{run: func(i int) { e.OK("get", "bulk", "one.bin", filepath.Join(local, fmt.Sprintf("get%d", i))) }}
	cpOut := &op{run: func(i int) { e.OK("cp", "bulk:t", filepath.Join(local, fmt.Sprintf("out%d", i))) }}
	stdin := &op{run: func(int) { e.RunIn(zeros, "exec", "bulk", "--", "sh", "-c", "cat > /dev/null") }}
	const n = 3
	for i := 0; i < n; i++ {
		for _, o := range []*op{put, cpIn, get, cpOut, stdin} {
			if o.setup != nil {
				o.setup(i)
			}
			c0 := daemonCPU(t, pid)
			start := time.Now()
			o.run(i)
			o.took = append(o.took, time.Since(start))
			o.cpu += daemonCPU(t, pid) - c0
		}
	}
	ref := median(put.took)
	line := func(what string, o *op, target string) {
		d := median(o.took)
		cpu := o.cpu / n * time.Duration(size) / time.Duration(total)
		t.Logf("BENCH %-44s %8s (%4.0f MB/s) vs put of one file %8s  ratio %.2fx  daemon CPU %.2f s/100 MB  (%s)", what,
			d.Round(time.Millisecond), mbs(total, d), ref.Round(time.Millisecond), float64(d)/float64(ref), cpu.Seconds(), target)
	}
	line("put of one 100 MB file (median)", put, "the reference")
	line("cp in of 100 MB in 2,000 files (median)", cpIn, "target ≤ 1.5x")
	line("get of one 100 MB file (median)", get, "report")
	line("cp out of 100 MB in 2,000 files (median)", cpOut, "target ≤ 1.5x")
	line("100 MB to a command's stdin (median)", stdin, "report")
}

package qemu

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/vmm"
	"github.com/berthvm/berth/vmm/vmmtest"
)

func pct(d []time.Duration, p float64) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[int(float64(len(s)-1)*p)]
}

func report(t *testing.T, name string, value, limit time.Duration, target string) {
	t.Logf("BENCH %-40s %10s vs limit %10s  ratio %.2fx  (target %s)", name, value.Round(time.Microsecond), limit.Round(time.Microsecond), float64(value)/float64(limit), target)
}

// TestBenchVM prints issue 2's figures, each against its physical limit
// measured in the same run. It runs only under `make bench`.
func TestBenchVM(t *testing.T) {
	if os.Getenv("BERTH_BENCH") == "" {
		t.Skip("set BERTH_BENCH=1 (make bench)")
	}
	d := driver(t)
	im := vmmtest.Image(t)
	ctx := context.Background()

	// Boot: start → agent ready, against bare QEMU booting the same
	// kernel and initramfs to a trivial init that powers off at once.
	var boots, bare []time.Duration
	for i := 0; i < 3; i++ {
		start := time.Now()
		cmd := exec.Command("qemu-system-x86_64", "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
			"-accel", "tcg,thread=multi", "-cpu", "max", "-smp", "1", "-m", "512", "-kernel", im.Kernel, "-initrd", im.Initramfs,
			"-append", "console=ttyS0 quiet panic=-1 berth.probe")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("bare boot: %v %s", err, out)
		}
		bare = append(bare, time.Since(start))

		dir := t.TempDir()
		ws := filepath.Join(dir, "ws.img")
		uuid := vmm.NewUUID()
		if err := vmm.CreateWorkspace(ctx, ws, 256<<20, uuid); err != nil {
			t.Fatal(err)
		}
		start = time.Now()
		vm, err := d.Start(ctx, vmm.Config{Dir: filepath.Join(dir, "vm"), Kernel: im.Kernel, Initramfs: im.Initramfs,
			Cmdline: "berth.ws=" + uuid, CPUs: 1, MemoryMiB: 512, Workspace: ws, Accel: vmm.AccelTCG})
		if err != nil {
			t.Fatal(err)
		}
		dctx, cancel := context.WithTimeout(ctx, time.Minute)
		c, err := guest.Dial(dctx, vm.DialAgent)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Hello(ctx); err != nil {
			t.Fatal(err)
		}
		boots = append(boots, time.Since(start))
		c.Close()
		vm.Kill(ctx)
		vm.Close()
	}
	report(t, "boot: start → agent ready (median)", pct(boots, 0.5), pct(bare, 0.5), "≤ 1.15x")

	dir := t.TempDir()
	b := vmmtest.Boot(t, d, filepath.Join(dir, "vm"), filepath.Join(dir, "ws.img"), vmm.NewUUID())
	b.Agent.Close()

	// The raw channel's limits: a line round trip and bulk bytes, below
	// the handshake, yamux and the agent's request handling.
	conn, err := b.VM.DialAgent(ctx)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReaderSize(conn, 256<<10)
	var raw []time.Duration
	for i := 0; i < 300; i++ {
		d, err := guest.RawPing(ctx, conn, br)
		if err != nil {
			t.Fatal(err)
		}
		raw = append(raw, d)
	}
	const bulk = 256 << 20
	rawBulk, err := guest.RawBulk(ctx, conn, br, bulk)
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()

	c, err := guest.Dial(ctx, b.VM.DialAgent)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var execs []time.Duration
	for i := 0; i < 200; i++ {
		start := time.Now()
		e, err := c.Exec(ctx, guest.ExecRequest{ID: fmt.Sprintf("true-%d", i), Argv: []string{"true"}})
		if err != nil {
			t.Fatal(err)
		}
		for range e.Output() {
		}
		if _, err := e.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		execs = append(execs, time.Since(start))
		c.Forget(ctx, fmt.Sprintf("true-%d", i))
	}
	report(t, "exec true round trip p50", pct(execs, 0.5), pct(raw, 0.5), "p50 ≤ 3x")
	// Context: what starting a process costs inside the guest at all.
	loopStart := time.Now()
	if r := vmmtest.Run(t, c, "", "sh", "-c", "i=0; while [ $i -lt 50 ]; do /bin/true; i=$((i+1)); done"); r.Err == nil {
		per := (time.Since(loopStart) - pct(execs, 0.5)) / 50
		t.Logf("BENCH %-40s %10s per fork+exec+wait of /bin/true by a shell inside the guest (context for the above)", "guest process start", per.Round(time.Microsecond))
	}
	report(t, "exec true round trip p99", pct(execs, 0.99), pct(raw, 0.99), "-")

	start := time.Now()
	// dd with 1 MiB blocks: busybox head writes in small pieces and is
	// itself the bottleneck under emulation.
	e, err := c.Exec(ctx, guest.ExecRequest{ID: "bulk", Argv: []string{"dd", "if=/dev/zero", "bs=1M", fmt.Sprintf("count=%d", bulk>>20)}})
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for o := range e.Output() {
		if o.Stream == guest.FrameStdout {
			n += int64(len(o.Data))
		}
	}
	if _, err := e.Wait(ctx); err != nil || n != bulk {
		t.Fatalf("bulk: %d bytes, %v", n, err)
	}
	stdout := time.Since(start)
	mbs := func(d time.Duration) float64 { return float64(bulk) / d.Seconds() / 1e6 }
	t.Logf("BENCH %-40s %7.0f MB/s vs raw %7.0f MB/s  ratio %.2fx  (target ≥ 0.7x)", "stdout throughput 256 MB", mbs(stdout), mbs(rawBulk), mbs(stdout)/mbs(rawBulk))

	// Durable 1 MB write through the file API, against the same
	// write+fsync+rename+fsync done in the guest by a command.
	data := bytes.Repeat([]byte("x"), 1<<20)
	if _, err := c.WriteFile(ctx, "in.bin", bytes.NewReader(data), 0); err != nil {
		t.Fatal(err)
	}
	var api, cmd []time.Duration
	for i := 0; i < 30; i++ {
		start := time.Now()
		if _, err := c.WriteFile(ctx, "out.bin", bytes.NewReader(data), 0); err != nil {
			t.Fatal(err)
		}
		api = append(api, time.Since(start))
		start = time.Now()
		r := vmmtest.Run(t, c, "", "sh", "-c", "dd if=in.bin of=.t bs=1M conv=fsync 2>/dev/null && mv .t cmd.bin && sync .")
		if r.Err != nil || r.Exit.ExitCode != 0 {
			t.Fatalf("%v %s", r.Err, r.Stderr)
		}
		cmd = append(cmd, time.Since(start))
	}
	report(t, "durable 1 MB write p50", pct(api, 0.5), pct(cmd, 0.5), "≤ 1.5x")
}

package engine_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/api"
	"github.com/berthvm/berth/store"
	"github.com/berthvm/berth/vmm"
	"github.com/berthvm/berth/vmm/qemu"
	"github.com/berthvm/berth/vmm/vmmtest"
)

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// TestBenchSessions prints issue 3's figures against limits measured in
// the same run. It runs only under `make bench`.
func TestBenchSessions(t *testing.T) {
	needBench(t)
	ctx := context.Background()

	// Limits, on a VM of their own: the raw channel's throughput and the
	// agent-level exec round trip.
	dir := t.TempDir()
	b := vmmtest.Boot(t, qemu.New(qemu.Options{}), filepath.Join(dir, "vm"), filepath.Join(dir, "ws.img"), vmm.NewUUID())
	var agentRT []time.Duration
	for i := 0; i < 100; i++ {
		start := time.Now()
		r := vmmtest.Run(t, b.Agent, "", "true")
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		agentRT = append(agentRT, time.Since(start))
	}
	b.Agent.Close()
	conn, err := b.VM.DialAgent(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const bulk = 512 << 20
	rawBulk, err := guest.RawBulk(ctx, conn, bufio.NewReaderSize(conn, 256<<10), bulk)
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
	b.VM.Kill(ctx)

	e := newEnv(t)
	e.StartDaemon()
	e.OK("create", "bench", "--disk", "256M")

	// Poll the API in-process and gently: a `berth ps` every few ms would
	// spend a core of this two-core machine on the poll itself.
	client := api.Dial(filepath.Join(e.Data, "berth.sock"))
	defer client.Close()
	start := time.Now()
	id := strings.TrimSpace(e.OK("exec", "bench", "--detach", "--", "dd", "if=/dev/zero", "bs=1M", fmt.Sprintf("count=%d", bulk>>20)))
	for {
		x, err := client.Execution(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if x.State.Done() {
			if x.StdoutBytes != bulk {
				t.Fatalf("recorded %d bytes (%s)", x.StdoutBytes, x.State)
			}
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	ingest := time.Since(start)
	mbs := func(d time.Duration) float64 { return float64(bulk) / d.Seconds() / 1e6 }
	t.Logf("BENCH %-40s %7.0f MB/s vs raw %7.0f MB/s  ratio %.2fx  (target ≥ 0.6x)", "output ingest 512 MB into the store", mbs(ingest), mbs(rawBulk), mbs(ingest)/mbs(rawBulk))

	var cliRT []time.Duration
	for i := 0; i < 40; i++ {
		start := time.Now()
		e.OK("exec", "bench", "--", "true")
		cliRT = append(cliRT, time.Since(start))
	}
	t.Logf("BENCH %-40s %10s vs agent %10s  ratio %.2fx  (target ≤ 5x)", "berth exec -- true p50", median(cliRT).Round(time.Microsecond), median(agentRT).Round(time.Microsecond), float64(median(cliRT))/float64(median(agentRT)))
	e.OK("delete", "bench", "--yes")
	e.KillDaemon()

	// berth ls with 1,000 stopped sessions, against berth version.
	st, err := store.Open(filepath.Join(e.Data, "store"), nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 1000; i++ {
		if err := st.PutSession(store.Session{Name: fmt.Sprintf("s%04d", i), State: "stopped", Image: "mini", VMM: "qemu", CPUs: 1, MemoryMiB: 512, DiskBytes: 4 << 30, CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	st.Close()
	e.StartDaemon()
	var ls, ver []time.Duration
	for i := 0; i < 20; i++ {
		start := time.Now()
		e.OK("version")
		ver = append(ver, time.Since(start))
		start = time.Now()
		out := e.OK("ls")
		ls = append(ls, time.Since(start))
		if i == 0 && len(out) < 1000*20 {
			t.Fatalf("ls printed %d bytes", len(out))
		}
	}
	t.Logf("BENCH %-40s %10s vs version %10s  ratio %.2fx  (target ≤ 2x)", "berth ls, 1,000 sessions (median)", median(ls).Round(time.Microsecond), median(ver).Round(time.Microsecond), float64(median(ls))/float64(median(ver)))
}

// rss returns a process's resident set size in bytes.
func rss(pid int) int64 {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return n << 10
		}
	}
	return 0
}

// TestBenchSleep prints issue 7's figures: wake against cold boot, the
// snapshot's size against the guest memory in use, and what sleeping
// sessions cost the host.
func TestBenchSleep(t *testing.T) {
	needBench(t)
	e := newBenchEnv(t, "memory = \"256M\"\ndisk = \"64M\"\nidle_timeout = \"0\"\n")
	e.OK("create", "zz")
	var cold, wake []time.Duration
	// A start restores the template; the cold boot it is measured
	// against is a daemon's with templates off.
	withColdDaemon(e, func() {
		for i := 0; i < 5; i++ {
			e.OK("stop", "zz")
			start := time.Now()
			e.OK("start", "zz")
			e.OK("exec", "zz", "--", "true")
			cold = append(cold, time.Since(start))
		}
	})
	for i := 0; i < 5; i++ {
		e.OK("sleep", "zz")
		start := time.Now()
		e.OK("exec", "zz", "--", "true")
		wake = append(wake, time.Since(start))
	}
	t.Logf("BENCH %-40s %10s vs cold %10s  ratio %.2fx  (target ≤ 0.1x)", "wake → first exec true (median)", median(wake).Round(time.Millisecond), median(cold).Round(time.Millisecond), float64(median(wake))/float64(median(cold)))

	var info session.Session
	var total, avail int64
	for _, l := range strings.Split(e.OK("exec", "zz", "--", "cat", "/proc/meminfo"), "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			switch f[0] {
			case "MemTotal:":
				total = n << 10
			case "MemAvailable:":
				avail = n << 10
			}
		}
	}
	used := total - avail
	e.OK("sleep", "zz")
	json.Unmarshal([]byte(e.OK("info", "zz", "--json")), &info)
	t.Logf("BENCH %-40s %10d bytes vs guest memory used %d  ratio %.2fx", "snapshot on disk", info.SnapshotBytes, used, float64(info.SnapshotBytes)/float64(max(used, 1)))

	// Create from a template (built by the first create above) against a
	// cold create, each to the first answered command; medians of five.
	var fromTemplate, coldCreate []time.Duration
	for i := 0; i < 5; i++ {
		name := fmt.Sprintf("tmpl%d", i)
		start := time.Now()
		e.OK("create", name)
		e.OK("exec", name, "--", "true")
		fromTemplate = append(fromTemplate, time.Since(start))
		e.OK("delete", name, "--yes")
	}
	e.KillDaemon()
	os.Setenv("BERTH_NO_TEMPLATES", "1")
	e.StartDaemon()
	os.Unsetenv("BERTH_NO_TEMPLATES")
	for i := 0; i < 5; i++ {
		name := fmt.Sprintf("cold%d", i)
		start := time.Now()
		e.OK("create", name)
		e.OK("exec", name, "--", "true")
		coldCreate = append(coldCreate, time.Since(start))
		e.OK("delete", name, "--yes")
	}
	t.Logf("BENCH %-40s %10s vs cold %10s  ratio %.2fx  (target ≤ 0.1x)", "create from template → ready (median)", median(fromTemplate).Round(time.Millisecond), median(coldCreate).Round(time.Millisecond), float64(median(fromTemplate))/float64(median(coldCreate)))
	e.KillDaemon()
	e.StartDaemon()

	const n = 50
	base := rss(e.Daemon.Process.Pid)
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("s%d", i)
		e.OK("create", name)
		e.OK("sleep", name)
	}
	vmms := 0
	for i := 0; i < n; i++ {
		if e.vmmAlive(fmt.Sprintf("s%d", i)) {
			vmms++
		}
	}
	t.Logf("BENCH %-40s %d VMM processes, daemon RSS growth %.1f MB for %d sleeping sessions (target: none, ≤ 50 MB for 50)", "sleeping sessions' host cost", vmms, float64(rss(e.Daemon.Process.Pid)-base)/1e6, n)
	var all []session.Session
	json.Unmarshal([]byte(e.OK("ls", "--json")), &all)
	var snaps int64
	for _, s := range all {
		snaps += s.SnapshotBytes
	}
	t.Logf("BENCH %-40s %.1f MB on disk for %d sessions, %.1f MB each", "sleeping sessions' snapshots", float64(snaps)/1e6, len(all), float64(snaps)/1e6/float64(max(len(all), 1)))
}

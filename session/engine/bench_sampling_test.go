package engine_test

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/berthvm/berth/vmm"
)

// cpuOf is the CPU time processes pids used while fn ran.
func cpuOf(t *testing.T, fn func(), pids ...int) time.Duration {
	t.Helper()
	read := func() time.Duration {
		var sum time.Duration
		for _, pid := range pids {
			ps, err := vmm.ReadProcStat(pid)
			if err != nil {
				t.Fatalf("pid %d: %v", pid, err)
			}
			sum += ps.CPU
		}
		return sum
	}
	before := read()
	fn()
	return read() - before
}

// TestBenchSampling (make bench): the daemon's CPU while it samples n idle
// TCG sessions, against the same daemon idle with none, per session; and
// with the sessions asleep (nothing to sample). BERTH_BENCH_SESSIONS
// overrides n = 50.
func TestBenchSampling(t *testing.T) {
	needBench(t)
	n := 50
	if v, err := strconv.Atoi(os.Getenv("BERTH_BENCH_SESSIONS")); err == nil && v > 0 {
		n = v
	}
	const window = 30 * time.Second
	e := newBenchEnv(t, "memory = \"256M\"\ndisk = \"64M\"\nidle_timeout = \"0\"\n")
	e.OK("create", "warm") // builds the image and the template
	e.OK("delete", "warm", "--yes")
	d := e.Daemon.Process.Pid
	idle := cpuOf(t, func() { time.Sleep(window) }, d)

	var vmms []int
	for i := range n {
		name := fmt.Sprintf("s%d", i)
		e.OK("create", name)
		vmms = append(vmms, e.VMMPid(name))
	}
	time.Sleep(10 * time.Second) // settle after the boots
	var guests time.Duration
	busy := cpuOf(t, func() { guests = cpuOf(t, func() { time.Sleep(window) }, vmms...) }, d)
	perSession := float64(busy-idle) / float64(window) / float64(n) * 100
	perVMM := float64(guests) / float64(window) / float64(n) * 100
	t.Logf("BENCH %-40s %6.3f%% of a core a session vs idle daemon %.3f%%, the idle VMM itself %.2f%%  ratio %.3fx of the VMM  (target ≤ 0.2%% a session)",
		fmt.Sprintf("daemon sampling %d idle TCG sessions", n), perSession, float64(idle)/float64(window)*100, perVMM, perSession/max(perVMM, 1e-9))

	for i := range n {
		e.OK("sleep", fmt.Sprintf("s%d", i))
	}
	asleep := cpuOf(t, func() { time.Sleep(window) }, d)
	t.Logf("BENCH %-40s %6.3f%% of a core vs idle daemon %.3f%%  ratio %.2fx  (target ≈ 1x: nothing to sample)",
		fmt.Sprintf("daemon with %d sleeping sessions", n), float64(asleep)/float64(window)*100, float64(idle)/float64(window)*100, float64(asleep)/float64(max(idle, time.Millisecond)))
}

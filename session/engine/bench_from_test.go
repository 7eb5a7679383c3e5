package engine_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestBenchCreateFrom prints issue 27's create --from figure against a
// fork of the same session measured in the same run: both copy 200 MB
// used of a 4 GiB workspace and resume a VM's memory, then run a first
// command. It runs only under `make bench`.
func TestBenchCreateFrom(t *testing.T) {
	needBench(t)
	e := newBenchEnv(t, "memory = \"256M\"\nidle_timeout = \"0\"\n")
	e.OK("create", "bench", "--disk", "4G")
	e.OK("exec", "bench", "--", "sh", "-c", "head -c 200000000 /dev/urandom > big.bin")
	e.OK("checkpoint", "bench", "--memory")
	mem := e.lastCheckpoint("bench")
	e.OK("checkpoint", "bench")
	disks := e.lastCheckpoint("bench")
	e.OK("create", "warm") // builds the template if needed
	e.OK("delete", "warm", "--yes")

	var fork, from, fromDisks []time.Duration
	how := ""
	for i := 0; i < 3; i++ {
		start := time.Now()
		e.OK("fork", "bench", "fk")
		e.OK("exec", "fk", "--", "true")
		fork = append(fork, time.Since(start))
		e.OK("delete", "fk", "--yes")

		start = time.Now()
		e.OK("create", "cf", "--from", "bench@"+mem)
		e.OK("exec", "cf", "--", "true")
		from = append(from, time.Since(start))
		how = e.Info("cf").Cause
		e.OK("delete", "cf", "--yes")

		start = time.Now()
		e.OK("create", "cd", "--from", "bench@"+disks)
		e.OK("exec", "cd", "--", "true")
		fromDisks = append(fromDisks, time.Since(start))
		e.OK("delete", "cd", "--yes")
	}
	t.Logf("BENCH %-40s %10s vs fork %10s  ratio %.2fx  (target ≤ 1x; %s)",
		"create --from memory ckpt → exec (median)", median(from).Round(time.Millisecond), median(fork).Round(time.Millisecond), float64(median(from))/float64(median(fork)), how)
	t.Logf("BENCH %-40s %10s vs fork %10s  ratio %.2fx  (a template boot on the copied disks)",
		"create --from disk ckpt → exec (median)", median(fromDisks).Round(time.Millisecond), median(fork).Round(time.Millisecond), float64(median(fromDisks))/float64(median(fork)))
	if testing.Verbose() {
		if b, err := os.ReadFile(filepath.Join(e.Data, "test-daemon.log")); err == nil {
			for _, l := range strings.Split(string(b), "\n") {
				if strings.Contains(l, "msg=fork") || strings.Contains(l, `msg="create from checkpoint"`) {
					t.Logf("daemon: %s", l[strings.Index(l, "msg="):])
				}
			}
		}
	}
	e.OK("delete", "bench", "--yes")
}

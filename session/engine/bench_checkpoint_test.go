package engine_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestBenchCheckpoints prints issue 17's figures against limits measured
// in the same run. It runs only under `make bench`.
func TestBenchCheckpoints(t *testing.T) {
	needBench(t)
	e := newBenchEnv(t, "memory = \"256M\"\nidle_timeout = \"0\"\ncheckpoint_limit = 100\n")
	e.OK("create", "bench", "--disk", "4G")
	e.OK("exec", "bench", "--", "sh", "-c", "head -c 200000000 /dev/urandom > big.bin")
	e.OK("flush", "bench")
	img := filepath.Join(e.Data, "sessions", "bench", "workspace.img")

	// Checkpoint of 200 MB used of 4 GiB against cp --sparse=always of
	// the same image (the VM stopped, so the image is still).
	var ckpt, cp []time.Duration
	how := ""
	for i := 0; i < 3; i++ {
		start := time.Now()
		e.OK("checkpoint", "bench")
		ckpt = append(ckpt, time.Since(start))
		l := e.checkpoints("bench")
		how = l[len(l)-1].Copy
		e.OK("checkpoint", "rm", "bench", l[len(l)-1].ID)
		dst := filepath.Join(e.Data, "cp-bench.img")
		start = time.Now()
		if out, err := exec.Command("cp", "--sparse=always", img, dst).CombinedOutput(); err != nil {
			t.Fatalf("cp: %v %s", err, out)
		}
		f, _ := os.OpenFile(dst, os.O_RDWR, 0)
		f.Sync() // a checkpoint is synced too
		f.Close()
		cp = append(cp, time.Since(start))
		os.Remove(dst)
	}
	t.Logf("BENCH %-40s %10s vs cp --sparse=always %10s  ratio %.2fx  (copy: %s; this filesystem has no reflink unless it says reflink)",
		"checkpoint 200 MB used of 4 GiB (median)", median(ckpt).Round(time.Millisecond), median(cp).Round(time.Millisecond), float64(median(ckpt))/float64(median(cp)), how)

	// Disk bytes added per checkpoint of an unchanged workspace.
	var added []int64
	for i := 0; i < 3; i++ {
		before := freeBytes(t, e.Data)
		e.OK("checkpoint", "bench")
		added = append(added, before-freeBytes(t, e.Data))
	}
	used := e.Info("bench").WorkspaceUsed
	a := added[1]
	t.Logf("BENCH %-40s %10.1f MB vs workspace used %.1f MB  ratio %.2fx  (copy: %s; target with reflink: close to 0)",
		"disk added per unchanged checkpoint", float64(a)/1e6, float64(used)/1e6, float64(a)/float64(max(used, 1)), how)
	for _, c := range e.checkpoints("bench") {
		e.OK("checkpoint", "rm", "bench", c.ID)
	}
	e.OK("exec", "bench", "--", "rm", "big.bin")

	// Fork → the fork's first exec true, against create from a template
	// → first exec true.
	e.OK("create", "warm") // builds the template if needed
	e.OK("delete", "warm", "--yes")
	var fork, create []time.Duration
	for i := 0; i < 3; i++ {
		start := time.Now()
		e.OK("fork", "bench", "fk")
		e.OK("exec", "fk", "--", "true")
		fork = append(fork, time.Since(start))
		e.OK("delete", "fk", "--yes")
		start = time.Now()
		e.OK("create", "fresh", "--disk", "4G")
		e.OK("exec", "fresh", "--", "true")
		create = append(create, time.Since(start))
		e.OK("delete", "fresh", "--yes")
	}
	t.Logf("BENCH %-40s %10s vs create from template %10s  ratio %.2fx  (target ≤ 1.5x)",
		"fork → first exec true (median)", median(fork).Round(time.Millisecond), median(create).Round(time.Millisecond), float64(median(fork))/float64(median(create)))

	// Restore → first exec true, against a start of the stopped session
	// → first exec true.
	e.OK("checkpoint", "bench")
	id := e.lastCheckpoint("bench")
	var restore, start []time.Duration
	for i := 0; i < 3; i++ {
		t0 := time.Now()
		e.OK("restore", "bench", id, "--yes")
		e.OK("exec", "bench", "--", "true")
		restore = append(restore, time.Since(t0))
		l := e.checkpoints("bench")
		e.OK("checkpoint", "rm", "bench", l[len(l)-1].ID) // the automatic one
		e.OK("stop", "bench")
		t0 = time.Now()
		e.OK("start", "bench")
		e.OK("exec", "bench", "--", "true")
		start = append(start, time.Since(t0))
	}
	t.Logf("BENCH %-40s %10s vs start %10s  ratio %.2fx",
		"restore → first exec true (median)", median(restore).Round(time.Millisecond), median(start).Round(time.Millisecond), float64(median(restore))/float64(median(start)))
	if !strings.Contains(how, "copy") && how != "reflink" {
		t.Errorf("unknown copy kind %q", how)
	}
	e.OK("delete", "bench", "--yes")
}

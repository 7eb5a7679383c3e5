package engine_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/vmm/vmmtest"
)

// TestBenchRunDiffGit prints issue 29's run diff figure: run diff --stat
// of a run that changed 100 files of a 20,000-file workspace, against git
// status of the same tree in the guest (the debian image has git), each
// a berth call, measured in the same run. Target ≤ 1×.
func TestBenchRunDiffGit(t *testing.T) {
	needBench(t)
	vmmtest.Debian(t)
	e := newBenchEnv(t, "memory = \"512M\"\ndisk = \"1G\"\nidle_timeout = \"0\"\n")
	e.OK("create", "g", "--image", "debian")
	// 200 directories of 100 files, committed: one python process (a
	// shell loop would fork 20,000 times under TCG).
	e.OK("exec", "g", "--", "python3", "-c", `
import os
for d in range(200):
    os.makedirs(f"src/{d}", exist_ok=True)
    for f in range(100):
        with open(f"src/{d}/{f}.txt", "w") as w:
            w.write("".join(f"line {i}\n" for i in range(20)))
`)
	e.OK("exec", "g", "--", "sh", "-c", "git init -q . && git add -A && git -c user.name=b -c user.email=b@b commit -qm tree && git status --porcelain | wc -l")
	id := strings.TrimSpace(e.OK("run", "start", "g", "--keep"))
	e.OK("exec", "--run", id, "g", "--", "python3", "-c", `
for d in range(100):
    with open(f"src/{d}/{d % 100}.txt", "a") as w:
        w.write("changed\n")
`)
	// Once each first: git refreshes its index on its first status.
	e.OK("exec", "g", "--", "git", "status", "--porcelain")
	e.OK("run", "diff", id, "--stat")
	var diff, git []time.Duration
	for range 5 {
		start := time.Now()
		out := e.OK("run", "diff", id, "--stat")
		diff = append(diff, time.Since(start))
		if !strings.Contains(out, "100 files changed, 100 insertions(+)") {
			t.Fatalf("run diff --stat:\n%s", out)
		}
		start = time.Now()
		out = e.OK("exec", "g", "--", "git", "status", "--porcelain")
		git = append(git, time.Since(start))
		if n := strings.Count(out, "\n"); n != 100 {
			t.Fatalf("git status lists %d paths, want 100", n)
		}
	}
	t.Logf("BENCH %-40s %10s vs git status %10s  ratio %.2fx  (target ≤ 1x)", "run diff --stat, 100 of 20,000 files",
		median(diff).Round(time.Millisecond), median(git).Round(time.Millisecond), float64(median(diff))/float64(median(git)))
}

// TestBenchRunTrack prints the cost of the guest's change record on a
// file-heavy command: untar of 10,000 files in a run that keeps its start
// (so the agent records), against the same untar with no run open (no
// record), alternating, in the same run. Target ≤ 1.1×.
func TestBenchRunTrack(t *testing.T) {
	needBench(t)
	e := newBenchEnv(t, "memory = \"256M\"\ndisk = \"1G\"\nidle_timeout = \"0\"\ncheckpoint_limit = 100\n")
	e.OK("create", "b")
	// 100 directories of 100 files; echo is the shell's own, so no fork
	// per file.
	e.OK("exec", "b", "--", "sh", "-c", "mkdir src && d=0; while [ $d -lt 100 ]; do mkdir src/$d; f=0; while [ $f -lt 100 ]; do echo $d $f > src/$d/$f; f=$((f+1)); done; d=$((d+1)); done; "+
		"tar cf t.tar src && rm -rf src && tar tf t.tar | wc -l")
	untar := func(run, dir string) time.Duration {
		args := []string{"exec"}
		if run != "" {
			args = append(args, "--run", run)
		}
		args = append(args, "b", "--", "sh", "-c", "mkdir "+dir+" && tar xf t.tar -C "+dir)
		start := time.Now()
		e.OK(args...)
		return time.Since(start)
	}
	var plain, tracked []time.Duration
	for i := range 4 {
		p := untar("", fmt.Sprintf("p%d", i))
		id := strings.TrimSpace(e.OK("run", "start", "b", "--keep"))
		tr := untar(id, fmt.Sprintf("t%d", i))
		// One directory of it (the whole would read 10,000 files for
		// their lines): from the record, not a full comparison.
		if d := e.diff("run", "diff", id, fmt.Sprintf("t%d/src/7", i)); d.Full || d.Files != 101 {
			t.Fatalf("the run's diff: full %v (%s), %d files; want 101 from the record", d.Full, d.Note, d.Files)
		}
		// run rm drops the record, so the next plain untar has none.
		e.OK("run", "rm", id)
		e.OK("exec", "b", "--", "rm", "-rf", fmt.Sprintf("p%d", i), fmt.Sprintf("t%d", i))
		if i == 0 {
			continue // warm-up
		}
		plain, tracked = append(plain, p), append(tracked, tr)
	}
	t.Logf("BENCH %-40s %10s vs no run %10s  ratio %.2fx  (target ≤ 1.1x)", "untar 10,000 files in a recorded run",
		median(tracked).Round(time.Millisecond), median(plain).Round(time.Millisecond), float64(median(tracked))/float64(median(plain)))
}

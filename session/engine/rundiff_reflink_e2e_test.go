package engine_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/vmm/vmmtest"
)

// loopFS makes a filesystem of kind (xfs, btrfs) in a sparse image of
// size bytes, loop-mounted on a directory of the test's, unmounted at its
// end. It skips, saying why, where mkfs for kind is missing (make deps
// installs xfsprogs and btrfs-progs) or this user cannot mount.
func loopFS(t *testing.T, kind string, size int64) string {
	t.Helper()
	mkfs, err := exec.LookPath("mkfs." + kind)
	if err != nil {
		t.Skipf("mkfs.%s not found: install Debian's %s (make deps does)", kind, map[string]string{"xfs": "xfsprogs", "btrfs": "btrfs-progs"}[kind])
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to loop-mount a filesystem image")
	}
	img := filepath.Join(t.TempDir(), kind+".img")
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(size)
	f.Close()
	args := []string{"-q", img}
	if kind == "btrfs" {
		args = []string{"-q", "-f", img}
	}
	if out, err := exec.Command(mkfs, args...).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.%s: %v: %s", kind, err, out)
	}
	mnt := filepath.Join(t.TempDir(), "mnt")
	os.Mkdir(mnt, 0o755)
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		t.Skipf("cannot loop-mount %s here: %v: %s", kind, err, out)
	}
	t.Cleanup(func() {
		// The VMs killed at the test's end let go of their files as
		// their processes go; past a few tries, lazily, so the test ends.
		for range 50 {
			if exec.Command("umount", mnt).Run() == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		out, err := exec.Command("umount", "-l", mnt).CombinedOutput()
		t.Logf("umount %s was busy; lazily: %v %s", mnt, err, out)
	})
	dir := filepath.Join(mnt, "data")
	os.Mkdir(dir, 0o755)
	return dir
}

// TestRunKeepReflink: on XFS and btrfs a run's starting point is a
// reflink of the workspace and allocates next to nothing.
func TestRunKeepReflink(t *testing.T) {
	for _, kind := range []string{"xfs", "btrfs"} {
		t.Run(kind, func(t *testing.T) {
			if testing.Short() {
				t.Skip("boots VMs")
			}
			dir := loopFS(t, kind, 4<<30)
			e := newEnvAt(t, vmmtest.DataDirIn(t, dir))
			os.WriteFile(filepath.Join(e.Data, "config.toml"), []byte("memory = \"256M\"\ndisk = \"1G\"\nidle_timeout = \"0\"\n"), 0o644)
			e.StartDaemon()
			e.OK("create", "x")
			e.OK("exec", "x", "--", "sh", "-c", "head -c 50000000 /dev/urandom > data.bin")
			e.OK("flush", "x")
			before := freeBytes(t, e.Data)
			id := strings.TrimSpace(e.OK("run", "start", "x", "--keep"))
			added := before - freeBytes(t, e.Data)
			l := e.checkpoints("x")
			if len(l) != 1 || l[0].Run != id || l[0].Copy != "reflink" {
				t.Fatalf("checkpoints %+v, want one reflink of run %s", l, id)
			}
			t.Logf("%s: run start --keep allocated %d bytes (50 MB written, 1 GiB workspace); took %s, frozen %s", kind, added, l[0].Took, l[0].Frozen)
			if added >= 1<<20 {
				t.Errorf("the starting point allocated %d bytes, want under 1 MiB", added)
			}
			e.OK("exec", "--run", id, "x", "--", "sh", "-c", "echo changed > new.txt")
			if d := e.diff("run", "diff", id); len(d.Changes) != 1 || d.Changes[0].Path != "new.txt" {
				t.Errorf("diff on %s: %q", kind, changeList(d))
			}
		})
	}
}

// TestBenchRunKeep prints issue 29's run start --keep figures against
// limits measured in the same run: on XFS, a reflink by cp of the same
// image; on the default data directory (ext4 here, no reflink), the run
// start without --keep, and cp --sparse=always of the same image.
func TestBenchRunKeep(t *testing.T) {
	needBench(t)
	bench := func(t *testing.T, e *env, fsName string) {
		os.WriteFile(filepath.Join(e.Data, "config.toml"), []byte("memory = \"256M\"\ndisk = \"1G\"\nidle_timeout = \"0\"\ncheckpoint_limit = 100\n"), 0o644)
		e.StartDaemon()
		e.OK("create", "b")
		e.OK("exec", "b", "--", "sh", "-c", "head -c 200000000 /dev/urandom > big.bin")
		e.OK("flush", "b")
		img := filepath.Join(e.Data, "sessions", "b", "workspace.img")
		var keep, plain, cp []time.Duration
		how := ""
		for range 3 {
			start := time.Now()
			id := strings.TrimSpace(e.OK("run", "start", "b", "--keep"))
			keep = append(keep, time.Since(start))
			l := e.checkpoints("b")
			how = l[len(l)-1].Copy
			e.OK("run", "end", id)
			e.OK("checkpoint", "rm", "b", l[len(l)-1].ID)
			start = time.Now()
			id = strings.TrimSpace(e.OK("run", "start", "b"))
			plain = append(plain, time.Since(start))
			e.OK("run", "end", id)
			dst := filepath.Join(e.Data, "cp-bench.img")
			flag := "--sparse=always"
			if how == "reflink" {
				flag = "--reflink=always"
			}
			start = time.Now()
			if out, err := exec.Command("cp", flag, img, dst).CombinedOutput(); err != nil {
				t.Fatalf("cp: %v %s", err, out)
			}
			f, _ := os.OpenFile(dst, os.O_RDWR, 0)
			f.Sync()
			f.Close()
			cp = append(cp, time.Since(start))
			os.Remove(dst)
		}
		cpName := "cp --sparse=always"
		if how == "reflink" {
			cpName = "cp --reflink=always"
		}
		t.Logf("BENCH %-40s %10s vs run start %10s  ratio %.2fx", "run start --keep, 1 GiB ("+fsName+", "+how+")",
			median(keep).Round(time.Millisecond), median(plain).Round(time.Millisecond), float64(median(keep))/float64(median(plain)))
		t.Logf("BENCH %-40s %10s vs %s %10s  ratio %.2fx  (the copy alone; --keep adds the guest's freeze and a CLI call)", "run start --keep, 1 GiB ("+fsName+", "+how+")",
			median(keep).Round(time.Millisecond), cpName, median(cp).Round(time.Millisecond), float64(median(keep))/float64(median(cp)))
	}
	t.Run("ext4", func(t *testing.T) { bench(t, newEnv(t), "default data dir") })
	t.Run("xfs", func(t *testing.T) {
		dir := loopFS(t, "xfs", 4<<30)
		bench(t, newEnvAt(t, vmmtest.DataDirIn(t, dir)), "xfs")
	})
}

// TestBenchRunDiff prints run diff --stat of a run that changed 10 files
// of a 1 GiB workspace holding 2,000, against reading just those 10 files
// in the guest (one exec of cat), measured in the same run.
func TestBenchRunDiff(t *testing.T) {
	needBench(t)
	e := newBenchEnv(t, "memory = \"256M\"\ndisk = \"1G\"\nidle_timeout = \"0\"\n")
	e.OK("create", "b")
	e.OK("exec", "b", "--", "sh", "-c", "head -c 300000000 /dev/urandom > big.bin && for d in $(seq 1 20); do mkdir -p src/$d; for f in $(seq 1 100); do seq 1 200 > src/$d/$f.txt; done; done")
	id := strings.TrimSpace(e.OK("run", "start", "b", "--keep"))
	var files []string
	for i := 1; i <= 10; i++ {
		files = append(files, fmt.Sprintf("src/%d/%d.txt", i, i))
	}
	e.OK("exec", "--run", id, "b", "--", "sh", "-c", "for f in "+strings.Join(files, " ")+"; do echo changed >> $f; done")
	var diff, read []time.Duration
	for range 3 {
		start := time.Now()
		out := e.OK("run", "diff", id, "--stat")
		diff = append(diff, time.Since(start))
		if !strings.Contains(out, "10 files changed, 10 insertions(+)") {
			t.Fatalf("run diff --stat:\n%s", out)
		}
		start = time.Now()
		e.OK("exec", "b", "--", "cat", files[0], files[1], files[2], files[3], files[4], files[5], files[6], files[7], files[8], files[9])
		read = append(read, time.Since(start))
	}
	t.Logf("BENCH %-40s %10s vs reading the 10 files %10s  ratio %.2fx", "run diff --stat, 10 of 2,000 files, 1 GiB",
		median(diff).Round(time.Millisecond), median(read).Round(time.Millisecond), float64(median(diff))/float64(median(read)))
}

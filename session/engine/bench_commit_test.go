package engine_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/vmm/vmmtest"
)

// TestBenchCommit prints issue 27's figures for commits and templates of
// images berth did not build, against limits measured in the same run:
// image commit of a system disk with 200 MB changed against cp --sparse
// of that disk (synced, as the layer is), and create → first exec from an
// imported image's template against the same from debian's. It runs only
// under `make bench`.
func TestBenchCommit(t *testing.T) {
	needBench(t)
	deb := vmmtest.Debian(t)
	e := newBenchEnv(t, "memory = \"512M\"\ndisk = \"64M\"\nidle_timeout = \"0\"\n")

	e.OK("create", "src", "--image", "debian")
	e.OK("exec", "src", "--", "sh", "-c", "mkdir -p /opt/big && head -c 200000000 /dev/urandom > /opt/big/blob.bin && sync")
	sys := filepath.Join(e.Data, "sessions", "src", "system.img")
	const n = 3
	var commit, cp []time.Duration
	var last session.CommitResult
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("bench-commit-%d", i)
		start := time.Now()
		out := e.OK("image", "commit", "src", name, "--json")
		commit = append(commit, time.Since(start))
		if err := json.Unmarshal([]byte(out), &last); err != nil {
			t.Fatal(err)
		}
		e.OK("image", "rm", name)
		dst := filepath.Join(e.Data, "cp-bench.img")
		start = time.Now()
		if out, err := exec.Command("cp", "--sparse=always", sys, dst).CombinedOutput(); err != nil {
			t.Fatalf("cp: %v %s", err, out)
		}
		f, _ := os.OpenFile(dst, os.O_RDWR, 0)
		f.Sync()
		f.Close()
		cp = append(cp, time.Since(start))
		os.Remove(dst)
	}
	t.Logf("BENCH %-44s %10s vs cp --sparse=always %10s  ratio %.2fx  (copy: %s; commands frozen %s; layer %s; %d files)",
		"image commit, 200 MB changed (median)", median(commit).Round(time.Millisecond), median(cp).Round(time.Millisecond),
		float64(median(commit))/float64(median(cp)), last.Copy, last.Frozen.Round(time.Millisecond), session.FormatBytes(last.Bytes), last.Files)
	e.OK("delete", "src", "--yes")

	// An imported copy of debian's root (its layer's tree as a root
	// filesystem tarball), so the two images differ in nothing but how
	// they came to be.
	if os.Geteuid() != 0 {
		t.Log("BENCH imported image template: skipped (imports need root)")
		return
	}
	work := t.TempDir()
	root := filepath.Join(work, "root")
	os.Mkdir(root, 0o755)
	if out, err := exec.Command("debugfs", "-R", "rdump /upper "+root, deb.Layers[0].Path).CombinedOutput(); err != nil {
		t.Fatalf("debugfs rdump: %v: %s", err, out)
	}
	tarball := filepath.Join(work, "rootfs.tar")
	if out, err := exec.Command("tar", "-C", filepath.Join(root, "upper"), "-cf", tarball, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar: %v: %s", err, out)
	}
	os.RemoveAll(root)
	e.OK("image", "import", tarball, "--name", "deb-imported")
	os.Remove(tarball)

	ready := func(name, img string) time.Duration {
		start := time.Now()
		e.OK("create", name, "--image", img)
		e.OK("exec", name, "--", "true")
		took := time.Since(start)
		if s := e.Info(name); !strings.Contains(s.Cause, "restored from a template") {
			t.Fatalf("%s of %s was not restored from a template: %q", name, img, s.Cause)
		}
		e.OK("delete", name, "--yes")
		return took
	}
	ready("warm-i", "deb-imported") // builds the templates
	ready("warm-d", "debian")
	var imp, dbn []time.Duration
	for i := 0; i < 5; i++ { // alternated: this machine's load moves either
		imp = append(imp, ready(fmt.Sprintf("ti%d", i), "deb-imported"))
		dbn = append(dbn, ready(fmt.Sprintf("td%d", i), "debian"))
	}
	t.Logf("BENCH %-44s %10s vs debian's %10s  ratio %.2fx  (target ≤ 1.1x)",
		"imported image: create → first exec (median)", median(imp).Round(time.Millisecond), median(dbn).Round(time.Millisecond), float64(median(imp))/float64(median(dbn)))
	e.OK("image", "rm", "deb-imported")
}

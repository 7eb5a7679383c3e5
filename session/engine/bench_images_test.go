package engine_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthvm/berth/guest/image"
	"github.com/berthvm/berth/vmm"
	"github.com/berthvm/berth/vmm/vmmtest"
)

// allocated is what a file occupies on the host's disk.
func allocated(path string) int64 {
	var st syscall.Stat_t
	if syscall.Stat(path, &st) != nil {
		return -1
	}
	return st.Blocks * 512
}

// withColdDaemon restarts e's daemon with templates off, runs fn and
// restarts it with templates on.
func withColdDaemon(e *env, fn func()) {
	e.KillDaemon()
	os.Setenv("BERTH_NO_TEMPLATES", "1")
	e.StartDaemon()
	os.Unsetenv("BERTH_NO_TEMPLATES")
	fn()
	e.KillDaemon()
	e.StartDaemon()
}

// TestBenchImages prints issue 12's figures: the debian image's boot,
// template create and start against cold boots, its build against
// mmdebstrap and mkfs.ext4 by hand, and what a new system disk takes.
func TestBenchImages(t *testing.T) {
	needBench(t)
	ctx := context.Background()
	deb := vmmtest.Debian(t)
	e := newBenchEnv(t, "memory = \"512M\"\ndisk = \"64M\"\nidle_timeout = \"0\"\n")

	ready := func(name string, args ...string) time.Duration {
		start := time.Now()
		e.OK(append([]string{"create", name}, args...)...)
		e.OK("exec", name, "--", "true")
		return time.Since(start)
	}
	const n = 3
	var miniCold, debCold, debTmpl, startMini, startDeb []time.Duration
	withColdDaemon(e, func() {
		for i := 0; i < n; i++ {
			miniCold = append(miniCold, ready(fmt.Sprintf("mc%d", i)))
			debCold = append(debCold, ready(fmt.Sprintf("dc%d", i), "--image", "debian"))
			e.OK("delete", fmt.Sprintf("mc%d", i), "--yes")
			e.OK("delete", fmt.Sprintf("dc%d", i), "--yes")
		}
	})
	t.Logf("BENCH %-44s %10s vs mini %10s  ratio %.2fx  (target ≤ 1.2x)", "debian cold boot → ready (median)", median(debCold).Round(time.Millisecond), median(miniCold).Round(time.Millisecond), float64(median(debCold))/float64(median(miniCold)))
	ready("warm", "--image", "debian") // builds the template
	e.OK("delete", "warm", "--yes")
	for i := 0; i < n; i++ {
		debTmpl = append(debTmpl, ready(fmt.Sprintf("dt%d", i), "--image", "debian"))
		e.OK("delete", fmt.Sprintf("dt%d", i), "--yes")
	}
	t.Logf("BENCH %-44s %10s vs cold %10s  ratio %.2fx  (target ≤ 0.1x)", "debian create from template → ready (median)", median(debTmpl).Round(time.Millisecond), median(debCold).Round(time.Millisecond), float64(median(debTmpl))/float64(median(debCold)))

	e.OK("create", "sm")
	e.OK("create", "sd", "--image", "debian")
	for i := 0; i < n; i++ {
		for _, s := range []struct {
			name string
			out  *[]time.Duration
		}{{"sm", &startMini}, {"sd", &startDeb}} {
			e.OK("stop", s.name)
			start := time.Now()
			e.OK("start", s.name)
			e.OK("exec", s.name, "--", "true")
			*s.out = append(*s.out, time.Since(start))
		}
	}
	t.Logf("BENCH %-44s %10s vs cold %10s  ratio %.2fx  (target ≤ 0.1x)", "start of a stopped mini session → ready", median(startMini).Round(time.Millisecond), median(miniCold).Round(time.Millisecond), float64(median(startMini))/float64(median(miniCold)))
	t.Logf("BENCH %-44s %10s vs cold %10s  ratio %.2fx  (target ≤ 0.1x)", "start of a stopped debian session → ready", median(startDeb).Round(time.Millisecond), median(debCold).Round(time.Millisecond), float64(median(startDeb))/float64(median(debCold)))
	booted := allocated(filepath.Join(e.Data, "sessions", "sd", "system.img"))

	// cp of a 100 MB tree of 2,000 files in, against put of one 100 MB file.
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
	os.WriteFile(filepath.Join(local, "one.bin"), one, 0o644)
	e.OK("create", "cpb", "--disk", "1G")
	var cpIn, put []time.Duration
	for i := 0; i < n; i++ {
		start := time.Now()
		e.OK("cp", tree, "cpb:t")
		cpIn = append(cpIn, time.Since(start))
		start = time.Now()
		e.OK("put", "cpb", filepath.Join(local, "one.bin"), "one.bin")
		put = append(put, time.Since(start))
		e.OK("rm", "cpb", "-r", "t")
	}
	mb := float64(len(one)) / 1e6
	t.Logf("BENCH %-44s %10s (%.0f MB/s) vs put of one file %10s (%.0f MB/s)  ratio %.2fx  (report)", "cp in of 100 MB in 2,000 files (median)",
		median(cpIn).Round(time.Millisecond), mb/median(cpIn).Seconds(), median(put).Round(time.Millisecond), mb/median(put).Seconds(), float64(median(cpIn))/float64(median(put)))
	var cpOut []time.Duration
	for i := 0; i < n; i++ {
		start := time.Now()
		e.OK("cp", "cpb:one.bin", filepath.Join(local, fmt.Sprintf("out%d", i)))
		cpOut = append(cpOut, time.Since(start))
	}
	t.Logf("BENCH %-44s %10s (%.0f MB/s)  (report)", "cp out of the same tree (median)", median(cpOut).Round(time.Millisecond), mb/median(cpOut).Seconds())

	// A new system disk before any write, and after the first boots.
	sys := filepath.Join(t.TempDir(), "system.img")
	if err := image.CreateSystemDisk(ctx, sys, 8<<30, vmm.NewUUID()); err != nil {
		t.Fatal(err)
	}
	t.Logf("BENCH %-44s %10d bytes of 8 GiB (target ≤ 1 MiB); after %d boots and stops %d bytes", "new system disk allocated", allocated(sys), n+1, booted)
	e.KillDaemon()

	// The build against mmdebstrap and mkfs.ext4 by hand, same packages,
	// alternated (this machine's load moves either by a third), with
	// berth's package cache emptied first so both download everything.
	work := t.TempDir()
	byHand := func() time.Duration {
		start := time.Now()
		root := filepath.Join(work, "root")
		cmd := exec.Command("mmdebstrap", "--variant=apt", "--include="+strings.Join(deb.Packages, ","), image.Suite, root)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("mmdebstrap: %v: %s", err, out)
		}
		du, _ := exec.Command("du", "-sb", root).Output()
		var used int64
		fmt.Sscan(string(du), &used)
		img := filepath.Join(work, "root.img")
		if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-d", root, img, fmt.Sprintf("%dM", used*13/10>>20+64)).CombinedOutput(); err != nil {
			t.Fatalf("mkfs.ext4: %v: %s", err, out)
		}
		took := time.Since(start)
		os.RemoveAll(root)
		os.Remove(img)
		return took
	}
	var st *image.Store
	var built image.Image
	ours := func(i int) time.Duration {
		os.RemoveAll(filepath.Join(vmmtest.CacheDir(), "debs"))
		st = &image.Store{Dir: filepath.Join(work, fmt.Sprintf("images%d", i)), CacheDir: vmmtest.CacheDir(), Agent: filepath.Join(vmmtest.CacheDir(), "test", "berth-agent")}
		start := time.Now()
		var did bool
		var err error
		built, did, err = st.Build(ctx, image.Options{Name: "debian"})
		if err != nil || !did {
			t.Fatalf("build: %v (built %v)", err, did)
		}
		return time.Since(start)
	}
	var hands, builds []time.Duration
	for i := 0; i < 2; i++ {
		hands = append(hands, byHand())
		builds = append(builds, ours(i))
	}
	hand, took := (hands[0]+hands[1])/2, (builds[0]+builds[1])/2
	t.Logf("BENCH %-44s %10s vs by hand %10s  ratio %.2fx  (target ≤ 1.3x; mean of 2, alternated)", "image build debian (mmdebstrap + layer)", took.Round(time.Millisecond), hand.Round(time.Millisecond), float64(took)/float64(hand))
	start := time.Now()
	if _, did, err := st.Build(ctx, image.Options{Name: "debian"}); err != nil || did {
		t.Fatalf("rebuild: %v (built %v)", err, did)
	}
	t.Logf("BENCH %-44s %10s  (target ≤ 1s)", "image rebuild with no change", time.Since(start).Round(time.Millisecond))
	t.Logf("BENCH %-44s %d packages installed, root layer %.1f MB (%.1f MB allocated), image %.1f MB on disk", "debian image", built.Installed, float64(built.Layers[0].Size)/1e6, float64(allocated(built.Layers[0].Path))/1e6, float64(built.DiskBytes())/1e6)
}

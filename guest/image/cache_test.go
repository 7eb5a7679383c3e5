package image

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The shared caches are tested with fakes of the programs a build runs
// (mmdebstrap, apt-cache, apt-get, dpkg-deb), put first on PATH: they
// behave as the real ones do towards the cache, slowly enough that two
// builds overlap, and check what a real one would trip over.

// fakeBin writes an executable script named name into dir.
func fakeBin(t *testing.T, dir, name, script string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"+script), 0o755); err != nil {
		t.Fatal(err)
	}
}

// withFakes puts dir first on PATH for the test.
func withFakes(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	t.Setenv("PATH", dir+":"+os.Getenv("PATH"))
	return dir
}

// countLines counts the lines of a log file the fakes append to.
func countLines(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Count(b, []byte("\n"))
}

func TestLockFileWaitsAndFollowsContext(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	unlock, err := lockFile(t.Context(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tryLockFile(path); !errors.Is(err, errLocked) {
		t.Fatalf("a second lock while the first is held: %v, want errLocked", err)
	}

	// A waiter says once that it waits, and gives up with its context.
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	said := 0
	start := time.Now()
	_, err = lockFile(ctx, path, func() { said++ })
	if !errors.Is(err, context.DeadlineExceeded) || said != 1 {
		t.Fatalf("waiting on a held lock: %v, said it waits %d times; want DeadlineExceeded, once", err, said)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("gave up %v after its context ended", d)
	}

	// One that waits gets it once it is released.
	got := make(chan error, 1)
	go func() {
		u, err := lockFile(t.Context(), path, nil)
		if err == nil {
			u()
		}
		got <- err
	}()
	time.Sleep(50 * time.Millisecond)
	unlock()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter never got the released lock")
	}

	// A lock file removed while held is not a lock: the next holder
	// takes the file under the name.
	unlock, err = lockFile(t.Context(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(path)
	unlock2, err := tryLockFile(path)
	if err != nil {
		t.Fatalf("after the lock file was removed: %v", err)
	}
	unlock2()
	unlock()
}

// TestLockHelperProcess is the other process of TestLockFileAcrossProcesses.
func TestLockHelperProcess(t *testing.T) {
	path := os.Getenv("BERTH_LOCK_HELPER")
	if path == "" {
		t.Skip("only as a helper process")
	}
	if _, err := lockFile(context.Background(), path, nil); err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println("locked")
	io.Copy(io.Discard, os.Stdin) // hold it until killed or stdin ends
	os.Exit(0)
}

// A lock held by another process keeps a build waiting, and the kernel
// releases it when that process dies, however it dies.
func TestLockFileAcrossProcesses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	cmd := exec.Command(os.Args[0], "-test.run=^TestLockHelperProcess$")
	cmd.Env = append(os.Environ(), "BERTH_LOCK_HELPER="+path)
	stdin, _ := cmd.StdinPipe()
	defer stdin.Close()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	if line != "locked\n" {
		cmd.Process.Kill()
		t.Fatalf("helper said %q", line)
	}
	said := make(chan struct{}, 1)
	got := make(chan error, 1)
	go func() {
		u, err := lockFile(t.Context(), path, func() { said <- struct{}{} })
		if err == nil {
			u()
		}
		got <- err
	}()
	select {
	case <-said:
	case err := <-got:
		t.Fatalf("took a lock another process holds: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("did not say it waits")
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a dead process's lock was never released")
	}
}

// fakeMmdebstrap is mmdebstrap towards the package cache: it reads the
// sync-in directory (failing as tar would on a package being written
// meanwhile: each whole one ends in "END"), "downloads" the packages
// not there, writes them out to the sync-out directory, and counts its
// runs in $FAKE_LOG. Two runs can be made to overlap exactly: one that
// installs "writer" stops halfway through writing its first package out
// until one that installs "reader" has read its packages in (files in
// $FAKE_SYNC say how far each got).
const fakeMmdebstrap = `
in=""; out=""; pkgs="base-files apt"; target=""
for a in "$@"; do
	case "$a" in
	--setup-hook=sync-in*) in=$(echo "$a" | cut -d' ' -f2) ;;
	--customize-hook=sync-out*) out=$(echo "$a" | cut -d' ' -f3) ;;
	--include=*) pkgs="$pkgs $(echo "${a#--include=}" | tr , ' ')" ;;
	esac
	target="$a"
done
role=""
case " $pkgs " in *" writer "*) role=writer ;; *" reader "*) role=reader ;; esac
waitfor() { n=0; while [ ! -e "$FAKE_SYNC/$1" ] && [ $n -lt 1000 ]; do sleep 0.01; n=$((n+1)); done; }
echo run >> "$FAKE_LOG"
echo "I: running apt-get update..."
[ "$role" = reader ] && waitfor half
arch="$target/var/cache/apt/archives"
mkdir -p "$arch"
if [ -n "$in" ]; then
	for f in "$in"/*.deb; do
		[ -e "$f" ] || continue
		if [ "$(tail -c 3 "$f")" != "END" ]; then
			echo "tar: $f: file changed as we read it" >&2
			echo "E: tar failed" >&2
			echo "E: setup failed: E: tar failed" >&2
			echo "I: removing tempdir $target..."
			echo "E: mmdebstrap failed to run" >&2
			[ "$role" = reader ] && touch "$FAKE_SYNC/read"
			exit 25
		fi
		cp "$f" "$arch/"
	done
fi
[ "$role" = reader ] && touch "$FAKE_SYNC/read"
for p in $pkgs; do
	f="$arch/${p}_1.0_amd64.deb"
	[ -e "$f" ] && continue
	echo "Get:1 http://deb.debian.org/debian bookworm/main amd64 $p amd64 1.0 [1 kB]"
	printf 'package %s ' "$p" > "$f"; printf 'END' >> "$f"
done
mkdir -p "$target/etc"; echo berth > "$target/etc/hostname"
if [ -n "$out" ]; then
	for f in "$arch"/*.deb; do
		head -c 5 "$f" > "$out/$(basename "$f")"
		if [ "$role" = writer ] && [ ! -e "$FAKE_SYNC/half" ]; then touch "$FAKE_SYNC/half"; waitfor read; fi
		tail -c +6 "$f" >> "$out/$(basename "$f")"
	done
fi
exit 0
`

// Two builds with their own data directories share the package cache,
// at once: one reads the cache in while the other is halfway through
// writing its packages out, then both again, with packages in common.
// Both succeed every time, and the cache only ever holds whole packages.
// (Before builds went through a snapshot and published by link, the
// reader failed as in issue 26: mmdebstrap's tar read a half-written
// package, exit status 25.)
func TestConcurrentBuildsShareTheDebCache(t *testing.T) {
	bin := withFakes(t)
	fakeBin(t, bin, "mmdebstrap", fakeMmdebstrap)
	t.Setenv("FAKE_LOG", filepath.Join(t.TempDir(), "runs"))
	debs := filepath.Join(t.TempDir(), "cache", "debs")
	for round, sets := range [][][]string{
		{{"jq", "curl"}, {"curl", "git"}},
		{{"writer", "make", "curl"}, {"reader", "jq"}},
		{{"jq", "curl", "gcc"}, {"curl", "git", "gcc"}},
	} {
		t.Setenv("FAKE_SYNC", t.TempDir())
		var wg sync.WaitGroup
		errs := make([]error, len(sets))
		for i, pkgs := range sets {
			wg.Go(func() {
				work := t.TempDir()
				tree := filepath.Join(work, "tree", "upper")
				os.MkdirAll(filepath.Dir(tree), 0o755)
				_, errs[i] = debootstrap(t.Context(), tree, debs, work, pkgs, func(Progress) {})
				if errs[i] == nil {
					if _, err := os.Stat(filepath.Join(work, "tree", "debs-in")); err == nil {
						errs[i] = errors.New("the package snapshot landed in the tree")
					}
				}
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d, build %d: %v", round, i, err)
			}
		}
	}
	ents, _ := os.ReadDir(debs)
	names := map[string]bool{}
	for _, e := range ents {
		b, _ := os.ReadFile(filepath.Join(debs, e.Name()))
		if !isDeb(e.Name()) || !bytes.HasSuffix(b, []byte("END")) {
			t.Errorf("the cache holds %s: %q", e.Name(), b)
		}
		names[e.Name()] = true
	}
	for _, p := range []string{"jq", "curl", "git", "make", "gcc", "base-files", "writer", "reader"} {
		if !names[p+"_1.0_amd64.deb"] {
			t.Errorf("the cache lacks %s (holds %v)", p, names)
		}
	}
}

// A failed build says why in one line: the line of the tool that failed,
// not mmdebstrap's closing "failed to run".
func TestMmdebstrapFailureSaysWhy(t *testing.T) {
	bin := withFakes(t)
	fakeBin(t, bin, "mmdebstrap", fakeMmdebstrap)
	t.Setenv("FAKE_LOG", filepath.Join(t.TempDir(), "runs"))
	debs := t.TempDir()
	os.WriteFile(filepath.Join(debs, "half_1.0_amd64.deb"), []byte("package half "), 0o644)
	work := t.TempDir()
	// The cache itself is written only by rename now: plant the half
	// file in the snapshot as a concurrent writer would have.
	in, _, err := stageDebs(t.TempDir(), work)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(in, "half_1.0_amd64.deb"), []byte("package half "), 0o644)
	tree := filepath.Join(work, "tree", "upper")
	_, err = debootstrap(t.Context(), tree, debs, work, nil, func(Progress) {})
	if err == nil {
		t.Fatal("a build on a half-written package succeeded")
	}
	msg := err.Error()
	if !strings.Contains(msg, "exit status 25") || !strings.Contains(msg, "half_1.0_amd64.deb: file changed as we read it") || strings.Contains(msg, "\n") {
		t.Fatalf("error %q; want one line with the exit status and tar's complaint", msg)
	}
}

func TestAptErrorPicksTheCause(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lines []string
		want  string
	}{
		{"apt", []string{"I: running apt-get update...", "E: Unable to locate package nosuch",
			"E: apt-get --yes -oAPT::Status-Fd=<$fd> -oDpkg::Use-Pty=false install nosuch failed", "I: removing tempdir /tmp/x...", "E: mmdebstrap failed to run"},
			"Unable to locate package nosuch"},
		{"tar", []string{"I: running special hook: sync-in /c/debs /var/cache/apt/archives/",
			"tar: ./curl_7.88_amd64.deb: File shrank by 1024 bytes; padding with zeros", "E: tar failed", "E: setup failed: E: tar failed",
			"I: removing tempdir...", "E: mmdebstrap failed to run"},
			"tar: ./curl_7.88_amd64.deb: File shrank by 1024 bytes; padding with zeros"},
		{"hook exit", []string{"I: running --setup-hook directly: mkdir -p /x", "E: special hook failed with exit code 256", "E: mmdebstrap failed to run"},
			"special hook failed with exit code 256"},
		{"network", append([]string{"W: Failed to fetch http://deb.debian.org/debian/dists/bookworm/InRelease  Temporary failure resolving 'deb.debian.org'"},
			"E: apt-get update -oAPT::Status-Fd=<$fd> failed", "E: mmdebstrap failed to run"),
			"W: Failed to fetch http://deb.debian.org/debian/dists/bookworm/InRelease  Temporary failure resolving 'deb.debian.org'"},
		{"many lines after", append([]string{"E: cannot open /x: Permission denied"}, strings.Split(strings.Repeat("I: cleanup\n", 40), "\n")...),
			"cannot open /x: Permission denied"},
		{"nothing", []string{"I: a", "something odd"}, "something odd"},
	} {
		tr := &aptTracker{report: func(Progress) {}}
		for _, l := range tc.lines {
			tr.line(l)
		}
		if got := tr.aptError(); got != tc.want {
			t.Errorf("%s: aptError = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// Fakes of apt-cache, apt-get download and dpkg-deb -x: one kernel
// package whose download and unpacking take a while; downloads are
// counted in $FAKE_LOG.
func fakeKernelTools(t *testing.T, bin string) {
	fakeBin(t, bin, "apt-cache", `echo "linux-image-amd64"; echo "  Depends: linux-image-6.1.0-99-amd64"`)
	fakeBin(t, bin, "apt-get", `[ "$1" = download ] || exit 100
echo download >> "$FAKE_LOG"; sleep 0.2
eval pkg=\${$#}; echo deb > "${pkg}_6.1.0-99_amd64.deb"`)
	fakeBin(t, bin, "dpkg-deb", `[ "$1" = -x ] || exit 2
mkdir -p "$3/boot" "$3/lib/modules/6.1.0-99-amd64/kernel"
printf vmlinuz > "$3/boot/vmlinuz-6.1.0-99-amd64"; sleep 0.2`)
}

// Two builds fetching the kernel into one cache at once: one downloads,
// the other says it waits, and both get the same whole kernel.
func TestConcurrentKernelFetch(t *testing.T) {
	bin := withFakes(t)
	fakeKernelTools(t, bin)
	log := filepath.Join(t.TempDir(), "downloads")
	t.Setenv("FAKE_LOG", log)
	cache := t.TempDir()
	var wg sync.WaitGroup
	ks := make([]Kernel, 3)
	errs := make([]error, 3)
	outs := make([]bytes.Buffer, 3)
	var mu sync.Mutex
	for i := range ks {
		wg.Go(func() {
			ks[i], errs[i] = FetchKernel(t.Context(), cache, writerFunc(func(p []byte) {
				mu.Lock()
				outs[i].Write(p)
				mu.Unlock()
			}))
		})
	}
	wg.Wait()
	waited := 0
	for i := range ks {
		if errs[i] != nil {
			t.Fatalf("fetch %d: %v", i, errs[i])
		}
		if ks[i] != ks[0] || ks[i].Version != "6.1.0-99-amd64" {
			t.Fatalf("fetch %d got %+v, fetch 0 %+v", i, ks[i], ks[0])
		}
		if b, err := os.ReadFile(ks[i].Vmlinuz); err != nil || string(b) != "vmlinuz" {
			t.Fatalf("kernel %s: %q %v", ks[i].Vmlinuz, b, err)
		}
		if strings.Contains(outs[i].String(), waitingFor(filepath.Join(cache, "kernel"))) {
			waited++
		}
	}
	if n := countLines(t, log); n != 1 {
		t.Errorf("the kernel was downloaded %d times, want once", n)
	}
	if waited == 0 {
		t.Errorf("no fetch said it waited for another: %q", outs[0].String()+outs[1].String()+outs[2].String())
	}
}

type writerFunc func(p []byte)

func (w writerFunc) Write(p []byte) (int, error) { w(p); return len(p), nil }

// A helper's failure is one line: apt's error, not its whole stderr.
func TestHelperFailureIsOneLine(t *testing.T) {
	bin := withFakes(t)
	fakeBin(t, bin, "apt-get", `echo "Reading package lists..." >&2
echo "E: Can't find a source to download version '6.1.0-99' of 'linux-image-6.1.0-99-amd64:amd64'" >&2
echo "W: something later" >&2; exit 100`)
	_, err := run(t.Context(), t.TempDir(), "apt-get", "download", "-q", "x")
	if err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "E: Can't find a source to download") {
		t.Fatalf("run = %v; want one line with apt's error", err)
	}
}

// Two data directories' builds of the same root layer in one images
// directory (or two builds in one daemon): one makes it, the other waits
// and uses it; a prune meanwhile leaves alone the layer a build holds.
func TestConcurrentRootLayerIsMadeOnce(t *testing.T) {
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("mkfs.ext4 not installed")
	}
	bin := withFakes(t)
	fakeBin(t, bin, "mmdebstrap", fakeMmdebstrap)
	log := filepath.Join(t.TempDir(), "runs")
	t.Setenv("FAKE_LOG", log)
	images, cache := t.TempDir(), t.TempDir()
	p := &plan{name: "x", packages: []string{"jq"}}
	hash := p.rootHash()
	builders := make([]*builder, 2)
	layers := make([]cachedLayer, 2)
	errs := make([]error, 2)
	var mu sync.Mutex
	var lines []string
	var wg sync.WaitGroup
	for i := range builders {
		builders[i] = &builder{o: Options{ImagesDir: images, CacheDir: cache, Report: func(p Progress) {
			mu.Lock()
			lines = append(lines, p.String())
			mu.Unlock()
		}}, start: time.Now()}
		wg.Go(func() {
			layers[i], errs[i] = builders[i].rootLayer(t.Context(), p, hash)
			builders[i].release() // as Build does once its image is committed
		})
	}
	wg.Wait()
	for i := range errs {
		if errs[i] != nil {
			t.Fatalf("build %d: %v", i, errs[i])
		}
	}
	if layers[0] != layers[1] {
		t.Fatalf("two layers for one hash: %+v and %+v", layers[0], layers[1])
	}
	if n := countLines(t, log); n != 1 {
		t.Fatalf("mmdebstrap ran %d times for one layer", n)
	}
	if !strings.Contains(strings.Join(lines, "\n"), "waiting for another build using layer "+hash) {
		t.Errorf("no build said it waited: %q", lines)
	}
}

// Pruning skips a layer a build holds and removes it once none does.
func TestPruneLeavesHeldLayers(t *testing.T) {
	images := t.TempDir()
	b := &builder{o: Options{ImagesDir: images, Report: func(Progress) {}}}
	if err := b.holdLayer(t.Context(), "abc"); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(images, layerCache, "work.img")
	os.WriteFile(file, []byte("layer"), 0o644)
	if _, err := b.store(file, "abc", "uuid", 0); err != nil {
		t.Fatal(err)
	}
	pruneLayerCache(images)
	if _, ok := b.cached("abc"); !ok {
		t.Fatal("a prune removed a layer a build holds, before its image links it")
	}
	b.release()
	pruneLayerCache(images)
	if _, ok := b.cached("abc"); ok {
		t.Fatal("a prune kept a layer no image links and no build holds")
	}
}

// A build of an image another build of it holds waits, says so, and
// gives up with its context.
func TestBuildWaitsForTheSameImage(t *testing.T) {
	images := t.TempDir()
	unlock, err := lockFile(t.Context(), nameLock(images, "mini"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	var got []string
	_, _, err = Build(ctx, Options{Name: "mini", ImagesDir: images, Report: func(p Progress) { got = append(got, p.String()) }})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Build while another holds the image: %v", err)
	}
	if len(got) != 1 || got[0] != "wait: "+waitingFor(filepath.Join(images, "mini")) {
		t.Fatalf("progress %q", got)
	}
	os.MkdirAll(filepath.Join(images, "mini"), 0o755)
	if err := Remove(images, "mini"); err == nil || !strings.Contains(err.Error(), "being built") {
		t.Fatalf("Remove while a build holds the image: %v", err)
	}
}

// An image built before builds took locks (no .locks directory) can be
// removed and pruned.
func TestRemoveWithoutLockDirectory(t *testing.T) {
	images := t.TempDir()
	os.MkdirAll(filepath.Join(images, "old", "0123456789abcdef"), 0o755)
	Prune(images, "old", func(string) bool { return false })
	if _, err := os.Stat(filepath.Join(images, "old", "0123456789abcdef")); err == nil {
		t.Fatal("Prune kept a build neither current nor kept")
	}
	if err := Remove(images, "old"); err != nil {
		t.Fatalf("Remove: %v", err)
	}
}

// Issue 26's case with the real mmdebstrap: two builds of a Debian root
// layer, with their own images directories and one fresh cache, at once.
// Both succeed, the cache then holds whole packages only, and a third
// build finds every package there (mmdebstrap reads the cache's
// snapshot). It downloads Debian and runs mmdebstrap three times (a few
// minutes): run it on request, under the machine's VM lock:
//
//	BERTH_TEST_MMDEBSTRAP=1 flock /tmp/berth-vm.lock go test -run TestMmdebstrapBuildsShareTheCache ./guest/image/
func TestMmdebstrapBuildsShareTheCache(t *testing.T) {
	if os.Getenv("BERTH_TEST_MMDEBSTRAP") == "" {
		t.Skip("set BERTH_TEST_MMDEBSTRAP=1 (downloads Debian, runs mmdebstrap three times)")
	}
	if _, err := exec.LookPath("mmdebstrap"); err != nil {
		t.Skip("mmdebstrap not installed")
	}
	cache := t.TempDir()
	p := &plan{name: "x", packages: []string{"jq"}}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	took := make([]time.Duration, 2)
	for i := range errs {
		wg.Go(func() {
			start := time.Now()
			b := &builder{o: Options{ImagesDir: t.TempDir(), CacheDir: cache, Report: func(Progress) {}}, start: start}
			defer b.release()
			_, errs[i] = b.rootLayer(t.Context(), p, p.rootHash())
			took[i] = time.Since(start)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("build %d: %v", i, err)
		}
		t.Logf("build %d took %v", i, took[i].Round(time.Second))
	}
	debs, _ := filepath.Glob(filepath.Join(cache, "debs", "*.deb"))
	if len(debs) < 50 {
		t.Fatalf("the cache holds %d packages", len(debs))
	}
	for _, d := range debs {
		if out, err := exec.Command("dpkg-deb", "--info", d).CombinedOutput(); err != nil {
			t.Fatalf("%s in the cache is no whole package: %v: %s", d, err, lastLine(string(out)))
		}
	}
	downloads := 0
	b := &builder{o: Options{ImagesDir: t.TempDir(), CacheDir: cache, Report: func(p Progress) {
		if p.Phase == "download" {
			downloads++
		}
	}}, start: time.Now()}
	defer b.release()
	if _, err := b.rootLayer(t.Context(), p, p.rootHash()); err != nil {
		t.Fatalf("a build on the filled cache: %v", err)
	}
	if downloads != 0 {
		t.Errorf("a build on the filled cache downloaded %d packages", downloads)
	}
}

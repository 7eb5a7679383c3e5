// Package vmmtest holds what tests that boot real VMs share: the guest
// image, built once per machine and cached, and the conformance suite every
// vmm.Driver passes.
package vmmtest

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthvm/berth/guest/image"
)

// CacheDir is where tests keep the kernel, agent and image between runs:
// $BERTH_TEST_CACHE, else the user cache directory.
func CacheDir() string {
	if d := os.Getenv("BERTH_TEST_CACHE"); d != "" {
		return d
	}
	d, err := os.UserCacheDir()
	if err != nil {
		d = os.TempDir()
	}
	return filepath.Join(d, "berth")
}

var (
	imageOnce sync.Once
	imageVal  image.Image
	imageErr  error
)

// RepoRoot finds the module root from this file's location.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Image returns the mini image, building the agent and image if needed.
// Test binaries of several packages run at once, so the build holds a lock.
func Image(t testing.TB) image.Image {
	t.Helper()
	imageOnce.Do(func() { imageVal, imageErr = buildImage() })
	if imageErr != nil {
		t.Fatalf("guest image: %v", imageErr)
	}
	return imageVal
}

// AgentBinary builds the static agent into the cache and returns its path.
func AgentBinary(ctx context.Context) (string, error) {
	dir := filepath.Join(CacheDir(), "test")
	os.MkdirAll(dir, 0o755)
	out := filepath.Join(dir, "berth-agent")
	tmp, err := os.CreateTemp(dir, ".agent-")
	if err != nil {
		return "", err
	}
	tmp.Close()
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w -X main.build=test", "-o", tmp.Name(), "./guest/cmd/berth-agent")
	cmd.Dir = RepoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp.Name())
		return "", &buildError{err: err, out: string(b)}
	}
	return out, os.Rename(tmp.Name(), out)
}

type buildError struct {
	err error
	out string
}

func (e *buildError) Error() string { return "build agent: " + e.err.Error() + ": " + e.out }

func buildImage() (image.Image, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	unlock, err := lockCache()
	if err != nil {
		return image.Image{}, err
	}
	defer unlock()
	if _, err := AgentBinary(ctx); err != nil {
		return image.Image{}, err
	}
	im, _, err := testStore().Build(ctx, image.Options{Name: "mini"})
	return im, err
}

// Debian returns the debian image, building it (mmdebstrap, about a
// minute; cached by its inputs like mini) the first time on a machine.
func Debian(t testing.TB) image.Image {
	t.Helper()
	Image(t)
	debianOnce.Do(func() { debianVal, debianErr = buildDebian() })
	if debianErr != nil {
		t.Fatalf("debian image: %v", debianErr)
	}
	return debianVal
}

var (
	debianOnce sync.Once
	debianVal  image.Image
	debianErr  error
)

func buildDebian() (image.Image, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	unlock, err := lockCache()
	if err != nil {
		return image.Image{}, err
	}
	defer unlock()
	st := testStore()
	im, _, err := st.Build(ctx, image.Options{Name: "debian"})
	return im, err
}

func testStore() *image.Store {
	return &image.Store{Dir: filepath.Join(CacheDir(), "test", "images"), CacheDir: CacheDir(), Agent: filepath.Join(CacheDir(), "test", "berth-agent")}
}

// lockCache serialises builds into the shared test cache: test binaries
// of several packages run at once.
func lockCache() (func(), error) {
	cache := CacheDir()
	os.MkdirAll(cache, 0o755)
	lock, err := os.OpenFile(filepath.Join(cache, "test.lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		lock.Close()
		return nil, err
	}
	return func() { unix.Flock(int(lock.Fd()), unix.LOCK_UN); lock.Close() }, nil
}

// Images returns the test image store, with the mini image built.
func Images(t testing.TB) *image.Store {
	t.Helper()
	Image(t)
	return testStore()
}

// Berth builds the berth command with berth-host and the agent next to it
// (where berth and the daemon look for them) and returns berth's path.
func Berth(t testing.TB) string {
	t.Helper()
	berthOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		// Each test process builds its own (the tree may have changed
		// since another did); those over 2 hours old are of processes
		// gone (make test bounds a package's run to 25 minutes).
		parent := filepath.Join(os.TempDir(), "berth-test-bin")
		os.MkdirAll(parent, 0o755)
		removeOlder(parent, 2*time.Hour)
		dir, err := os.MkdirTemp(parent, "berth-bin-")
		if err != nil {
			berthErr = err
			return
		}
		agent, err := AgentBinary(ctx)
		if err != nil {
			berthErr = err
			return
		}
		b, err := os.ReadFile(agent)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, "berth-agent"), b, 0o755)
		}
		if err != nil {
			berthErr = err
			return
		}
		// berth runs the client commands and becomes berth-host, next
		// to it, for the others (serve among them).
		for _, b := range []struct{ out, pkg string }{{"berth", "."}, {"berth-host", "./ui/app/cmd/berth-host"}} {
			cmd := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(dir, b.out), b.pkg)
			cmd.Dir = RepoRoot()
			if out, err := cmd.CombinedOutput(); err != nil {
				berthErr = &buildError{err: err, out: string(out)}
				return
			}
		}
		berthPath = filepath.Join(dir, "berth")
	})
	if berthErr != nil {
		t.Fatalf("build berth: %v", berthErr)
	}
	return berthPath
}

var (
	berthOnce sync.Once
	berthPath string
	berthErr  error
	etcdOnce  sync.Once
	etcdErr   error
)

// BerthEtcd is Berth with berth-etcd built next to it, for the tests
// that run `berth etcd`.
func BerthEtcd(t testing.TB) string {
	t.Helper()
	berth := Berth(t)
	etcdOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(filepath.Dir(berth), "berth-etcd"), "./session/fleet/member/cmd/berth-etcd")
		cmd.Dir = RepoRoot()
		if out, err := cmd.CombinedOutput(); err != nil {
			etcdErr = &buildError{err: err, out: string(out)}
		}
	})
	if etcdErr != nil {
		t.Fatalf("build berth-etcd: %v", etcdErr)
	}
	return berth
}

// shareImage links a test image the shared cache holds into a data
// directory, with the layer cache, so recipes built on it reuse its layers.
func shareImage(t testing.TB, dir, name string) {
	t.Helper()
	st := testStore()
	if _, err := st.Load(name, ""); err != nil {
		return
	}
	os.Symlink(filepath.Join(st.Dir, name), filepath.Join(dir, "images", name))
	if _, err := os.Lstat(filepath.Join(dir, "images", ".layers")); err != nil {
		os.Symlink(filepath.Join(st.Dir, ".layers"), filepath.Join(dir, "images", ".layers"))
	}
}

// DebianDataDir is DataDir with the debian image shared as well.
func DebianDataDir(t testing.TB) string {
	t.Helper()
	Debian(t)
	return DataDir(t)
}

// DataDir returns a fresh data directory whose mini image is the shared
// test image, so daemons under test do not rebuild it.
func DataDir(t testing.TB) string {
	t.Helper()
	return DataDirIn(t, t.TempDir())
}

// DataDirIn makes dir (which must not hold a data directory yet) a data
// directory like DataDir's: for a data directory on a filesystem of the
// test's own, such as a small tmpfs.
func DataDirIn(t testing.TB, dir string) string {
	t.Helper()
	im := Image(t)
	if err := os.MkdirAll(filepath.Join(dir, "images"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Dir(im.Dir), filepath.Join(dir, "images", "mini")); err != nil {
		t.Fatal(err)
	}
	shareImage(t, dir, "debian")
	// Templates are shared too: building one costs a boot.
	shared := filepath.Join(CacheDir(), "test", "templates")
	os.MkdirAll(shared, 0o755)
	pruneOnce.Do(func() { pruneTemplates(shared) })
	if err := os.Symlink(shared, filepath.Join(dir, "templates")); err != nil {
		t.Fatal(err)
	}
	return dir
}

var pruneOnce sync.Once

// pruneTemplates removes the shared templates of image builds the test
// store no longer has (each agent change builds mini again, and its
// templates, ~100 MB each, would pile up): nothing restores those. One
// of a live build is kept, however old (a test may be restoring it now),
// and so is one made in the last hour, whose builder may be writing it.
func pruneTemplates(dir string) {
	live := map[string]bool{}
	for _, name := range []string{"mini", "debian"} {
		builds, _ := os.ReadDir(filepath.Join(CacheDir(), "test", "images", name))
		for _, b := range builds {
			live[b.Name()] = true
		}
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		fi, err := os.Stat(p)
		if err != nil || time.Since(fi.ModTime()) < time.Hour || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		var t struct{ Digest string }
		b, err := os.ReadFile(filepath.Join(p, "image.json"))
		if err == nil && json.Unmarshal(b, &t) == nil && live[t.Digest] {
			continue
		}
		os.RemoveAll(p)
	}
}

// removeOlder removes what in dir was last changed more than age ago.
func removeOlder(dir string, age time.Duration) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > age {
			os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	}
}

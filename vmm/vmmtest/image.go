// Package vmmtest holds what tests that boot real VMs share: the guest
// image, built once per machine and cached, and the conformance suite every
// vmm.Driver passes.
package vmmtest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
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
	cache := CacheDir()
	os.MkdirAll(cache, 0o755)
	lock, err := os.OpenFile(filepath.Join(cache, "test.lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return image.Image{}, err
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return image.Image{}, err
	}
	defer unix.Flock(int(lock.Fd()), unix.LOCK_UN)
	agent, err := AgentBinary(ctx)
	if err != nil {
		return image.Image{}, err
	}
	im, _, err := image.Build(ctx, image.Options{
		Name: "mini", ImagesDir: filepath.Join(cache, "test", "images"), CacheDir: cache, Agent: agent,
	})
	return im, err
}

// Berth builds the berth command with the agent next to it (where the
// daemon looks for it) and returns the command's path.
func Berth(t testing.TB) string {
	t.Helper()
	berthOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		dir, err := os.MkdirTemp("", "berth-bin-")
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
		cmd := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(dir, "berth"), ".")
		cmd.Dir = RepoRoot()
		if out, err := cmd.CombinedOutput(); err != nil {
			berthErr = &buildError{err: err, out: string(out)}
			return
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
)

// DataDir returns a fresh data directory whose mini image is the shared
// test image, so daemons under test do not rebuild it.
func DataDir(t testing.TB) string {
	t.Helper()
	im := Image(t)
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "images"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(im.Dir, filepath.Join(dir, "images", "mini")); err != nil {
		t.Fatal(err)
	}
	// Templates are shared too: building one costs a boot.
	shared := filepath.Join(CacheDir(), "test", "templates")
	os.MkdirAll(shared, 0o755)
	if err := os.Symlink(shared, filepath.Join(dir, "templates")); err != nil {
		t.Fatal(err)
	}
	return dir
}

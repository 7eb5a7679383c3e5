package daemon_test

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/api"
	"github.com/berthvm/berth/session/daemon"
)

// These tests start the daemon but never a session: no VM boots.

// options returns daemon options on a fresh data directory, logging to
// the test. The directory is short: the socket's path must fit in 108
// bytes.
func options(t *testing.T) daemon.Options {
	t.Helper()
	dir, err := os.MkdirTemp("", "berthd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return daemon.Options{
		DataDir:     dir,
		CacheDir:    t.TempDir(),
		Agent:       filepath.Join(dir, "no-agent"), // nothing builds an image
		Version:     "test-1",
		Logger:      slog.New(slog.NewTextHandler(t.Output(), nil)),
		NoTemplates: true,
	}
}

// running is a daemon started by start.
type running struct {
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

// start runs the daemon and returns once its socket accepts calls; the
// test's cleanup stops it.
func start(t *testing.T, o daemon.Options) *running {
	t.Helper()
	ready := make(chan struct{})
	o.Ready = func() { close(ready) }
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- daemon.Run(ctx, o) }()
	select {
	case <-ready:
	case err := <-r.done:
		cancel()
		t.Fatalf("Run ended before it was ready: %v", err)
	case <-time.After(30 * time.Second):
		cancel()
		t.Fatal("the daemon was not ready within 30s")
	}
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop cancels Run's context and returns what Run returned (idempotent).
func (r *running) stop(t *testing.T) error {
	t.Helper()
	r.once.Do(func() {
		r.cancel()
		select {
		case r.err = <-r.done:
		case <-time.After(30 * time.Second):
			t.Fatal("Run did not return within 30s of its context ending")
		}
	})
	return r.err
}

func ping(t *testing.T, dataDir string) (string, error) {
	t.Helper()
	c := api.Dial(daemon.SocketPath(dataDir))
	defer c.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	return c.Ping(ctx)
}

// TestStart: the socket answers a Ping with the daemon's version, the
// Manager behind it serves, and the person starting it is told where.
func TestStart(t *testing.T) {
	o := options(t)
	var out bytes.Buffer
	o.Out = &out
	start(t, o)
	v, err := ping(t, o.DataDir)
	if err != nil || v != "test-1" {
		t.Fatalf("Ping = %q, %v; want test-1", v, err)
	}
	c := api.Dial(daemon.SocketPath(o.DataDir))
	defer c.Close()
	list, err := c.List(t.Context())
	if err != nil || len(list) != 0 {
		t.Errorf("List = %v, %v; want no sessions", list, err)
	}
	want := "berth daemon test-1 (pid " + strconv.Itoa(os.Getpid()) + "): data " + o.DataDir + ", socket " + daemon.SocketPath(o.DataDir) + "\n"
	if out.String() != want {
		t.Errorf("Out = %q, want %q", out.String(), want)
	}
	if _, err := os.Stat(filepath.Join(o.DataDir, "config.toml")); err != nil {
		t.Errorf("no documented config written on first start: %v", err)
	}
}

// TestLockRefusal: a second daemon on the same data directory is refused
// with ErrConflict naming the first one's pid, and the first keeps serving.
func TestLockRefusal(t *testing.T) {
	o := options(t)
	start(t, o)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	err := daemon.Run(ctx, o)
	if !errors.Is(err, session.ErrConflict) {
		t.Fatalf("second Run = %v, want ErrConflict", err)
	}
	if want := "berth daemon pid " + strconv.Itoa(os.Getpid()); !strings.Contains(err.Error(), want) {
		t.Errorf("second Run = %q, want it to name %q", err, want)
	}
	if _, err := ping(t, o.DataDir); err != nil {
		t.Errorf("the first daemon stopped answering: %v", err)
	}
}

// TestOrderedShutdown: once ctx ends, open streams end, Run returns nil,
// the socket is gone and refuses, and the lock is released: a new daemon
// starts on the same data directory and store.
func TestOrderedShutdown(t *testing.T) {
	o := options(t)
	r := start(t, o)
	c := api.Dial(daemon.SocketPath(o.DataDir))
	defer c.Close()
	events, err := c.Watch(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := r.stop(t); err != nil {
		t.Fatalf("Run = %v after a clean stop, want nil", err)
	}
	select {
	case _, ok := <-events:
		for ok {
			_, ok = <-events
		}
	case <-time.After(10 * time.Second):
		t.Error("a watch stream outlived the daemon")
	}
	if _, err := os.Stat(daemon.SocketPath(o.DataDir)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("socket after shutdown: %v, want it gone", err)
	}
	if _, err := ping(t, o.DataDir); !errors.Is(err, session.ErrUnavailable) {
		t.Errorf("Ping after shutdown = %v, want ErrUnavailable", err)
	}
	start(t, o)
	if _, err := ping(t, o.DataDir); err != nil {
		t.Errorf("Ping on the restarted daemon: %v", err)
	}
}

// TestShutdownErrors: an extra that fails ends the daemon with its error,
// and errors the extras return at shutdown are returned with it.
func TestShutdownErrors(t *testing.T) {
	o := options(t)
	boom, late := errors.New("extra failed"), errors.New("extra failed at shutdown")
	o.Extra = []func(context.Context, session.Service) error{
		func(ctx context.Context, svc session.Service) error {
			if _, err := svc.List(ctx); err != nil {
				return err
			}
			return boom
		},
		func(ctx context.Context, svc session.Service) error {
			<-ctx.Done()
			return late
		},
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	err := daemon.Run(ctx, o)
	if !errors.Is(err, boom) || !errors.Is(err, late) {
		t.Fatalf("Run = %v, want both extras' errors", err)
	}
	if ctx.Err() != nil {
		t.Error("Run waited for its context instead of ending with the failed extra")
	}
	lock, err := daemon.LockDataDir(o.DataDir)
	if err != nil {
		t.Fatalf("lock after the daemon ended: %v", err)
	}
	lock.Unlock()
}

// TestConfigErrors: a bad config.toml stops the daemon before it serves,
// with an error naming the file and the key, and leaves the lock free.
func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name, config, key string
	}{
		{"unknown key", "cpu = 2\n", `"cpu"`},
		{"bad size", "memory = \"12Q\"\n", "memory"},
		{"bad accel", "accel = \"fast\"\n", "accel"},
		{"bad vmm", "vmm = \"xen\"\n", "vmm"},
		{"bad duration", "idle_timeout = \"soon\"\n", "idle_timeout"},
		{"wrong type", "cpus = \"two\"\n", "cpus"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := options(t)
			path := filepath.Join(o.DataDir, "config.toml")
			if err := os.WriteFile(path, []byte(tc.config), 0o644); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			err := daemon.Run(ctx, o)
			if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.key) {
				t.Fatalf("Run = %v, want an error naming %s and %s", err, path, tc.key)
			}
			if _, err := os.Stat(daemon.SocketPath(o.DataDir)); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("socket after a config error: %v, want none", err)
			}
			lock, err := daemon.LockDataDir(o.DataDir)
			if err != nil {
				t.Fatalf("lock after a config error: %v", err)
			}
			lock.Unlock()
		})
	}
}

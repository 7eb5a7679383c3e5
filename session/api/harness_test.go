package api_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/api"
	"github.com/berthvm/berth/session/sessiontest"
)

// harness is a daemon API on a real unix socket, backed by a fake, and a
// client for it.
type harness struct {
	fake   *sessiontest.Fake
	client *api.Client
	socket string
}

// start serves svc (a new fake when nil) until the test ends.
func start(t testing.TB, svc session.Service, opts ...api.ServerOption) *harness {
	t.Helper()
	h := &harness{}
	if svc == nil {
		h.fake = sessiontest.New(sessiontest.Options{})
		svc = h.fake
	}
	// Unix socket paths are short (108 bytes); t.TempDir can be longer.
	dir, err := os.MkdirTemp("", "berth-api")
	if err != nil {
		t.Fatal(err)
	}
	h.socket = filepath.Join(dir, "berth.sock")
	ln, err := api.Listen(h.socket)
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	base, stopStreams := context.WithCancel(context.Background())
	srv := &http.Server{
		Handler:     api.NewServer(svc, logger, append([]api.ServerOption{api.WithVersion("v9.9.9-test")}, opts...)...),
		BaseContext: func(net.Listener) context.Context { return base },
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.Serve(ln)
	}()
	h.client = api.Dial(h.socket, api.WithActor("test"))
	t.Cleanup(func() {
		h.client.Close()
		stopStreams()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("server shutdown: %v", err)
		}
		<-served
		if h.fake != nil {
			h.fake.Close()
		}
		os.RemoveAll(dir)
	})
	return h
}

// create makes a running session through the client.
func (h *harness) create(t testing.TB, name string) {
	t.Helper()
	if _, err := h.client.Create(t.Context(), session.CreateOptions{Name: name}); err != nil {
		t.Fatalf("Create %s: %v", name, err)
	}
}

// goroutinesBack returns a check that waits for the goroutine count to be
// back at most where it is now, and fails with a dump when it is not.
func goroutinesBack(t *testing.T) func() {
	base := runtime.NumGoroutine()
	return func() {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > base {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				n := runtime.Stack(buf, true)
				t.Errorf("goroutines: %d before, %d after:\n%s", base, runtime.NumGoroutine(), buf[:n])
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

func wantClass(t *testing.T, what string, err, class error) {
	t.Helper()
	if !errors.Is(err, class) {
		t.Errorf("%s: err = %v, want %v", what, err, class)
	}
}

func collect(p session.Process) (stdout, stderr string) {
	var o, e strings.Builder
	for c := range p.Output() {
		if c.Stream == session.Stderr {
			e.Write(c.Data)
		} else {
			o.Write(c.Data)
		}
	}
	return o.String(), e.String()
}

package cli_test

import (
	"bytes"
	"context"
	"flag"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/api"
	"github.com/berthvm/berth/session/sessiontest"
	"github.com/berthvm/berth/ui/cli"
)

var update = flag.Bool("update", false, "rewrite golden files")

// epoch is where the fake's clock starts; now is what the CLI sees.
var (
	epoch = time.Date(2026, 3, 14, 9, 0, 0, 0, time.UTC)
	now   = epoch.Add(2 * time.Hour)
)

// clock ticks one second per reading, so records get distinct, repeatable
// times.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(time.Second)
	return c.t
}

// world is a daemon API on a real socket, backed by a fake, and the client
// the CLI connects with.
type world struct {
	fake   *sessiontest.Fake
	client *api.Client
	socket string
}

func newWorld(t *testing.T, opts sessiontest.Options) *world {
	t.Helper()
	if opts.Now == nil {
		opts.Now = (&clock{t: epoch}).Now
	}
	w := &world{fake: sessiontest.New(opts)}
	dir, err := os.MkdirTemp("", "berth-cli")
	if err != nil {
		t.Fatal(err)
	}
	w.socket = filepath.Join(dir, "berth.sock")
	ln, err := api.Listen(w.socket)
	if err != nil {
		t.Fatal(err)
	}
	base, stopStreams := context.WithCancel(context.Background())
	srv := &http.Server{
		Handler:     api.NewServer(w.fake, nil),
		BaseContext: func(net.Listener) context.Context { return base },
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.Serve(ln)
	}()
	w.client = api.Dial(w.socket)
	t.Cleanup(func() {
		w.client.Close()
		stopStreams()
		srv.Close()
		<-served
		w.fake.Close()
		os.RemoveAll(dir)
	})
	return w
}

// result is what one Run printed and returned.
type result struct {
	stdout, stderr string
	code           int
}

// run runs the CLI with env (Stdout, Stderr, Connect, Who and Now filled
// in) and args.
func (w *world) run(ctx context.Context, env cli.Env, args ...string) result {
	var out, errOut bytes.Buffer
	if env.Stdout == nil { // a test may read a stream itself
		env.Stdout = &out
	}
	env.Stderr = &errOut
	if env.Connect == nil {
		env.Connect = func(context.Context) (session.Service, error) { return w.client, nil }
	}
	if env.Who == "" {
		env.Who = "cli"
	}
	if env.Now == nil {
		env.Now = func() time.Time { return now }
	}
	code := cli.Run(ctx, env, args)
	return result{out.String(), errOut.String(), code}
}

// sh runs args with an empty environment and fails the test unless the
// exit code is 0.
func (w *world) sh(t *testing.T, args ...string) string {
	t.Helper()
	r := w.run(t.Context(), cli.Env{}, args...)
	if r.code != 0 {
		t.Fatalf("berth %s: exit %d, stderr %q", strings.Join(args, " "), r.code, r.stderr)
	}
	return r.stdout
}

// golden compares got with testdata/<name>.golden, rewriting it with
// -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from %s (go test -update rewrites it):\n--- got\n%s\n--- want\n%s", name, path, got, want)
	}
}

package sshd

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/charmbracelet/x/ansi"
	gossh "golang.org/x/crypto/ssh"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/sessiontest"
)

// testKey is a client key pair.
type testKey struct {
	signer  gossh.Signer
	priv    ed25519.PrivateKey
	comment string
	role    Role
}

func newKey(t testing.TB, comment string, role Role) testKey {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := gossh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return testKey{signer: s, priv: priv, comment: comment, role: role}
}

func (k testKey) pub() gossh.PublicKey { return k.signer.PublicKey() }

func (k testKey) fingerprint() string { return gossh.FingerprintSHA256(k.pub()) }

// line is the key's authorized_keys line.
func (k testKey) line() string { return FormatAuthorizedKey(k.pub(), k.role, k.comment) }

// writeOpenSSH writes the private key where the ssh binary can use it.
func (k testKey) writeOpenSSH(t testing.TB, dir string) string {
	t.Helper()
	block, err := gossh.MarshalPrivateKey(k.priv, k.comment)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "id_"+strings.NewReplacer("@", "_", " ", "_").Replace(k.comment))
	if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// world is a server on a random loopback port in front of a fake service.
type world struct {
	t      testing.TB
	fake   *sessiontest.Fake
	svc    session.Service // what the server serves (the fake, maybe wrapped)
	srv    *Server
	dir    string
	addr   string
	cancel context.CancelFunc
	served chan error
}

// worldOpts adjust a world before it starts.
type worldOpts struct {
	opts Options
	wrap func(session.Service) session.Service
}

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("BERTH_TEST_LOG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func newWorld(t testing.TB, wo worldOpts, keys ...testKey) *world {
	t.Helper()
	fake := sessiontest.New(sessiontest.Options{})
	w := &world{t: t, fake: fake, svc: fake, dir: t.TempDir()}
	if wo.wrap != nil {
		w.svc = wo.wrap(fake)
	}
	w.writeKeys(keys...)
	o := wo.opts
	o.Dir = w.dir
	if o.Logger == nil {
		o.Logger = testLogger(t)
	}
	if o.RatePerIP == 0 {
		o.RatePerIP = -1 // tests connect a lot from one address
	}
	srv, err := New(w.svc, o)
	if err != nil {
		t.Fatal(err)
	}
	w.srv = srv
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	w.addr = ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	w.served = make(chan error, 1)
	go func() { w.served <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		w.stop()
		fake.Close()
	})
	return w
}

// stop shuts the server down and waits for Serve (idempotent).
func (w *world) stop() error {
	w.cancel()
	select {
	case err, ok := <-w.served:
		if ok {
			close(w.served)
		}
		return err
	case <-time.After(30 * time.Second):
		w.t.Fatal("Serve did not return within 30s of its context ending")
	}
	return nil
}

// writeKeys replaces authorized_keys.
func (w *world) writeKeys(keys ...testKey) {
	w.t.Helper()
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(k.line() + "\n")
	}
	path := filepath.Join(w.dir, AuthorizedKeysFile)
	if err := os.WriteFile(path+".new", []byte(b.String()), 0o600); err != nil {
		w.t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		w.t.Fatal(err)
	}
}

// create makes sessions in the fake.
func (w *world) create(names ...string) {
	w.t.Helper()
	for _, n := range names {
		if _, err := w.fake.Create(context.Background(), session.CreateOptions{Name: n}); err != nil {
			w.t.Fatal(err)
		}
	}
}

func (w *world) config(auth ...gossh.AuthMethod) *gossh.ClientConfig {
	return &gossh.ClientConfig{
		User:            "berth",
		Auth:            auth,
		HostKeyCallback: gossh.FixedHostKey(w.srv.HostKey()),
		Timeout:         10 * time.Second,
	}
}

// dialErr connects with k.
func (w *world) dialErr(k testKey) (*gossh.Client, error) {
	return gossh.Dial("tcp", w.addr, w.config(gossh.PublicKeys(k.signer)))
}

func (w *world) dial(k testKey) *gossh.Client {
	w.t.Helper()
	c, err := w.dialErr(k)
	if err != nil {
		w.t.Fatalf("dial as %s: %v", k.comment, err)
	}
	w.t.Cleanup(func() { c.Close() })
	return c
}

// result is what a command produced.
type result struct {
	stdout, stderr string
	code           int
}

// run runs cmd in a new session on c, feeding stdin.
func run(t testing.TB, c *gossh.Client, cmd, stdin string) result {
	t.Helper()
	s, err := c.NewSession()
	if err != nil {
		t.Fatalf("new session for %q: %v", cmd, err)
	}
	defer s.Close()
	var out, errb bytes.Buffer
	s.Stdout, s.Stderr = &out, &errb
	if stdin != "" {
		// Only for commands that read it: a command that exits without
		// reading makes the client's copy fail (EOF) after exit 0.
		s.Stdin = strings.NewReader(stdin)
	}
	err = s.Run(cmd)
	code := 0
	var ee *gossh.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitStatus()
	case err != nil:
		t.Fatalf("%q: %v (stderr %q)", cmd, err, errb.String())
	}
	return result{out.String(), errb.String(), code}
}

// screen collects a PTY session's output.
type screen struct {
	mu  sync.Mutex
	buf bytes.Buffer
	eof chan struct{}
}

func newScreen(r io.Reader) *screen {
	sc := &screen{eof: make(chan struct{})}
	go func() { // ends when r does
		defer close(sc.eof)
		b := make([]byte, 32<<10)
		for {
			n, err := r.Read(b)
			sc.mu.Lock()
			sc.buf.Write(b[:n])
			sc.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return sc
}

func (sc *screen) len() int {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.buf.Len()
}

// since returns the output after offset from.
func (sc *screen) since(from int) string {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.buf.String()[from:]
}

// waitFor waits until the output after from, stripped of escape
// sequences, contains want.
func (sc *screen) waitFor(t testing.TB, from int, want string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if strings.Contains(stripANSI(sc.since(from)), want) {
			return
		}
		select {
		case <-sc.eof:
			if strings.Contains(stripANSI(sc.since(from)), want) {
				return
			}
			t.Fatalf("output ended without %q; got %q", want, stripANSI(sc.since(from)))
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatalf("no %q within %s; got %q", want, within, stripANSI(sc.since(from)))
}

// goroutines waits for the goroutine count to come back to at most n.
func waitGoroutines(t testing.TB, n int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		got := runtime.NumGoroutine()
		if got <= n {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			t.Fatalf("%d goroutines, want at most %d:\n%s", got, n, buf)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func stripANSI(s string) string { return ansi.Strip(s) }

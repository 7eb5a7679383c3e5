package api_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/api"
	"github.com/berthvm/berth/session/sessiontest"
)

// TestSuite runs the Service conformance suite through the socket.
func TestSuite(t *testing.T) {
	h := start(t, nil)
	sessiontest.Suite(t, h.client)
}

func TestPing(t *testing.T) {
	h := start(t, nil)
	v, err := h.client.Ping(t.Context())
	if err != nil || v != "v9.9.9-test" {
		t.Errorf("Ping = %q, %v", v, err)
	}
	gone := api.Dial(filepath.Join(t.TempDir(), "none.sock"))
	defer gone.Close()
	_, err = gone.Ping(t.Context())
	wantClass(t, "Ping without daemon", err, session.ErrUnavailable)
	if err != nil && !strings.Contains(err.Error(), "berth serve") {
		t.Errorf("Ping without daemon: %q does not say what to do", err)
	}
}

// countingListener counts the connections it accepted.
type countingListener struct {
	net.Listener
	n atomic.Int32
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// TestReachableKeepsItsConnection: Reachable connects without a request,
// and the next calls run on that connection: one connect in all.
func TestReachableKeepsItsConnection(t *testing.T) {
	dir, err := os.MkdirTemp("", "berth-api")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "berth.sock")
	ln, err := api.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	cl := &countingListener{Listener: ln}
	srv := &http.Server{Handler: api.NewServer(sessiontest.New(sessiontest.Options{}), nil)}
	go srv.Serve(cl)
	defer srv.Close()
	c := api.Dial(sock)
	defer c.Close()
	if !c.Reachable(t.Context()) {
		t.Fatal("Reachable = false with a daemon listening")
	}
	for range 2 {
		if _, err := c.List(t.Context()); err != nil {
			t.Fatalf("List after Reachable: %v", err)
		}
	}
	if n := cl.n.Load(); n != 1 {
		t.Errorf("%d connections accepted, want 1", n)
	}
	gone := api.Dial(filepath.Join(t.TempDir(), "none.sock"))
	defer gone.Close()
	if gone.Reachable(t.Context()) {
		t.Error("Reachable = true without a daemon")
	}
}

// TestOtherAPIVersionRefused: with no ping before the first call, that
// call is where a daemon speaking another API version is found out.
func TestOtherAPIVersionRefused(t *testing.T) {
	dir, err := os.MkdirTemp("", "berth-api")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "berth.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(api.HeaderAPI, "v0")
		w.Write([]byte("[]"))
	})}
	go srv.Serve(ln)
	defer srv.Close()
	c := api.Dial(sock)
	defer c.Close()
	_, err = c.List(t.Context())
	wantClass(t, "List from a v0 daemon", err, session.ErrUnavailable)
	if err != nil && !strings.Contains(err.Error(), "restart the daemon") {
		t.Errorf("List from a v0 daemon: %q does not say what to do", err)
	}
}

// failing returns err from every call it overrides.
type failing struct {
	session.Service
	err error
}

func (f failing) Get(context.Context, string) (session.Session, error) {
	return session.Session{}, f.err
}

func TestErrorClassRoundTrip(t *testing.T) {
	classes := []error{
		session.ErrNotFound, session.ErrExists, session.ErrInvalid, session.ErrInvalidState,
		session.ErrConflict, session.ErrPermission, session.ErrUnavailable,
	}
	for _, class := range classes {
		t.Run(class.Error(), func(t *testing.T) {
			want := fmt.Errorf("session %q: something specific: %w", "x", class)
			h := start(t, failing{err: want})
			_, err := h.client.Get(t.Context(), "x")
			wantClass(t, "Get", err, class)
			if err == nil || err.Error() != want.Error() {
				t.Errorf("message = %q, want %q verbatim", err, want)
			}
			for _, other := range classes {
				if other != class && errors.Is(err, other) {
					t.Errorf("err also matches %v", other)
				}
			}
		})
	}
	t.Run("unclassified", func(t *testing.T) {
		h := start(t, failing{err: errors.New("disk on fire")})
		_, err := h.client.Get(t.Context(), "x")
		if err == nil || err.Error() != "disk on fire" {
			t.Errorf("err = %v, want the message verbatim", err)
		}
	})
	t.Run("fake messages", func(t *testing.T) {
		h := start(t, nil)
		h.create(t, "demo")
		ctx := t.Context()
		h.client.Stop(ctx, "demo")
		_, direct := h.fake.Pause(ctx, "demo")
		_, remote := h.client.Pause(ctx, "demo")
		if direct == nil || remote == nil || direct.Error() != remote.Error() {
			t.Errorf("Pause stopped: remote %q, direct %q", remote, direct)
		}
		wantClass(t, "Pause stopped", remote, session.ErrInvalidState)
	})
}

// A *session.Error crosses the socket whole: its class, field, code,
// message and hint, so a client renders the field its own way and matches
// errno and codes, never message text.
func TestStructuredErrorsRoundTrip(t *testing.T) {
	h := start(t, nil)
	ctx := t.Context()
	h.create(t, "demo")
	flag := func(f string) string { return "--" + f }
	for _, c := range []struct {
		what string
		call func() error
		want *session.Error
	}{
		{"memory too small", func() error {
			_, err := h.client.Create(ctx, session.CreateOptions{Name: "x", MemoryMiB: 64})
			return err
		}, &session.Error{Class: session.ErrInvalid, Field: session.FieldMemory}},
		{"no such checkpoint", func() error { return h.client.DeleteCheckpoint(ctx, "demo", "c9") },
			&session.Error{Class: session.ErrNotFound, Field: session.FieldCheckpoint}},
		{"a missing file", func() error { _, err := h.client.Stat(ctx, "demo", "nope"); return err },
			&session.Error{Class: session.ErrNotFound, Code: "ENOENT"}},
		{"a path out of the workspace", func() error { _, err := h.client.Stat(ctx, "demo", "../etc/passwd"); return err },
			&session.Error{Class: session.ErrInvalid, Code: session.CodeEscape}},
	} {
		t.Run(c.what, func(t *testing.T) {
			remote := c.call()
			if !errors.Is(remote, c.want) {
				t.Fatalf("over the socket: %v (field %q, code %q), want %+v", remote, session.FieldOf(remote), session.CodeOf(remote), c.want)
			}
			var direct error
			switch c.what {
			case "memory too small":
				_, direct = h.fake.Create(ctx, session.CreateOptions{Name: "x", MemoryMiB: 64})
			case "no such checkpoint":
				direct = h.fake.DeleteCheckpoint(ctx, "demo", "c9")
			case "a missing file":
				_, direct = h.fake.Stat(ctx, "demo", "nope")
			default:
				_, direct = h.fake.Stat(ctx, "demo", "../etc/passwd")
			}
			if remote.Error() != direct.Error() || session.Render(remote, flag) != session.Render(direct, flag) {
				t.Errorf("remote %q / %q, direct %q / %q", remote, session.Render(remote, flag), direct, session.Render(direct, flag))
			}
			if c.want.Code == "ENOENT" && !errors.Is(remote, syscall.ENOENT) {
				t.Errorf("%v is not ENOENT across the socket", remote)
			}
		})
	}
	_, err := h.client.Create(ctx, session.CreateOptions{Name: "x", MemoryMiB: 64})
	if got := session.Render(err, flag); !strings.HasPrefix(got, "--memory 64M is below") {
		t.Errorf("rendered for the command line: %q", got)
	}
}

func TestBadRequests(t *testing.T) {
	h := start(t, nil)
	hc := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", h.socket)
		},
	}}
	defer hc.CloseIdleConnections()
	tests := []struct {
		method, path, body string
		status             int
		class              string
	}{
		{"POST", "/v1/sessions", `{"name":"a","colour":"red"}`, 400, "invalid"},
		{"POST", "/v1/sessions", `not json`, 400, "invalid"},
		{"GET", "/v1/nothing", "", 404, ""},
		{"GET", "/v1/sessions/a", "", 404, "not_found"},
		{"GET", "/v1/execs/e1/output?from=-1", "", 400, "invalid"},
		{"GET", "/v1/sessions/a/executions?all=maybe", "", 400, "invalid"},
		{"POST", "/v1/sessions/a/exec", `{"stdin":"aGk="}`, 400, "invalid"},
		{"GET", "/v1/sessions/a/files/x?op=shred", "", 400, "invalid"},
	}
	for _, tt := range tests {
		req, _ := http.NewRequest(tt.method, "http://berth"+tt.path, strings.NewReader(tt.body))
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tt.status || !strings.Contains(string(b), `"class":"`+tt.class+`"`) && tt.class != "" {
			t.Errorf("%s %s: %d %s, want %d class %q", tt.method, tt.path, resp.StatusCode, b, tt.status, tt.class)
		}
	}
}

func TestExecStdinAndStreams(t *testing.T) {
	h := start(t, nil)
	h.create(t, "demo")
	ctx := t.Context()
	in := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB, many frames
	r := sessiontest.Run(t, ctx, h.client, "demo", session.ExecRequest{Argv: []string{"cat"}, Stdin: true}, string(in))
	if r.Stdout != string(in) || r.Stderr != "" || r.Exec.StdoutBytes != int64(len(in)) {
		t.Errorf("cat of 1 MiB: got %d bytes out, %q err, record %d", len(r.Stdout), r.Stderr, r.Exec.StdoutBytes)
	}
	r = sessiontest.Run(t, ctx, h.client, "demo", session.ExecRequest{Argv: []string{"sh", "-c", "echo to-out; echo to-err >&2; exit 42"}}, "")
	if r.Stdout != "to-out\n" || r.Stderr != "to-err\n" || r.Exec.ExitCode == nil || *r.Exec.ExitCode != 42 {
		t.Errorf("sh: %q %q exit %v", r.Stdout, r.Stderr, r.Exec.ExitCode)
	}
	if r.Exec.By != "test" {
		t.Errorf("By = %q, want the client's actor", r.Exec.By)
	}
	r = sessiontest.Run(t, session.WithActor(ctx, "tui"), h.client, "demo", session.ExecRequest{Argv: []string{"true"}}, "")
	if r.Exec.By != "tui" {
		t.Errorf("By = %q, want the context's actor", r.Exec.By)
	}
}

func TestExecCancelledByContext(t *testing.T) {
	h := start(t, nil)
	h.create(t, "demo")
	ctx, hangUp := context.WithCancel(t.Context())
	p, err := h.client.Exec(ctx, "demo", session.ExecRequest{Argv: []string{"sleep", "30"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	hangUp()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range p.Output() {
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Output still open 5 s after the context ended")
	}
	if _, err := p.Stdin().Write([]byte("x")); err == nil {
		t.Error("stdin write after the context ended succeeded")
	}
	if err := p.Resize(t.Context(), 10, 10); err == nil {
		t.Error("Resize of a non-terminal command succeeded")
	}
	// The command outlives the stream; Wait asks the daemon.
	if err := p.Cancel(t.Context()); err != nil {
		t.Fatalf("Cancel: %v", err)
	}
	x, err := p.Wait(t.Context())
	if err != nil || x.State != session.ExecCancelled {
		t.Errorf("Wait = %s, %v; want cancelled", x.State, err)
	}
}

func TestWaitWithoutDrainingOutput(t *testing.T) {
	h := start(t, nil)
	h.create(t, "demo")
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	p, err := h.client.Exec(ctx, "demo", session.ExecRequest{Argv: []string{"head", "-c", "1000000", "/dev/zero"}})
	if err != nil {
		t.Fatal(err)
	}
	x, err := p.Wait(ctx)
	if err != nil || x.State != session.ExecExited || x.StdoutBytes != 1000000 {
		t.Errorf("Wait = %s %d bytes, %v", x.State, x.StdoutBytes, err)
	}
}

func TestAttachLive(t *testing.T) {
	h := start(t, nil)
	h.create(t, "demo")
	ctx := t.Context()
	p, err := h.client.Exec(ctx, "demo", session.ExecRequest{Argv: []string{"sh"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	second := api.Dial(h.socket, api.WithActor("tui"))
	defer second.Close()
	a, err := second.Attach(ctx, p.ID(), 0)
	if err != nil {
		t.Fatal(err)
	}
	// Stdin from either handle reaches the command.
	io.WriteString(a.Stdin(), "echo via-attach\n")
	if c := <-a.Output(); string(c.Data) != "via-attach\n" {
		t.Errorf("attached output = %q, want via-attach", c.Data)
	}
	io.WriteString(p.Stdin(), "echo via-exec\nexit 5\n")
	if out, _ := collect(a); out != "via-exec\n" {
		t.Errorf("attached output = %q, want via-exec", out)
	}
	collect(p)
	x, err := a.Wait(ctx)
	if err != nil || x.ExitCode == nil || *x.ExitCode != 5 {
		t.Errorf("attached Wait = %+v, %v", x, err)
	}
	// Replay of a finished execution from the start.
	r, err := second.Attach(ctx, p.ID(), 1)
	if err != nil {
		t.Fatal(err)
	}
	if out, _ := collect(r); out != "via-attach\nvia-exec\n" {
		t.Errorf("replay = %q", out)
	}
	_, err = second.Attach(ctx, "e9999", 1)
	wantClass(t, "Attach missing", err, session.ErrNotFound)
}

func TestWatchEndsWithContext(t *testing.T) {
	h := start(t, nil)
	h.create(t, "demo")
	ctx, cancel := context.WithCancel(t.Context())
	events, err := h.client.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ev := <-events
	if ev.Kind != session.EventState || ev.Name != "demo" || ev.Session == nil {
		t.Errorf("first event = %+v, want demo's state", ev)
	}
	h.client.Pause(t.Context(), "demo")
	ev = <-events
	if ev.Kind != session.EventState || ev.Session.State != session.StatePaused || ev.By != "test" {
		t.Errorf("event after Pause = %+v", ev)
	}
	cancel()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case _, ok := <-events:
			if !ok {
				return
			}
		case <-timeout:
			t.Fatal("watch channel open 5 s after cancel")
		}
	}
}

// prng is a deterministic, unbuffered stream of pseudo-random bytes.
type prng struct{ r *rand.ChaCha8 }

func (p prng) Read(b []byte) (int, error) { return p.r.Read(b) }

func TestLargeFileRoundTrip(t *testing.T) {
	h := start(t, nil)
	h.create(t, "demo")
	ctx := t.Context()
	const size = 20 << 20
	src := func() io.Reader { return io.LimitReader(prng{rand.NewChaCha8([32]byte{7})}, size) }
	want := sha256.New()
	io.Copy(want, src())

	n, err := h.client.WriteFile(ctx, "demo", "big.bin", src())
	if err != nil || n != size {
		t.Fatalf("WriteFile = %d, %v", n, err)
	}
	rc, err := h.client.ReadFile(ctx, "demo", "/workspace/big.bin")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	got := sha256.New()
	if m, err := io.Copy(got, rc); err != nil || m != size {
		t.Fatalf("ReadFile: %d bytes, %v", m, err)
	}
	if !bytes.Equal(got.Sum(nil), want.Sum(nil)) {
		t.Error("20 MiB round trip: hashes differ")
	}
	fi, err := h.client.Stat(ctx, "demo", "big.bin")
	if err != nil || fi.Size != size {
		t.Errorf("Stat = %+v, %v", fi, err)
	}
}

func TestFilePaths(t *testing.T) {
	h := start(t, nil)
	h.create(t, "demo")
	ctx := t.Context()
	odd := "dir with space/file?#%.txt"
	if err := h.client.Mkdir(ctx, "demo", "dir with space"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.client.WriteFile(ctx, "demo", odd, strings.NewReader("odd")); err != nil {
		t.Fatal(err)
	}
	list, err := h.client.ListDir(ctx, "demo", "/workspace/dir with space/")
	if err != nil || len(list) != 1 || list[0].Name != "file?#%.txt" {
		t.Errorf("ListDir = %+v, %v", list, err)
	}
	root, err := h.client.ListDir(ctx, "demo", "")
	if err != nil || len(root) != 1 || !root[0].IsDir() {
		t.Errorf("ListDir root = %+v, %v", root, err)
	}
	if err := h.client.Rename(ctx, "demo", odd, "/workspace/plain.txt"); err != nil {
		t.Errorf("Rename: %v", err)
	}
	for _, bad := range []string{"..", "../x", "/etc", "a/../../b"} {
		_, err := h.client.Stat(ctx, "demo", bad)
		wantClass(t, "Stat "+bad, err, session.ErrInvalid)
	}
	_, err = h.client.Get(ctx, "..")
	wantClass(t, "Get ..", err, session.ErrInvalid)
	_, err = h.client.Get(ctx, "a/b")
	wantClass(t, "Get a/b", err, session.ErrNotFound)
}

// brokenRead serves files that fail halfway.
type brokenRead struct{ session.Service }

func (brokenRead) ReadFile(context.Context, string, string) (io.ReadCloser, error) {
	return io.NopCloser(io.MultiReader(strings.NewReader(strings.Repeat("x", 100000)), errReader{})), nil
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("disk read error") }

func TestReadCutShortIsAnError(t *testing.T) {
	h := start(t, brokenRead{})
	rc, err := h.client.ReadFile(t.Context(), "demo", "f")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, err := io.ReadAll(rc); err == nil {
		t.Error("a read that failed on the daemon's side ended cleanly")
	}
}

func TestListen(t *testing.T) {
	dir, _ := os.MkdirTemp("", "berth-listen")
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "s.sock")
	ln, err := api.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode = %v, %v; want 0600", fi.Mode().Perm(), err)
	}
	accepted := make(chan struct{})
	go func() { // answers the liveness probe below
		defer close(accepted)
		if c, err := ln.Accept(); err == nil {
			c.Close()
		}
	}()
	_, err = api.Listen(sock)
	wantClass(t, "Listen on a live socket", err, session.ErrConflict)
	<-accepted
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close() // leaves a stale socket file
	again, err := api.Listen(sock)
	if err != nil {
		t.Fatalf("Listen over a stale socket: %v", err)
	}
	again.Close()
}

// TestNoGoroutineLeaks drives every kind of stream, ends them by their
// contexts, and checks that nothing keeps running on either side once the
// client is closed; the server and fake are still up.
func TestNoGoroutineLeaks(t *testing.T) {
	h := start(t, nil)
	check := goroutinesBack(t)
	h.create(t, "demo")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	events, err := h.client.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	<-events
	sessiontest.Run(t, ctx, h.client, "demo", session.ExecRequest{Argv: []string{"cat"}, Stdin: true}, "x")
	p, err := h.client.Exec(ctx, "demo", session.ExecRequest{Argv: []string{"sh"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(p.Stdin(), "echo hi\n")
	<-p.Output()
	a, err := h.client.Attach(ctx, p.ID(), 1)
	if err != nil {
		t.Fatal(err)
	}
	<-a.Output() // left undrained on purpose
	h.client.WriteFile(ctx, "demo", "f", strings.NewReader("data"))
	rc, _ := h.client.ReadFile(ctx, "demo", "f")
	io.ReadAll(rc)
	rc.Close()
	tree := sessiontest.Tar(t, sessiontest.TarEntry{Name: "t/big", Data: strings.Repeat("x", 1<<20)})
	if _, err := h.client.CopyIn(ctx, "demo", "", bytes.NewReader(tree)); err != nil {
		t.Fatal(err)
	}
	tc, err := h.client.CopyOut(ctx, "demo", "t")
	if err != nil {
		t.Fatal(err)
	}
	tc.Read(make([]byte, 1024)) // closed half read on purpose
	tc.Close()

	cancel()
	for range p.Output() {
	}
	for range events {
	}
	// The command outlives its stream; end it, then the fake's goroutine
	// for it ends too.
	if err := h.client.Cancel(t.Context(), p.ID()); err != nil {
		t.Fatal(err)
	}
	if x, err := p.Wait(t.Context()); err != nil || x.State != session.ExecCancelled {
		t.Fatalf("Wait = %s, %v", x.State, err)
	}
	h.client.Close()
	check()
}

// TestRefusedStreamKeepsConnection: a refused exec or attach whose body
// ends only after the refusal (as a client's body does when it is written
// while the response comes back) leaves the connection serving the next
// request. net/http with full duplex enabled closes such a body after the
// handler, too late to stop the background read its end starts, and then
// panics reading the next request (golang/go#68560): the client's next call
// on that connection failed with EOF.
func TestRefusedStreamKeepsConnection(t *testing.T) {
	h := start(t, nil)
	for _, path := range []string{"/v1/sessions/ghost/exec", "/v1/execs/ghost/attach"} {
		t.Run(path, func(t *testing.T) {
			conn, err := net.Dial("unix", h.socket)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(10 * time.Second))
			br := bufio.NewReader(conn)
			first := `{"request":{"argv":["true"]}}` + "\n"
			fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: berth\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", path, len(first), first)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusNotFound {
				t.Fatalf("refused stream: status %d, want 404", resp.StatusCode)
			}
			io.WriteString(conn, "0\r\n\r\n") // the body ends after the refusal
			io.WriteString(conn, "GET /v1/version HTTP/1.1\r\nHost: berth\r\n\r\n")
			resp, err = http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("the next request on the connection: %v", err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("the next request on the connection: status %d", resp.StatusCode)
			}
		})
	}
}

// TestHarnessSuite runs the Harness conformance suite through the socket.
func TestHarnessSuite(t *testing.T) {
	h := start(t, nil)
	sessiontest.HarnessSuite(t, h.client)
}

// sinceFake is a fake that follows a fleet's revisions: WatchSince sends
// one fleet event at the revision after since.
type sinceFake struct{ *sessiontest.Fake }

func (f sinceFake) WatchSince(ctx context.Context, since int64) (<-chan session.Event, error) {
	ch := make(chan session.Event, 1)
	ch <- session.Event{Kind: session.EventFleet, Name: "demo", Rev: since + 1,
		Fleet: &session.FleetChange{Change: session.FleetMoved, Host: "h2", From: "h1", Epoch: since + 1}}
	go func() { <-ctx.Done(); close(ch) }()
	return ch, nil
}

// ?since_rev reaches a fleet's front door, its events whole; a berth
// not in a fleet refuses it in one line.
func TestWatchSince(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	_, err := start(t, nil).client.WatchSince(ctx, 5)
	wantClass(t, "WatchSince of a berth not in a fleet", err, session.ErrInvalid)

	h := start(t, sinceFake{sessiontest.New(sessiontest.Options{})})
	events, err := h.client.WatchSince(ctx, 41)
	if err != nil {
		t.Fatal(err)
	}
	ev := <-events
	if ev.Kind != session.EventFleet || ev.Rev != 42 || ev.Fleet == nil || *ev.Fleet != (session.FleetChange{Change: session.FleetMoved, Host: "h2", From: "h1", Epoch: 42}) {
		t.Errorf("resumed after 41: %+v (%+v)", ev, ev.Fleet)
	}
}

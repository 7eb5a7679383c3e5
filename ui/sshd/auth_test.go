package sshd

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"

	"github.com/berthvm/berth/session"
)

// offerOnly presents a key it cannot sign with: the client offers it (a
// query the server approves), then sends a signature in an algorithm that
// does not fit the key, which the server refuses as a failed attempt
// without closing the connection, so the client goes on to its next key.
type offerOnly struct{ shown gossh.PublicKey }

func (o offerOnly) PublicKey() gossh.PublicKey { return o.shown }
func (o offerOnly) Sign(io.Reader, []byte) (*gossh.Signature, error) {
	return &gossh.Signature{Format: gossh.KeyAlgoRSASHA256, Blob: []byte("not a signature")}, nil
}

// TestAuthBypassRegression is the CVE-2024-45337 pattern: the client
// first offers admin key A without proving it holds it (the server says
// A would do), then authenticates with operator key B. The session must
// run as B (role and records), never as A.
func TestAuthBypassRegression(t *testing.T) {
	a := newKey(t, "alice-admin", Admin)
	b := newKey(t, "bob-operator", Operator)
	w := newWorld(t, worldOpts{}, a, b)
	w.create("demo", "other")

	offerAThenB := gossh.PublicKeys(offerOnly{a.pub()}, b.signer)
	c, err := gossh.Dial("tcp", w.addr, w.config(offerAThenB))
	if err != nil {
		t.Fatalf("dial offering A then signing with B: %v", err)
	}
	defer c.Close()

	r := run(t, c, "delete other --yes", "")
	if r.code != 1 || !strings.Contains(r.stderr, "role operator may not delete sessions") {
		t.Errorf("delete as B: %+v; want refused for role operator", r)
	}
	if _, err := w.fake.Get(context.Background(), "other"); err != nil {
		t.Errorf("the session was deleted with A's role: %v", err)
	}
	if r := run(t, c, "pause demo", ""); r.code != 0 {
		t.Fatalf("pause as B: %+v", r)
	}
	evs, _ := w.fake.Timeline(context.Background(), "demo", 0)
	if by := evs[len(evs)-1].By; by != "ssh:bob-operator" {
		t.Errorf("pause recorded by %q, want ssh:bob-operator", by)
	}

	// The sftp subsystem re-verifies the same way.
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.RequestSubsystem("sftp"); err != nil {
		t.Fatal(err)
	}
}

// TestAuthRefusals: unknown keys, passwords and keyboard-interactive get
// nowhere, also after an approved key offer.
func TestAuthRefusals(t *testing.T) {
	a := newKey(t, "alice", Admin)
	stranger := newKey(t, "mallory", Admin)
	w := newWorld(t, worldOpts{}, a)
	w.create("demo")

	cases := []struct {
		name string
		auth []gossh.AuthMethod
	}{
		{"unknown key", []gossh.AuthMethod{gossh.PublicKeys(stranger.signer)}},
		{"password", []gossh.AuthMethod{gossh.Password("hunter2")}},
		{"keyboard-interactive", []gossh.AuthMethod{gossh.KeyboardInteractive(
			func(string, string, []string, []bool) ([]string, error) { return []string{"hunter2"}, nil })}},
		{"offer A then password", []gossh.AuthMethod{
			gossh.PublicKeys(offerOnly{a.pub()}), gossh.Password("hunter2")}},
		{"offer A then unknown key", []gossh.AuthMethod{
			gossh.PublicKeys(offerOnly{a.pub()}, stranger.signer)}},
	}
	for _, tc := range cases {
		c, err := gossh.Dial("tcp", w.addr, w.config(tc.auth...))
		if err == nil {
			c.Close()
			t.Errorf("%s: logged in", tc.name)
			continue
		}
		if !strings.Contains(err.Error(), "unable to authenticate") {
			t.Errorf("%s: %v, want an authentication failure", tc.name, err)
		}
	}
	// Nothing ran.
	evs, _ := w.fake.Timeline(context.Background(), "demo", 0)
	for _, ev := range evs {
		if strings.HasPrefix(ev.By, "ssh:") {
			t.Errorf("event by %s after refused logins: %+v", ev.By, ev)
		}
	}
}

// TestKeyRemovedMidConnection: once a key leaves authorized_keys, the
// next action on a connection it opened is refused; a changed role
// applies at the next action.
func TestKeyRemovedMidConnection(t *testing.T) {
	op := newKey(t, "op", Operator)
	other := newKey(t, "other", Admin)
	// A long recheck: the refusal must come from the per-action check.
	w := newWorld(t, worldOpts{opts: Options{RecheckEvery: time.Hour}}, op, other)
	w.create("demo")
	c := w.dial(op)
	if r := run(t, c, "pause demo", ""); r.code != 0 {
		t.Fatalf("pause: %+v", r)
	}

	op.role = Viewer
	w.writeKeys(op, other)
	r := run(t, c, "resume demo", "")
	if r.code != 1 || !strings.Contains(r.stderr, "role viewer may not resume sessions") {
		t.Errorf("resume after the downgrade: %+v", r)
	}
	if r := run(t, c, "ls", ""); r.code != 0 {
		t.Errorf("ls as viewer: %+v", r)
	}

	w.writeKeys(other)
	r = run(t, c, "ls", "")
	if r.code != 1 || !strings.Contains(r.stderr, "is not in") || r.stdout != "" {
		t.Errorf("ls after removal: %+v", r)
	}
	// Its open TUI or sftp calls are refused too: the Service checks.
	svc := w.srv.serviceFor(AuthorizedKey{Key: op.pub(), Role: Operator, Comment: "op"})
	if _, err := svc.List(context.Background()); !isPermission(err) {
		t.Errorf("List after removal: %v", err)
	}
}

func isPermission(err error) bool {
	return err != nil && strings.Contains(err.Error(), session.ErrPermission.Error())
}

// TestKeyRemovedClosesConnections: connections of a removed key are
// closed by the periodic re-check, ending what they run.
func TestKeyRemovedClosesConnections(t *testing.T) {
	op := newKey(t, "op", Operator)
	w := newWorld(t, worldOpts{opts: Options{RecheckEvery: 50 * time.Millisecond}}, op)
	w.create("demo")
	c := w.dial(op)
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start("exec demo -- sleep 60"); err != nil {
		t.Fatal(err)
	}
	waitExecs(t, w, "demo", func(xs []session.Execution) bool { return len(xs) == 1 })
	w.writeKeys()
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the connection of a removed key is still open")
	}
	waitExecs(t, w, "demo", func(xs []session.Execution) bool { return len(xs) == 1 && xs[0].State.Done() })
}

// waitExecs waits until the session's executions satisfy ok.
func waitExecs(t testing.TB, w *world, name string, ok func([]session.Execution) bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		xs, err := w.fake.Executions(context.Background(), name, true)
		if err == nil && ok(xs) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("executions of %s: %+v (%v)", name, xs, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestAuthorizedKeysProblems: a world-writable file lets nobody in; lines
// with unsupported options are ignored.
func TestAuthorizedKeysProblems(t *testing.T) {
	a := newKey(t, "alice", Admin)
	w := newWorld(t, worldOpts{}, a)
	path := filepath.Join(w.dir, AuthorizedKeysFile)

	if err := os.WriteFile(path, []byte(`from="10.0.0.0/8" `+strings.TrimSpace(string(gossh.MarshalAuthorizedKey(a.pub())))+" alice\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := w.dialErr(a); err == nil {
		t.Error("a key restricted with from= (unsupported) logged in")
	}
	w.writeKeys(a)
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
	if _, err := w.dialErr(a); err == nil {
		t.Error("logged in through a world-writable authorized_keys")
	}
	os.Chmod(path, 0o600)
	c := w.dial(a)
	if r := run(t, c, "ls", ""); r.code != 0 {
		t.Errorf("ls: %+v", r)
	}
}

// TestHandshakeTimeout: a connection that never authenticates is closed
// after HandshakeTimeout.
func TestHandshakeTimeout(t *testing.T) {
	a := newKey(t, "alice", Admin)
	w := newWorld(t, worldOpts{opts: Options{HandshakeTimeout: 200 * time.Millisecond}}, a)
	nc, err := net.Dial("tcp", w.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	start := time.Now()
	nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadAll(nc); err != nil {
		t.Fatalf("the server did not close a silent connection: %v", err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("closed after %s, want about 200ms", took)
	}
}

// fakeSession is just enough of an ssh.Session for identify.
type fakeSession struct {
	ssh.Session
	ctx ssh.Context
	key ssh.PublicKey
}

func (f fakeSession) Context() ssh.Context     { return f.ctx }
func (f fakeSession) PublicKey() ssh.PublicKey { return f.key }

type fakeCtx struct {
	context.Context
	sync.Mutex
	vals map[any]any
}

func (c *fakeCtx) Value(k any) any {
	if v, ok := c.vals[k]; ok {
		return v
	}
	return c.Context.Value(k)
}
func (c *fakeCtx) SetValue(k, v any)     { c.vals[k] = v }
func (c *fakeCtx) User() string          { return "u" }
func (c *fakeCtx) SessionID() string     { return "id" }
func (c *fakeCtx) ClientVersion() string { return "c" }
func (c *fakeCtx) ServerVersion() string { return "s" }
func (c *fakeCtx) RemoteAddr() net.Addr  { return &net.TCPAddr{} }
func (c *fakeCtx) LocalAddr() net.Addr   { return &net.TCPAddr{} }
func (c *fakeCtx) Permissions() *ssh.Permissions {
	return &ssh.Permissions{Permissions: &gossh.Permissions{}}
}

// TestIdentify: the session handler trusts only the key the connection
// verified, and only while it is listed; what an auth callback last saw
// (sess.PublicKey) must agree with it.
func TestIdentify(t *testing.T) {
	a := newKey(t, "alice", Admin)
	b := newKey(t, "bob", Viewer)
	w := newWorld(t, worldOpts{}, a, b)
	p1, p2 := net.Pipe()
	defer p1.Close()
	defer p2.Close()
	c := &conn{s: w.srv, Conn: p1}
	ctx := &fakeCtx{Context: context.Background(), vals: map[any]any{connKey{}: c}}

	if _, _, err := w.srv.identify(fakeSession{ctx: ctx, key: a.pub()}); !errors.Is(err, session.ErrPermission) {
		t.Errorf("no verified key: %v", err)
	}
	k := b.pub()
	c.key.Store(&k)
	for _, tc := range []struct {
		name string
		key  ssh.PublicKey
		ok   bool
	}{{"the verified key", b.pub(), true}, {"another approved key", a.pub(), false}, {"no key", nil, false}} {
		ak, _, err := w.srv.identify(fakeSession{ctx: ctx, key: tc.key})
		if tc.ok != (err == nil) || (tc.ok && ak.Role != Viewer) {
			t.Errorf("%s: %+v, %v", tc.name, ak, err)
		}
	}
	w.writeKeys(a)
	if _, _, err := w.srv.identify(fakeSession{ctx: ctx, key: b.pub()}); !errors.Is(err, session.ErrPermission) {
		t.Errorf("verified key removed from the file: %v", err)
	}
}

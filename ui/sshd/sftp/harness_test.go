package sftp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	pkgsftp "github.com/pkg/sftp"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/sessiontest"
)

// The tests drive a Server at the protocol level: the client's end of an
// in-memory pipe, written either by hand (raw, for what a faulty or
// hostile peer sends) or by github.com/pkg/sftp's client, in front of
// the in-memory fake service.

// testSession is the session every fixture serves.
const testSession = "work"

// timeout bounds every wait of the tests: a server that hangs fails the
// test instead of the run.
const timeout = 10 * time.Second

// seedTime dates the files a fixture seeds.
var seedTime = time.Unix(1700000000, 0).UTC()

// fixture is a fake service with one running session.
type fixture struct {
	t    *testing.T
	fake *sessiontest.Fake
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	fake := sessiontest.New(sessiontest.Options{})
	t.Cleanup(func() { fake.Close() })
	if err := fake.AddSession(session.Session{Name: testSession, State: session.StateRunning, DiskBytes: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, fake: fake}
}

// file puts a file into the workspace (p relative to it).
func (fx *fixture) file(p, data string) {
	fx.t.Helper()
	if err := fx.fake.AddFile(testSession, p, []byte(data), seedTime); err != nil {
		fx.t.Fatal(err)
	}
}

func (fx *fixture) dir(p string) {
	fx.t.Helper()
	if err := fx.fake.AddDir(testSession, p, seedTime); err != nil {
		fx.t.Fatal(err)
	}
}

// content is what the workspace holds under p, as any other client of
// the service sees it.
func (fx *fixture) content(p string) (string, error) {
	rc, err := fx.fake.ReadFile(context.Background(), testSession, p)
	if err != nil {
		return "", err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	return string(b), err
}

// wantContent fails the test unless p holds want.
func (fx *fixture) wantContent(p, want string) {
	fx.t.Helper()
	got, err := fx.content(p)
	if err != nil {
		fx.t.Fatalf("reading %s: %v; want %q", p, err, want)
	}
	if got != want {
		fx.t.Fatalf("%s holds %q; want %q", p, clip(got), clip(want))
	}
}

// wantMissing fails the test unless nothing is under p.
func (fx *fixture) wantMissing(p string) {
	fx.t.Helper()
	if _, err := fx.fake.Stat(context.Background(), testSession, p); !errors.Is(err, session.ErrNotFound) {
		fx.t.Fatalf("stat %s: %v; want it not to exist (ErrNotFound)", p, err)
	}
}

// waitReleased waits until the server has released every File it opened
// (the fake releases a File whose context ended on its own goroutine).
func (fx *fixture) waitReleased() {
	fx.t.Helper()
	waitFor(fx.t, "every file released (Fake.OpenFiles == 0)", func() bool { return fx.fake.OpenFiles(testSession) == 0 })
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up after %v waiting for %s", timeout, what)
		}
		time.Sleep(time.Millisecond)
	}
}

func clip(s string) string {
	if len(s) > 64 {
		return fmt.Sprintf("%s… (%d bytes)", s[:64], len(s))
	}
	return s
}

// stream is one Serve call: conn is the client's end of its pipe.
type stream struct {
	t      *testing.T
	conn   net.Conn
	cancel context.CancelFunc
	served chan error

	once sync.Once
	err  error
}

// serve starts srv on a new pipe; Files, Handles and Name default to
// the fixture's. The stream is torn down when the test ends.
func (fx *fixture) serve(srv Server) *stream {
	fx.t.Helper()
	if srv.Files == nil {
		srv.Files = fx.fake
	}
	if srv.Handles == nil {
		srv.Handles = fx.fake
	}
	if srv.Name == "" {
		srv.Name = testSession
	}
	if srv.Logger == nil && os.Getenv("BERTH_TEST_LOG") != "" {
		srv.Logger = slog.New(slog.NewTextHandler(fx.t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	cli, end := net.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	st := &stream{t: fx.t, conn: cli, cancel: cancel, served: make(chan error, 1)}
	go func() { // ends with Serve: when the pipe closes or ctx ends
		err := srv.Serve(ctx, end)
		end.Close() // as the SSH server closes the channel
		st.served <- err
	}()
	fx.t.Cleanup(func() {
		cli.Close()
		cancel()
		st.wait()
	})
	return st
}

// wait returns Serve's result, failing the test if it does not return.
func (st *stream) wait() error {
	st.t.Helper()
	st.once.Do(func() {
		select {
		case st.err = <-st.served:
		case <-time.After(timeout):
			st.t.Fatalf("Serve did not return within %v", timeout)
		}
	})
	return st.err
}

// client speaks to st with github.com/pkg/sftp's client.
func (st *stream) client(opts ...pkgsftp.ClientOption) *pkgsftp.Client {
	st.t.Helper()
	c, err := pkgsftp.NewClientPipe(st.conn, st.conn, opts...)
	if err != nil {
		st.t.Fatalf("sftp client: %v", err)
	}
	st.t.Cleanup(func() { c.Close() })
	return c
}

// raw is a hand-driven client: it writes packets as built and reads the
// server's replies on a goroutine (net.Pipe does not buffer: a server
// writing a reply must not wait on the test).
type raw struct {
	*stream
	replies chan []byte
	lastID  uint32
}

// raw starts a hand-driven client on st (without INIT: see init).
func (st *stream) raw() *raw {
	r := &raw{stream: st, replies: make(chan []byte, 1024)}
	go func() { // ends when the pipe closes
		defer close(r.replies)
		for {
			b, err := readPacket(st.conn, 1<<24)
			if err != nil {
				return
			}
			r.replies <- b
		}
	}()
	return r
}

// rawBytes go into a packet as they are, without a length.
type rawBytes []byte

// build makes a packet of typ with fields: uint32, uint64, string
// (length-prefixed), wireAttrs or rawBytes.
func build(typ byte, fields ...any) []byte {
	e := newEncoder(typ, 64)
	for _, f := range fields {
		switch v := f.(type) {
		case uint32:
			e.u32(v)
		case int:
			e.u32(uint32(v))
		case uint64:
			e.u64(v)
		case string:
			e.str(v)
		case wireAttrs:
			e.attrs(v)
		case rawBytes:
			e.b = append(e.b, v...)
		default:
			panic(fmt.Sprintf("build: field of type %T", f))
		}
	}
	return e.finish()
}

// write sends b as it is.
func (r *raw) write(b []byte) {
	r.t.Helper()
	r.conn.SetWriteDeadline(time.Now().Add(timeout))
	if _, err := r.conn.Write(b); err != nil {
		r.t.Fatalf("writing a request: %v", err)
	}
}

// init sends INIT and returns VERSION's extensions.
func (r *raw) init() map[string]string {
	r.t.Helper()
	r.write(build(fxpInit, uint32(3)))
	b := r.next()
	if b[0] != fxpVersion {
		r.t.Fatalf("INIT answered with type %d; want VERSION", b[0])
	}
	d := &decoder{b: b[1:]}
	if v := d.u32(); v != protocolVersion {
		r.t.Fatalf("VERSION %d; want %d", v, protocolVersion)
	}
	ext := map[string]string{}
	for len(d.b) > 0 && d.err == nil {
		name, data := d.str(), d.str()
		ext[name] = data
	}
	if d.err != nil {
		r.t.Fatalf("VERSION malformed: %v", d.err)
	}
	return ext
}

// send sends a request of typ with a fresh id followed by fields, and
// returns the id.
func (r *raw) send(typ byte, fields ...any) uint32 {
	r.t.Helper()
	r.lastID++
	r.write(build(typ, append([]any{r.lastID}, fields...)...))
	return r.lastID
}

// next is the next reply.
func (r *raw) next() []byte {
	r.t.Helper()
	select {
	case b, ok := <-r.replies:
		if !ok {
			r.t.Fatal("the server ended the stream; want a reply")
		}
		return b
	case <-time.After(timeout):
		r.t.Fatalf("no reply within %v", timeout)
	}
	return nil
}

// reply is a parsed reply: its type, id and the decoder after the id.
type reply struct {
	typ byte
	id  uint32
	d   *decoder
}

func (r *raw) recv() reply {
	r.t.Helper()
	b := r.next()
	d := &decoder{b: b[1:]}
	rep := reply{typ: b[0], id: d.u32(), d: d}
	if d.err != nil {
		r.t.Fatalf("reply of type %d without an id", b[0])
	}
	return rep
}

// recvID is the next reply, which must answer id.
func (r *raw) recvID(id uint32) reply {
	r.t.Helper()
	rep := r.recv()
	if rep.id != id {
		r.t.Fatalf("reply to request %d; want one to %d", rep.id, id)
	}
	return rep
}

// statusOfReply is a STATUS reply's code and message.
func (r *raw) statusOfReply(rep reply) (uint32, string) {
	r.t.Helper()
	if rep.typ != fxpStatus {
		r.t.Fatalf("reply of type %d to request %d; want STATUS", rep.typ, rep.id)
	}
	code, msg := rep.d.u32(), rep.d.str()
	if rep.d.err != nil {
		r.t.Fatalf("STATUS malformed: %v", rep.d.err)
	}
	return code, msg
}

// wantStatus fails the test unless id is answered with code.
func (r *raw) wantStatus(id uint32, code uint32, what string) {
	r.t.Helper()
	got, msg := r.statusOfReply(r.recvID(id))
	if got != code {
		r.t.Fatalf("%s: status %s (%q); want %s", what, codeName(got), msg, codeName(code))
	}
}

// call sends a request and waits for its reply.
func (r *raw) call(typ byte, fields ...any) reply {
	r.t.Helper()
	return r.recvID(r.send(typ, fields...))
}

// handleOf is a HANDLE reply's handle.
func (r *raw) handleOf(rep reply, what string) string {
	r.t.Helper()
	if rep.typ == fxpStatus {
		code, msg := r.statusOfReply(rep)
		r.t.Fatalf("%s: status %s (%q); want a handle", what, codeName(code), msg)
	}
	if rep.typ != fxpHandle {
		r.t.Fatalf("%s: reply of type %d; want HANDLE", what, rep.typ)
	}
	h := rep.d.str()
	if rep.d.err != nil {
		r.t.Fatalf("%s: HANDLE malformed: %v", what, rep.d.err)
	}
	return h
}

// open opens p with pflags and returns its handle.
func (r *raw) open(p string, pflags uint32) string {
	r.t.Helper()
	return r.handleOf(r.call(fxpOpen, p, pflags, wireAttrs{}), "open "+p)
}

func (r *raw) opendir(p string) string {
	r.t.Helper()
	return r.handleOf(r.call(fxpOpendir, p), "opendir "+p)
}

// ok sends a request that must succeed with STATUS OK.
func (r *raw) ok(what string, typ byte, fields ...any) {
	r.t.Helper()
	r.wantStatus(r.send(typ, fields...), fxOK, what)
}

// wantEnd fails the test unless the server ends the stream without
// another reply: Serve has returned, and the pipe is closed.
func (r *raw) wantEnd() error {
	r.t.Helper()
	err := r.wait()
	for b := range r.replies {
		r.t.Errorf("a reply of type %d after the stream broke; want none", b[0])
	}
	return err
}

// attrsOf is an ATTRS reply's attributes.
func (r *raw) attrsOf(rep reply, what string) wireAttrs {
	r.t.Helper()
	if rep.typ == fxpStatus {
		code, msg := r.statusOfReply(rep)
		r.t.Fatalf("%s: status %s (%q); want ATTRS", what, codeName(code), msg)
	}
	if rep.typ != fxpAttrs {
		r.t.Fatalf("%s: reply of type %d; want ATTRS", what, rep.typ)
	}
	a := rep.d.attrs()
	if rep.d.err != nil {
		r.t.Fatalf("%s: ATTRS malformed: %v", what, rep.d.err)
	}
	return a
}

func codeName(code uint32) string {
	names := []string{"OK", "EOF", "NO_SUCH_FILE", "PERMISSION_DENIED", "FAILURE", "BAD_MESSAGE", "NO_CONNECTION", "CONNECTION_LOST", "OP_UNSUPPORTED"}
	if int(code) < len(names) {
		return names[code]
	}
	return fmt.Sprintf("status %d", code)
}

package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/fleet/fleettest"
	"github.com/berthvm/berth/session/fleet/member"
)

// switchAllower is allowed or isolated as a test sets it.
type switchAllower struct{ isolated atomic.Bool }

var errTestIsolated = &session.Error{Class: session.ErrIsolated, Msg: "host t is isolated from the fleet: test"}

func (s *switchAllower) Allowed(context.Context) error {
	if s.isolated.Load() {
		return errTestIsolated
	}
	return nil
}

// stubService answers Get and GetRun with a session in state; every
// other call panics on the nil Service: a call that reached it.
type stubService struct {
	session.Service
	state session.State
}

func (s stubService) Get(_ context.Context, name string) (session.Session, error) {
	return session.Session{Name: name, State: s.state}, nil
}

func (s stubService) GetRun(_ context.Context, id string) (session.Run, error) {
	return session.Run{ID: id, Session: "s"}, nil
}

// reads are the Service's methods an isolated host still answers.
var reads = map[string]bool{
	"List": true, "Get": true, "Host": true, "Watch": true, "Timeline": true, "History": true,
	"Attach": true, "Executions": true, "Execution": true, "Output": true,
	"ListDir": true, "Stat": true, "ReadFile": true, "CopyOut": true, "StatFollow": true, "Statfs": true, "Open": true,
	"Checkpoints": true, "Diff": true, "RunDiff": true, "NetStatus": true,
	"Runs": true, "GetRun": true, "Schedules": true, "Images": true, "ExportImage": true,
}

// call calls method m of svc with zero arguments (a live context) and
// says whether it reached the stub, and the error it returned if not.
func call(svc session.Service, m reflect.Method) (reached bool, err error) {
	v := reflect.ValueOf(svc).MethodByName(m.Name)
	ft := v.Type()
	args := make([]reflect.Value, ft.NumIn())
	for i := range args {
		if ft.In(i) == reflect.TypeFor[context.Context]() {
			args[i] = reflect.ValueOf(context.Background())
		} else {
			args[i] = reflect.Zero(ft.In(i))
		}
	}
	defer func() {
		if recover() != nil {
			reached = true
		}
	}()
	out := v.Call(args)
	last := out[len(out)-1]
	if last.Type() != reflect.TypeFor[error]() {
		panic(fmt.Sprintf("%s does not return an error last", m.Name))
	}
	if !last.IsNil() {
		return false, last.Interface().(error)
	}
	return true, nil // Get and GetRun: answered by the stub
}

// Every method of session.Service is a read an isolated host answers, or
// a change it refuses with the isolation error before it reaches the
// engine; allowed, every call reaches it. A method added to the Service
// fails here until it is classified.
func TestFenceClassifiesEveryMethod(t *testing.T) {
	t.Parallel()
	a := &switchAllower{}
	svc := Fence(stubService{state: session.StateRunning}, a)
	typ := reflect.TypeFor[session.Service]()
	for i := range typ.NumMethod() {
		m := typ.Method(i)
		a.isolated.Store(true)
		reached, err := call(svc, m)
		switch {
		case reads[m.Name] && !reached:
			t.Errorf("isolated: read %s refused: %v", m.Name, err)
		case !reads[m.Name] && reached:
			t.Errorf("isolated: %s reached the engine; a change must be refused (or, if it is a read, listed in reads)", m.Name)
		case !reads[m.Name] && !errors.Is(err, session.ErrIsolated):
			t.Errorf("isolated: %s refused with %v, want the isolation error", m.Name, err)
		}
		a.isolated.Store(false)
		if reached, err := call(svc, m); !reached {
			t.Errorf("allowed: %s did not reach the engine: %v", m.Name, err)
		}
	}
}

// An isolated host refuses to read a sleeping session's files (answering
// would wake it), and an attached process's input, resizes and cancels.
func TestFenceSleepingAndAttached(t *testing.T) {
	t.Parallel()
	a := &switchAllower{}
	a.isolated.Store(true)
	ctx := context.Background()
	svc := Fence(stubService{state: session.StateSleeping}, a)
	if _, err := svc.ReadFile(ctx, "s", "f"); !errors.Is(err, session.ErrIsolated) {
		t.Errorf("ReadFile of a sleeping session while isolated: %v", err)
	}
	if _, err := svc.Open(ctx, "s", "f", 0, 0); !errors.Is(err, session.ErrIsolated) {
		t.Errorf("Open of a sleeping session while isolated: %v", err)
	}
	if _, err := svc.RunDiff(ctx, "r", session.DiffOptions{}); !errors.Is(err, session.ErrIsolated) {
		t.Errorf("RunDiff of a sleeping session while isolated: %v", err)
	}

	p := &recProcess{}
	svc = Fence(attachService{p: p}, a)
	got, err := svc.Attach(ctx, "e", 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := got.Stdin().Write([]byte("x")); !errors.Is(err, session.ErrIsolated) {
		t.Errorf("stdin to an attached process while isolated: %v", err)
	}
	if err := got.Cancel(ctx); !errors.Is(err, session.ErrIsolated) {
		t.Errorf("cancel of an attached process while isolated: %v", err)
	}
	if err := got.Resize(ctx, 1, 1); !errors.Is(err, session.ErrIsolated) {
		t.Errorf("resize of an attached process while isolated: %v", err)
	}
	if p.writes.Load() != 0 || p.cancels.Load() != 0 {
		t.Errorf("the process saw %d writes, %d cancels", p.writes.Load(), p.cancels.Load())
	}
	a.isolated.Store(false)
	if _, err := got.Stdin().Write([]byte("x")); err != nil || p.writes.Load() != 1 {
		t.Errorf("stdin allowed again: %v, %d writes", err, p.writes.Load())
	}
}

type attachService struct {
	session.Service
	p *recProcess
}

func (s attachService) Attach(context.Context, string, uint64) (session.Process, error) {
	return s.p, nil
}

type recProcess struct {
	session.Process
	writes, cancels atomic.Int32
}

func (p *recProcess) Stdin() io.WriteCloser { return recStdin{p} }
func (p *recProcess) Cancel(context.Context) error {
	p.cancels.Add(1)
	return nil
}
func (p *recProcess) Resize(context.Context, int, int) error { return nil }

type recStdin struct{ p *recProcess }

func (w recStdin) Write(b []byte) (int, error) { w.p.writes.Add(1); return len(b), nil }
func (w recStdin) Close() error                { return nil }

// freePort is a loopback port free now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// restartable is a one-member etcd on fixed ports that a test stops and
// starts again on its data directory.
type restartable struct {
	t          *testing.T
	cfg        member.Config
	mu         sync.Mutex
	m          *member.Member
	clientURL  string
	stoppedFor time.Duration
}

func newRestartable(t *testing.T) *restartable {
	r := &restartable{t: t}
	r.clientURL = fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	r.cfg = member.Config{Name: "t", Dir: filepath.Join(t.TempDir(), "etcd"), ListenClient: r.clientURL,
		ListenPeer: fmt.Sprintf("http://127.0.0.1:%d", freePort(t))}
	r.start()
	t.Cleanup(r.stop)
	return r
}

func (r *restartable) start() {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := member.Start(ctx, r.cfg)
	if err != nil {
		r.t.Fatalf("start etcd: %v", err)
	}
	r.mu.Lock()
	r.m = m
	r.mu.Unlock()
}

func (r *restartable) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m != nil {
		r.m.Close()
		r.m = nil
	}
}

// A host whose etcd goes away knows itself isolated by its own clock
// before its TTL is out (at TTL-margin after its last confirmed renewal)
// and refuses changes in one line that says why; when etcd is back it
// registers again, runs OnJoin, and is ready.
func TestHostIsolatedAndRejoins(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	e := newRestartable(t)
	cli, err := Dial(e.clientURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	var joins atomic.Int32
	h, err := Join(ctxT(t), cli, HostConfig{ID: "h1", Instance: "i-h1", TTL: ttl,
		OnJoin: func(context.Context) error { joins.Add(1); return nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.crash() })
	waitAllowed(t, h, true, 5*time.Second)
	first := h.Status()

	stopped := time.Now()
	e.stop()
	waitAllowed(t, h, false, ttl+2*time.Second)
	// The instant the host stopped taking changes is its judgment's, not
	// when this poll (maybe starved on a loaded machine) saw it.
	since := h.Status().Until.Sub(stopped)
	t.Logf("isolated %s after etcd stopped (TTL %s, margin %s)", since.Round(time.Millisecond), ttl, DefaultMargin(ttl))
	if since > ttl {
		t.Errorf("isolated %s after etcd stopped, not before the TTL %s", since, ttl)
	}
	err = h.Allowed(context.Background())
	msg := err.Error()
	if !errors.Is(err, session.ErrIsolated) || !strings.HasPrefix(msg, "host h1 is isolated from the fleet: its etcd lease expired ") ||
		!strings.Contains(msg, "unreachable") || !strings.HasSuffix(msg, "running VMs and commands go on, changes wait for it to rejoin") || strings.Contains(msg, "\n") {
		t.Errorf("refusal %q", msg)
	}

	healed := time.Now()
	e.start()
	waitAllowed(t, h, true, 15*time.Second)
	t.Logf("ready %s after etcd came back", time.Since(healed).Round(time.Millisecond))
	if n := joins.Load(); n != 2 {
		t.Errorf("OnJoin ran %d times, want 2 (join and rejoin)", n)
	}
	if st := h.Status(); !st.Until.After(first.Until) || st.Why != "" {
		t.Errorf("status after rejoin %+v", st)
	}
}

// Until OnJoin succeeds a newly registered host is not ready: it says it
// is rejoining.
func TestHostNotReadyBeforeOnJoin(t *testing.T) {
	t.Parallel()
	e := newRestartable(t)
	cli, err := Dial(e.clientURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	var fail atomic.Bool
	fail.Store(true)
	h, err := Join(ctxT(t), cli, HostConfig{ID: "h1", TTL: 2 * time.Second, OnJoin: func(context.Context) error {
		if fail.Load() {
			return errors.New("quarantine pass failed")
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.crash() })
	time.Sleep(500 * time.Millisecond)
	if err := h.Allowed(context.Background()); !errors.Is(err, session.ErrIsolated) || !strings.Contains(err.Error(), "rejoining") {
		t.Errorf("before OnJoin succeeded: %v", err)
	}
	fail.Store(false)
	waitAllowed(t, h, true, 5*time.Second)
}

// waitAllowed polls h until it is allowed (or refused), and returns how
// long that took.
func waitAllowed(t *testing.T, h *Host, want bool, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		err := h.Allowed(context.Background())
		if (err == nil) == want {
			return time.Since(start)
		}
		if time.Since(start) > within {
			t.Fatalf("host allowed=%v after %s, want %v (%v)", err == nil, within, want, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stallProxy forwards TCP connections to target. Cut, it forwards
// nothing (bytes wait, as behind a firewall that drops them); healed, it
// closes the stalled connections, so clients dial again, and forwards.
type stallProxy struct {
	ln     net.Listener
	target string
	cut    atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
}

func newStallProxy(t *testing.T, target string) *stallProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{ln: ln, target: target}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		p.closeAll()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			wg.Go(func() { p.pipe(u, c) })
			wg.Go(func() { p.pipe(c, u) })
		}
	})
	return p
}

func (p *stallProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		for p.cut.Load() {
			time.Sleep(5 * time.Millisecond)
			if _, werr := dst.Write(nil); werr != nil {
				return
			}
		}
		if n > 0 {
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			dst.Close()
			return
		}
	}
}

func (p *stallProxy) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func (p *stallProxy) heal() {
	p.closeAll()
	p.cut.Store(false)
}

// Cut off from etcd while etcd itself runs on, a host refuses changes
// before etcd expires its lease (as another host's watch sees the
// expiry), and is ready again soon after the cut heals.
func TestHostIsolatedBeforeItsLeaseExpires(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	url := fleettest.Etcd(t)[0]
	proxy := newStallProxy(t, strings.TrimPrefix(url, "http://"))
	hostCli, err := Dial("http://"+proxy.ln.Addr().String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer hostCli.Close()
	other := dial(t, []string{url})
	h, err := Join(ctxT(t), hostCli, HostConfig{ID: "h1", Instance: "i-h1", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.crash() })
	waitAllowed(t, h, true, 5*time.Second)
	r, err := other.Get(ctxT(t), hostKey("h1"))
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	expired := make(chan time.Time, 1)
	wch := other.Watch(wctx, hostKey("h1"), clientv3.WithRev(r.Header.Revision+1))
	go func() {
		for resp := range wch {
			for _, ev := range resp.Events {
				if ev.Type == clientv3.EventTypeDelete {
					expired <- time.Now()
					return
				}
			}
		}
	}()

	cut := time.Now()
	proxy.cut.Store(true)
	for h.Allowed(context.Background()) == nil {
		if time.Since(cut) > 3*ttl {
			t.Fatalf("still allowed %s after the cut", time.Since(cut))
		}
		time.Sleep(2 * time.Millisecond)
	}
	// The instant the host stopped taking changes (every call from then
	// on is refused): its judgment's, exact, where this poll and the
	// watch below may both be late on a loaded machine. The watch being
	// late only makes the check below easier to pass, never fail.
	isolated := h.Status().Until
	var gone time.Time
	select {
	case gone = <-expired:
	case <-time.After(3 * ttl):
		t.Fatal("etcd did not expire the cut host's lease")
	}
	t.Logf("cut: isolated by its own clock after %s, lease expired in etcd after %s (TTL %s, margin %s): %s ahead",
		isolated.Sub(cut).Round(time.Millisecond), gone.Sub(cut).Round(time.Millisecond), ttl, DefaultMargin(ttl), gone.Sub(isolated).Round(time.Millisecond))
	if !isolated.Before(gone) {
		t.Errorf("the host refused changes only %s after etcd expired its lease", isolated.Sub(gone))
	}
	healed := time.Now()
	proxy.heal()
	waitAllowed(t, h, true, 3*ttl)
	t.Logf("ready %s after the cut healed", time.Since(healed).Round(time.Millisecond))
}

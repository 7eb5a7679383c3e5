package fleet_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/api"
	"github.com/berthvm/berth/session/fleet"
	"github.com/berthvm/berth/session/sessiontest"
)

// movingFake is the fake engine as one end of a move: a session's bundle
// is its sizes and state, and the target makes it again from them, in
// the same state. It moves the fleet's coordination (owners, epochs,
// allocations, who holds a copy), not disks: the engine's own tests and
// the fleet bed move those.
type movingFake struct {
	*sessiontest.Fake
	mu     sync.Mutex
	staged map[string]bundle
}

type bundle struct {
	Opts  session.CreateOptions `json:"opts"`
	State session.State         `json:"state"`
}

var _ session.Mover = (*movingFake)(nil)

func (m *movingFake) SendSession(ctx context.Context, name string, w io.Writer) error {
	s, err := m.Get(ctx, name)
	if err != nil {
		return err
	}
	if s.State != session.StateStopped && s.State != session.StateSleeping {
		return &session.Error{Class: session.ErrInvalidState, Msg: fmt.Sprintf("session %s is %s: stop it or put it to sleep first", name, s.State)}
	}
	return json.NewEncoder(w).Encode(bundle{State: s.State, Opts: session.CreateOptions{Name: name, CPUs: s.CPUs, MemoryMiB: s.MemoryMiB,
		DiskBytes: s.DiskBytes, Image: s.Image, VMM: s.VMM}})
}

func (m *movingFake) ReceiveSession(ctx context.Context, r io.Reader) (session.MoveStaged, error) {
	var b bundle
	if err := json.NewDecoder(io.LimitReader(r, 1<<20)).Decode(&b); err != nil {
		return session.MoveStaged{}, fmt.Errorf("bundle: %w", err)
	}
	if _, err := m.Get(ctx, b.Opts.Name); err == nil {
		return session.MoveStaged{}, &session.Error{Class: session.ErrExists, Msg: "session " + b.Opts.Name + " is here already"}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.staged == nil {
		m.staged = map[string]bundle{}
	}
	m.staged[b.Opts.Name] = b
	return session.MoveStaged{Name: b.Opts.Name, State: b.State, Image: b.Opts.Image, Files: 1}, nil
}

func (m *movingFake) CommitReceived(ctx context.Context, name string) (session.Session, error) {
	m.mu.Lock()
	b, ok := m.staged[name]
	delete(m.staged, name)
	m.mu.Unlock()
	if !ok {
		return m.Get(ctx, name) // committed already
	}
	if _, err := m.Create(ctx, b.Opts); err != nil {
		return session.Session{}, err
	}
	if b.State == session.StateSleeping {
		return m.Sleep(ctx, name)
	}
	return m.Stop(ctx, name)
}

func (m *movingFake) DiscardReceived(_ context.Context, name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.staged, name)
	return nil
}

func (m *movingFake) SendSessionImage(context.Context, string, io.Writer) error {
	return session.ErrUnsupported
}

func (m *movingFake) ReceiveImage(context.Context, io.Reader) error { return session.ErrUnsupported }

func (m *movingFake) DropSent(ctx context.Context, name string) error { return m.Delete(ctx, name) }

// ownerOf is a session's owner and epoch in etcd.
func (f *testFleet) ownerOf(t *testing.T, name string) (string, int64) {
	t.Helper()
	r, err := f.cli.Get(t.Context(), fleet.Prefix+"sessions/"+name+"/owner")
	if err != nil || len(r.Kvs) != 1 {
		t.Fatalf("owner of %s: %v, %v", name, r, err)
	}
	o, err := fleet.ParseOwner(r.Kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	return o.Host, r.Kvs[0].ModRevision
}

func hostState(t *testing.T, c *api.Client, id string) session.HostState {
	t.Helper()
	l, err := c.Hosts(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range l.Hosts {
		if h.ID == id {
			return h.State
		}
	}
	return ""
}

// A host with a stopped, a sleeping and a running session, drained
// through a third host's front door by an operator: placement passes it
// by (create --on it is refused, saying it drains); the stopped and the
// sleeping sessions move to other hosts, owned there at a new epoch, in
// their state, gone from the drained host; the running one is left with
// what to do, and the drain says it did not finish. The mark outlasts
// the host's restart; undrained, placement picks it again (the other
// two drained: the sessions they hold move to it). A host that is gone,
// or not in the fleet, is refused in one line.
func TestRouterDrain(t *testing.T) {
	f := startFleet(t, map[string]fleet.Facts{"a": roomy, "b": roomy, "c": roomy})
	ctx := t.Context()
	op := f.operator(t, "c")
	for _, name := range []string{"st", "sl", "run"} {
		if _, err := op.Create(ctx, session.CreateOptions{Name: name, On: "a"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := op.Stop(ctx, "st"); err != nil {
		t.Fatal(err)
	}
	if _, err := op.Sleep(ctx, "sl"); err != nil {
		t.Fatal(err)
	}
	_, stEpoch := f.ownerOf(t, "st")
	_, slEpoch := f.ownerOf(t, "sl")

	var seen []session.DrainStep
	res, err := op.Drain(ctx, "a", func(s session.DrainStep) { seen = append(seen, s) })
	if err != nil {
		t.Fatalf("drain a through c: %v", err)
	}
	if res.Host != "a" || len(res.Steps) != 3 || len(seen) != 3 || res.Moved() {
		t.Fatalf("drain a = %+v (progress %+v); want 3 steps, not all moved", res, seen)
	}
	byName := map[string]session.DrainStep{}
	for i, s := range res.Steps {
		byName[s.Session] = s
		if seen[i] != s {
			t.Errorf("progress %d = %+v, result step %+v", i, seen[i], s)
		}
	}
	for name, c := range map[string]struct {
		epoch int64
		state session.State
	}{"st": {stEpoch, session.StateStopped}, "sl": {slEpoch, session.StateSleeping}} {
		s := byName[name]
		if s.Outcome != session.DrainMoved || (s.To != "b" && s.To != "c") || s.Took <= 0 || s.State != c.state {
			t.Errorf("drain step of %s: %+v; want moved to b or c", name, s)
			continue
		}
		host, epoch := f.ownerOf(t, name)
		if host != s.To || epoch <= c.epoch {
			t.Errorf("%s: owner %s at epoch %d; want %s past %d", name, host, epoch, s.To, c.epoch)
		}
		if got, err := op.Get(ctx, name); err != nil || got.Host != s.To || got.State != c.state {
			t.Errorf("%s after the drain: %+v, %v; want %s on %s", name, got, err, c.state, s.To)
		}
		if _, err := f.hosts["a"].fake.Get(ctx, name); !errors.Is(err, session.ErrNotFound) {
			t.Errorf("a still holds %s: %v", name, err)
		}
	}
	if s := byName["run"]; s.Outcome != session.DrainLeft || s.State != session.StateRunning ||
		!strings.Contains(s.Why, "berth sleep run") || !strings.Contains(s.Why, "berth host drain a again") {
		t.Errorf("drain step of run: %+v; want left, saying what to do", s)
	}
	if host, _ := f.ownerOf(t, "run"); host != "a" {
		t.Errorf("run is owned by %s after the drain", host)
	}
	if st := hostState(t, op, "a"); st != session.HostDraining {
		t.Errorf("host a is %s, want draining", st)
	}

	// Placement passes a by; pinned there, one line says why.
	for i := range 4 {
		s, err := op.Create(ctx, session.CreateOptions{Name: fmt.Sprintf("new-%d", i)})
		if err != nil || s.Host == "a" {
			t.Errorf("create new-%d while a drains: host %q, %v", i, s.Host, err)
		}
	}
	_, err = op.Create(ctx, session.CreateOptions{Name: "pinned", On: "a"})
	if !errors.Is(err, session.ErrInvalidState) || !strings.Contains(err.Error(), "draining") {
		t.Errorf("create --on a while it drains: %v", err)
	}

	// A restart of a's daemon: still draining.
	f.restart(t, f.hosts["a"])
	if st := hostState(t, op, "a"); st != session.HostDraining {
		t.Errorf("host a after its restart is %s, want draining", st)
	}
	if _, err := op.Create(ctx, session.CreateOptions{Name: "pinned", On: "a"}); !errors.Is(err, session.ErrInvalidState) {
		t.Errorf("create --on a after its restart: %v", err)
	}
	// Drained again, with run put to sleep: nothing is left.
	if _, err := op.Sleep(ctx, "run"); err != nil {
		t.Fatal(err)
	}
	res, err = op.Drain(ctx, "a", nil)
	if err != nil || !res.Moved() || len(res.Steps) != 1 || res.Steps[0].Session != "run" {
		t.Errorf("second drain of a: %+v, %v; want run moved", res, err)
	}

	// Undrained, a takes sessions again: with b and c drained, the
	// sleeping and stopped ones they hold come to a, and so does a new one.
	if err := op.Undrain(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if st := hostState(t, op, "a"); st != session.HostReady {
		t.Errorf("host a undrained is %s, want ready", st)
	}
	for _, c := range []struct{ id, to string }{
		{"c", "ab"}, // c drains itself: it is the door
		{"b", "a"},  // c drains: only a is left
	} {
		res, err := op.Drain(ctx, c.id, nil)
		if err != nil {
			t.Fatalf("drain %s: %v", c.id, err)
		}
		for _, s := range res.Steps {
			if (s.State == session.StateRunning) != (s.Outcome == session.DrainLeft) || (s.Outcome == session.DrainMoved && !strings.Contains(c.to, s.To)) {
				t.Errorf("drain %s: %+v, want moved to one of %q or left running", c.id, s, c.to)
			}
		}
	}
	for _, name := range []string{"st", "sl", "run"} {
		if host, _ := f.ownerOf(t, name); host != "a" {
			t.Errorf("%s is on %s after b and c drained, want a", name, host)
		}
	}
	if s, err := op.Create(ctx, session.CreateOptions{Name: "back"}); err != nil || s.Host != "a" {
		t.Errorf("create with only a undrained: host %q, %v", s.Host, err)
	}

	// Refusals: a host not in the fleet, one gone.
	_, err = op.Drain(ctx, "nowhere", nil)
	if !errors.Is(err, session.ErrNotFound) || !strings.Contains(err.Error(), "no host nowhere") {
		t.Errorf("drain nowhere: %v", err)
	}
	b := f.hosts["b"]
	b.srv.Close()
	if err := b.host.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = op.Drain(ctx, "b", nil)
	if !errors.Is(err, session.ErrInvalidState) || !strings.Contains(err.Error(), "host b is gone") || strings.Contains(err.Error(), "\n") {
		t.Errorf("drain of gone host b: %v", err)
	}
	if err := op.Undrain(ctx, "b"); !errors.Is(err, session.ErrInvalidState) {
		t.Errorf("undrain of gone host b: %v", err)
	}
}

// A host isolated from the fleet refuses to be drained, and marks
// nothing.
func TestRouterDrainIsolated(t *testing.T) {
	f := startFleet(t, map[string]fleet.Facts{"a": roomy})
	a := f.hosts["a"]
	a.host.Crash() // renewals stop: a knows itself isolated within its TTL
	deadline := time.Now().Add(5 * time.Second)
	for a.host.Allowed(t.Context()) == nil {
		if time.Now().After(deadline) {
			t.Fatal("host a is not isolated 5s after its renewals stopped")
		}
		time.Sleep(50 * time.Millisecond)
	}
	_, err := a.router.Drain(t.Context(), "a", nil)
	if !errors.Is(err, session.ErrIsolated) || !strings.Contains(err.Error(), "host a is isolated") {
		t.Errorf("drain of isolated a: %v", err)
	}
	if a.host.Draining() {
		t.Errorf("an isolated host was marked draining")
	}
}

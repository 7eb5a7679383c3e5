package engine

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/store"
	"github.com/berthvm/berth/vmm"
)

// stubVM is a VM whose VMM only pauses and resumes; stops, when set, makes
// it a vmm.Stopper (a VMM that stops a VM on a full disk by itself).
type stubVM struct {
	mu      sync.Mutex
	paused  bool
	pauses  int
	resumes int
	done    chan struct{}
}

func (v *stubVM) Pid() int                                    { return 4242 }
func (v *stubVM) Accel() vmm.Accel                            { return vmm.AccelTCG }
func (v *stubVM) DialAgent(context.Context) (net.Conn, error) { return nil, errors.New("no agent") }
func (v *stubVM) Pause(context.Context) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.paused = true
	v.pauses++
	return nil
}
func (v *stubVM) Resume(context.Context) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.paused = false
	v.resumes++
	return nil
}
func (v *stubVM) Status(context.Context) (vmm.State, error) { return vmm.StateRunning, nil }
func (v *stubVM) Kill(context.Context) error                { return nil }
func (v *stubVM) Done() <-chan struct{}                     { return v.done }
func (v *stubVM) Exit() vmm.Exit                            { return vmm.Exit{} }
func (v *stubVM) Close() error                              { return nil }

// stubDriver starts nothing: the tests that use it are refused first.
type stubDriver struct{}

func (stubDriver) Name() string { return "qemu" }
func (stubDriver) Start(context.Context, vmm.Config) (vmm.VM, error) {
	return nil, errors.New("stub driver")
}
func (stubDriver) Attach(context.Context, string) (vmm.VM, error) { return nil, vmm.ErrNotRunning }

type stoppingVM struct {
	stubVM
	stops chan vmm.Stop
}

func (v *stoppingVM) Stops() <-chan vmm.Stop { return v.stops }

func newSpaceManager(t *testing.T, floor int64) *Manager {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "store"), nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewManager(context.Background(), st, Config{DataDir: dir, Floor: floor, StatsInterval: time.Hour,
		Drivers: map[string]vmm.Driver{"qemu": stubDriver{}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close(); st.Close() })
	return m
}

func (m *Manager) addRunning(t *testing.T, name string, vm vmm.VM) *sess {
	t.Helper()
	s := m.newSess(store.Session{Name: name, State: string(session.StateRunning), VMM: "qemu", Image: "mini"})
	if err := m.st.PutSession(s.rec); err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	m.sessions[name] = s
	m.mu.Unlock()
	s.mu.Lock()
	s.vm = vm
	s.mu.Unlock()
	return s
}

// A VMM that stops its VM on a full disk makes the session paused with
// the reason; back above the floor, berth resumes it. A VMM that would
// hand the guest I/O errors instead gets its VM paused by berth.
func TestDiskFullPausesAndResumes(t *testing.T) {
	m := newSpaceManager(t, 1) // a floor any disk is above
	stopping := &stoppingVM{stubVM: stubVM{done: make(chan struct{})}, stops: make(chan vmm.Stop, 1)}
	plain := &stubVM{done: make(chan struct{})}
	a := m.addRunning(t, "a", stopping)
	b := m.addRunning(t, "b", plain)
	a.supervise(stopping)

	stopping.stops <- vmm.Stop{Disk: "ws", NoSpace: true, Reason: "No space left on device"}
	deadline := time.Now().Add(5 * time.Second)
	for a.state() != session.StatePaused {
		if time.Now().After(deadline) {
			t.Fatal("a VMM's stop on a full disk did not pause the session")
		}
		time.Sleep(10 * time.Millisecond)
	}
	snap := a.snapshot()
	if !strings.Contains(snap.Cause, "host disk full") || !strings.Contains(snap.Cause, "berth resume a") {
		t.Errorf("cause %q", snap.Cause)
	}
	err := a.check(session.ActionExec)
	if !errors.Is(err, session.ErrInvalidState) || !strings.Contains(err.Error(), "host disk full") {
		t.Errorf("exec on it: %v", err)
	}
	if stopping.pauses != 0 {
		t.Error("berth paused a VM its VMM had stopped already")
	}

	m.pauseUnguarded(session.HostStatus{Free: 1})
	if !plain.paused || b.state() != session.StatePaused {
		t.Errorf("a VM whose VMM does not stop on a full disk: paused %v, session %s", plain.paused, b.state())
	}
	h, _ := m.Host(context.Background())
	if len(h.DiskFullPaused) != 2 {
		t.Errorf("host status lists %v", h.DiskFullPaused)
	}
	for _, s := range []*sess{a, b} {
		s.resumeAfterDiskFull(context.Background(), h)
		if s.state() != session.StateRunning {
			t.Errorf("%s after space returned: %s", s.name, s.state())
		}
	}
	if stopping.resumes != 1 || plain.resumes != 1 {
		t.Errorf("resumes: %d %d", stopping.resumes, plain.resumes)
	}
	// A person's pause is theirs: space returning does not resume it.
	a.setState(session.StatePaused, "paused", "cli")
	a.resumeAfterDiskFull(context.Background(), h)
	if a.state() != session.StatePaused {
		t.Error("space returning resumed a session a person paused")
	}
}

// Below the floor, what needs space is refused with the figures.
func TestFloorRefuses(t *testing.T) {
	m := newSpaceManager(t, 1<<62)
	err := m.checkFloor("create session x")
	if !errors.Is(err, session.ErrNoSpace) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("err = %v", err)
	}
	for _, want := range []string{"cannot create session x", m.cfg.DataDir, "free, below the", "free_space_floor"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
	if _, err := m.Create(context.Background(), session.CreateOptions{Name: "x"}); !errors.Is(err, session.ErrNoSpace) {
		t.Errorf("create below the floor: %v", err)
	}
	h, _ := m.Host(context.Background())
	if !h.Below || h.Message() == "" {
		t.Errorf("host status %+v", h)
	}
	m.cfg.Floor = 0
	if err := m.checkFloor("create session x"); err != nil {
		t.Errorf("with no floor: %v", err)
	}
}

func TestHostFull(t *testing.T) {
	tests := []struct {
		err       error
		noSpace   bool
		unchanged bool
	}{
		{fmt.Errorf("snapshot failed: disk is full: %w", syscall.ENOSPC), true, false},
		{fmt.Errorf("room: %w: %w", session.ErrNoSpace, syscall.ENOSPC), true, true},
		{errors.New("snapshot failed: QEMU quit"), false, true},
	}
	for _, tt := range tests {
		got := hostFull(tt.err)
		if errors.Is(got, session.ErrNoSpace) != tt.noSpace || !errors.Is(got, tt.err) || (got == tt.err) != tt.unchanged {
			t.Errorf("hostFull(%v) = %v", tt.err, got)
		}
	}
}

package engine

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/store"
	"github.com/berthvm/berth/vmm"
)

// openManager opens a Manager on the stub driver over the store and data
// directory in dir, as a daemon (re)starting there does.
func openManager(t *testing.T, dir string) (*Manager, *store.Store) {
	t.Helper()
	st, err := store.Open(filepath.Join(dir, "store"), nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewManager(context.Background(), st, Config{DataDir: dir, Floor: 1, StatsInterval: time.Hour,
		Drivers: map[string]vmm.Driver{"qemu": stubDriver{}}})
	if err != nil {
		st.Close()
		t.Fatal(err)
	}
	return m, st
}

// The workspace's use is kept with the session's record: measured at the
// start, it is what a stopped session shows, also after a daemon restart,
// with the time it was measured; never measured, it is not shown as 0 B.
func TestWorkspaceUseIsKept(t *testing.T) {
	dir := t.TempDir()
	m, st := openManager(t, dir)
	ctx := context.Background()

	s := m.addRunning(t, "ws", &stubVM{done: make(chan struct{})})
	if snap := s.snapshot(); snap.WorkspaceKnown() {
		t.Fatalf("before any measurement: %d bytes measured at %s; want not measured", snap.WorkspaceUsed, snap.WorkspaceMeasuredAt)
	}
	// Running with an agent: the move to running measures at once, not at
	// the next refresh of the live figures (an hour away here).
	s.mu.Lock()
	s.agent = localAgent(t)
	s.mu.Unlock()
	before := time.Now()
	if err := s.setState(session.StateRunning, "started", "test"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !s.snapshot().WorkspaceKnown() {
		if time.Now().After(deadline) {
			t.Fatal("the move to running did not measure the workspace")
		}
		time.Sleep(10 * time.Millisecond)
	}
	measured := s.snapshot()
	if measured.WorkspaceUsed <= 0 || measured.WorkspaceMeasuredAt.Before(before) {
		t.Fatalf("measured %d bytes at %s", measured.WorkspaceUsed, measured.WorkspaceMeasuredAt)
	}
	if rec, err := st.GetSession("ws"); err != nil || rec.WorkspaceUsed != measured.WorkspaceUsed {
		t.Errorf("stored record: %d bytes, %v; want the first measurement stored", rec.WorkspaceUsed, err)
	}

	s.mu.Lock()
	s.agent.Close()
	s.agent, s.vm = nil, nil
	s.mu.Unlock()
	if err := s.setState(session.StateStopped, "stopped", "test"); err != nil {
		t.Fatal(err)
	}
	stopped, err := m.Get(ctx, "ws")
	if err != nil || stopped.WorkspaceUsed != measured.WorkspaceUsed || !stopped.WorkspaceMeasuredAt.Equal(measured.WorkspaceMeasuredAt) {
		t.Errorf("stopped: %d bytes at %s, %v; want %d at %s", stopped.WorkspaceUsed, stopped.WorkspaceMeasuredAt, err, measured.WorkspaceUsed, measured.WorkspaceMeasuredAt)
	}

	// A daemon restart reads it from the record.
	m.Close()
	st.Close()
	m, st = openManager(t, dir)
	defer func() { m.Close(); st.Close() }()
	again, err := m.Get(ctx, "ws")
	if err != nil || again.WorkspaceUsed != measured.WorkspaceUsed || !again.WorkspaceMeasuredAt.Equal(measured.WorkspaceMeasuredAt) {
		t.Errorf("after a restart: %d bytes at %s, %v; want %d at %s", again.WorkspaceUsed, again.WorkspaceMeasuredAt, err, measured.WorkspaceUsed, measured.WorkspaceMeasuredAt)
	}
}

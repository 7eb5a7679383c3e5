package engine

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/vmm"
)

// Sleep and wake. Sleeping frees an idle session's VM: the workspace is
// flushed and frozen (so the volume is clean and writers wait), the VM is
// paused, its memory and device state are saved and fsynced, and only then
// is the session recorded as sleeping and the VMM stopped. The volume is
// not touched while asleep, so snapshot and disk match. Waking restores the
// snapshot into a new VMM, records the session running, then resumes it,
// thaws the workspace and sets the clock. A daemon killed at any step
// leaves a session that is running, cleanly sleeping, or cold-bootable:
// see recoverSleep.

// idleTimeout is the session's idle timeout: its own, else the configured
// one. The caller holds s.mu.
func (s *sess) idleTimeoutLocked() time.Duration {
	if t := s.rec.IdleTimeout; t != nil {
		return *t
	}
	return s.m.cfg.IdleTimeout
}

func (s *sess) snapshotDir() string  { return filepath.Join(s.dir(), "snapshot") }
func (s *sess) snapshotPath() string { return filepath.Join(s.snapshotDir(), "memory.snap") }

// crash is the fault injection used by tests: the daemon kills itself at
// the named step, as a kill -9 would.
func (m *Manager) crash(point string) {
	if m.cfg.CrashAt != "" && m.cfg.CrashAt == point {
		m.log.Warn("crash point reached: killing the daemon", "point", point)
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		time.Sleep(time.Hour)
	}
}

// Sleep snapshots a running, idle session to disk and stops its VM.
func (m *Manager) Sleep(ctx context.Context, name string) (session.Session, error) {
	return m.lifecycle(ctx, name, session.ActionSleep, func(s *sess) error {
		return s.sleep(ctx, session.Actor(ctx))
	})
}

func (s *sess) sleep(ctx context.Context, by string) error {
	m := s.m
	if err := m.checkFloor("put session " + s.name + " to sleep (its memory snapshot needs room)"); err != nil {
		return err
	}
	if n := m.runningCount(s); n > 0 {
		return fmt.Errorf("cannot sleep session %q: %d command(s) still running: %w", s.name, n, session.ErrInvalidState)
	}
	vm, err := s.currentVM()
	if err != nil {
		return err
	}
	snap, ok := vm.(vmm.Snapshotter)
	if !ok {
		return fmt.Errorf("the %s driver cannot snapshot VMs: %w", s.rec.VMM, session.ErrInvalid)
	}
	c, err := s.connectedAgent()
	if err != nil {
		return err
	}
	start := time.Now()
	abandon := func(step string, cause error) error {
		// Bounded: a QEMU or guest that stopped answering must not keep
		// the session's lifecycle lock (and the idle loop) forever.
		rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		vm.Resume(rctx)
		cancel()
		tctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		c.Thaw(tctx)
		cancel()
		os.RemoveAll(s.snapshotDir())
		m.event(session.Event{Kind: session.EventNote, Name: s.name, By: by, Message: fmt.Sprintf("sleep abandoned while %s: %v; the session keeps running", step, cause)})
		return fmt.Errorf("sleep %q: %s: %w", s.name, step, hostFull(cause))
	}
	// Every step is bounded: a guest that does not answer must not leave
	// the session half asleep with the caller waiting forever.
	step := func(d time.Duration) (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, d) }
	fctx, cancel := step(time.Minute)
	_, err = c.Freeze(fctx)
	cancel()
	if err != nil {
		return abandon("flushing and freezing /workspace", agentErr(s.name, err))
	}
	m.crash("sleep:frozen")
	pctx, cancel := step(10 * time.Second)
	err = vm.Pause(pctx)
	cancel()
	if err != nil {
		return abandon("pausing", err)
	}
	m.crash("sleep:paused")
	if err := os.MkdirAll(s.snapshotDir(), 0o755); err != nil {
		return abandon("preparing the snapshot directory", err)
	}
	tmp := s.snapshotPath() + ".tmp"
	sctx, cancel := step(5 * time.Minute)
	err = snap.Snapshot(sctx, tmp)
	cancel()
	if err != nil {
		return abandon("saving memory", err)
	}
	markNIC(vm, s.snapshotPath())
	m.crash("sleep:saved")
	size, err := syncFile(tmp)
	if err == nil {
		err = os.Rename(tmp, s.snapshotPath())
	}
	if err == nil {
		err = syncDir(s.snapshotDir())
	}
	if err != nil {
		return abandon("writing the snapshot to disk", err)
	}
	m.crash("sleep:synced")
	s.mu.Lock()
	s.rec.SnapshotPath, s.rec.SnapshotBytes = s.snapshotPath(), size
	s.intended = true
	s.mu.Unlock()
	if err := s.setState(session.StateSleeping, fmt.Sprintf("asleep: %s snapshot written in %s", session.FormatBytes(size), time.Since(start).Round(time.Millisecond)), by); err != nil {
		return abandon("recording", err)
	}
	m.crash("sleep:recorded")
	vm.Kill(context.Background())
	<-vm.Done()
	s.detach()
	return nil
}

// wake brings a sleeping session back; the caller holds s.op. A missing or
// unusable snapshot means a cold boot on the (clean) workspace instead.
func (s *sess) wake(ctx context.Context, by string) error {
	m := s.m
	start := time.Now()
	err := s.restore(ctx)
	cause := ""
	if err != nil {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		m.log.Warn("restore failed; cold boot", "session", s.name, "err", err)
		m.event(session.Event{Kind: session.EventNote, Name: s.name, By: by, Message: "could not restore the sleep snapshot (" + err.Error() + "); booting a new VM on the workspace instead"})
		if err := s.boot(ctx); err != nil {
			return err
		}
		cause = "woke by a cold boot (the snapshot was unusable)"
	}
	took := time.Since(start)
	if cause == "" {
		cause = fmt.Sprintf("woke from sleep in %s", took.Round(time.Millisecond))
	}
	s.mu.Lock()
	s.rec.SnapshotPath, s.rec.SnapshotBytes = "", 0
	s.rec.LastWake = took
	s.mu.Unlock()
	if err := s.setState(session.StateRunning, cause, by); err != nil {
		return err
	}
	m.cfg.Observer.Woke(took)
	m.crash("wake:recorded")
	os.RemoveAll(s.snapshotDir()) // the disk moves on from here
	return s.afterWake(ctx)
}

// restore starts a VMM from the sleep snapshot and connects to its agent.
// The VM stays paused until afterWake.
func (s *sess) restore(ctx context.Context) error {
	rec, d, _, cfg, err := s.vmSetup(ctx)
	if err != nil {
		return err
	}
	path := rec.SnapshotPath
	if path == "" {
		return errors.New("no snapshot recorded")
	}
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	// The accelerator the snapshot was taken under.
	cfg.Accel, cfg.Incoming = vmm.Accel(rec.Accel), path
	cfg.NIC = snapHasNIC(path) // the devices it was taken with
	bctx, cancel := context.WithTimeout(ctx, s.m.cfg.BootTimeout)
	defer cancel()
	vm, err := d.Start(bctx, cfg)
	if err != nil {
		return err
	}
	s.m.crash("wake:restored")
	s.mu.Lock()
	s.vm, s.agent, s.intended = vm, nil, false
	s.rec.Pid, s.rec.Accel, s.rec.StartedAt = vm.Pid(), string(vm.Accel()), time.Now()
	s.mu.Unlock()
	s.supervise(vm)
	return nil
}

// afterWake resumes a restored VM, reconnects its agent, thaws the
// workspace, sets the clock and reseeds the RNG. Idempotent: recovery runs
// it for sessions whose wake was interrupted.
func (s *sess) afterWake(ctx context.Context) error {
	vm, err := s.currentVM()
	if err != nil {
		return err
	}
	if err := vm.Resume(ctx); err != nil {
		return fmt.Errorf("resume the restored VM: %w", err)
	}
	s.m.crash("wake:resumed")
	c, err := s.connectedAgent()
	if err != nil {
		return err
	}
	seed := make([]byte, 64)
	rand.Read(seed)
	err = c.ThawAt(ctx, time.Now(), seed)
	if errors.Is(err, guest.ErrDisconnected) && ctx.Err() == nil {
		// The agent channel of a VM just restored from a snapshot can
		// drop once under load (the soak saw it fail an ssh command's
		// wake): thaw through a new connection rather than leave the
		// workspace frozen under a record that says running.
		c.Close()
		if c, err = s.connectedAgent(); err == nil {
			err = c.ThawAt(ctx, time.Now(), seed)
		}
	}
	return agentErr(s.name, err)
}

// ensureAwake wakes a sleeping session before an action on it; concurrent
// callers wait for one wake.
func (m *Manager) ensureAwake(ctx context.Context, s *sess) error {
	if s.state() != session.StateSleeping {
		return nil
	}
	s.op.Lock()
	defer s.op.Unlock()
	if s.state() != session.StateSleeping {
		return nil
	}
	return s.wake(ctx, orAPI(session.Actor(ctx)))
}

// sleepIdle puts sessions to sleep once they have had no running command,
// no open file and no action for the idle timeout.
func (m *Manager) sleepIdle() {
	if m.cfg.Allowed != nil && m.cfg.Allowed(m.ctx) != nil {
		return // an isolated host changes nothing, its sessions' sleep included
	}
	ss := m.all()
	for _, s := range ss {
		s.mu.Lock()
		limit := s.idleTimeoutLocked()
		idle := limit > 0 && s.rec.State == string(session.StateRunning) && time.Since(s.rec.LastActivity) > limit
		s.mu.Unlock()
		// An open file is a client at work (an sftp upload, an
		// sshfs mount's open file): sleeping would end its handle.
		if !idle || m.runningCount(s) > 0 || s.files.Load() > 0 || s.fwd.open.Load() > 0 {
			continue
		}
		// A session busy with a lifecycle change is not idle; waiting
		// for it here would hold up every other session's sleep.
		if !s.op.TryLock() {
			continue
		}
		if s.state() == session.StateRunning && m.runningCount(s) == 0 {
			if err := s.sleep(m.ctx, "idle"); err != nil {
				m.log.Info("idle sleep", "session", s.name, "err", err)
				s.touch() // do not retry at once
			}
		}
		s.op.Unlock()
	}
}

// recoverSleep settles a session an earlier daemon left mid-sleep or
// mid-wake. vm is the VMM still alive in the session's directory, or nil.
func (s *sess) recoverSleep(ctx context.Context, st session.State, vm vmm.VM) {
	switch st {
	case session.StateSleeping:
		// Recorded asleep: the snapshot is complete and synced. A VMM still
		// alive either was about to be stopped or was restored but never
		// recorded running (so it never ran): stop it.
		if vm != nil {
			s.mu.Lock()
			s.intended = true
			s.mu.Unlock()
			vm.Kill(ctx)
			<-vm.Done()
			vm.Close()
		}
		if _, err := os.Stat(s.rec.SnapshotPath); err != nil {
			s.m.event(session.Event{Kind: session.EventNote, Name: s.name, Message: "the sleep snapshot is missing; the next wake boots a new VM on the workspace"})
		}
	case session.StateRunning:
		// Running, or caught between freeze and the sleeping record, or
		// between the running record and resume: make sure the VM runs and
		// the workspace is thawed. A stale snapshot is removed.
		os.RemoveAll(s.snapshotDir())
		if err := s.afterWake(ctx); err != nil {
			s.m.log.Warn("settle after restart", "session", s.name, "err", err)
		}
	}
}

func syncFile(path string) (int64, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return fi.Size(), f.Sync()
}

func syncDir(path string) error {
	d, err := os.Open(path)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

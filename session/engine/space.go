package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/engine/diskcopy"
	"github.com/berthvm/berth/session/engine/internal/lock"
	"github.com/berthvm/berth/vmm"
)

// A full host disk is an event, not a crash. Three things guard it:
//
//   - Below a free-space floor on the data directory, berth refuses what
//     would need space (create, a cold start, sleep, an image build), with
//     the figures; running sessions keep running.
//   - A session whose VMM stops it because a write to one of its disks
//     failed for lack of space (QEMU's werror=enospc) is recorded paused,
//     saying so, and resumed by itself once the data directory is back
//     above the floor; its commands are not lost.
//   - Output that cannot be stored is not acknowledged to the agent, so it
//     stays in the guest and the command blocks on its pipe until space
//     returns (see run.store).

// pauseDiskFull marks a session paused by its VMM for a full host disk.
const pauseDiskFull = "host-disk-full"

// space watches the data directory's free space.
type space struct {
	mu     lock.Mutex
	free   int64              // last measured, kept when a statfs fails
	status session.HostStatus // last published
}

// freeSpace returns the data directory's free bytes, measured now (a
// statfs costs microseconds; a cached figure would refuse a create just
// after space was freed).
func (m *Manager) freeSpace() int64 {
	sp := &m.space
	sp.mu.Lock()
	defer sp.mu.Unlock()
	var st unix.Statfs_t
	if err := unix.Statfs(m.cfg.DataDir, &st); err != nil {
		return sp.free
	}
	sp.free = int64(st.Bavail) * st.Bsize
	return sp.free
}

// checkFloor refuses what needs space while the data directory is below
// the floor.
func (m *Manager) checkFloor(what string) error {
	if m.cfg.Floor <= 0 {
		return nil
	}
	if free := m.freeSpace(); free < m.cfg.Floor {
		return fmt.Errorf("cannot %s: the data directory %s has %s free, below the %s floor (free_space_floor in config.toml); free some space first: %w: %w",
			what, m.cfg.DataDir, session.FormatBytes(free), session.FormatBytes(m.cfg.Floor), session.ErrNoSpace, syscall.ENOSPC)
	}
	return nil
}

// Host reports the data directory's free space against the floor.
func (m *Manager) Host(ctx context.Context) (session.HostStatus, error) {
	free := m.freeSpace()
	h := session.HostStatus{DataDir: m.cfg.DataDir, Free: free, Floor: m.cfg.Floor, Below: m.cfg.Floor > 0 && free < m.cfg.Floor}
	for _, s := range m.all() {
		s.mu.Lock()
		if s.rec.State == string(session.StatePaused) && s.rec.PauseReason == pauseDiskFull {
			h.DiskFullPaused = append(h.DiskFullPaused, s.name)
		}
		s.mu.Unlock()
		if s.heldOut.Load() > 0 {
			h.OutputHeld = append(h.OutputHeld, s.name)
		}
	}
	sort.Strings(h.DiskFullPaused)
	sort.Strings(h.OutputHeld)
	return h, nil
}

// watchSpace watches free space: it publishes the host's status when it
// changes and resumes sessions a full disk paused once space is back. For
// VMMs that do not stop a VM on a full disk themselves (Cloud Hypervisor
// hands the guest an I/O error), it pauses their VMs while the disk is
// all but full.
func (m *Manager) watchSpace() {
	h, _ := m.Host(m.ctx)
	m.space.mu.Lock()
	changed := h.Below != m.space.status.Below || len(h.DiskFullPaused) != len(m.space.status.DiskFullPaused) ||
		!slices.Equal(h.OutputHeld, m.space.status.OutputHeld)
	m.space.status = h
	m.space.mu.Unlock()
	if changed {
		msg := h.Message()
		if msg == "" {
			msg = fmt.Sprintf("host disk: %s free under %s, above the %s floor again", session.FormatBytes(h.Free), h.DataDir, session.FormatBytes(h.Floor))
		}
		m.log.Warn("host disk", "free", h.Free, "floor", h.Floor, "below", h.Below)
		m.hub.publish(session.Event{Time: time.Now(), Kind: session.EventHost, Message: msg, Host: &h})
	}
	if !h.Below {
		for _, name := range h.DiskFullPaused {
			if s, err := m.get(name); err == nil {
				s.resumeAfterDiskFull(m.ctx, h)
			}
		}
	}
	if h.Free < diskFullMargin {
		m.pauseUnguarded(h)
	}
}

// diskFullMargin is the free space under which VMs whose VMM does not
// stop them on a full disk are paused by berth.
const diskFullMargin = 32 << 20

// pauseUnguarded pauses running VMs that do not implement vmm.Stopper.
func (m *Manager) pauseUnguarded(h session.HostStatus) {
	ss := m.all()
	for _, s := range ss {
		s.mu.Lock()
		vm := s.vm
		running := s.rec.State == string(session.StateRunning)
		s.mu.Unlock()
		if vm == nil || !running {
			continue
		}
		if _, ok := vm.(vmm.Stopper); ok {
			continue
		}
		s.diskFull(vmm.Stop{NoSpace: true, Reason: "the host disk is all but full"}, true)
	}
}

// watchStops turns the VMM's own stops into the session's state; it runs
// with the supervisor and ends with ctx or the stops channel.
func (s *sess) watchStops(ctx context.Context, st vmm.Stopper) {
	stops := st.Stops()
	for {
		select {
		case <-ctx.Done():
			return
		case stop, ok := <-stops:
			if !ok {
				return
			}
			s.diskFull(stop, false)
		}
	}
}

// diskFull records a session stopped by a failed disk write. When
// pauseIt, berth pauses the VM itself (a VMM that would not).
func (s *sess) diskFull(stop vmm.Stop, pauseIt bool) {
	if pauseIt {
		// From the space loop, for every session: a busy one is paused
		// at the next tick (a second later) rather than waited for.
		if !s.op.TryLock() {
			return
		}
	} else {
		s.op.Lock()
	}
	defer s.op.Unlock()
	if s.state() != session.StateRunning {
		return
	}
	if pauseIt {
		vm, err := s.currentVM()
		if err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(s.m.ctx, 10*time.Second)
		err = vm.Pause(ctx)
		cancel()
		if err != nil {
			return
		}
	}
	free := s.m.freeSpace()
	what := "a disk write failed on the host"
	if stop.NoSpace {
		what = "host disk full"
	}
	cause := fmt.Sprintf("%s: %s free under %s; the VM waits (free space, then it resumes by itself, or berth resume %s)", what, session.FormatBytes(free), s.m.cfg.DataDir, s.name)
	if stop.Reason != "" && !stop.NoSpace {
		cause += " (" + stop.Reason + ")"
	}
	s.mu.Lock()
	s.rec.PauseReason = pauseDiskFull
	s.mu.Unlock()
	s.m.log.Warn("VM stopped on a disk write", "session", s.name, "disk", stop.Disk, "nospace", stop.NoSpace, "reason", stop.Reason)
	s.setState(session.StatePaused, cause, "host")
}

// check refuses action when the session's state does not allow it. A
// session its VMM paused on a full host disk says so: what to free, and
// that it resumes by itself.
func (s *sess) check(action session.Action) error {
	s.mu.Lock()
	st, reason, cause := session.State(s.rec.State), s.rec.PauseReason, s.rec.Cause
	s.mu.Unlock()
	if st == session.StatePaused && reason == pauseDiskFull {
		return session.CheckTransitionHint(s.name, action, st, cause)
	}
	return session.CheckTransition(s.name, action, st)
}

// resumeAfterDiskFull continues a session a full disk paused.
func (s *sess) resumeAfterDiskFull(ctx context.Context, h session.HostStatus) {
	// Called from the space loop for every session: one busy with a
	// lifecycle change is retried at the next tick rather than waited for.
	if !s.op.TryLock() {
		return
	}
	defer s.op.Unlock()
	s.mu.Lock()
	paused := s.rec.State == string(session.StatePaused) && s.rec.PauseReason == pauseDiskFull
	s.mu.Unlock()
	if !paused {
		return
	}
	vm, err := s.currentVM()
	if err != nil {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err = vm.Resume(rctx)
	cancel()
	if err != nil {
		s.m.log.Warn("resume after the disk filled", "session", s.name, "err", err)
		return
	}
	s.mu.Lock()
	s.rec.PauseReason = ""
	s.mu.Unlock()
	s.setState(session.StateRunning, fmt.Sprintf("resumed: the host disk has %s free again", session.FormatBytes(h.Free)), "host")
	s.m.resumeRuns(s)
}

// checkRoom refuses to write need bytes when that would take the data
// directory below the floor (or past full, with no floor set).
func (m *Manager) checkRoom(what string, need int64) error {
	free := m.freeSpace()
	if free-need < m.cfg.Floor || need > free {
		return fmt.Errorf("cannot %s: it needs %s and the data directory %s has %s free, to stay above the %s floor (free_space_floor in config.toml); free some space first: %w: %w",
			what, session.FormatBytes(need), m.cfg.DataDir, session.FormatBytes(free), session.FormatBytes(m.cfg.Floor), session.ErrNoSpace, syscall.ENOSPC)
	}
	return nil
}

// copier copies disks, checking the room a sparse copy needs.
func (m *Manager) copier() *diskcopy.Copier { return &diskcopy.Copier{Room: m.checkRoom} }

// hostFull classes a write that failed for want of room (ENOSPC from a
// VMM or a copy) as the host's full disk, so that clients tell it from a
// fault and know to free space.
func hostFull(err error) error {
	if errors.Is(err, syscall.ENOSPC) && !errors.Is(err, session.ErrNoSpace) {
		return fmt.Errorf("%w: %w", session.ErrNoSpace, err)
	}
	return err
}

package session

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthvm/berth/store"
	"github.com/berthvm/berth/vmm"
)

// hostMemAvailable reads MemAvailable from /proc/meminfo.
func hostMemAvailable() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n << 10
		}
	}
	return 0
}

func (m *Manager) checkResources(opts CreateOptions) error {
	if err := CheckCPUs(opts.CPUs); err != nil {
		return err
	}
	if opts.CPUs > runtime.NumCPU()*4 {
		return fmt.Errorf("--cpus %d is more than 4x this host's %d CPUs: %w", opts.CPUs, runtime.NumCPU(), ErrInvalid)
	}
	if opts.MemoryMiB < 128 {
		return fmt.Errorf("--memory %dM is below the 128M a guest needs: %w", opts.MemoryMiB, ErrInvalid)
	}
	if avail := hostMemAvailable(); avail > 0 && int64(opts.MemoryMiB)<<20 > avail {
		return fmt.Errorf("--memory %dM exceeds the host's available memory (%dM): %w", opts.MemoryMiB, avail>>20, ErrInvalid)
	}
	if opts.DiskBytes < 16<<20 {
		return fmt.Errorf("--disk %d bytes is below the 16M minimum: %w", opts.DiskBytes, ErrInvalid)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(m.cfg.DataDir, &fs); err == nil {
		if free := int64(fs.Bavail) * fs.Bsize; opts.DiskBytes > free {
			return fmt.Errorf("--disk %dM exceeds the free space under %s (%dM): %w", opts.DiskBytes>>20, m.cfg.DataDir, free>>20, ErrInvalid)
		}
	}
	return nil
}

// Create makes a session: its workspace volume, then its VM. A failure at
// any step removes everything the create made.
func (m *Manager) Create(ctx context.Context, opts CreateOptions) (Session, error) {
	if err := ValidateName(opts.Name); err != nil {
		return Session{}, err
	}
	d := m.cfg.Defaults
	if opts.CPUs == 0 {
		opts.CPUs = d.CPUs
	}
	if opts.MemoryMiB == 0 {
		opts.MemoryMiB = d.MemoryMiB
	}
	if opts.DiskBytes == 0 {
		opts.DiskBytes = d.DiskBytes
	}
	if opts.Image == "" {
		opts.Image = d.Image
	}
	if opts.VMM == "" {
		opts.VMM = d.VMM
	}
	if _, err := m.driver(opts.VMM); err != nil {
		return Session{}, err
	}
	if err := m.checkResources(opts); err != nil {
		return Session{}, err
	}
	if err := m.checkFloor("create session " + opts.Name); err != nil {
		return Session{}, err
	}
	now := time.Now()
	rec := store.Session{
		Name: opts.Name, State: string(StateCreating), Cause: "created", Image: opts.Image, VMM: opts.VMM,
		CPUs: opts.CPUs, MemoryMiB: opts.MemoryMiB, DiskBytes: opts.DiskBytes, CreatedAt: now, LastActivity: now,
		Retention: d.Retention, WorkspaceUUID: vmm.NewUUID(), MachineID: randomMachineID(),
	}
	if opts.SystemBytes == 0 {
		opts.SystemBytes = d.SystemBytes
	}
	if opts.SystemBytes < minSystemBytes {
		return Session{}, fmt.Errorf("--system-disk %s is below the %s minimum: %w", FormatBytes(opts.SystemBytes), FormatBytes(minSystemBytes), ErrInvalid)
	}
	if opts.IdleTimeout != nil {
		if *opts.IdleTimeout < 0 {
			return Session{}, fmt.Errorf("--idle-timeout %s: want 0 (never) or a positive duration: %w", *opts.IdleTimeout, ErrInvalid)
		}
		t := *opts.IdleTimeout
		rec.IdleTimeout = &t
	}
	net, err := m.createNet(opts.Net)
	if err != nil {
		return Session{}, err
	}
	rec.Net = net
	s := m.newSess(rec)
	s.op.Lock()
	defer s.op.Unlock()
	m.mu.Lock()
	if _, ok := m.sessions[opts.Name]; ok {
		m.mu.Unlock()
		return Session{}, fmt.Errorf("session %q: %w", opts.Name, ErrExists)
	}
	m.sessions[opts.Name] = s
	m.mu.Unlock()

	by := Actor(ctx)
	fail := func(err error) (Session, error) {
		m.removeSession(s, "")
		return Session{}, err
	}
	if err := s.setState(StateCreating, "create requested", by); err != nil {
		return fail(err)
	}
	if err := os.MkdirAll(s.vmDir(), 0o755); err != nil {
		return fail(fmt.Errorf("create session directory: %w", err))
	}
	if err := vmm.CreateWorkspace(ctx, s.wsPath(), opts.DiskBytes, rec.WorkspaceUUID); err != nil {
		return fail(err)
	}
	if err := s.newSystem(ctx, opts.Image, opts.SystemBytes); err != nil {
		return fail(err)
	}
	how, err := s.bootNew(ctx, by)
	if err != nil {
		return fail(err)
	}
	if err := s.setState(StateRunning, "created: "+how, by); err != nil {
		return fail(err)
	}
	m.cfg.Observer.Created(time.Since(now))
	return s.snapshot(), nil
}

// removeSession deletes a session's VM files, workspace and records.
func (m *Manager) removeSession(s *sess, why string) {
	s.detach()
	os.RemoveAll(s.dir())
	if err := m.st.DeleteSession(s.name); err != nil && !errors.Is(err, store.ErrNotFound) {
		m.log.Warn("delete session records", "session", s.name, "err", err)
	}
	m.mu.Lock()
	if m.sessions[s.name] == s {
		delete(m.sessions, s.name)
	}
	m.mu.Unlock()
	m.dropHarness(s.name)
	m.hub.publish(Event{Time: time.Now(), Kind: EventDeleted, Name: s.name, Message: why})
}

// lifecycle runs fn for an allowed transition under the session's op lock.
func (m *Manager) lifecycle(ctx context.Context, name string, action Action, fn func(s *sess) error) (Session, error) {
	s, err := m.get(name)
	if err != nil {
		return Session{}, err
	}
	s.op.Lock()
	defer s.op.Unlock()
	if err := s.check(action); err != nil {
		return Session{}, err
	}
	s.touch()
	if err := fn(s); err != nil {
		return Session{}, err
	}
	return s.snapshot(), nil
}

func (s *sess) currentVM() (vmm.VM, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.vm == nil {
		return nil, fmt.Errorf("session %q has no running VM: %w", s.name, ErrUnavailable)
	}
	return s.vm, nil
}

// Pause stops the session's vCPUs. It does not flush: dirty pages stay in
// the guest until a flush or a clean stop.
func (m *Manager) Pause(ctx context.Context, name string) (Session, error) {
	return m.lifecycle(ctx, name, ActionPause, func(s *sess) error {
		vm, err := s.currentVM()
		if err != nil {
			return err
		}
		if err := vm.Pause(ctx); err != nil {
			return fmt.Errorf("pause %q: %w", name, err)
		}
		return s.setState(StatePaused, "paused (not flushed)", Actor(ctx))
	})
}

// Resume continues a paused session.
func (m *Manager) Resume(ctx context.Context, name string) (Session, error) {
	return m.lifecycle(ctx, name, ActionResume, func(s *sess) error {
		if s.state() == StateSleeping {
			return s.wake(ctx, Actor(ctx))
		}
		vm, err := s.currentVM()
		if err != nil {
			return err
		}
		if err := vm.Resume(ctx); err != nil {
			return fmt.Errorf("resume %q: %w", name, err)
		}
		if err := s.setState(StateRunning, "resumed", Actor(ctx)); err != nil {
			return err
		}
		m.resumeRuns(s) // executions recovered while paused resume now
		return nil
	})
}

// stopGrace is how long running commands get between TERM and KILL.
const stopGrace = 5 * time.Second

// Stop shuts the session down cleanly: commands get TERM then KILL, the
// workspace is flushed and unmounted, the VM powers off. A VM that does
// not answer is killed, and the event says so.
func (m *Manager) Stop(ctx context.Context, name string) (Session, error) {
	return m.lifecycle(ctx, name, ActionStop, func(s *sess) error {
		return s.stopVM(ctx, Actor(ctx), "stop")
	})
}

// stopVM ends the session's VM as a stop does and records it stopped; a
// session with no VM (stopped, crashed) is only recorded so. why names the
// action for the records. The caller holds s.op.
func (s *sess) stopVM(ctx context.Context, by, why string) error {
	m, name := s.m, s.name
	prev := s.state()
	switch prev {
	case StateStopped:
		return nil
	case StateSleeping:
		// Asleep, the disks are already flushed and clean and no VM
		// runs: dropping the snapshot is the whole stop.
		os.RemoveAll(s.snapshotDir())
		s.mu.Lock()
		s.rec.SnapshotPath, s.rec.SnapshotBytes = "", 0
		s.mu.Unlock()
		return s.setState(StateStopped, "stopped while asleep (its disks were flushed at sleep)", by)
	}
	if err := s.setState(StateStopping, why+" requested", by); err != nil {
		return err
	}
	cause := "stopped cleanly (commands ended, disks flushed, workspace unmounted)"
	s.mu.Lock()
	vm := s.vm
	s.intended = true
	s.mu.Unlock()
	if vm != nil {
		if prev == StatePaused {
			vm.Resume(ctx)
		}
		m.cancelRuns(name, ExecCancelled, "session stopped ("+why+")")
		if err := s.shutdownVM(ctx, vm); err != nil {
			cause = "stopped by killing the VM: " + err.Error()
			vm.Kill(context.Background())
		}
		<-vm.Done()
	}
	s.detach()
	m.loseRuns(name, "the session stopped")
	return s.setState(StateStopped, cause, by)
}

func (s *sess) shutdownVM(ctx context.Context, vm vmm.VM) error {
	c, err := s.connectedAgent()
	if err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, stopGrace+30*time.Second)
	defer cancel()
	if _, err := c.Shutdown(sctx, stopGrace); err != nil {
		return fmt.Errorf("agent shutdown: %w", err)
	}
	select {
	case <-vm.Done():
		return nil
	case <-time.After(20 * time.Second):
		return errors.New("the VM did not power off within 20s of a clean shutdown")
	}
}

// Start gives a stopped or crashed session a new VM on its retained disks
// (workspace and system disk): from the image's booted template when it
// can, so no boot at all. Processes and memory are gone; files are not.
func (m *Manager) Start(ctx context.Context, name string) (Session, error) {
	return m.lifecycle(ctx, name, ActionStart, func(s *sess) error {
		if s.state() == StateSleeping {
			return s.wake(ctx, Actor(ctx))
		}
		how, err := s.bootNew(ctx, Actor(ctx))
		if err != nil {
			return err
		}
		m.crash("start:booted") // a VM runs; the record still says stopped
		return s.setState(StateRunning, "started on its retained disks: "+how, Actor(ctx))
	})
}

// Delete removes the session's VM and all its storage, permanently.
func (m *Manager) Delete(ctx context.Context, name string) error {
	_, err := m.lifecycle(ctx, name, ActionDelete, func(s *sess) error {
		if err := s.setState(StateDeleting, "delete requested", Actor(ctx)); err != nil {
			return err
		}
		s.mu.Lock()
		vm := s.vm
		s.intended = true
		s.mu.Unlock()
		if vm != nil {
			vm.Kill(ctx)
		}
		m.cancelRuns(name, ExecCancelled, "session deleted")
		m.loseRuns(name, "the session was deleted")
		m.removeSession(s, "deleted by "+Actor(ctx))
		return nil
	})
	return err
}

// Flush makes every pending workspace write durable.
func (m *Manager) Flush(ctx context.Context, name string) (FlushResult, error) {
	var res FlushResult
	_, err := m.lifecycle(ctx, name, ActionFlush, func(s *sess) error {
		if s.state() == StateSleeping {
			return nil // flushed when it went to sleep; nothing is dirty
		}
		c, err := s.connectedAgent()
		if err != nil {
			return err
		}
		r, err := c.Flush(ctx)
		if err != nil {
			return agentErr(name, err)
		}
		res = FlushResult{DirtyBefore: r.DirtyBefore, DirtyAfter: r.DirtyAfter, Took: r.Took}
		m.event(Event{Kind: EventFlush, Name: name, By: Actor(ctx),
			Message: fmt.Sprintf("flushed %d bytes in %s (%d dirty after)", r.DirtyBefore, r.Took.Round(time.Millisecond), r.DirtyAfter)})
		s.mu.Lock()
		s.stats.Dirty, s.stats.Writeback = r.DirtyAfter, 0
		s.mu.Unlock()
		return nil
	})
	return res, err
}

package engine

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

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/session"
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

// limits are the host's side of a create's rules, measured now.
func (m *Manager) limits() session.Limits {
	lim := session.Limits{HostCPUs: runtime.NumCPU(), MemAvailable: hostMemAvailable(), DataDir: m.cfg.DataDir}
	var fs unix.Statfs_t
	if err := unix.Statfs(m.cfg.DataDir, &fs); err == nil {
		lim.DiskFree = int64(fs.Bavail) * fs.Bsize
	}
	return lim
}

// Create makes a session: its workspace volume, then its VM; with
// opts.From, copies of a checkpoint's disks (from.go). A failure at any
// step removes everything the create made.
func (m *Manager) Create(ctx context.Context, opts session.CreateOptions) (session.Session, error) {
	if err := session.ValidateName(opts.Name); err != nil {
		return session.Session{}, err
	}
	if opts.From != "" {
		return m.createFrom(ctx, opts)
	}
	d := m.cfg.Defaults
	dc := d.create()
	dc.Net = m.proxy.Config().Default
	opts = opts.WithDefaults(dc)
	net, err := session.ValidateCreate(opts, m.limits())
	if err != nil {
		return session.Session{}, err
	}
	if _, err := m.driver(opts.VMM); err != nil {
		return session.Session{}, err
	}
	if err := m.checkFloor("create session " + opts.Name); err != nil {
		return session.Session{}, err
	}
	now := time.Now()
	rec := store.Session{
		Name: opts.Name, State: string(session.StateCreating), Cause: "created", Image: opts.Image, VMM: opts.VMM,
		CPUs: opts.CPUs, MemoryMiB: opts.MemoryMiB, DiskBytes: opts.DiskBytes, CreatedAt: now, LastActivity: now,
		Retention: d.Retention, WorkspaceUUID: vmm.NewUUID(), MachineID: randomMachineID(),
		NICMAC: guest.NewNICMAC(),
	}
	if opts.IdleTimeout != nil {
		t := *opts.IdleTimeout
		rec.IdleTimeout = &t
	}
	rec.Net = net
	s, err := m.claim(rec)
	if err != nil {
		return session.Session{}, err
	}
	defer s.op.Unlock()

	by := session.Actor(ctx)
	fail := func(err error) (session.Session, error) {
		m.removeSession(s, "")
		return session.Session{}, err
	}
	if err := s.setState(session.StateCreating, "create requested", by); err != nil {
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
	if err := s.makeWorkDir(ctx); err != nil {
		return fail(err)
	}
	if err := s.setState(session.StateRunning, "created: "+how, by); err != nil {
		return fail(err)
	}
	m.cfg.Observer.Created(time.Since(now))
	return s.snapshot(), nil
}

// makeWorkDir readies a new workspace for the commands of the session's
// image: the working directory its config names, when under /workspace,
// is made (they start there), and with a user other than root the
// workspace and that directory are the user's, so its commands can write
// where they run. The user is resolved in the guest, as for commands and
// the files the file API makes.
func (s *sess) makeWorkDir(ctx context.Context) error {
	d := s.execDefaults()
	mkdir := d.Cwd != "" && d.Cwd != "/workspace"
	if !mkdir && d.User == "" {
		return nil
	}
	c, err := s.connectedAgent()
	if err != nil {
		return err
	}
	if d.User != "" {
		if err := c.Setstat(ctx, "/workspace", guest.Attrs{Owner: d.User}); err != nil {
			return fmt.Errorf("give /workspace to the image's user %s: %w", d.User, agentErr(s.name, err))
		}
	}
	if mkdir {
		// Every directory made on the way is the user's too.
		if err := c.Owned(d.User).Mkdir(ctx, d.Cwd, true); err != nil {
			return fmt.Errorf("make the image's working directory %s: %w", d.Cwd, agentErr(s.name, err))
		}
	}
	return nil
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
	m.hub.publish(session.Event{Time: time.Now(), Kind: session.EventDeleted, Name: s.name, Message: why})
}

// lifecycle runs fn for an allowed transition under the session's op lock.
func (m *Manager) lifecycle(ctx context.Context, name string, action session.Action, fn func(s *sess) error) (session.Session, error) {
	s, err := m.get(name)
	if err != nil {
		return session.Session{}, err
	}
	s.op.Lock()
	defer s.op.Unlock()
	if err := s.check(action); err != nil {
		return session.Session{}, err
	}
	s.touch()
	if err := fn(s); err != nil {
		return session.Session{}, err
	}
	return s.snapshot(), nil
}

func (s *sess) currentVM() (vmm.VM, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.vm == nil {
		return nil, fmt.Errorf("session %q has no running VM: %w", s.name, session.ErrUnavailable)
	}
	return s.vm, nil
}

// Pause stops the session's vCPUs. It does not flush: dirty pages stay in
// the guest until a flush or a clean stop.
func (m *Manager) Pause(ctx context.Context, name string) (session.Session, error) {
	return m.lifecycle(ctx, name, session.ActionPause, func(s *sess) error {
		vm, err := s.currentVM()
		if err != nil {
			return err
		}
		if err := vm.Pause(ctx); err != nil {
			return fmt.Errorf("pause %q: %w", name, err)
		}
		return s.setState(session.StatePaused, "paused (not flushed)", session.Actor(ctx))
	})
}

// Resume continues a paused session.
func (m *Manager) Resume(ctx context.Context, name string) (session.Session, error) {
	return m.lifecycle(ctx, name, session.ActionResume, func(s *sess) error {
		if s.state() == session.StateSleeping {
			return s.wake(ctx, session.Actor(ctx))
		}
		vm, err := s.currentVM()
		if err != nil {
			return err
		}
		if err := vm.Resume(ctx); err != nil {
			return fmt.Errorf("resume %q: %w", name, err)
		}
		if err := s.setState(session.StateRunning, "resumed", session.Actor(ctx)); err != nil {
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
func (m *Manager) Stop(ctx context.Context, name string) (session.Session, error) {
	return m.lifecycle(ctx, name, session.ActionStop, func(s *sess) error {
		return s.stopVM(ctx, session.Actor(ctx), "stop")
	})
}

// stopVM ends the session's VM as a stop does and records it stopped; a
// session with no VM (stopped, crashed) is only recorded so. why names the
// action for the records. The caller holds s.op.
func (s *sess) stopVM(ctx context.Context, by, why string) error {
	m, name := s.m, s.name
	prev := s.state()
	switch prev {
	case session.StateStopped:
		return nil
	case session.StateSleeping:
		// Asleep, the disks are already flushed and clean and no VM
		// runs: dropping the snapshot is the whole stop.
		os.RemoveAll(s.snapshotDir())
		s.mu.Lock()
		s.rec.SnapshotPath, s.rec.SnapshotBytes = "", 0
		s.mu.Unlock()
		return s.setState(session.StateStopped, "stopped while asleep (its disks were flushed at sleep)", by)
	}
	if err := s.setState(session.StateStopping, why+" requested", by); err != nil {
		return err
	}
	cause := "stopped cleanly (commands ended, disks flushed, workspace unmounted)"
	s.mu.Lock()
	vm := s.vm
	s.intended = true
	s.mu.Unlock()
	if vm != nil {
		if prev == session.StatePaused {
			vm.Resume(ctx)
		}
		m.cancelRuns(name, session.ExecCancelled, "session stopped ("+why+")")
		if err := s.shutdownVM(ctx, vm); err != nil {
			cause = "stopped by killing the VM: " + err.Error()
			vm.Kill(context.Background())
		}
		<-vm.Done()
	}
	s.detach()
	m.loseRuns(name, "the session stopped")
	return s.setState(session.StateStopped, cause, by)
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
func (m *Manager) Start(ctx context.Context, name string) (session.Session, error) {
	return m.lifecycle(ctx, name, session.ActionStart, func(s *sess) error {
		if s.state() == session.StateSleeping {
			return s.wake(ctx, session.Actor(ctx))
		}
		how, err := s.bootNew(ctx, session.Actor(ctx))
		if err != nil {
			return err
		}
		m.crash("start:booted") // a VM runs; the record still says stopped
		return s.setState(session.StateRunning, "started on its retained disks: "+how, session.Actor(ctx))
	})
}

// Delete removes the session's VM and all its storage, permanently.
func (m *Manager) Delete(ctx context.Context, name string) error {
	_, err := m.lifecycle(ctx, name, session.ActionDelete, func(s *sess) error {
		if err := s.setState(session.StateDeleting, "delete requested", session.Actor(ctx)); err != nil {
			return err
		}
		s.mu.Lock()
		vm := s.vm
		s.intended = true
		s.mu.Unlock()
		if vm != nil {
			vm.Kill(ctx)
		}
		m.cancelRuns(name, session.ExecCancelled, "session deleted")
		m.loseRuns(name, "the session was deleted")
		m.removeSession(s, "deleted by "+session.Actor(ctx))
		return nil
	})
	return err
}

// Flush makes every pending workspace write durable.
func (m *Manager) Flush(ctx context.Context, name string) (session.FlushResult, error) {
	var res session.FlushResult
	_, err := m.lifecycle(ctx, name, session.ActionFlush, func(s *sess) error {
		if s.state() == session.StateSleeping {
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
		res = session.FlushResult{DirtyBefore: r.DirtyBefore, DirtyAfter: r.DirtyAfter, Took: r.Took}
		m.event(session.Event{Kind: session.EventFlush, Name: name, By: session.Actor(ctx),
			Message: fmt.Sprintf("flushed %d bytes in %s (%d dirty after)", r.DirtyBefore, r.Took.Round(time.Millisecond), r.DirtyAfter)})
		s.mu.Lock()
		s.stats.Dirty, s.stats.Writeback = r.DirtyAfter, 0
		s.mu.Unlock()
		return nil
	})
	return res, err
}

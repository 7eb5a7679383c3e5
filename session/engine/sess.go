package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/engine/egress"
	"github.com/berthvm/berth/session/engine/internal/lock"
	"github.com/berthvm/berth/session/engine/netstack"
	"github.com/berthvm/berth/store"
	"github.com/berthvm/berth/vmm"
)

// sess is one session's runtime state.
type sess struct {
	m    *Manager
	name string

	// op serialises lifecycle changes; held for their whole duration, so
	// a pause during a boot waits instead of racing it.
	op lock.Mutex

	// putMu orders the writes of the record: held from the copy under mu
	// through its store write and its event, so an older copy never lands
	// after a newer one (a state change racing a policy change or a crash).
	putMu    lock.Mutex
	mu       lock.Mutex
	rec      store.Session
	vm       vmm.VM
	agent    *guest.Client
	intended bool // the VM is being stopped on purpose: its exit is no crash
	supStop  context.CancelFunc
	stats    guest.Stats
	statsAt  time.Time
	sampler  sampler    // host and guest figures, and their history
	agentMu  lock.Mutex // serialises (re)connecting the agent
	// files counts the Handles files open on the session's agent; the
	// idle loop does not put a session holding any to sleep.
	files atomic.Int32
	// running counts the session's executions being recorded (Manager.addRun
	// and dropRun, under m.mu); read without a lock.
	running atomic.Int32
	// heldOut counts the session's executions whose output is held for
	// lack of room (run.setHeld); read without a lock, as running is.
	heldOut atomic.Int32
	ckpt    ckptTotals // guarded by mu; see refreshCheckpoints
	egress  egress.Counters
	fwd     fwdCounts
	// nic is the running NIC stack's way into the guest (serveNIC);
	// nil while the VM has no NIC or its stack is not up.
	nic  atomic.Pointer[netstack.Guest]
	note func(string) // where egress refusals are noted; nil: the timeline
	// exec caches the defaults the session's image build gives its
	// commands, for the build named by execKey; guarded by mu.
	exec    execDefaults
	execKey string
	// changes counts state changes; sent is changes+1 as of the last
	// complete SendSession (0: none since the Manager started), so
	// DropSent can tell a copy sent away from one changed since.
	changes atomic.Uint64
	sent    atomic.Uint64
}

// claim lists a new session under rec.Name with its sess.op held, so
// nothing else acts on it before its maker is done; the caller unlocks
// op. A name already listed is ErrExists.
func (m *Manager) claim(rec store.Session) (*sess, error) {
	s := m.newSess(rec)
	s.op.Lock()
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.sessions[rec.Name]; ok {
		s.op.Unlock()
		return nil, fmt.Errorf("session %q: %w", rec.Name, session.ErrExists)
	}
	m.sessions[rec.Name] = s
	return s, nil
}

func (m *Manager) newSess(rec store.Session) *sess {
	s := &sess{m: m, name: rec.Name, rec: rec}
	s.mu.Watch(m.locks, "sess.mu "+rec.Name)
	return s
}

func (s *sess) dir() string   { return s.m.sessionDir(s.name) }
func (s *sess) vmDir() string { return filepath.Join(s.dir(), "vm") }
func (s *sess) wsPath() string {
	return filepath.Join(s.dir(), "workspace.img")
}

func (s *sess) state() session.State {
	s.mu.Lock()
	defer s.mu.Unlock()
	return session.State(s.rec.State)
}

// snapshot converts the record and live figures.
func (s *sess) snapshot() session.Session {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.snapshotLocked()
}

func (s *sess) snapshotLocked() session.Session {
	r := s.rec
	out := session.Session{
		Name: r.Name, State: session.State(r.State), Cause: r.Cause,
		CPUs: r.CPUs, MemoryMiB: r.MemoryMiB, DiskBytes: r.DiskBytes, Image: r.Image, VMM: r.VMM,
		CreatedAt: r.CreatedAt, StartedAt: r.StartedAt, LastActivity: r.LastActivity,
	}
	if out.State == session.StateRunning || out.State == session.StatePaused {
		out.Accel, out.Pid = r.Accel, r.Pid
		out.DirtyBytes = s.stats.Dirty + s.stats.Writeback
		out.MemUsedBytes = s.stats.MemTotal - s.stats.MemAvailable
	}
	if out.State == session.StateRunning {
		out.Live = s.sampler.live
	}
	out.WorkspaceUsed, out.WorkspaceMeasuredAt = r.WorkspaceUsed, r.WorkspaceMeasuredAt
	out.ImageDigest = r.ImageDigest
	out.RootDirectory, out.HomeDirectory = "/workspace", "/root"
	if r.SystemUUID != "" {
		out.SystemBytes = r.SystemBytes
		out.SystemUsed = s.systemUsedLocked()
	}
	out.IdleTimeout = s.idleTimeoutLocked()
	if out.State == session.StateSleeping {
		out.SnapshotBytes = r.SnapshotBytes
	}
	out.LastWake = r.LastWake
	out.Epoch = r.Epoch
	out.Net = r.Net
	if out.Net == "" {
		out.Net = session.DefaultNet
	}
	out.Running = s.m.runningCount(s)
	out.OutputHeld = int(s.heldOut.Load())
	out.Checkpoints, out.CheckpointBytes = s.ckpt.n, s.ckpt.bytes
	return out
}

// setState records a transition with its cause and publishes it.
func (s *sess) setState(st session.State, cause, by string) error {
	s.putMu.Lock()
	defer s.putMu.Unlock()
	s.mu.Lock()
	s.rec.State, s.rec.Cause = string(st), cause
	s.changes.Add(1)
	if st != session.StateRunning && st != session.StatePaused {
		s.rec.Pid = 0
	}
	if st != session.StatePaused {
		s.rec.PauseReason = ""
	}
	rec := s.rec
	snap := s.snapshotLocked()
	s.mu.Unlock()
	// Watchers see the change even when the store cannot keep it (a full
	// disk): the state is true in memory either way.
	msg := string(st)
	if cause != "" {
		msg += ": " + cause
	}
	perr := s.m.st.PutSession(rec)
	s.m.event(session.Event{Kind: session.EventState, Name: s.name, Message: msg, By: by, Session: &snap})
	if perr != nil {
		return fmt.Errorf("record state of %q: %w", s.name, perr)
	}
	if st == session.StateRunning {
		s.measureWorkspace()
	}
	return nil
}

// execDefaults returns what the session's image asks of the commands
// run in it (an imported image's Env and WorkingDir), read once per build.
func (s *sess) execDefaults() execDefaults {
	s.mu.Lock()
	name, digest := s.rec.Image, s.rec.ImageDigest
	key := name + "@" + digest
	if s.execKey == key {
		d := s.exec
		s.mu.Unlock()
		return d
	}
	s.mu.Unlock()
	var d execDefaults
	if st := s.m.cfg.Images; st != nil && digest != "" {
		b, err := st.Load(name, digest)
		if err != nil {
			s.m.log.Warn("image config unreadable: commands run without it", "session", s.name, "image", key, "err", err)
			return d
		}
		d = imageExecDefaults(b.Config)
	}
	s.mu.Lock()
	s.exec, s.execKey = d, key
	s.mu.Unlock()
	return d
}

func (s *sess) touch() {
	s.mu.Lock()
	s.rec.LastActivity = time.Now()
	s.mu.Unlock()
}

func (s *sess) sysPath() string { return filepath.Join(s.dir(), "system.img") }

// vmSetup resolves what starting the session's VM takes: its record, its
// driver, its image, and the Config of a cold boot on its disks, which a
// restore adjusts.
func (s *sess) vmSetup(ctx context.Context) (store.Session, vmm.Driver, Image, vmm.Config, error) {
	s.mu.Lock()
	rec := s.rec
	s.mu.Unlock()
	d, err := s.m.driver(rec.VMM)
	if err != nil {
		return rec, nil, Image{}, vmm.Config{}, err
	}
	im, err := s.m.resolveImage(ctx, rec.Image, rec.ImageDigest)
	if err != nil {
		return rec, nil, Image{}, vmm.Config{}, fmt.Errorf("session %q: %w", s.name, err)
	}
	cfg := vmm.Config{
		Dir: s.vmDir(), Kernel: im.Kernel, Initramfs: im.Initramfs,
		Cmdline: bootCmdline(rec.WorkspaceUUID, rec.SystemUUID, im, s.name, rec.MachineID),
		CPUs:    rec.CPUs, MemoryMiB: rec.MemoryMiB,
		Workspace: s.wsPath(), Accel: s.m.cfg.Defaults.Accel,
		NIC: s.wantsNIC(), NICMAC: rec.NICMAC,
	}
	if im.RootFS() {
		if rec.SystemUUID == "" {
			return rec, nil, im, cfg, fmt.Errorf("session %q has no system disk for image %s: `berth replace %s` gives it one (the workspace is kept): %w", s.name, rec.Image, s.name, session.ErrInvalidState)
		}
		if _, err := os.Stat(s.sysPath()); err != nil {
			return rec, nil, im, cfg, fmt.Errorf("the system disk of %q is missing (%v): the session cannot start; `berth replace %s` gives it a fresh one from image %s (the workspace is kept): %w", s.name, err, s.name, rec.Image, session.ErrInvalidState)
		}
		cfg.System, cfg.Layers = s.sysPath(), layerPaths(im)
	}
	return rec, d, im, cfg, nil
}

// checkHello refuses a VM whose disks did not mount as the session's.
func (s *sess) checkHello(h guest.Hello, im Image) error {
	if im.RootFS() && !h.System.Mounted {
		return fmt.Errorf("the system disk of %q did not mount (%s): it may be corrupt; `berth replace %s` gives the session a fresh one (the workspace is kept): %w", s.name, h.System.Error, s.name, session.ErrInvalidState)
	}
	if !h.Workspace.Mounted {
		return fmt.Errorf("the VM booted but /workspace is not the session's volume: %s", h.Workspace.Error)
	}
	return nil
}

// boot starts a VM on the session's disks and waits for its agent.
func (s *sess) boot(ctx context.Context) error {
	// A cold boot writes (the journal's replay, a fresh system's first
	// files); a template restore does not, and is not refused.
	if err := s.m.checkFloor("start session " + s.name + " from cold"); err != nil {
		return err
	}
	_, d, im, cfg, err := s.vmSetup(ctx)
	if err != nil {
		return err
	}
	bctx, cancel := context.WithTimeout(ctx, s.m.cfg.BootTimeout)
	defer cancel()
	vm, err := d.Start(bctx, cfg)
	if err != nil {
		if errors.Is(err, vmm.ErrInUse) {
			return fmt.Errorf("session %q: %w: %w", s.name, session.ErrConflict, err)
		}
		return fmt.Errorf("start VM for %q: %w", s.name, err)
	}
	c, err := guest.Dial(bctx, vm.DialAgent)
	if err == nil {
		var h guest.Hello
		if h, err = c.Hello(bctx); err == nil {
			err = s.checkHello(h, im)
		}
		if err != nil {
			c.Close()
		}
	}
	if err != nil {
		vm.Kill(context.Background())
		tail := vm.Exit().LogTail
		vm.Close()
		if errors.Is(err, session.ErrInvalidState) {
			return err
		}
		if ctx.Err() == nil && bctx.Err() != nil {
			return fmt.Errorf("VM for %q did not answer within %s: %w (console: %s)", s.name, s.m.cfg.BootTimeout, session.ErrUnavailable, lastLines(filepath.Join(s.vmDir(), "console.log")))
		}
		return fmt.Errorf("VM for %q: %w %s", s.name, err, tail)
	}
	s.attached(vm, c)
	return nil
}

// attached makes vm and its agent connection the session's and starts
// watching them.
func (s *sess) attached(vm vmm.VM, c *guest.Client) {
	s.mu.Lock()
	s.vm, s.agent, s.intended = vm, c, false
	s.rec.Pid, s.rec.Accel, s.rec.StartedAt = vm.Pid(), string(vm.Accel()), time.Now()
	s.stats = guest.Stats{}
	s.sampler.reset()
	s.mu.Unlock()
	s.serveGuest(c)
	s.supervise(vm)
}

// supervise watches the VM: an exit nobody asked for is a crash, and while
// it runs the live figures are refreshed.
func (s *sess) supervise(vm vmm.VM) {
	ctx, cancel := context.WithCancel(s.m.ctx)
	s.mu.Lock()
	if s.supStop != nil {
		s.supStop()
	}
	s.supStop = cancel
	s.mu.Unlock()
	if st, ok := vm.(vmm.Stopper); ok {
		s.m.wg.Go(func() { s.watchStops(ctx, st) })
	}
	s.m.wg.Go(func() { s.serveNIC(ctx, vm) })
	s.m.wg.Go(func() {
		t := time.NewTicker(s.m.cfg.StatsInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-vm.Done():
				s.vmExited(vm)
				return
			case <-t.C:
				s.refreshStats(ctx)
			}
		}
	})
}

func (s *sess) refreshStats(ctx context.Context) {
	if s.state() != session.StateRunning {
		return
	}
	c, err := s.connectedAgent()
	if err != nil {
		return
	}
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	st, err := c.Stats(sctx)
	if err != nil {
		return
	}
	pid, ps, hostOK := s.sampleHost()
	now := time.Now()
	s.mu.Lock()
	s.stats, s.statsAt = st, now
	s.keepWorkspaceUseLocked(st, now)
	if hostOK {
		lv := s.sampler.add(now, pid, s.rec.CPUs, ps, st, ringCap(s.m.cfg.StatsInterval))
		lv.NetReceivedBytes, lv.NetSentBytes = s.egress.RX.Load(), s.egress.TX.Load()
	} else {
		s.sampler.live = nil // the VMM is gone: its series end
	}
	snap := s.snapshotLocked()
	s.mu.Unlock()
	s.m.event(session.Event{Kind: session.EventStats, Name: s.name, Session: &snap})
}

// vmExited handles the end of the VMM process.
func (s *sess) vmExited(vm vmm.VM) {
	s.mu.Lock()
	if s.vm != vm {
		s.mu.Unlock()
		return
	}
	intended := s.intended
	s.vm = nil
	if s.agent != nil {
		s.agent.Close()
		s.agent = nil
	}
	s.mu.Unlock()
	vm.Close()
	s.m.loseRuns(s.name, "the VM exited: "+vm.Exit().String())
	if intended {
		return
	}
	ex := vm.Exit()
	cause := fmt.Sprintf("VMM pid %d %s", vm.Pid(), ex.String())
	if ex.Code < 0 && ex.Signal == "" {
		cause = fmt.Sprintf("VMM pid %d exited unexpectedly (its exit status is unknown: an earlier daemon started it)", vm.Pid())
	}
	var lines []string
	for _, l := range strings.Split(ex.LogTail, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "--- ") {
			lines = append(lines, l) // skip berth's own start markers
		}
	}
	if len(lines) > 0 {
		cause += "; last log lines:\n" + strings.Join(lines, "\n")
	}
	s.m.log.Warn("VM crashed", "session", s.name, "exit", ex.String())
	s.setState(session.StateCrashed, cause, "")
}

// connectedAgent returns the agent connection, reconnecting if it broke.
func (s *sess) connectedAgent() (*guest.Client, error) {
	s.mu.Lock()
	c, vm := s.agent, s.vm
	s.mu.Unlock()
	if c != nil {
		select {
		case <-c.Done():
		default:
			return c, nil
		}
	}
	if vm == nil {
		return nil, fmt.Errorf("session %q has no VM: %w", s.name, session.ErrUnavailable)
	}
	s.agentMu.Lock()
	defer s.agentMu.Unlock()
	s.mu.Lock()
	c = s.agent
	s.mu.Unlock()
	if c != nil {
		select {
		case <-c.Done():
			c.Close()
		default:
			return c, nil
		}
	}
	ctx, cancel := context.WithTimeout(s.m.ctx, 20*time.Second)
	defer cancel()
	c, err := guest.Dial(ctx, vm.DialAgent)
	if err != nil {
		return nil, fmt.Errorf("agent of %q does not answer: %w: %w", s.name, session.ErrUnavailable, err)
	}
	s.mu.Lock()
	s.agent = c
	s.mu.Unlock()
	s.serveGuest(c)
	return c, nil
}

// detach drops and forgets berth's handles on the VM without stopping it.
func (s *sess) detach() {
	s.mu.Lock()
	if s.supStop != nil {
		s.supStop()
	}
	vm, c := s.vm, s.agent
	s.vm, s.agent = nil, nil
	s.mu.Unlock()
	if c != nil {
		c.Close()
	}
	if vm != nil {
		vm.Close()
	}
}

// recover brings a session recorded by an earlier daemon back under
// supervision.
func (s *sess) recover(ctx context.Context) {
	s.cleanCheckpoints()
	defer s.refreshCheckpoints()
	st := s.state()
	d, derr := s.m.driver(s.rec.VMM)
	var vm vmm.VM
	// Stopped and crashed sessions are looked for too: a start the
	// daemon died in leaves a VMM running under a record that says
	// stopped (see the default case below).
	if derr == nil {
		var err error
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		vm, err = d.Attach(actx, s.vmDir())
		cancel()
		if err != nil {
			vm = nil
		}
	}
	if vm == nil {
		// Nothing this daemon can supervise runs in the VM's directory;
		// a VMM that does anyway is a stray, and would be a second VM
		// beside the next start's.
		if pids := vmm.KillStrays(s.vmDir()); len(pids) > 0 {
			s.m.log.Warn("killed a VMM no record or driver could attach to", "session", s.name, "state", st, "pids", pids)
		}
	}
	switch st {
	case session.StateCreating:
		// A create that never finished: undo it, as a failed create would.
		if vm != nil {
			vm.Kill(ctx)
			vm.Close()
		}
		s.m.removeSession(s, "creation was interrupted by a daemon restart")
		return
	case session.StateDeleting:
		if vm != nil {
			vm.Kill(ctx)
			vm.Close()
		}
		s.m.removeSession(s, "")
		return
	case session.StateStopping:
		if vm != nil {
			vm.Kill(ctx)
			vm.Close()
		}
		s.m.loseRuns(s.name, "the daemon restarted while the session was stopping")
		s.setState(session.StateStopped, "stop finished after a daemon restart", "")
		s.recoverRestore(ctx)
		return
	case session.StateSleeping:
		s.recoverSleep(ctx, st, vm)
		return
	case session.StateRunning, session.StatePaused:
	default:
		// Recorded stopped or crashed, yet a VMM runs in the session's
		// directory: a start (or a restore's boot) the daemon was killed
		// in before it recorded the session running. Nothing ran in it
		// for anyone, and the next start would leave it running
		// unsupervised beside the new VM (a template's VM takes its
		// workspace only once hot-plugged, so no disk lock stops that):
		// stop it.
		if vm != nil {
			s.m.log.Warn("stopping a VM left by a start the daemon died in", "session", s.name, "state", st, "pid", vm.Pid())
			s.mu.Lock()
			s.intended = true
			s.mu.Unlock()
			vm.Kill(ctx)
			<-vm.Done()
			vm.Close()
		}
		s.m.loseRuns(s.name, "the VM is not running")
		s.recoverRestore(ctx) // stopped by a restore the daemon died in
		return
	}
	if vm == nil {
		s.m.loseRuns(s.name, "the VM exited while the daemon was down")
		s.setState(session.StateCrashed, "the VM exited while the daemon was down", "")
		return
	}
	s.mu.Lock()
	s.vm = vm
	s.rec.Pid = vm.Pid()
	s.mu.Unlock()
	s.supervise(vm)
	if st == session.StateRunning {
		// A VM its VMM stopped on a full disk while no daemon watched: it
		// is paused, and its commands are caught up when it resumes.
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		vst, err := vm.Status(sctx)
		cancel()
		if err == nil && vst == vmm.StateIOError {
			s.diskFull(vmm.Stop{NoSpace: true, Reason: "found stopped on a disk error after a daemon restart"}, false)
			return
		}
		s.recoverSleep(ctx, st, vm) // settle a sleep or wake the daemon died in
		s.m.resumeRuns(s)
	}
}

func lastLines(path string) string {
	return strings.ReplaceAll(vmm.LogTail(path, 5), "\n", " | ")
}

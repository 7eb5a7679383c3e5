// Package engine runs sessions: the Manager owns their VMs, agent
// connections, recorded executions, runs and schedules, checkpoints, images
// and egress, and implements the contract of package session. The daemon
// (session/daemon) wires it to the store, the VMM drivers and the socket.
// Mechanisms with one job each live in packages of their own: the egress
// proxy and DNS beneath it (egress), the timetables of schedules beside
// it (session/schedule, which the fake and the CLI read specs with too).
//
// # Locks
//
// The engine's locks are taken in this order and never against it; a lock
// may be taken while holding only locks above it:
//
//  1. sess.op: one session's lifecycle, held for a whole boot, sleep or
//     checkpoint. A fork, and a create from a checkpoint, take their
//     source's before their new session's (the new one is not listed yet,
//     so nobody else can hold it).
//  2. Manager.tmplMu, then imageBuilds.mu: template and image builds.
//  3. sess.agentMu: (re)connecting a session's agent.
//  4. harness.putMu, then harness.mu: runs and schedules.
//  5. sess.putMu: orders one session's record writes (held from the copy
//     under sess.mu through the store write and the event), then run.mu:
//     one execution's record.
//  6. sess.mu: one session's record and figures. Never two sessions' at once.
//  7. Manager.mu: the maps of sessions and of executions being recorded. It
//     is a leaf among these: nothing is locked while it is held (Manager.all
//     copies the sessions out), and what must be read under sess.mu — how
//     many commands a session runs — is an atomic of the session.
//  8. Leaves, which call nothing that locks: space.mu, egress.Counters.mu, fwdCounts.mu, hub.mu
//     (then a watcher's mu), the lock.Watch, and the store's own locks
//     (store calls never call back into the engine).
//
// No lock is held across a call that waits on the guest, a VMM or the
// network, except sess.op and sess.agentMu, whose waits are bounded by
// contexts. make test builds this package with -tags lockcheck, under which
// every one of these locks is checked (internal/lock): a test fails the
// moment two locks are seen taken in both orders. berth serve -v logs any
// hold of sess.mu, run.mu, harness.mu or Manager.mu longer than a second,
// with the holder's stack.
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/guest/image"
	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/engine/egress"
	"github.com/berthvm/berth/session/engine/internal/lock"
	"github.com/berthvm/berth/store"
	"github.com/berthvm/berth/vmm"
)

// The defaults of the engine that front ends need not know (the contract
// holds the rest, in defaults.go).
const (
	DefaultAccel = vmm.AccelAuto
	// DefaultRetention is the recorded output kept per session.
	DefaultRetention = store.DefaultRetention
)

// Defaults are the settings of new sessions when Create leaves them zero.
// Zero fields take the Default constants.
type Defaults struct {
	Image     string
	CPUs      int
	MemoryMiB int
	DiskBytes int64
	// SystemBytes is the size of a new session's system disk (images with
	// a root filesystem), allocated as it is written.
	SystemBytes int64
	VMM         string
	Accel       vmm.Accel
	Retention   int64 // recorded output per session
}

// WithFallbacks fills what d leaves unset with the defaults: the ones a
// config file that does not name a key gets.
func (d Defaults) WithFallbacks() Defaults {
	c := d.create().WithDefaults(session.DefaultCreate())
	d.Image, d.CPUs, d.MemoryMiB, d.DiskBytes, d.SystemBytes, d.VMM = c.Image, c.CPUs, c.MemoryMiB, c.DiskBytes, c.SystemBytes, c.VMM
	if d.Accel == "" {
		d.Accel = DefaultAccel
	}
	if d.Retention == 0 {
		d.Retention = DefaultRetention
	}
	return d
}

// create is d as the defaults of a create.
func (d Defaults) create() session.CreateOptions {
	return session.CreateOptions{CPUs: d.CPUs, MemoryMiB: d.MemoryMiB, DiskBytes: d.DiskBytes, Image: d.Image, VMM: d.VMM, SystemBytes: d.SystemBytes}
}

// Config configures a Manager. Zero values take the documented defaults.
type Config struct {
	// DataDir holds sessions/<name>/ (workspace.img and the VM's files).
	DataDir  string
	Defaults Defaults
	// Drivers by name; Defaults.VMM picks one.
	Drivers map[string]vmm.Driver
	// Images is where images are found and built; shipped images (mini,
	// debian) are built the first time a session needs them.
	Images *image.Store
	// StatsInterval is how often live figures are refreshed; default 2s.
	StatsInterval time.Duration
	// BootTimeout bounds a VM boot until its agent answers; default 2 min
	// (TCG boots take ~6 s, but a loaded host can take much longer).
	BootTimeout time.Duration
	// IdleTimeout puts a session with no running command and no action
	// for this long to sleep; 0 disables.
	IdleTimeout time.Duration
	// Allowed, if set, says whether the Manager may make a change of its
	// own now (an idle sleep, a scheduled command): a fleet host isolated
	// from etcd may not (nil: it may). Calls from callers are fenced
	// where the daemon serves them (fleet.Fence), not here.
	Allowed func(ctx context.Context) error
	// Floor is the free space on the data directory below which what
	// needs space (create, cold start, sleep, image build) is refused; 0
	// disables the check.
	Floor int64
	// KeepRuns makes runs started without a Keep of their own (MCP's)
	// keep their starting point: the daemon's run_checkpoint. Default
	// false.
	KeepRuns bool
	// RunRecordLimit bounds the guest's record of the paths a run
	// changes (distinct entries); past it the record overflows and the
	// run's diff compares whole trees. 0 is DefaultRunRecordLimit, which
	// is also the most the agent takes.
	RunRecordLimit int
	// RunTimeout ends an open agent run as abandoned once it has had
	// nothing running and no use for this long; default DefaultRunTimeout.
	RunTimeout time.Duration
	// CheckpointLimit bounds each session's checkpoints (default
	// DefaultCheckpointLimit); CheckpointBytes their size on disk together
	// (default DefaultCheckpointBytes).
	CheckpointLimit int
	CheckpointBytes int64
	// NoTemplates makes every create boot cold.
	NoTemplates bool
	// ForwardViaAgent makes every forward go through the agent, also
	// into a guest with a NIC: for the benchmark that compares the two.
	ForwardViaAgent bool
	// Observer learns of creates, wakes and executions' ends (metrics);
	// nil: nobody.
	Observer session.Observer
	// Net configures sessions' networking.
	Net egress.Config
	// NIC gives the guests of sessions whose policy is not none a NIC
	// served by berth's userspace network stack, each flow decided by the
	// policy (QEMU only). Off by default. Such sessions restore from
	// templates made with a NIC; a policy changed from none gets its NIC
	// at the next cold boot.
	NIC bool
	// CrashAt names a step at which the daemon kills itself (tests only).
	CrashAt string
	// LockWatch, when positive, logs every hold of the Manager's, the
	// sessions', the executions' and the harness's locks longer than it,
	// with the stack that took the lock (berth serve -v).
	LockWatch time.Duration
	Logger    *slog.Logger
}

// Manager runs sessions: it owns their VMs, agent connections and
// recorded executions. It is the Service the daemon serves. VMs outlive the
// Manager: Close stops watching them, it does not stop them.
type Manager struct {
	cfg Config
	st  *store.Store
	log *slog.Logger
	hub *hub

	ctx    context.Context // the Manager's lifetime
	cancel context.CancelFunc
	wg     sync.WaitGroup // every goroutine the Manager starts

	tmplMu lock.Mutex // serialises template builds
	builds imageBuilds
	space  space

	mu       lock.Mutex
	sessions map[string]*sess
	runs     map[string]*run // executions being recorded, by id

	hx    *harness      // agent runs and schedules (runs.go, schedule.go)
	proxy *egress.Proxy // every session's egress (net.go)

	locks *lock.Watch // nil unless Config.LockWatch
}

var _ session.Service = (*Manager)(nil)

// NewManager opens the sessions recorded in st and re-attaches to every VM
// that still runs: running executions are caught up from the agent, and
// those whose VM died meanwhile end as lost.
func NewManager(ctx context.Context, st *store.Store, cfg Config) (*Manager, error) {
	cfg.Defaults = cfg.Defaults.WithFallbacks()
	if cfg.StatsInterval == 0 {
		cfg.StatsInterval = 2 * time.Second
	}
	if cfg.BootTimeout == 0 {
		cfg.BootTimeout = 2 * time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.RunTimeout == 0 {
		cfg.RunTimeout = DefaultRunTimeout
	}
	if cfg.Observer == nil {
		cfg.Observer = noObserver{}
	}
	if cfg.DataDir == "" {
		return nil, errors.New("session manager: no data directory")
	}
	m := &Manager{cfg: cfg, st: st, log: cfg.Logger.With("component", "session"), hub: newHub(), sessions: map[string]*sess{}, runs: map[string]*run{}, proxy: egress.New(cfg.Net)}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	if cfg.LockWatch > 0 {
		m.locks = lock.NewWatch(cfg.LockWatch, m.log)
		m.mu.Watch(m.locks, "Manager.mu")
	}
	recs, err := st.ListSessions()
	if err != nil {
		return nil, err
	}
	for _, rec := range recs {
		s := m.newSess(rec)
		m.sessions[rec.Name] = s
	}
	if err := m.loadHarness(); err != nil {
		return nil, fmt.Errorf("load runs and schedules: %w", err)
	}
	m.removeStaleWork()
	m.removePartialMoves()
	m.removePartialReplicas()
	m.removePartialImages()
	m.removePartialTemplates(ctx)
	var wg sync.WaitGroup
	for _, s := range m.sessions {
		wg.Go(func() { s.recover(ctx) })
	}
	wg.Wait()
	if m.locks != nil {
		m.wg.Go(func() { m.locks.Run(m.ctx) })
	}
	// Each of these checks is a cheap pass over what is in memory, so one
	// short fixed tick serves minutes-long and seconds-long timeouts alike.
	m.wg.Go(func() { m.everySecond(m.sleepIdle) })
	m.wg.Go(func() { m.everySecond(m.watchSpace) })
	m.wg.Go(func() { m.everySecond(m.endLeftRuns) })
	m.wg.Go(m.scheduleLoop)
	return m, nil
}

// everySecond calls check once a second until the Manager closes.
func (m *Manager) everySecond(check func()) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-t.C:
			check()
		}
	}
}

// Close stops the Manager's goroutines and connections. VMs and the
// commands in them keep running; a new Manager re-attaches.
func (m *Manager) Close() error {
	m.cancel()
	ss := m.all()
	for _, s := range ss {
		s.detach()
	}
	m.wg.Wait()
	return nil
}

func (m *Manager) sessionDir(name string) string {
	return filepath.Join(m.cfg.DataDir, "sessions", name)
}

// all returns every session, in no order. m.mu is not held on return, so
// the caller may take each session's locks.
func (m *Manager) all() []*sess {
	m.mu.Lock()
	defer m.mu.Unlock()
	ss := make([]*sess, 0, len(m.sessions))
	for _, s := range m.sessions {
		ss = append(ss, s)
	}
	return ss
}

func (m *Manager) get(name string) (*sess, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.sessions[name]
	if !ok {
		return nil, fmt.Errorf("session %q: %w", name, session.ErrNotFound)
	}
	return s, nil
}

func (m *Manager) driver(name string) (vmm.Driver, error) {
	d, ok := m.cfg.Drivers[name]
	if !ok {
		return nil, fmt.Errorf("unknown VMM %q: %w", name, session.ErrInvalid)
	}
	return d, nil
}

// event records ev in the session's timeline (unless it is live-only) and
// publishes it.
func (m *Manager) event(ev session.Event) {
	if ev.Time.IsZero() {
		ev.Time = time.Now()
	}
	if ev.Kind != session.EventStats && ev.Kind != session.EventDeleted {
		rec, err := m.st.AppendEvent(store.Event{Time: ev.Time, Session: ev.Name, Kind: string(ev.Kind), Message: ev.Message, By: ev.By})
		if err != nil {
			m.log.Warn("record event", "session", ev.Name, "err", err)
		}
		ev.Seq = rec.Seq
	}
	m.hub.publish(ev)
}

// List returns every session, by name.
func (m *Manager) List(ctx context.Context) ([]session.Session, error) {
	ss := m.all()
	out := make([]session.Session, 0, len(ss))
	for _, s := range ss {
		out = append(out, s.snapshot())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Get returns one session.
func (m *Manager) Get(ctx context.Context, name string) (session.Session, error) {
	s, err := m.get(name)
	if err != nil {
		return session.Session{}, err
	}
	return s.snapshot(), nil
}

// Watch streams every change, starting with the current sessions.
func (m *Manager) Watch(ctx context.Context) (<-chan session.Event, error) {
	list, _ := m.List(ctx)
	initial := make([]session.Event, 0, len(list))
	for i := range list {
		initial = append(initial, session.Event{Time: time.Now(), Kind: session.EventState, Name: list[i].Name, Session: &list[i]})
	}
	// A watch also ends with the Manager.
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(m.ctx, cancel)
	ch := m.hub.watch(ctx, &m.wg, initial)
	m.wg.Go(func() { <-ctx.Done(); stop(); cancel() })
	return ch, nil
}

// Timeline returns a session's recorded events.
func (m *Manager) Timeline(ctx context.Context, name string, limit int) ([]session.Event, error) {
	if _, err := m.get(name); err != nil {
		return nil, err
	}
	if limit <= 0 {
		limit = 1000
	}
	recs, err := m.st.Events(name, limit)
	if err != nil {
		return nil, err
	}
	out := make([]session.Event, 0, len(recs))
	for _, r := range recs {
		ev := session.Event{Seq: r.Seq, Time: r.Time, Kind: session.EventKind(r.Kind), Name: r.Session, Message: r.Message, By: r.By}
		if ev.Kind == session.EventState {
			// State events are recorded as "<state>: <cause>".
			st, cause, _ := strings.Cut(r.Message, ": ")
			ev.Session = &session.Session{Name: r.Session, State: session.State(st), Cause: cause}
		}
		out = append(out, ev)
	}
	return out, nil
}

// agentErr maps an agent error to the Service's error classes, keeping the
// agent's own error (and its errno) in the chain.
func agentErr(name string, err error) error {
	if err == nil {
		return nil
	}
	var class error
	var code string
	var ge *guest.Error
	if errors.As(err, &ge) {
		code = ge.Code
	}
	switch {
	case errors.Is(err, guest.ErrEscape):
		class, code = session.ErrInvalid, session.CodeEscape
	case errors.Is(err, os.ErrNotExist):
		class = session.ErrNotFound
	case errors.Is(err, os.ErrExist):
		class = session.ErrExists
	case errors.Is(err, guest.ErrNoWorkspace):
		class = session.ErrUnavailable
	case errors.Is(err, guest.ErrDisconnected), errors.Is(err, vmm.ErrNotRunning):
		class = session.ErrUnavailable
	default:
		if ge != nil {
			switch ge.Code {
			case "ENOSPC", "EDQUOT":
				return &session.Error{Class: session.ErrConflict, Code: ge.Code, Msg: fmt.Sprintf("workspace of %q is full: %v", name, err),
					Hint: "free space in it, or create a session with a larger disk", Err: err}
			case "EISDIR", "ENOTDIR", "ENOTEMPTY", "EINVAL", "ENAMETOOLONG", "EBUSY", "ELOOP", "EBADF", "EXDEV", "EMLINK":
				class = session.ErrInvalid
			case "EACCES", "EPERM", "EROFS":
				class = session.ErrPermission
			}
		}
	}
	if class == nil && code == "" {
		return err
	}
	// The same text, with its class and code kept for every client.
	return &session.Error{Class: class, Code: code, Msg: err.Error(), Err: err}
}

// classed gives an error a Service error class without changing its text.
type classed struct{ class, err error }

func (c classed) Error() string   { return c.err.Error() }
func (c classed) Unwrap() []error { return []error{c.class, c.err} }

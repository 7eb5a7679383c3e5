// Package sessiontest provides Fake, an in-memory session.Service for tests,
// and Suite, the conformance tests every session.Service must pass.
//
// The fake keeps the contract of the real Manager: names are validated, state
// transitions are checked, errors wrap one of the session error classes with a
// message saying what failed and what to do. Instead of VMs it runs commands
// implemented in Go (see Commands and Fake.Handle) against an in-memory
// /workspace tree.
//
// Tests and the TUI demo drive it further: seeding (AddSession,
// AddExecution, AddGenerated for huge computed outputs, AddFile, Note) puts
// it in any state a daemon could be in, Update, Grow and Crash change it as
// a guest would, and faults (Options.Delay, FailNext, Hang, CloseWatchers)
// make it slow, failing or wedged; Calls records what was called.
package sessiontest

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/berthvm/berth/session"
)

// Options configure a Fake. The zero value is a valid configuration.
type Options struct {
	// Now is the clock stamped on records and events; nil means time.Now.
	Now func() time.Time
	// Defaults for zero CreateOptions fields; zero means session's
	// (1 CPU, 512 MiB, 4 GiB, image "mini", VMM "qemu").
	CPUs      int
	MemoryMiB int
	DiskBytes int64
	Image     string
	VMM       string
	// Images lists the images Create accepts; nil means just the default.
	Images []string
	// OutputRetention bounds the output bytes kept per execution; older
	// chunks are trimmed and reported as a gap. Zero keeps everything.
	OutputRetention int64
	// Delay makes every lifecycle call (Create, Pause, Resume, Stop,
	// Start, Sleep, Delete, Flush, Replace) wait this long before it acts, so a
	// test can see the caller's pending state. Zero waits not at all.
	Delay time.Duration
	// FlushTook is how long Flush reports it took; zero means 3 ms.
	FlushTook time.Duration
	// Limits are the host the fake pretends to run on, for the contract's
	// create rules; zero fields are not checked.
	Limits session.Limits
	// CheckpointLimit and CheckpointBytes bound each session's
	// checkpoints as the daemon's config does; zero means session's
	// defaults.
	CheckpointLimit int
	CheckpointBytes int64
	// KeepRuns makes runs whose options leave Keep unset keep their
	// starting point, as the daemon's run_checkpoint does.
	KeepRuns bool
}

// Fake is an in-memory session.Service. Create one with New and Close it
// when done; Close ends running commands and every stream.
type Fake struct {
	opts     Options
	life     context.Context
	shutdown context.CancelFunc
	wg       sync.WaitGroup // command goroutines

	mu       sync.Mutex
	sessions map[string]*fakeSession
	execs    map[string]*fakeExec
	watchers map[*watcher]struct{}
	commands map[string]Command
	eventSeq uint64
	execSeq  int
	pidSeq   int
	host     session.HostStatus

	// Faults and the call record (faults.go).
	fail  map[string]error
	hang  map[string]bool
	calls map[string]int

	hx *fakeHarness // runs and schedules (harness.go), made on first use

	committed map[string]session.ImageInfo // images made by CommitImage (images.go)
	commitSeq int
}

type fakeSession struct {
	info     session.Session
	root     *node
	timeline []session.Event
	execs    []*fakeExec            // in start order
	open     map[*fakeFile]struct{} // open Files (handles.go)
	ckpts    []fakeCkpt             // oldest first (checkpoints.go)
	ckptSeq  int
	history  []session.Sample
	listen   map[int]func(net.Conn) // guest ports served (net.go)
	fwd      map[int]int            // open forwarded connections per port
}

var _ session.Service = (*Fake)(nil)

// New returns an empty Fake.
func New(opts Options) *Fake {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	d := session.CreateOptions{CPUs: opts.CPUs, MemoryMiB: opts.MemoryMiB, DiskBytes: opts.DiskBytes, Image: opts.Image, VMM: opts.VMM}.
		WithDefaults(session.DefaultCreate())
	opts.CPUs, opts.MemoryMiB, opts.DiskBytes, opts.Image, opts.VMM = d.CPUs, d.MemoryMiB, d.DiskBytes, d.Image, d.VMM
	if opts.Images == nil {
		opts.Images = []string{session.DefaultImage}
	}
	if opts.FlushTook == 0 {
		opts.FlushTook = 3 * time.Millisecond
	}
	life, shutdown := context.WithCancel(context.Background())
	f := &Fake{
		opts:     opts,
		life:     life,
		shutdown: shutdown,
		sessions: map[string]*fakeSession{},
		execs:    map[string]*fakeExec{},
		watchers: map[*watcher]struct{}{},
		commands: builtins(),
		fail:     map[string]error{},
		hang:     map[string]bool{},
		calls:    map[string]int{},
	}
	return f
}

// Close cancels running commands, ends every Watch and output stream, and
// waits for the command goroutines. It is safe to call more than once.
func (f *Fake) Close() error {
	f.shutdown()
	f.wg.Wait()
	return nil
}

// Handle adds or replaces the command run for argv[0] == name (also inside
// the fake sh).
func (f *Fake) Handle(name string, cmd Command) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.commands[name] = cmd
}

func (f *Fake) now() time.Time { return f.opts.Now() }

// getLocked returns the named session or a wrapped ErrNotFound.
func (f *Fake) getLocked(name string) (*fakeSession, error) {
	s, ok := f.sessions[name]
	if !ok || s.info.State == session.StateDeleting {
		return nil, fmt.Errorf("session %q: %w", name, session.ErrNotFound)
	}
	return s, nil
}

// enterSession enters method (see enter) and finds the named session. On
// success it returns with f.mu held, for the caller to release.
func (f *Fake) enterSession(ctx context.Context, method, name string) (*fakeSession, error) {
	if err := f.enter(ctx, method); err != nil {
		return nil, err
	}
	f.mu.Lock()
	s, err := f.getLocked(name)
	if err != nil {
		f.mu.Unlock()
		return nil, err
	}
	return s, nil
}

// List returns every session, sorted by name.
func (f *Fake) List(ctx context.Context) ([]session.Session, error) {
	if err := f.enter(ctx, "List"); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]session.Session, 0, len(f.sessions))
	for _, s := range f.sessions {
		if s.info.State != session.StateDeleting {
			out = append(out, s.info)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Get returns one session.
func (f *Fake) Get(ctx context.Context, name string) (session.Session, error) {
	s, err := f.enterSession(ctx, "Get", name)
	if err != nil {
		return session.Session{}, err
	}
	defer f.mu.Unlock()
	return s.info, nil
}

// Timeline returns the session's recorded events (all but stats), oldest
// first; limit > 0 keeps the newest limit events.
func (f *Fake) Timeline(ctx context.Context, name string, limit int) ([]session.Event, error) {
	s, err := f.enterSession(ctx, "Timeline", name)
	if err != nil {
		return nil, err
	}
	defer f.mu.Unlock()
	evs := s.timeline
	if limit > 0 && len(evs) > limit {
		evs = evs[len(evs)-limit:]
	}
	out := make([]session.Event, len(evs))
	for i, ev := range evs {
		out[i] = cloneEvent(ev)
	}
	return out, nil
}

func cloneEvent(ev session.Event) session.Event {
	if ev.Session != nil {
		s := *ev.Session
		ev.Session = &s
	}
	if ev.Exec != nil {
		x := cloneExec(*ev.Exec)
		ev.Exec = &x
	}
	return ev
}

func cloneExec(x session.Execution) session.Execution {
	x.Argv = slices.Clone(x.Argv)
	x.EnvNames = slices.Clone(x.EnvNames)
	if x.ExitCode != nil {
		c := *x.ExitCode
		x.ExitCode = &c
	}
	return x
}

// errClosed is returned once the Fake is closed.
var errClosed = fmt.Errorf("berth fake is closed: %w", session.ErrUnavailable)

func (f *Fake) checkOpen(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if f.life.Err() != nil {
		return errClosed
	}
	return nil
}

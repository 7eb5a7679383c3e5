// Package fakesvc is an in-memory session.Service for the TUI's tests and
// benchmarks. It follows the interface's documented behaviour (states,
// events, paged output with seq numbers, workspace files) without VMs, and
// lets tests inject delays, failures, hangs and generated output too large
// to hold (a 1,000,000-line execution is computed page by page).
package fakesvc

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"path"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/berthvm/berth/session"
)

var _ session.Service = (*Service)(nil)

// Service is the fake. The zero value is not usable; call New.
type Service struct {
	mu       sync.Mutex
	now      func() time.Time
	sessions map[string]*sess
	execs    map[string]*execution
	watchers map[*queue[session.Event]]struct{}
	evSeq    uint64
	execN    int

	// Delay makes every lifecycle call take this long, so tests can see
	// the pending state.
	Delay time.Duration
	// HangFiles makes file calls block until their context ends.
	HangFiles bool
	fail      map[string]error
	// OnExec, when set, is called (without the lock) for each new
	// execution; the default emits one line and exits 0.
	OnExec func(s *Service, id string, req session.ExecRequest)
	// Calls counts calls per method, for tests asserting that something
	// was (or was not) called.
	calls map[string]int
}

type sess struct {
	s        session.Session
	timeline []session.Event
	execs    []string
	files    map[string]*file
}

type file struct {
	info session.FileInfo
	data []byte
}

type execution struct {
	e      session.Execution
	chunks []session.Chunk
	// gen computes chunk seq (1-based) of a generated output of genN
	// chunks; generated chunks are never stored.
	gen  func(seq uint64) session.Chunk
	genN uint64
	subs map[*proc]struct{}
}

// New returns an empty fake whose clock is now.
func New(now func() time.Time) *Service {
	if now == nil {
		now = time.Now
	}
	return &Service{
		now:      now,
		sessions: map[string]*sess{},
		execs:    map[string]*execution{},
		watchers: map[*queue[session.Event]]struct{}{},
		fail:     map[string]error{},
		calls:    map[string]int{},
	}
}

// FailNext makes the next call of op (a method name, e.g. "Pause") fail.
func (f *Service) FailNext(op string, err error) {
	f.mu.Lock()
	f.fail[op] = err
	f.mu.Unlock()
}

// Calls returns how often op was called.
func (f *Service) Calls(op string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[op]
}

func (f *Service) enter(op string) error {
	f.calls[op]++
	if err, ok := f.fail[op]; ok {
		delete(f.fail, op)
		return err
	}
	return nil
}

// AddSession adds a session as is and publishes its state.
func (f *Service) AddSession(s session.Session) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s.CreatedAt.IsZero() {
		s.CreatedAt = f.now()
	}
	f.sessions[s.Name] = &sess{s: s, files: map[string]*file{}}
	f.publishLocked(session.Event{Kind: session.EventState, Name: s.Name, Message: s.Cause, Session: ptr(s)})
}

// Update changes a session's live figures and publishes a stats event.
func (f *Service) Update(name string, fn func(*session.Session)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.sessions[name]
	if !ok {
		return
	}
	fn(&s.s)
	f.publishLocked(session.Event{Kind: session.EventStats, Name: name, Session: ptr(s.s)})
}

// SetState moves a session to st with a cause (e.g. a crash) and publishes it.
func (f *Service) SetState(name string, st session.State, cause string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s, ok := f.sessions[name]; ok {
		f.setStateLocked(s, st, cause, "")
	}
}

// Note records a timeline event.
func (f *Service) Note(name string, kind session.EventKind, msg string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.publishLocked(session.Event{Kind: kind, Name: name, Message: msg})
}

// AddFile creates a workspace file (and its parent directories).
func (f *Service) AddFile(name, p string, data []byte, mtime time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.sessions[name]
	p = clean(p)
	for d := path.Dir(p); d != "." && d != "/"; d = path.Dir(d) {
		if _, ok := s.files[d]; !ok {
			s.files[d] = &file{info: session.FileInfo{Name: path.Base(d), Mode: fs.ModeDir | 0o755, ModTime: mtime}}
		}
	}
	s.files[p] = &file{info: session.FileInfo{Name: path.Base(p), Size: int64(len(data)), Mode: 0o644, ModTime: mtime}, data: data}
}

// AddDir creates an empty workspace directory.
func (f *Service) AddDir(name, p string, mtime time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p = clean(p)
	f.sessions[name].files[p] = &file{info: session.FileInfo{Name: path.Base(p), Mode: fs.ModeDir | 0o755, ModTime: mtime}}
}

// AddExecution records a finished (or running) execution with stored
// output chunks; chunk seqs and exec ids are filled in.
func (f *Service) AddExecution(e session.Execution, chunks ...session.Chunk) {
	f.mu.Lock()
	defer f.mu.Unlock()
	x := &execution{e: e, subs: map[*proc]struct{}{}}
	for i := range chunks {
		chunks[i].Exec = e.ID
		chunks[i].Seq = uint64(i + 1)
		if chunks[i].Time.IsZero() {
			chunks[i].Time = e.StartedAt
		}
	}
	x.chunks = chunks
	f.execs[e.ID] = x
	s := f.sessions[e.Session]
	s.execs = append(s.execs, e.ID)
}

// AddGenerated records an execution whose n output chunks are computed on
// demand by gen, so tests can serve huge outputs without holding them.
func (f *Service) AddGenerated(e session.Execution, n uint64, gen func(seq uint64) session.Chunk) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.execs[e.ID] = &execution{e: e, gen: gen, genN: n, subs: map[*proc]struct{}{}}
	s := f.sessions[e.Session]
	s.execs = append(s.execs, e.ID)
}

// GrowGenerated extends a generated execution by n chunks and sends them
// to attached followers (live output).
func (f *Service) GrowGenerated(id string, n uint64) {
	f.mu.Lock()
	x := f.execs[id]
	from := x.genN + 1
	x.genN += n
	subs := maps(x.subs)
	f.mu.Unlock()
	if len(subs) == 0 {
		return
	}
	out := make([]session.Chunk, 0, n)
	for seq := from; seq <= from+n-1; seq++ {
		out = append(out, x.gen(seq))
	}
	for _, p := range subs {
		p.q.push(out...)
	}
}

// Emit appends output to an execution and sends it to followers.
func (f *Service) Emit(id string, stream session.Stream, data string) {
	f.mu.Lock()
	x := f.execs[id]
	c := session.Chunk{Exec: id, Seq: uint64(len(x.chunks) + 1), Stream: stream, Time: f.now(), Data: []byte(data)}
	x.chunks = append(x.chunks, c)
	if stream == session.Stderr {
		x.e.StderrBytes += int64(len(data))
	} else {
		x.e.StdoutBytes += int64(len(data))
	}
	subs := maps(x.subs)
	f.mu.Unlock()
	for _, p := range subs {
		p.q.push(c)
	}
}

// Finish ends an execution with an exit code (or the given state when
// code < 0) and closes followers.
func (f *Service) Finish(id string, st session.ExecState, code int) {
	f.mu.Lock()
	x := f.execs[id]
	x.e.State = st
	if code >= 0 {
		x.e.ExitCode = &code
	}
	x.e.EndedAt = f.now()
	subs := maps(x.subs)
	x.subs = map[*proc]struct{}{}
	f.publishLocked(session.Event{Kind: session.EventExec, Name: x.e.Session, Exec: ptr(x.e)})
	f.mu.Unlock()
	for _, p := range subs {
		p.finish(x.e)
	}
}

func maps(m map[*proc]struct{}) []*proc {
	out := make([]*proc, 0, len(m))
	for p := range m {
		out = append(out, p)
	}
	return out
}

func ptr[T any](v T) *T { return &v }

func clean(p string) string {
	p = path.Clean("/" + strings.TrimPrefix(p, "/workspace"))
	return strings.TrimPrefix(p, "/")
}

func (f *Service) publishLocked(ev session.Event) {
	f.evSeq++
	ev.Seq = f.evSeq
	if ev.Time.IsZero() {
		ev.Time = f.now()
	}
	if s, ok := f.sessions[ev.Name]; ok && ev.Kind != session.EventStats {
		s.timeline = append(s.timeline, ev)
	}
	for q := range f.watchers {
		q.push(ev)
	}
}

func (f *Service) setStateLocked(s *sess, st session.State, cause, by string) {
	s.s.State = st
	s.s.Cause = cause
	switch st {
	case session.StateRunning:
		if s.s.StartedAt.IsZero() {
			s.s.StartedAt = f.now()
		}
		if s.s.Pid == 0 {
			s.s.Pid = 4000 + len(f.sessions)
		}
	case session.StateStopped, session.StateCrashed:
		s.s.StartedAt = time.Time{}
		s.s.Pid = 0
		s.s.Running = 0
	}
	f.publishLocked(session.Event{Kind: session.EventState, Name: s.s.Name, Message: cause, By: by, Session: ptr(s.s)})
}

func (f *Service) get(name string) (*sess, error) {
	s, ok := f.sessions[name]
	if !ok {
		return nil, fmt.Errorf("session %q: %w", name, session.ErrNotFound)
	}
	return s, nil
}

func (f *Service) sleep(ctx context.Context) error {
	if f.Delay <= 0 {
		return nil
	}
	select {
	case <-time.After(f.Delay):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// List implements session.Lister.
func (f *Service) List(ctx context.Context) ([]session.Session, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("List"); err != nil {
		return nil, err
	}
	out := make([]session.Session, 0, len(f.sessions))
	for _, s := range f.sessions {
		out = append(out, s.s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Get implements session.Lister.
func (f *Service) Get(ctx context.Context, name string) (session.Session, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("Get"); err != nil {
		return session.Session{}, err
	}
	s, err := f.get(name)
	if err != nil {
		return session.Session{}, err
	}
	return s.s, nil
}

// Watch implements session.Watcher.
func (f *Service) Watch(ctx context.Context) (<-chan session.Event, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("Watch"); err != nil {
		return nil, err
	}
	q := newQueue[session.Event](ctx, 64)
	names := make([]string, 0, len(f.sessions))
	for n := range f.sessions {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		s := f.sessions[n].s
		q.push(session.Event{Kind: session.EventState, Name: n, Time: f.now(), Session: &s})
	}
	f.watchers[q] = struct{}{}
	go func() {
		<-ctx.Done()
		f.mu.Lock()
		delete(f.watchers, q)
		f.mu.Unlock()
	}()
	return q.out, nil
}

// CloseWatchers ends every watch stream, as a daemon restart would.
func (f *Service) CloseWatchers() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for q := range f.watchers {
		q.close()
		delete(f.watchers, q)
	}
}

// Timeline implements session.Watcher.
func (f *Service) Timeline(ctx context.Context, name string, limit int) ([]session.Event, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("Timeline"); err != nil {
		return nil, err
	}
	s, err := f.get(name)
	if err != nil {
		return nil, err
	}
	tl := s.timeline
	if limit > 0 && len(tl) > limit {
		tl = tl[len(tl)-limit:]
	}
	return slices.Clone(tl), nil
}

// Create implements session.Lifecycle.
func (f *Service) Create(ctx context.Context, o session.CreateOptions) (session.Session, error) {
	if err := f.sleep(ctx); err != nil {
		return session.Session{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("Create"); err != nil {
		return session.Session{}, err
	}
	if o.Name == "" {
		return session.Session{}, fmt.Errorf("name is required: %w", session.ErrInvalid)
	}
	if _, ok := f.sessions[o.Name]; ok {
		return session.Session{}, fmt.Errorf("session %q: %w", o.Name, session.ErrExists)
	}
	s := &sess{s: session.Session{
		Name: o.Name, CPUs: def(o.CPUs, 2), MemoryMiB: def(o.MemoryMiB, 1024), DiskBytes: def(o.DiskBytes, 10<<30),
		Image: defs(o.Image, "mini"), VMM: defs(o.VMM, "qemu"), Accel: "tcg", CreatedAt: f.now(),
	}, files: map[string]*file{}}
	f.sessions[o.Name] = s
	f.setStateLocked(s, session.StateCreating, "created", "tui")
	f.setStateLocked(s, session.StateRunning, "booted", "tui")
	return s.s, nil
}

func def[T int | int64](v, d T) T {
	if v == 0 {
		return d
	}
	return v
}

func defs(v, d string) string {
	if v == "" {
		return d
	}
	return v
}

func (f *Service) transition(ctx context.Context, op, name string, to session.State, cause string) (session.Session, error) {
	if err := f.sleep(ctx); err != nil {
		return session.Session{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(op); err != nil {
		return session.Session{}, err
	}
	s, err := f.get(name)
	if err != nil {
		return session.Session{}, err
	}
	if err := session.CheckTransition(name, session.Action(strings.ToLower(op)), s.s.State); err != nil {
		return session.Session{}, err
	}
	if to == session.StateStopped {
		s.s.DirtyBytes = 0 // stop flushes first
	}
	f.setStateLocked(s, to, cause, "tui")
	return s.s, nil
}

// Pause implements session.Lifecycle; like the real one it does not flush.
func (f *Service) Pause(ctx context.Context, name string) (session.Session, error) {
	return f.transition(ctx, "Pause", name, session.StatePaused, "paused by tui")
}

// Resume implements session.Lifecycle.
func (f *Service) Resume(ctx context.Context, name string) (session.Session, error) {
	return f.transition(ctx, "Resume", name, session.StateRunning, "resumed by tui")
}

// Sleep implements session.Lifecycle.
func (f *Service) Sleep(ctx context.Context, name string) (session.Session, error) {
	return f.transition(ctx, "Sleep", name, session.StateSleeping, "put to sleep by tui")
}

// Stop implements session.Lifecycle.
func (f *Service) Stop(ctx context.Context, name string) (session.Session, error) {
	return f.transition(ctx, "Stop", name, session.StateStopped, "stopped by tui")
}

// Start implements session.Lifecycle.
func (f *Service) Start(ctx context.Context, name string) (session.Session, error) {
	return f.transition(ctx, "Start", name, session.StateRunning, "started by tui")
}

// Delete implements session.Lifecycle.
func (f *Service) Delete(ctx context.Context, name string) error {
	if err := f.sleep(ctx); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("Delete"); err != nil {
		return err
	}
	if _, err := f.get(name); err != nil {
		return err
	}
	delete(f.sessions, name)
	f.publishLocked(session.Event{Kind: session.EventDeleted, Name: name, By: "tui"})
	return nil
}

// Flush implements session.Lifecycle.
func (f *Service) Flush(ctx context.Context, name string) (session.FlushResult, error) {
	if err := f.sleep(ctx); err != nil {
		return session.FlushResult{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("Flush"); err != nil {
		return session.FlushResult{}, err
	}
	s, err := f.get(name)
	if err != nil {
		return session.FlushResult{}, err
	}
	if err := session.CheckTransition(name, session.ActionFlush, s.s.State); err != nil {
		return session.FlushResult{}, err
	}
	r := session.FlushResult{DirtyBefore: s.s.DirtyBytes, Took: 120 * time.Millisecond}
	s.s.DirtyBytes = 0
	f.publishLocked(session.Event{Kind: session.EventFlush, Name: name, By: "tui", Message: fmt.Sprintf("flushed %d bytes", r.DirtyBefore)})
	f.publishLocked(session.Event{Kind: session.EventStats, Name: name, Session: ptr(s.s)})
	return r, nil
}

// Exec implements session.Execer.
func (f *Service) Exec(ctx context.Context, name string, req session.ExecRequest) (session.Process, error) {
	f.mu.Lock()
	if err := f.enter("Exec"); err != nil {
		f.mu.Unlock()
		return nil, err
	}
	s, err := f.get(name)
	if err != nil {
		f.mu.Unlock()
		return nil, err
	}
	if err := session.CheckTransition(name, session.ActionExec, s.s.State); err != nil {
		f.mu.Unlock()
		return nil, err
	}
	f.execN++
	id := fmt.Sprintf("x%07d", f.execN)
	e := session.Execution{ID: id, Session: name, Argv: req.Argv, Cwd: "/workspace", By: "tui", State: session.ExecRunning, StartedAt: f.now()}
	x := &execution{e: e, subs: map[*proc]struct{}{}}
	f.execs[id] = x
	s.execs = append(s.execs, id)
	p := newProc(ctx, f, id)
	x.subs[p] = struct{}{}
	f.publishLocked(session.Event{Kind: session.EventExec, Name: name, Exec: ptr(e)})
	hook := f.OnExec
	f.mu.Unlock()
	if hook != nil {
		go hook(f, id, req)
	} else {
		go func() {
			f.Emit(id, session.Stdout, "ran: "+strings.Join(req.Argv, " ")+"\n")
			f.Finish(id, session.ExecExited, 0)
		}()
	}
	return p, nil
}

// Attach implements session.Execer: recorded output from fromSeq, then live.
func (f *Service) Attach(ctx context.Context, id string, fromSeq uint64) (session.Process, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("Attach"); err != nil {
		return nil, err
	}
	x, ok := f.execs[id]
	if !ok {
		return nil, fmt.Errorf("execution %q: %w", id, session.ErrNotFound)
	}
	p := newProc(ctx, f, id)
	if fromSeq > 0 {
		if x.gen != nil {
			for seq := max(fromSeq, 1); seq <= x.genN; seq++ {
				p.q.push(x.gen(seq))
			}
		} else {
			for _, c := range x.chunks {
				if c.Seq >= fromSeq {
					p.q.push(c)
				}
			}
		}
	}
	if x.e.State.Done() {
		p.finish(x.e)
		return p, nil
	}
	x.subs[p] = struct{}{}
	return p, nil
}

// Executions implements session.Execer, newest last as recorded.
func (f *Service) Executions(ctx context.Context, name string, all bool) ([]session.Execution, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("Executions"); err != nil {
		return nil, err
	}
	s, err := f.get(name)
	if err != nil {
		return nil, err
	}
	out := make([]session.Execution, 0, len(s.execs))
	for _, id := range s.execs {
		if e := f.execs[id].e; all || !e.State.Done() {
			out = append(out, e)
		}
	}
	return out, nil
}

// Execution implements session.Execer.
func (f *Service) Execution(ctx context.Context, id string) (session.Execution, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("Execution"); err != nil {
		return session.Execution{}, err
	}
	x, ok := f.execs[id]
	if !ok {
		return session.Execution{}, fmt.Errorf("execution %q: %w", id, session.ErrNotFound)
	}
	return x.e, nil
}

// Output implements session.Execer.
func (f *Service) Output(ctx context.Context, id string, fromSeq uint64, limit int) (session.OutputPage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls["Output"]++
	x, ok := f.execs[id]
	if !ok {
		return session.OutputPage{}, fmt.Errorf("execution %q: %w", id, session.ErrNotFound)
	}
	if fromSeq == 0 {
		fromSeq = 1
	}
	if limit <= 0 {
		limit = 256
	}
	page := session.OutputPage{Next: fromSeq}
	if x.gen != nil {
		for seq := fromSeq; seq <= x.genN && len(page.Chunks) < limit; seq++ {
			page.Chunks = append(page.Chunks, x.gen(seq))
			page.Next = seq + 1
		}
		return page, nil
	}
	i := sort.Search(len(x.chunks), func(i int) bool { return x.chunks[i].Seq >= fromSeq })
	for ; i < len(x.chunks) && len(page.Chunks) < limit; i++ {
		page.Chunks = append(page.Chunks, x.chunks[i])
		page.Next = x.chunks[i].Seq + 1
	}
	return page, nil
}

// Cancel implements session.Execer.
func (f *Service) Cancel(ctx context.Context, id string) error {
	f.mu.Lock()
	if err := f.enter("Cancel"); err != nil {
		f.mu.Unlock()
		return err
	}
	x, ok := f.execs[id]
	if !ok {
		f.mu.Unlock()
		return fmt.Errorf("execution %q: %w", id, session.ErrNotFound)
	}
	if x.e.State.Done() {
		f.mu.Unlock()
		return fmt.Errorf("execution %q is %s: %w", id, x.e.State, session.ErrInvalidState)
	}
	f.mu.Unlock()
	f.Finish(id, session.ExecCancelled, -1)
	return nil
}

func (f *Service) files(ctx context.Context, op, name string) (*sess, error) {
	f.mu.Lock()
	hang := f.HangFiles
	f.mu.Unlock()
	if hang {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(op); err != nil {
		return nil, err
	}
	s, err := f.get(name)
	if err != nil {
		return nil, err
	}
	if s.s.State != session.StateRunning {
		return nil, fmt.Errorf("%s: session %q is %s: %w", op, name, s.s.State, session.ErrInvalidState)
	}
	return s, nil
}

// ListDir implements session.Files.
func (f *Service) ListDir(ctx context.Context, name, p string) ([]session.FileInfo, error) {
	s, err := f.files(ctx, "ListDir", name)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	dir := clean(p)
	if dir != "" {
		if d, ok := s.files[dir]; !ok || !d.info.IsDir() {
			return nil, fmt.Errorf("%s: %w", p, session.ErrNotFound)
		}
	}
	var out []session.FileInfo
	for fp, fl := range s.files {
		parent := path.Dir(fp)
		if parent == "." {
			parent = ""
		}
		if parent == dir {
			out = append(out, fl.info)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Stat implements session.Files.
func (f *Service) Stat(ctx context.Context, name, p string) (session.FileInfo, error) {
	s, err := f.files(ctx, "Stat", name)
	if err != nil {
		return session.FileInfo{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	fl, ok := s.files[clean(p)]
	if !ok {
		return session.FileInfo{}, fmt.Errorf("%s: %w", p, session.ErrNotFound)
	}
	return fl.info, nil
}

// ReadFile implements session.Files.
func (f *Service) ReadFile(ctx context.Context, name, p string) (io.ReadCloser, error) {
	s, err := f.files(ctx, "ReadFile", name)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	fl, ok := s.files[clean(p)]
	if !ok || fl.info.IsDir() {
		return nil, fmt.Errorf("%s: %w", p, session.ErrNotFound)
	}
	return io.NopCloser(bytes.NewReader(fl.data)), nil
}

// WriteFile implements session.Files.
func (f *Service) WriteFile(ctx context.Context, name, p string, r io.Reader) (int64, error) {
	if _, err := f.files(ctx, "WriteFile", name); err != nil {
		return 0, err
	}
	data, err := io.ReadAll(r)
	if err != nil {
		return 0, err
	}
	f.AddFile(name, p, data, f.now())
	return int64(len(data)), nil
}

// Mkdir implements session.Files.
func (f *Service) Mkdir(ctx context.Context, name, p string) error {
	if _, err := f.files(ctx, "Mkdir", name); err != nil {
		return err
	}
	f.AddDir(name, p, f.now())
	return nil
}

// Remove implements session.Files.
func (f *Service) Remove(ctx context.Context, name, p string) error {
	s, err := f.files(ctx, "Remove", name)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(s.files, clean(p))
	return nil
}

// Rename implements session.Files.
func (f *Service) Rename(ctx context.Context, name, from, to string) error {
	s, err := f.files(ctx, "Rename", name)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	fl, ok := s.files[clean(from)]
	if !ok {
		return fmt.Errorf("%s: %w", from, session.ErrNotFound)
	}
	delete(s.files, clean(from))
	fl.info.Name = path.Base(clean(to))
	s.files[clean(to)] = fl
	return nil
}

// proc is a fake Process.
type proc struct {
	f    *Service
	id   string
	q    *queue[session.Chunk]
	done chan struct{}
	once sync.Once
	rec  session.Execution
}

func newProc(ctx context.Context, f *Service, id string) *proc {
	return &proc{f: f, id: id, q: newQueue[session.Chunk](ctx, 256), done: make(chan struct{})}
}

func (p *proc) finish(e session.Execution) {
	p.once.Do(func() {
		p.rec = e
		p.q.close()
		close(p.done)
	})
}

func (p *proc) ID() string                       { return p.id }
func (p *proc) Output() <-chan session.Chunk     { return p.q.out }
func (p *proc) Stdin() io.WriteCloser            { return nopWC{} }
func (p *proc) Cancel(ctx context.Context) error { return p.f.Cancel(ctx, p.id) }
func (p *proc) Resize(ctx context.Context, rows, cols int) error {
	return nil
}

func (p *proc) Wait(ctx context.Context) (session.Execution, error) {
	select {
	case <-p.done:
		return p.rec, nil
	case <-ctx.Done():
		return session.Execution{}, ctx.Err()
	}
}

type nopWC struct{}

func (nopWC) Write(b []byte) (int, error) { return len(b), nil }
func (nopWC) Close() error                { return nil }

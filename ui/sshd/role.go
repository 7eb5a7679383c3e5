package sshd

import (
	"context"
	"fmt"
	"io"

	"github.com/berthvm/berth/session"
)

// Role is what an SSH key may do. Roles are ordered: each one may do
// everything the one before it may.
type Role int

const (
	// Viewer reads everything (sessions, events, executions, output,
	// files) and changes nothing.
	Viewer Role = iota + 1
	// Operator also runs the lifecycle (create, pause, resume, stop,
	// start, sleep, flush), runs and cancels commands, and changes
	// files; it may not delete sessions.
	Operator
	// Admin may do everything, including deleting sessions.
	Admin
)

func (r Role) String() string {
	switch r {
	case Viewer:
		return "viewer"
	case Operator:
		return "operator"
	case Admin:
		return "admin"
	}
	return fmt.Sprintf("role(%d)", int(r))
}

// ParseRole parses "viewer", "operator" or "admin".
func ParseRole(s string) (Role, error) {
	for r := Viewer; r <= Admin; r++ {
		if r.String() == s {
			return r, nil
		}
	}
	return 0, fmt.Errorf("unknown role %q: use viewer, operator or admin: %w", s, session.ErrInvalid)
}

// op is one kind of change a role may or may not make. Reads need no op:
// every role may read.
type op int

const (
	opCreate op = iota
	opPause
	opResume
	opStop
	opStart
	opSleep
	opFlush
	opDelete
	opExec
	opCancel
	opStdin
	opResize
	opWriteFile
	opMkdir
	opRemoveFile
	opRename
)

// describe returns what o does, completing "role viewer may not ...", and
// the least role that may do it.
func (o op) describe() (what string, least Role) {
	switch o {
	case opCreate:
		return "create sessions", Operator
	case opPause:
		return "pause sessions", Operator
	case opResume:
		return "resume sessions", Operator
	case opStop:
		return "stop sessions", Operator
	case opStart:
		return "start sessions", Operator
	case opSleep:
		return "put sessions to sleep", Operator
	case opFlush:
		return "flush sessions", Operator
	case opDelete:
		return "delete sessions", Admin
	case opExec:
		return "run commands", Operator
	case opCancel:
		return "cancel commands", Operator
	case opStdin:
		return "send input to commands", Operator
	case opResize:
		return "resize command terminals", Operator
	case opWriteFile:
		return "write files", Operator
	case opMkdir:
		return "create directories", Operator
	case opRemoveFile:
		return "remove files", Operator
	case opRename:
		return "rename files", Operator
	}
	return fmt.Sprintf("op(%d)", int(o)), Admin
}

// allows returns nil when role may do o, or a wrapped session.ErrPermission
// saying which role may.
func (r Role) allows(o op) error {
	what, least := o.describe()
	if r >= least {
		return nil
	}
	return fmt.Errorf("role %s may not %s (needs %s): %w", r, what, least, session.ErrPermission)
}

// Restrict returns svc as a caller with role may use it: calls the role
// may not make fail with a wrapped session.ErrPermission ("role viewer may
// not pause sessions (needs operator)") before they reach svc. Reads are
// allowed to every role; a viewer's attached processes refuse input,
// resizes and cancels.
func Restrict(svc session.Service, role Role) session.Service {
	return RestrictFunc(svc, func(context.Context) (Role, error) { return role, nil })
}

// RestrictFunc is Restrict with a role looked up on every call, reads
// included, so a key whose role changed or that was removed is refused at
// its next action. An error from current refuses the call with that error.
func RestrictFunc(svc session.Service, current func(ctx context.Context) (Role, error)) session.Service {
	return &restricted{svc: svc, current: current}
}

// As returns svc with every call made as who (session.WithActor), whatever
// the caller's context says: an SSH client cannot choose its records' name.
func As(svc session.Service, who string) session.Service {
	return &actor{svc: svc, who: who}
}

type restricted struct {
	svc     session.Service
	current func(ctx context.Context) (Role, error)
}

var _ session.Service = (*restricted)(nil)

// read checks that the caller may still read at all.
func (r *restricted) read(ctx context.Context) (Role, error) {
	return r.current(ctx)
}

// may checks o against the caller's current role.
func (r *restricted) may(ctx context.Context, o op) error {
	role, err := r.current(ctx)
	if err != nil {
		return err
	}
	return role.allows(o)
}

func (r *restricted) List(ctx context.Context) ([]session.Session, error) {
	if _, err := r.read(ctx); err != nil {
		return nil, err
	}
	return r.svc.List(ctx)
}

func (r *restricted) Get(ctx context.Context, name string) (session.Session, error) {
	if _, err := r.read(ctx); err != nil {
		return session.Session{}, err
	}
	return r.svc.Get(ctx, name)
}

func (r *restricted) Watch(ctx context.Context) (<-chan session.Event, error) {
	if _, err := r.read(ctx); err != nil {
		return nil, err
	}
	return r.svc.Watch(ctx)
}

func (r *restricted) Timeline(ctx context.Context, name string, limit int) ([]session.Event, error) {
	if _, err := r.read(ctx); err != nil {
		return nil, err
	}
	return r.svc.Timeline(ctx, name, limit)
}

func (r *restricted) Create(ctx context.Context, opts session.CreateOptions) (session.Session, error) {
	if err := r.may(ctx, opCreate); err != nil {
		return session.Session{}, err
	}
	return r.svc.Create(ctx, opts)
}

func (r *restricted) Pause(ctx context.Context, name string) (session.Session, error) {
	if err := r.may(ctx, opPause); err != nil {
		return session.Session{}, err
	}
	return r.svc.Pause(ctx, name)
}

func (r *restricted) Resume(ctx context.Context, name string) (session.Session, error) {
	if err := r.may(ctx, opResume); err != nil {
		return session.Session{}, err
	}
	return r.svc.Resume(ctx, name)
}

func (r *restricted) Stop(ctx context.Context, name string) (session.Session, error) {
	if err := r.may(ctx, opStop); err != nil {
		return session.Session{}, err
	}
	return r.svc.Stop(ctx, name)
}

func (r *restricted) Start(ctx context.Context, name string) (session.Session, error) {
	if err := r.may(ctx, opStart); err != nil {
		return session.Session{}, err
	}
	return r.svc.Start(ctx, name)
}

func (r *restricted) Sleep(ctx context.Context, name string) (session.Session, error) {
	if err := r.may(ctx, opSleep); err != nil {
		return session.Session{}, err
	}
	return r.svc.Sleep(ctx, name)
}

func (r *restricted) Delete(ctx context.Context, name string) error {
	if err := r.may(ctx, opDelete); err != nil {
		return err
	}
	return r.svc.Delete(ctx, name)
}

func (r *restricted) Flush(ctx context.Context, name string) (session.FlushResult, error) {
	if err := r.may(ctx, opFlush); err != nil {
		return session.FlushResult{}, err
	}
	return r.svc.Flush(ctx, name)
}

func (r *restricted) Exec(ctx context.Context, name string, req session.ExecRequest) (session.Process, error) {
	if err := r.may(ctx, opExec); err != nil {
		return nil, err
	}
	p, err := r.svc.Exec(ctx, name, req)
	if err != nil {
		return nil, err
	}
	return &restrictedProcess{Process: p, r: r, own: true}, nil
}

func (r *restricted) Attach(ctx context.Context, execID string, fromSeq uint64) (session.Process, error) {
	if _, err := r.read(ctx); err != nil {
		return nil, err
	}
	p, err := r.svc.Attach(ctx, execID, fromSeq)
	if err != nil {
		return nil, err
	}
	return &restrictedProcess{Process: p, r: r}, nil
}

func (r *restricted) Executions(ctx context.Context, name string, all bool) ([]session.Execution, error) {
	if _, err := r.read(ctx); err != nil {
		return nil, err
	}
	return r.svc.Executions(ctx, name, all)
}

func (r *restricted) Execution(ctx context.Context, execID string) (session.Execution, error) {
	if _, err := r.read(ctx); err != nil {
		return session.Execution{}, err
	}
	return r.svc.Execution(ctx, execID)
}

func (r *restricted) Output(ctx context.Context, execID string, fromSeq uint64, limit int) (session.OutputPage, error) {
	if _, err := r.read(ctx); err != nil {
		return session.OutputPage{}, err
	}
	return r.svc.Output(ctx, execID, fromSeq, limit)
}

func (r *restricted) Cancel(ctx context.Context, execID string) error {
	if err := r.may(ctx, opCancel); err != nil {
		return err
	}
	return r.svc.Cancel(ctx, execID)
}

func (r *restricted) ListDir(ctx context.Context, name, path string) ([]session.FileInfo, error) {
	if _, err := r.read(ctx); err != nil {
		return nil, err
	}
	return r.svc.ListDir(ctx, name, path)
}

func (r *restricted) Stat(ctx context.Context, name, path string) (session.FileInfo, error) {
	if _, err := r.read(ctx); err != nil {
		return session.FileInfo{}, err
	}
	return r.svc.Stat(ctx, name, path)
}

func (r *restricted) ReadFile(ctx context.Context, name, path string) (io.ReadCloser, error) {
	if _, err := r.read(ctx); err != nil {
		return nil, err
	}
	return r.svc.ReadFile(ctx, name, path)
}

func (r *restricted) WriteFile(ctx context.Context, name, path string, rd io.Reader) (int64, error) {
	if err := r.may(ctx, opWriteFile); err != nil {
		return 0, err
	}
	return r.svc.WriteFile(ctx, name, path, rd)
}

func (r *restricted) Mkdir(ctx context.Context, name, path string) error {
	if err := r.may(ctx, opMkdir); err != nil {
		return err
	}
	return r.svc.Mkdir(ctx, name, path)
}

func (r *restricted) Remove(ctx context.Context, name, path string) error {
	if err := r.may(ctx, opRemoveFile); err != nil {
		return err
	}
	return r.svc.Remove(ctx, name, path)
}

func (r *restricted) Rename(ctx context.Context, name, from, to string) error {
	if err := r.may(ctx, opRename); err != nil {
		return err
	}
	return r.svc.Rename(ctx, name, from, to)
}

// restrictedProcess checks the caller's role before each change to a
// running process (Stdin, Resize, Cancel); following its output is a read.
// A process the caller started itself can always be cancelled through its
// handle: that only stops what the caller began, and it is how a command
// ends when its client disconnects, also after the key was removed.
type restrictedProcess struct {
	session.Process
	r   *restricted
	own bool // started by this caller's Exec
}

func (p *restrictedProcess) Stdin() io.WriteCloser {
	return &restrictedStdin{w: p.Process.Stdin(), p: p}
}

func (p *restrictedProcess) Resize(ctx context.Context, rows, cols int) error {
	if err := p.r.may(ctx, opResize); err != nil {
		return err
	}
	return p.Process.Resize(ctx, rows, cols)
}

func (p *restrictedProcess) Cancel(ctx context.Context) error {
	if !p.own {
		if err := p.r.may(ctx, opCancel); err != nil {
			return err
		}
	}
	return p.Process.Cancel(ctx)
}

// restrictedStdin checks the role on every write, so input stops at the
// first write after the key lost the right to send it. Close (EOF) is
// always allowed: it only ends input.
type restrictedStdin struct {
	w io.WriteCloser
	p *restrictedProcess
}

func (s *restrictedStdin) Write(b []byte) (int, error) {
	if err := s.p.r.may(context.Background(), opStdin); err != nil {
		return 0, err
	}
	return s.w.Write(b)
}

func (s *restrictedStdin) Close() error { return s.w.Close() }

// actor stamps every call with who.
type actor struct {
	svc session.Service
	who string
}

var _ session.Service = (*actor)(nil)

func (a *actor) ctx(ctx context.Context) context.Context { return session.WithActor(ctx, a.who) }

func (a *actor) List(ctx context.Context) ([]session.Session, error) { return a.svc.List(a.ctx(ctx)) }
func (a *actor) Get(ctx context.Context, name string) (session.Session, error) {
	return a.svc.Get(a.ctx(ctx), name)
}
func (a *actor) Watch(ctx context.Context) (<-chan session.Event, error) {
	return a.svc.Watch(a.ctx(ctx))
}
func (a *actor) Timeline(ctx context.Context, name string, limit int) ([]session.Event, error) {
	return a.svc.Timeline(a.ctx(ctx), name, limit)
}
func (a *actor) Create(ctx context.Context, opts session.CreateOptions) (session.Session, error) {
	return a.svc.Create(a.ctx(ctx), opts)
}
func (a *actor) Pause(ctx context.Context, name string) (session.Session, error) {
	return a.svc.Pause(a.ctx(ctx), name)
}
func (a *actor) Resume(ctx context.Context, name string) (session.Session, error) {
	return a.svc.Resume(a.ctx(ctx), name)
}
func (a *actor) Stop(ctx context.Context, name string) (session.Session, error) {
	return a.svc.Stop(a.ctx(ctx), name)
}
func (a *actor) Start(ctx context.Context, name string) (session.Session, error) {
	return a.svc.Start(a.ctx(ctx), name)
}
func (a *actor) Sleep(ctx context.Context, name string) (session.Session, error) {
	return a.svc.Sleep(a.ctx(ctx), name)
}
func (a *actor) Delete(ctx context.Context, name string) error { return a.svc.Delete(a.ctx(ctx), name) }
func (a *actor) Flush(ctx context.Context, name string) (session.FlushResult, error) {
	return a.svc.Flush(a.ctx(ctx), name)
}
func (a *actor) Exec(ctx context.Context, name string, req session.ExecRequest) (session.Process, error) {
	p, err := a.svc.Exec(a.ctx(ctx), name, req)
	if err != nil {
		return nil, err
	}
	return &actorProcess{Process: p, a: a}, nil
}
func (a *actor) Attach(ctx context.Context, execID string, fromSeq uint64) (session.Process, error) {
	p, err := a.svc.Attach(a.ctx(ctx), execID, fromSeq)
	if err != nil {
		return nil, err
	}
	return &actorProcess{Process: p, a: a}, nil
}
func (a *actor) Executions(ctx context.Context, name string, all bool) ([]session.Execution, error) {
	return a.svc.Executions(a.ctx(ctx), name, all)
}
func (a *actor) Execution(ctx context.Context, execID string) (session.Execution, error) {
	return a.svc.Execution(a.ctx(ctx), execID)
}
func (a *actor) Output(ctx context.Context, execID string, fromSeq uint64, limit int) (session.OutputPage, error) {
	return a.svc.Output(a.ctx(ctx), execID, fromSeq, limit)
}
func (a *actor) Cancel(ctx context.Context, execID string) error {
	return a.svc.Cancel(a.ctx(ctx), execID)
}
func (a *actor) ListDir(ctx context.Context, name, path string) ([]session.FileInfo, error) {
	return a.svc.ListDir(a.ctx(ctx), name, path)
}
func (a *actor) Stat(ctx context.Context, name, path string) (session.FileInfo, error) {
	return a.svc.Stat(a.ctx(ctx), name, path)
}
func (a *actor) ReadFile(ctx context.Context, name, path string) (io.ReadCloser, error) {
	return a.svc.ReadFile(a.ctx(ctx), name, path)
}
func (a *actor) WriteFile(ctx context.Context, name, path string, r io.Reader) (int64, error) {
	return a.svc.WriteFile(a.ctx(ctx), name, path, r)
}
func (a *actor) Mkdir(ctx context.Context, name, path string) error {
	return a.svc.Mkdir(a.ctx(ctx), name, path)
}
func (a *actor) Remove(ctx context.Context, name, path string) error {
	return a.svc.Remove(a.ctx(ctx), name, path)
}
func (a *actor) Rename(ctx context.Context, name, from, to string) error {
	return a.svc.Rename(a.ctx(ctx), name, from, to)
}

// actorProcess stamps Resize and Cancel with the actor too.
type actorProcess struct {
	session.Process
	a *actor
}

func (p *actorProcess) Resize(ctx context.Context, rows, cols int) error {
	return p.Process.Resize(p.a.ctx(ctx), rows, cols)
}

func (p *actorProcess) Cancel(ctx context.Context) error {
	return p.Process.Cancel(p.a.ctx(ctx))
}

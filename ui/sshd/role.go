package sshd

import (
	"context"
	"io"

	"github.com/berthvm/berth/session"
)

// Role is what an SSH key may do: the contract's roles (session.Role),
// whose action table says what each may.
type Role = session.Role

// The roles, as the contract orders them.
const (
	Viewer   = session.Viewer
	Operator = session.Operator
	Admin    = session.Admin
)

// ParseRole parses "viewer", "operator" or "admin".
func ParseRole(s string) (Role, error) { return session.ParseRole(s) }

// permit says whether the caller's current role may do a: what a front
// end asks before it asks its user to confirm a.
func (g *guard) permit(ctx context.Context, a session.Action) error {
	role, err := g.role(ctx)
	if err != nil {
		return err
	}
	return session.Permit(role, a)
}

// Restrict returns svc as a caller with role may use it: calls the role
// may not make fail with a wrapped session.ErrPermission ("role viewer may
// not pause sessions (needs operator)") before they reach svc. Reads are
// allowed to every role; a viewer's attached processes refuse input,
// resizes and cancels. Calls keep the actor of their context.
func Restrict(svc session.Service, role Role) session.Service {
	return &guard{svc: svc, role: func(context.Context) (Role, error) { return role, nil }}
}

// guard is the Service as an SSH key may use it. Once per call, enter
// looks up the key's role (reads included, so a key whose role changed or
// that was removed is refused at its next call; an error from role refuses
// the call with that error), checks the call's op, and makes the call as
// who (session.WithActor), whatever the caller's context says: an SSH
// client cannot choose its records' name. Interactive (TTY) commands it
// starts, an SSH shell or exec -t, are recorded as outside berth's
// coordination.
type guard struct {
	svc  session.Service
	who  string // "" keeps the context's actor
	role func(ctx context.Context) (Role, error)
}

var _ session.Service = (*guard)(nil)

// enter checks that the caller's current role may do a and returns the
// context to make the call with.
func (g *guard) enter(ctx context.Context, a session.Action) (context.Context, error) {
	if err := g.permit(ctx, a); err != nil {
		return ctx, err
	}
	return g.as(ctx), nil
}

// call is every guarded method: the role check, then the call as the key.
func call[T any](g *guard, ctx context.Context, a session.Action, f func(context.Context) (T, error)) (T, error) {
	ctx, err := g.enter(ctx, a)
	if err != nil {
		var zero T
		return zero, err
	}
	return f(ctx)
}

// call0 is call for the methods that return only an error.
func call0(g *guard, ctx context.Context, a session.Action, f func(context.Context) error) error {
	ctx, err := g.enter(ctx, a)
	if err != nil {
		return err
	}
	return f(ctx)
}

func (g *guard) as(ctx context.Context) context.Context {
	if g.who == "" {
		return ctx
	}
	return session.WithActor(ctx, g.who)
}

func (g *guard) List(ctx context.Context) ([]session.Session, error) {
	return call(g, ctx, session.ActionRead, func(ctx context.Context) ([]session.Session, error) { return g.svc.List(ctx) })
}

func (g *guard) Host(ctx context.Context) (session.HostStatus, error) {
	return call(g, ctx, session.ActionRead, func(ctx context.Context) (session.HostStatus, error) { return g.svc.Host(ctx) })
}

// Hosts lists the fleet's hosts for the TUI's hosts page. A service
// that lists none (a berth on its own) answers as the daemon's API does
// then: not in a fleet.
func (g *guard) Hosts(ctx context.Context) (session.HostList, error) {
	return call(g, ctx, session.ActionHosts, func(ctx context.Context) (session.HostList, error) {
		l, ok := g.svc.(session.HostLister)
		if !ok {
			return session.HostList{Hosts: []session.HostInfo{}}, nil
		}
		return l.Hosts(ctx)
	})
}

var _ session.HostLister = (*guard)(nil)

func (g *guard) Get(ctx context.Context, name string) (session.Session, error) {
	return call(g, ctx, session.ActionRead, func(ctx context.Context) (session.Session, error) { return g.svc.Get(ctx, name) })
}

func (g *guard) Watch(ctx context.Context) (<-chan session.Event, error) {
	return call(g, ctx, session.ActionRead, func(ctx context.Context) (<-chan session.Event, error) { return g.svc.Watch(ctx) })
}

func (g *guard) Timeline(ctx context.Context, name string, limit int) ([]session.Event, error) {
	return call(g, ctx, session.ActionRead, func(ctx context.Context) ([]session.Event, error) { return g.svc.Timeline(ctx, name, limit) })
}

func (g *guard) History(ctx context.Context, name string) ([]session.Sample, error) {
	return call(g, ctx, session.ActionRead, func(ctx context.Context) ([]session.Sample, error) { return g.svc.History(ctx, name) })
}

func (g *guard) Create(ctx context.Context, opts session.CreateOptions) (session.Session, error) {
	return call(g, ctx, session.ActionCreate, func(ctx context.Context) (session.Session, error) { return g.svc.Create(ctx, opts) })
}

func (g *guard) Pause(ctx context.Context, name string) (session.Session, error) {
	return call(g, ctx, session.ActionPause, func(ctx context.Context) (session.Session, error) { return g.svc.Pause(ctx, name) })
}

func (g *guard) Resume(ctx context.Context, name string) (session.Session, error) {
	return call(g, ctx, session.ActionResume, func(ctx context.Context) (session.Session, error) { return g.svc.Resume(ctx, name) })
}

func (g *guard) Stop(ctx context.Context, name string) (session.Session, error) {
	return call(g, ctx, session.ActionStop, func(ctx context.Context) (session.Session, error) { return g.svc.Stop(ctx, name) })
}

func (g *guard) Start(ctx context.Context, name string) (session.Session, error) {
	return call(g, ctx, session.ActionStart, func(ctx context.Context) (session.Session, error) { return g.svc.Start(ctx, name) })
}

func (g *guard) Sleep(ctx context.Context, name string) (session.Session, error) {
	return call(g, ctx, session.ActionSleep, func(ctx context.Context) (session.Session, error) { return g.svc.Sleep(ctx, name) })
}

func (g *guard) Delete(ctx context.Context, name string) error {
	return call0(g, ctx, session.ActionDelete, func(ctx context.Context) error { return g.svc.Delete(ctx, name) })
}

func (g *guard) Flush(ctx context.Context, name string) (session.FlushResult, error) {
	return call(g, ctx, session.ActionFlush, func(ctx context.Context) (session.FlushResult, error) { return g.svc.Flush(ctx, name) })
}

// Replace drops the VM's system changes, as delete drops everything.
func (g *guard) Replace(ctx context.Context, name string, opts session.ReplaceOptions) (session.ReplaceResult, error) {
	return call(g, ctx, session.ActionReplace, func(ctx context.Context) (session.ReplaceResult, error) { return g.svc.Replace(ctx, name, opts) })
}

func (g *guard) Exec(ctx context.Context, name string, req session.ExecRequest) (session.Process, error) {
	ctx, err := g.enter(ctx, session.ActionExec)
	if err != nil {
		return nil, err
	}
	if req.TTY {
		req.Outside = true
	}
	p, err := g.svc.Exec(ctx, name, req)
	if err != nil {
		return nil, err
	}
	return &guardedProcess{Process: p, g: g, own: true}, nil
}

func (g *guard) Attach(ctx context.Context, execID string, fromSeq uint64) (session.Process, error) {
	ctx, err := g.enter(ctx, session.ActionRead)
	if err != nil {
		return nil, err
	}
	p, err := g.svc.Attach(ctx, execID, fromSeq)
	if err != nil {
		return nil, err
	}
	return &guardedProcess{Process: p, g: g}, nil
}

func (g *guard) Executions(ctx context.Context, name string, all bool) ([]session.Execution, error) {
	return call(g, ctx, session.ActionRead, func(ctx context.Context) ([]session.Execution, error) { return g.svc.Executions(ctx, name, all) })
}

func (g *guard) Execution(ctx context.Context, execID string) (session.Execution, error) {
	return call(g, ctx, session.ActionRead, func(ctx context.Context) (session.Execution, error) { return g.svc.Execution(ctx, execID) })
}

func (g *guard) Output(ctx context.Context, execID string, fromSeq uint64, limit int) (session.OutputPage, error) {
	return call(g, ctx, session.ActionRead, func(ctx context.Context) (session.OutputPage, error) {
		return g.svc.Output(ctx, execID, fromSeq, limit)
	})
}

func (g *guard) Cancel(ctx context.Context, execID string) error {
	return call0(g, ctx, session.ActionCancel, func(ctx context.Context) error { return g.svc.Cancel(ctx, execID) })
}

func (g *guard) ListDir(ctx context.Context, name, path string) ([]session.FileInfo, error) {
	return call(g, ctx, session.ActionRead, func(ctx context.Context) ([]session.FileInfo, error) { return g.svc.ListDir(ctx, name, path) })
}

func (g *guard) Stat(ctx context.Context, name, path string) (session.FileInfo, error) {
	return call(g, ctx, session.ActionRead, func(ctx context.Context) (session.FileInfo, error) { return g.svc.Stat(ctx, name, path) })
}

func (g *guard) ReadFile(ctx context.Context, name, path string) (io.ReadCloser, error) {
	return call(g, ctx, session.ActionRead, func(ctx context.Context) (io.ReadCloser, error) { return g.svc.ReadFile(ctx, name, path) })
}

func (g *guard) WriteFile(ctx context.Context, name, path string, r io.Reader) (int64, error) {
	return call(g, ctx, session.ActionWriteFile, func(ctx context.Context) (int64, error) { return g.svc.WriteFile(ctx, name, path, r) })
}

func (g *guard) Mkdir(ctx context.Context, name, path string) error {
	return call0(g, ctx, session.ActionMkdir, func(ctx context.Context) error { return g.svc.Mkdir(ctx, name, path) })
}

func (g *guard) Remove(ctx context.Context, name, path string) error {
	return call0(g, ctx, session.ActionRemoveFile, func(ctx context.Context) error { return g.svc.Remove(ctx, name, path) })
}

func (g *guard) Rename(ctx context.Context, name, from, to string) error {
	return call0(g, ctx, session.ActionRename, func(ctx context.Context) error { return g.svc.Rename(ctx, name, from, to) })
}

// CopyIn writes files.
func (g *guard) CopyIn(ctx context.Context, name, dir string, r io.Reader) (session.CopyResult, error) {
	return call(g, ctx, session.ActionWriteFile, func(ctx context.Context) (session.CopyResult, error) { return g.svc.CopyIn(ctx, name, dir, r) })
}

func (g *guard) CopyOut(ctx context.Context, name, path string) (io.ReadCloser, error) {
	return call(g, ctx, session.ActionRead, func(ctx context.Context) (io.ReadCloser, error) { return g.svc.CopyOut(ctx, name, path) })
}

// guardedProcess checks the caller's role before each change to a running
// process (Stdin, Resize, Cancel) and makes Resize and Cancel as the key;
// following its output is a read. A process the caller started itself can
// always be cancelled through its handle: that only stops what the caller
// began, and it is how a command ends when its client disconnects, also
// after the key was removed.
type guardedProcess struct {
	session.Process
	g   *guard
	own bool // started by this caller's Exec
}

func (p *guardedProcess) Stdin() io.WriteCloser {
	return &guardedStdin{w: p.Process.Stdin(), g: p.g}
}

func (p *guardedProcess) Resize(ctx context.Context, rows, cols int) error {
	ctx, err := p.g.enter(ctx, session.ActionResize)
	if err != nil {
		return err
	}
	return p.Process.Resize(ctx, rows, cols)
}

func (p *guardedProcess) Cancel(ctx context.Context) error {
	if p.own {
		return p.Process.Cancel(p.g.as(ctx))
	}
	ctx, err := p.g.enter(ctx, session.ActionCancel)
	if err != nil {
		return err
	}
	return p.Process.Cancel(ctx)
}

// guardedStdin checks the role on every write, so input stops at the
// first write after the key lost the right to send it. Close (EOF) is
// always allowed: it only ends input.
type guardedStdin struct {
	w io.WriteCloser
	g *guard
}

func (s *guardedStdin) Write(b []byte) (int, error) {
	if _, err := s.g.enter(context.Background(), session.ActionStdin); err != nil {
		return 0, err
	}
	return s.w.Write(b)
}

func (s *guardedStdin) Close() error { return s.w.Close() }

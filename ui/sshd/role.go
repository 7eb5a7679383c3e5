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
	// files, trees copied out) and changes nothing.
	Viewer Role = iota + 1
	// Operator also runs the lifecycle (create, pause, resume, stop,
	// start, sleep, flush), runs and cancels commands, and changes
	// files (trees copied in too); it may not delete sessions or replace
	// their VMs.
	Operator
	// Admin may do everything, including deleting sessions and replacing
	// their VMs (which drops what was installed on them).
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

// op is one kind of call a role may or may not make.
type op int

const (
	opRead op = iota // sessions, events, executions, output, files
	opCreate
	opPause
	opResume
	opStop
	opStart
	opSleep
	opFlush
	opDelete
	opReplace
	opExec
	opCancel
	opStdin
	opResize
	opWriteFile
	opMkdir
	opRemoveFile
	opRename
	opSetattr
	opLink
	opRun      // start and end agent runs
	opSchedule // add and remove schedules
	opCheckpoint
	opDeleteCheckpoint
	opRestore
	opFork
	opNet
)

// describe returns what o does, completing "role viewer may not ...", and
// the least role that may do it.
func (o op) describe() (what string, least Role) {
	switch o {
	case opRead:
		return "read sessions", Viewer
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
	case opReplace:
		return "replace session VMs", Admin
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
	case opSetattr:
		return "change file attributes", Operator
	case opLink:
		return "create links", Operator
	case opRun:
		return "start or end agent runs", Operator
	case opSchedule:
		return "add or remove schedules", Operator
	case opCheckpoint:
		return "checkpoint sessions", Operator
	case opDeleteCheckpoint:
		return "remove checkpoints", Admin
	case opRestore:
		return "restore sessions to checkpoints", Admin
	case opFork:
		return "fork sessions", Operator
	case opNet:
		return "change networks or forward ports", Operator
	}
	return fmt.Sprintf("op(%d)", int(o)), Admin
}

// actionOp is the op of a transition-table action; false for one that
// every role may do (using a session's files is reading them too).
func actionOp(a session.Action) (op, bool) {
	switch a {
	case session.ActionPause:
		return opPause, true
	case session.ActionResume:
		return opResume, true
	case session.ActionStop:
		return opStop, true
	case session.ActionStart:
		return opStart, true
	case session.ActionDelete:
		return opDelete, true
	case session.ActionFlush:
		return opFlush, true
	case session.ActionExec:
		return opExec, true
	case session.ActionSleep:
		return opSleep, true
	case session.ActionReplace:
		return opReplace, true
	case session.ActionCheckpoint:
		return opCheckpoint, true
	case session.ActionRestore:
		return opRestore, true
	case session.ActionFork:
		return opFork, true
	}
	return 0, false
}

// permit says whether the caller's current role may do a: what a front
// end asks before it asks its user to confirm a.
func (g *guard) permit(ctx context.Context, a session.Action) error {
	o, ok := actionOp(a)
	if !ok {
		return nil
	}
	role, err := g.role(ctx)
	if err != nil {
		return err
	}
	return role.allows(o)
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

// enter checks that the caller's current role allows o and returns the
// context to make the call with.
func (g *guard) enter(ctx context.Context, o op) (context.Context, error) {
	role, err := g.role(ctx)
	if err != nil {
		return ctx, err
	}
	if err := role.allows(o); err != nil {
		return ctx, err
	}
	return g.as(ctx), nil
}

func (g *guard) as(ctx context.Context) context.Context {
	if g.who == "" {
		return ctx
	}
	return session.WithActor(ctx, g.who)
}

func (g *guard) List(ctx context.Context) ([]session.Session, error) {
	ctx, err := g.enter(ctx, opRead)
	if err != nil {
		return nil, err
	}
	return g.svc.List(ctx)
}

func (g *guard) Host(ctx context.Context) (session.HostStatus, error) {
	ctx, err := g.enter(ctx, opRead)
	if err != nil {
		return session.HostStatus{}, err
	}
	return g.svc.Host(ctx)
}

func (g *guard) Get(ctx context.Context, name string) (session.Session, error) {
	ctx, err := g.enter(ctx, opRead)
	if err != nil {
		return session.Session{}, err
	}
	return g.svc.Get(ctx, name)
}

func (g *guard) Watch(ctx context.Context) (<-chan session.Event, error) {
	ctx, err := g.enter(ctx, opRead)
	if err != nil {
		return nil, err
	}
	return g.svc.Watch(ctx)
}

func (g *guard) Timeline(ctx context.Context, name string, limit int) ([]session.Event, error) {
	ctx, err := g.enter(ctx, opRead)
	if err != nil {
		return nil, err
	}
	return g.svc.Timeline(ctx, name, limit)
}

func (g *guard) History(ctx context.Context, name string) ([]session.Sample, error) {
	ctx, err := g.enter(ctx, opRead)
	if err != nil {
		return nil, err
	}
	return g.svc.History(ctx, name)
}

func (g *guard) Create(ctx context.Context, opts session.CreateOptions) (session.Session, error) {
	ctx, err := g.enter(ctx, opCreate)
	if err != nil {
		return session.Session{}, err
	}
	return g.svc.Create(ctx, opts)
}

func (g *guard) Pause(ctx context.Context, name string) (session.Session, error) {
	ctx, err := g.enter(ctx, opPause)
	if err != nil {
		return session.Session{}, err
	}
	return g.svc.Pause(ctx, name)
}

func (g *guard) Resume(ctx context.Context, name string) (session.Session, error) {
	ctx, err := g.enter(ctx, opResume)
	if err != nil {
		return session.Session{}, err
	}
	return g.svc.Resume(ctx, name)
}

func (g *guard) Stop(ctx context.Context, name string) (session.Session, error) {
	ctx, err := g.enter(ctx, opStop)
	if err != nil {
		return session.Session{}, err
	}
	return g.svc.Stop(ctx, name)
}

func (g *guard) Start(ctx context.Context, name string) (session.Session, error) {
	ctx, err := g.enter(ctx, opStart)
	if err != nil {
		return session.Session{}, err
	}
	return g.svc.Start(ctx, name)
}

func (g *guard) Sleep(ctx context.Context, name string) (session.Session, error) {
	ctx, err := g.enter(ctx, opSleep)
	if err != nil {
		return session.Session{}, err
	}
	return g.svc.Sleep(ctx, name)
}

func (g *guard) Delete(ctx context.Context, name string) error {
	ctx, err := g.enter(ctx, opDelete)
	if err != nil {
		return err
	}
	return g.svc.Delete(ctx, name)
}

func (g *guard) Flush(ctx context.Context, name string) (session.FlushResult, error) {
	ctx, err := g.enter(ctx, opFlush)
	if err != nil {
		return session.FlushResult{}, err
	}
	return g.svc.Flush(ctx, name)
}

// Replace drops the VM's system changes, as delete drops everything.
func (g *guard) Replace(ctx context.Context, name string, opts session.ReplaceOptions) (session.ReplaceResult, error) {
	ctx, err := g.enter(ctx, opReplace)
	if err != nil {
		return session.ReplaceResult{}, err
	}
	return g.svc.Replace(ctx, name, opts)
}

func (g *guard) Exec(ctx context.Context, name string, req session.ExecRequest) (session.Process, error) {
	ctx, err := g.enter(ctx, opExec)
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
	ctx, err := g.enter(ctx, opRead)
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
	ctx, err := g.enter(ctx, opRead)
	if err != nil {
		return nil, err
	}
	return g.svc.Executions(ctx, name, all)
}

func (g *guard) Execution(ctx context.Context, execID string) (session.Execution, error) {
	ctx, err := g.enter(ctx, opRead)
	if err != nil {
		return session.Execution{}, err
	}
	return g.svc.Execution(ctx, execID)
}

func (g *guard) Output(ctx context.Context, execID string, fromSeq uint64, limit int) (session.OutputPage, error) {
	ctx, err := g.enter(ctx, opRead)
	if err != nil {
		return session.OutputPage{}, err
	}
	return g.svc.Output(ctx, execID, fromSeq, limit)
}

func (g *guard) Cancel(ctx context.Context, execID string) error {
	ctx, err := g.enter(ctx, opCancel)
	if err != nil {
		return err
	}
	return g.svc.Cancel(ctx, execID)
}

func (g *guard) ListDir(ctx context.Context, name, path string) ([]session.FileInfo, error) {
	ctx, err := g.enter(ctx, opRead)
	if err != nil {
		return nil, err
	}
	return g.svc.ListDir(ctx, name, path)
}

func (g *guard) Stat(ctx context.Context, name, path string) (session.FileInfo, error) {
	ctx, err := g.enter(ctx, opRead)
	if err != nil {
		return session.FileInfo{}, err
	}
	return g.svc.Stat(ctx, name, path)
}

func (g *guard) ReadFile(ctx context.Context, name, path string) (io.ReadCloser, error) {
	ctx, err := g.enter(ctx, opRead)
	if err != nil {
		return nil, err
	}
	return g.svc.ReadFile(ctx, name, path)
}

func (g *guard) WriteFile(ctx context.Context, name, path string, r io.Reader) (int64, error) {
	ctx, err := g.enter(ctx, opWriteFile)
	if err != nil {
		return 0, err
	}
	return g.svc.WriteFile(ctx, name, path, r)
}

func (g *guard) Mkdir(ctx context.Context, name, path string) error {
	ctx, err := g.enter(ctx, opMkdir)
	if err != nil {
		return err
	}
	return g.svc.Mkdir(ctx, name, path)
}

func (g *guard) Remove(ctx context.Context, name, path string) error {
	ctx, err := g.enter(ctx, opRemoveFile)
	if err != nil {
		return err
	}
	return g.svc.Remove(ctx, name, path)
}

func (g *guard) Rename(ctx context.Context, name, from, to string) error {
	ctx, err := g.enter(ctx, opRename)
	if err != nil {
		return err
	}
	return g.svc.Rename(ctx, name, from, to)
}

// CopyIn writes files.
func (g *guard) CopyIn(ctx context.Context, name, dir string, r io.Reader) (session.CopyResult, error) {
	ctx, err := g.enter(ctx, opWriteFile)
	if err != nil {
		return session.CopyResult{}, err
	}
	return g.svc.CopyIn(ctx, name, dir, r)
}

func (g *guard) CopyOut(ctx context.Context, name, path string) (io.ReadCloser, error) {
	ctx, err := g.enter(ctx, opRead)
	if err != nil {
		return nil, err
	}
	return g.svc.CopyOut(ctx, name, path)
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
	ctx, err := p.g.enter(ctx, opResize)
	if err != nil {
		return err
	}
	return p.Process.Resize(ctx, rows, cols)
}

func (p *guardedProcess) Cancel(ctx context.Context) error {
	if p.own {
		return p.Process.Cancel(p.g.as(ctx))
	}
	ctx, err := p.g.enter(ctx, opCancel)
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
	if _, err := s.g.enter(context.Background(), opStdin); err != nil {
		return 0, err
	}
	return s.w.Write(b)
}

func (s *guardedStdin) Close() error { return s.w.Close() }

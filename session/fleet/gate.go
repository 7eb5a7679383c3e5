package fleet

import (
	"context"
	"io"
	"io/fs"
	"net"

	"github.com/berthvm/berth/session"
)

// Allower says whether a host may change what it holds now: nil, or the
// refusal (of class session.ErrIsolated) to return. Node and Host
// implement it.
type Allower interface {
	Allowed(ctx context.Context) error
}

// Fence returns svc as an isolated host may serve it: every call that
// changes something (the action table's Mutates: lifecycle, exec,
// cancel, file writes, checkpoints, runs, schedules, networks, images) is
// refused with a.Allowed's error while that is not nil, before it
// reaches svc; reads pass through. A read that would wake a sleeping
// session (its files, a diff with the workspace now) is refused too,
// since a wake is a change. What runs goes on: VMs, commands, and the
// input and output of processes started while the host was allowed.
//
// A router of the fleet sits on top of it, so a forwarded call meets the
// same fence as a local one.
func Fence(svc session.Service, a Allower) session.Service {
	return &fence{Service: svc, a: a}
}

// fence embeds the Service so reads pass through as they are; every
// change is listed below. TestFenceClassifiesEveryMethod fails when a
// method of session.Service is neither a read it names nor refused here.
type fence struct {
	session.Service
	a Allower
}

// WatchSince passes through: a watch changes nothing.
func (g *fence) WatchSince(ctx context.Context, since int64) (<-chan session.Event, error) {
	fw, ok := g.Service.(session.FleetWatcher)
	if !ok {
		return nil, &session.Error{Class: session.ErrInvalid, Msg: "this berth does not follow a fleet's revisions"}
	}
	return fw.WatchSince(ctx, since)
}

var _ session.FleetWatcher = (*fence)(nil)

// gate runs f if the host is allowed to change.
func gate[T any](g *fence, ctx context.Context, f func() (T, error)) (T, error) {
	if err := g.a.Allowed(ctx); err != nil {
		var zero T
		return zero, err
	}
	return f()
}

func gate0(g *fence, ctx context.Context, f func() error) error {
	if err := g.a.Allowed(ctx); err != nil {
		return err
	}
	return f()
}

// awake refuses, while the host is isolated, a read of a sleeping
// session: answering it would wake the VM. Allowed, it costs nothing.
func (g *fence) awake(ctx context.Context, name string) error {
	err := g.a.Allowed(ctx)
	if err == nil {
		return nil
	}
	if s, gerr := g.Service.Get(ctx, name); gerr == nil && s.State == session.StateSleeping {
		return err
	}
	return nil
}

func readAwake[T any](g *fence, ctx context.Context, name string, f func() (T, error)) (T, error) {
	if err := g.awake(ctx, name); err != nil {
		var zero T
		return zero, err
	}
	return f()
}

// Lifecycle.

func (g *fence) Create(ctx context.Context, opts session.CreateOptions) (session.Session, error) {
	return gate(g, ctx, func() (session.Session, error) { return g.Service.Create(ctx, opts) })
}

func (g *fence) Pause(ctx context.Context, name string) (session.Session, error) {
	return gate(g, ctx, func() (session.Session, error) { return g.Service.Pause(ctx, name) })
}

func (g *fence) Resume(ctx context.Context, name string) (session.Session, error) {
	return gate(g, ctx, func() (session.Session, error) { return g.Service.Resume(ctx, name) })
}

func (g *fence) Stop(ctx context.Context, name string) (session.Session, error) {
	return gate(g, ctx, func() (session.Session, error) { return g.Service.Stop(ctx, name) })
}

func (g *fence) Start(ctx context.Context, name string) (session.Session, error) {
	return gate(g, ctx, func() (session.Session, error) { return g.Service.Start(ctx, name) })
}

func (g *fence) Sleep(ctx context.Context, name string) (session.Session, error) {
	return gate(g, ctx, func() (session.Session, error) { return g.Service.Sleep(ctx, name) })
}

func (g *fence) Delete(ctx context.Context, name string) error {
	return gate0(g, ctx, func() error { return g.Service.Delete(ctx, name) })
}

// Flush changes nothing a session is, but the action table counts it a
// change, and one rule is simpler to trust than exceptions.
func (g *fence) Flush(ctx context.Context, name string) (session.FlushResult, error) {
	return gate(g, ctx, func() (session.FlushResult, error) { return g.Service.Flush(ctx, name) })
}

func (g *fence) Replace(ctx context.Context, name string, opts session.ReplaceOptions) (session.ReplaceResult, error) {
	return gate(g, ctx, func() (session.ReplaceResult, error) { return g.Service.Replace(ctx, name, opts) })
}

// Execer.

func (g *fence) Exec(ctx context.Context, name string, req session.ExecRequest) (session.Process, error) {
	// A process started while allowed keeps its input and output when
	// the host is isolated later: a command that runs goes on whole.
	return gate(g, ctx, func() (session.Process, error) { return g.Service.Exec(ctx, name, req) })
}

// Attach follows output (a read); what the follower then sends to the
// command is a change.
func (g *fence) Attach(ctx context.Context, execID string, fromSeq uint64) (session.Process, error) {
	p, err := g.Service.Attach(ctx, execID, fromSeq)
	if err != nil {
		return nil, err
	}
	return &fencedProcess{Process: p, g: g}, nil
}

func (g *fence) Cancel(ctx context.Context, execID string) error {
	return gate0(g, ctx, func() error { return g.Service.Cancel(ctx, execID) })
}

// Files.

func (g *fence) ListDir(ctx context.Context, name, path string) ([]session.FileInfo, error) {
	return readAwake(g, ctx, name, func() ([]session.FileInfo, error) { return g.Service.ListDir(ctx, name, path) })
}

func (g *fence) Stat(ctx context.Context, name, path string) (session.FileInfo, error) {
	return readAwake(g, ctx, name, func() (session.FileInfo, error) { return g.Service.Stat(ctx, name, path) })
}

func (g *fence) ReadFile(ctx context.Context, name, path string) (io.ReadCloser, error) {
	return readAwake(g, ctx, name, func() (io.ReadCloser, error) { return g.Service.ReadFile(ctx, name, path) })
}

func (g *fence) CopyOut(ctx context.Context, name, path string) (io.ReadCloser, error) {
	return readAwake(g, ctx, name, func() (io.ReadCloser, error) { return g.Service.CopyOut(ctx, name, path) })
}

func (g *fence) WriteFile(ctx context.Context, name, path string, r io.Reader) (int64, error) {
	return gate(g, ctx, func() (int64, error) { return g.Service.WriteFile(ctx, name, path, r) })
}

func (g *fence) Mkdir(ctx context.Context, name, path string) error {
	return gate0(g, ctx, func() error { return g.Service.Mkdir(ctx, name, path) })
}

func (g *fence) Remove(ctx context.Context, name, path string) error {
	return gate0(g, ctx, func() error { return g.Service.Remove(ctx, name, path) })
}

func (g *fence) Rename(ctx context.Context, name, from, to string) error {
	return gate0(g, ctx, func() error { return g.Service.Rename(ctx, name, from, to) })
}

func (g *fence) CopyIn(ctx context.Context, name, dir string, r io.Reader) (session.CopyResult, error) {
	return gate(g, ctx, func() (session.CopyResult, error) { return g.Service.CopyIn(ctx, name, dir, r) })
}

// Handles.

// writeFlags are the open flags that change a file.
const writeFlags = session.OpenWrite | session.OpenAppend | session.OpenCreate | session.OpenTruncate | session.OpenExclusive

func (g *fence) Open(ctx context.Context, name, path string, flags int, perm fs.FileMode) (session.File, error) {
	if flags&writeFlags != 0 {
		if err := g.a.Allowed(ctx); err != nil {
			return nil, err
		}
	} else if err := g.awake(ctx, name); err != nil {
		return nil, err
	}
	f, err := g.Service.Open(ctx, name, path, flags, perm)
	if err != nil {
		return nil, err
	}
	return &fencedFile{File: f, g: g}, nil
}

func (g *fence) Setstat(ctx context.Context, name, path string, a session.Attrs) error {
	return gate0(g, ctx, func() error { return g.Service.Setstat(ctx, name, path, a) })
}

func (g *fence) StatFollow(ctx context.Context, name, path string) (session.FileInfo, error) {
	return readAwake(g, ctx, name, func() (session.FileInfo, error) { return g.Service.StatFollow(ctx, name, path) })
}

func (g *fence) Symlink(ctx context.Context, name, target, path string) error {
	return gate0(g, ctx, func() error { return g.Service.Symlink(ctx, name, target, path) })
}

func (g *fence) Link(ctx context.Context, name, oldpath, newpath string) error {
	return gate0(g, ctx, func() error { return g.Service.Link(ctx, name, oldpath, newpath) })
}

func (g *fence) Statfs(ctx context.Context, name, path string) (session.FSStat, error) {
	return readAwake(g, ctx, name, func() (session.FSStat, error) { return g.Service.Statfs(ctx, name, path) })
}

func (g *fence) Rmdir(ctx context.Context, name, path string) error {
	return gate0(g, ctx, func() error { return g.Service.Rmdir(ctx, name, path) })
}

// Checkpointer.

func (g *fence) Checkpoint(ctx context.Context, name string, opts session.CheckpointOptions) (session.Checkpoint, error) {
	return gate(g, ctx, func() (session.Checkpoint, error) { return g.Service.Checkpoint(ctx, name, opts) })
}

func (g *fence) DeleteCheckpoint(ctx context.Context, name, id string) error {
	return gate0(g, ctx, func() error { return g.Service.DeleteCheckpoint(ctx, name, id) })
}

func (g *fence) Restore(ctx context.Context, name, id string) (session.RestoreResult, error) {
	return gate(g, ctx, func() (session.RestoreResult, error) { return g.Service.Restore(ctx, name, id) })
}

func (g *fence) Fork(ctx context.Context, name, newName string) (session.ForkResult, error) {
	return gate(g, ctx, func() (session.ForkResult, error) { return g.Service.Fork(ctx, name, newName) })
}

// Differ.

// Diff with the workspace now asks the VM, as reading files does.
func (g *fence) Diff(ctx context.Context, name, from, to string, opts session.DiffOptions) (session.Diff, error) {
	return readAwake(g, ctx, name, func() (session.Diff, error) { return g.Service.Diff(ctx, name, from, to, opts) })
}

func (g *fence) UndoRun(ctx context.Context, runID string, paths []string) (session.UndoResult, error) {
	return gate(g, ctx, func() (session.UndoResult, error) { return g.Service.UndoRun(ctx, runID, paths) })
}

// Networker.

func (g *fence) SetNet(ctx context.Context, name, policy string) (session.Session, error) {
	return gate(g, ctx, func() (session.Session, error) { return g.Service.SetNet(ctx, name, policy) })
}

// Forward wakes a sleeping session and lets a client act on the guest:
// a change, as exec is.
func (g *fence) Forward(ctx context.Context, name string, port int) (net.Conn, error) {
	return gate(g, ctx, func() (net.Conn, error) { return g.Service.Forward(ctx, name, port) })
}

// Harness.

func (g *fence) StartRun(ctx context.Context, name string, opts session.RunOptions) (session.Run, error) {
	return gate(g, ctx, func() (session.Run, error) { return g.Service.StartRun(ctx, name, opts) })
}

func (g *fence) EndRun(ctx context.Context, runID string, status session.RunStatus) (session.Run, error) {
	return gate(g, ctx, func() (session.Run, error) { return g.Service.EndRun(ctx, runID, status) })
}

func (g *fence) RemoveRun(ctx context.Context, runID string) (session.RemovedRun, error) {
	return gate(g, ctx, func() (session.RemovedRun, error) { return g.Service.RemoveRun(ctx, runID) })
}

func (g *fence) AddSchedule(ctx context.Context, name string, req session.ScheduleRequest) (session.Schedule, error) {
	return gate(g, ctx, func() (session.Schedule, error) { return g.Service.AddSchedule(ctx, name, req) })
}

func (g *fence) RemoveSchedule(ctx context.Context, name, id string) error {
	return gate0(g, ctx, func() error { return g.Service.RemoveSchedule(ctx, name, id) })
}

// Imager: images are the host's, but building, importing, committing and
// removing change it, and an isolated host changes nothing.

func (g *fence) BuildImage(ctx context.Context, req session.BuildRequest, progress func(session.BuildProgress)) (session.ImageInfo, error) {
	return gate(g, ctx, func() (session.ImageInfo, error) { return g.Service.BuildImage(ctx, req, progress) })
}

func (g *fence) ImportImage(ctx context.Context, req session.ImportRequest, src io.Reader, progress func(session.BuildProgress)) (session.ImageInfo, error) {
	return gate(g, ctx, func() (session.ImageInfo, error) { return g.Service.ImportImage(ctx, req, src, progress) })
}

func (g *fence) CommitImage(ctx context.Context, req session.CommitRequest) (session.CommitResult, error) {
	return gate(g, ctx, func() (session.CommitResult, error) { return g.Service.CommitImage(ctx, req) })
}

func (g *fence) RemoveImage(ctx context.Context, name string) error {
	return gate0(g, ctx, func() error { return g.Service.RemoveImage(ctx, name) })
}

// fencedProcess is an attached process: following its output is a read;
// input, resizes and cancels are changes, refused while isolated.
type fencedProcess struct {
	session.Process
	g *fence
}

func (p *fencedProcess) Stdin() io.WriteCloser { return &fencedStdin{w: p.Process.Stdin(), g: p.g} }

func (p *fencedProcess) Resize(ctx context.Context, rows, cols int) error {
	return gate0(p.g, ctx, func() error { return p.Process.Resize(ctx, rows, cols) })
}

func (p *fencedProcess) Cancel(ctx context.Context) error {
	return gate0(p.g, ctx, func() error { return p.Process.Cancel(ctx) })
}

// fencedStdin checks on every write; Close (EOF) only ends input.
type fencedStdin struct {
	w io.WriteCloser
	g *fence
}

func (s *fencedStdin) Write(b []byte) (int, error) {
	if err := s.g.a.Allowed(context.Background()); err != nil {
		return 0, err
	}
	return s.w.Write(b)
}

func (s *fencedStdin) Close() error { return s.w.Close() }

// fencedFile is an open file: reads go on; writes and attribute changes
// are refused once the host is isolated.
type fencedFile struct {
	session.File
	g *fence
}

func (f *fencedFile) WriteAt(p []byte, off int64) (int, error) {
	if err := f.g.a.Allowed(context.Background()); err != nil {
		return 0, err
	}
	return f.File.WriteAt(p, off)
}

func (f *fencedFile) Setstat(ctx context.Context, a session.Attrs) error {
	return gate0(f.g, ctx, func() error { return f.File.Setstat(ctx, a) })
}

// RunDiff compares a run's start with the workspace now: it asks the VM.
func (g *fence) RunDiff(ctx context.Context, runID string, opts session.DiffOptions) (session.Diff, error) {
	if g.a.Allowed(ctx) != nil {
		if r, err := g.Service.GetRun(ctx, runID); err == nil {
			if err := g.awake(ctx, r.Session); err != nil {
				return session.Diff{}, err
			}
		}
	}
	return g.Service.RunDiff(ctx, runID, opts)
}

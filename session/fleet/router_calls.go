package fleet

import (
	"context"
	"io"
	"io/fs"
	"net"

	"github.com/berthvm/berth/session"
)

// The rest of session.Service: each call on a session goes to its owner
// (on), each on a run by id to whichever live host knows it (byID), and
// images are this host's own.

func (r *Router) ListDir(ctx context.Context, name, path string) ([]session.FileInfo, error) {
	return on(r, ctx, name, func(svc session.Service, ctx context.Context) ([]session.FileInfo, error) {
		return svc.ListDir(ctx, name, path)
	})
}

func (r *Router) Stat(ctx context.Context, name, path string) (session.FileInfo, error) {
	return on(r, ctx, name, func(svc session.Service, ctx context.Context) (session.FileInfo, error) {
		return svc.Stat(ctx, name, path)
	})
}

func (r *Router) ReadFile(ctx context.Context, name, path string) (io.ReadCloser, error) {
	return on(r, ctx, name, func(svc session.Service, ctx context.Context) (io.ReadCloser, error) {
		return svc.ReadFile(ctx, name, path)
	})
}

func (r *Router) WriteFile(ctx context.Context, name, path string, rd io.Reader) (int64, error) {
	return onStreaming(r, ctx, name, func(svc session.Service, ctx context.Context) (int64, error) {
		return svc.WriteFile(ctx, name, path, rd)
	})
}

func (r *Router) Mkdir(ctx context.Context, name, path string) error {
	return onErr(r, ctx, name, func(svc session.Service, ctx context.Context) error { return svc.Mkdir(ctx, name, path) })
}

func (r *Router) Remove(ctx context.Context, name, path string) error {
	return onErr(r, ctx, name, func(svc session.Service, ctx context.Context) error { return svc.Remove(ctx, name, path) })
}

func (r *Router) Rename(ctx context.Context, name, from, to string) error {
	return onErr(r, ctx, name, func(svc session.Service, ctx context.Context) error { return svc.Rename(ctx, name, from, to) })
}

func (r *Router) CopyIn(ctx context.Context, name, dir string, rd io.Reader) (session.CopyResult, error) {
	return onStreaming(r, ctx, name, func(svc session.Service, ctx context.Context) (session.CopyResult, error) {
		return svc.CopyIn(ctx, name, dir, rd)
	})
}

func (r *Router) CopyOut(ctx context.Context, name, path string) (io.ReadCloser, error) {
	return on(r, ctx, name, func(svc session.Service, ctx context.Context) (io.ReadCloser, error) {
		return svc.CopyOut(ctx, name, path)
	})
}

func (r *Router) Checkpoint(ctx context.Context, name string, opts session.CheckpointOptions) (session.Checkpoint, error) {
	return on(r, ctx, name, func(svc session.Service, ctx context.Context) (session.Checkpoint, error) {
		return svc.Checkpoint(ctx, name, opts)
	})
}

// Checkpoints lists the owner's checkpoints of name; the front door the
// caller asked names the hosts that keep replicas of each.
func (r *Router) Checkpoints(ctx context.Context, name string) ([]session.Checkpoint, error) {
	cks, err := on(r, ctx, name, func(svc session.Service, ctx context.Context) ([]session.Checkpoint, error) {
		return svc.Checkpoints(ctx, name)
	})
	if _, fwd := session.ForwardedOf(ctx); fwd {
		return cks, err
	}
	if err != nil {
		return cks, r.replicasOfUnreachable(ctx, name, err)
	}
	return r.withReplicas(ctx, name, cks), nil
}

func (r *Router) DeleteCheckpoint(ctx context.Context, name, id string) error {
	return onErr(r, ctx, name, func(svc session.Service, ctx context.Context) error { return svc.DeleteCheckpoint(ctx, name, id) })
}

func (r *Router) Restore(ctx context.Context, name, id string) (session.RestoreResult, error) {
	return changeOn(r, ctx, name, "restore", func(svc session.Service, ctx context.Context) (session.RestoreResult, error) {
		return svc.Restore(ctx, name, id)
	})
}

// Fork makes newName on name's owner: placed there first (pinned, of
// name's sizes), so the new name is the fleet's once.
func (r *Router) Fork(ctx context.Context, name, newName string) (session.ForkResult, error) {
	t, err := r.route(ctx, name)
	if err != nil {
		return session.ForkResult{}, err
	}
	if t.remote {
		return t.svc.Fork(t.ctx, name, newName)
	}
	src, err := t.svc.Get(ctx, name)
	if err != nil {
		return session.ForkResult{}, err
	}
	if err := session.ValidateName(newName); err != nil {
		return session.ForkResult{}, err
	}
	p, err := Place(ctx, r.cli, Request{On: r.cfg.Self, Door: r.cfg.Self, Opts: session.CreateOptions{Name: newName, CPUs: src.CPUs, MemoryMiB: src.MemoryMiB,
		DiskBytes: src.DiskBytes, Image: src.Image, VMM: src.VMM}})
	if err != nil {
		return session.ForkResult{}, err
	}
	res, err := t.svc.Fork(ctx, name, newName)
	if err != nil {
		r.release(ctx, newName, p.Epoch)
		return res, err
	}
	r.setEpoch(ctx, newName, p.Epoch)
	return res, nil
}

func (r *Router) Diff(ctx context.Context, name, from, to string, opts session.DiffOptions) (session.Diff, error) {
	return on(r, ctx, name, func(svc session.Service, ctx context.Context) (session.Diff, error) {
		return svc.Diff(ctx, name, from, to, opts)
	})
}

func (r *Router) RunDiff(ctx context.Context, runID string, opts session.DiffOptions) (session.Diff, error) {
	return byID(r, ctx, func(svc session.Service, ctx context.Context) (session.Diff, error) {
		return svc.RunDiff(ctx, runID, opts)
	})
}

func (r *Router) UndoRun(ctx context.Context, runID string, paths []string) (session.UndoResult, error) {
	return byID(r, ctx, func(svc session.Service, ctx context.Context) (session.UndoResult, error) {
		return svc.UndoRun(ctx, runID, paths)
	})
}

func (r *Router) History(ctx context.Context, name string) ([]session.Sample, error) {
	return on(r, ctx, name, func(svc session.Service, ctx context.Context) ([]session.Sample, error) {
		return svc.History(ctx, name)
	})
}

func (r *Router) SetNet(ctx context.Context, name, policy string) (session.Session, error) {
	return r.change(ctx, name, "net", func(svc session.Service, ctx context.Context) (session.Session, error) {
		return svc.SetNet(ctx, name, policy)
	})
}

// Forward connects to a port in the session's guest, through its owner.
func (r *Router) Forward(ctx context.Context, name string, port int) (net.Conn, error) {
	return on(r, ctx, name, func(svc session.Service, ctx context.Context) (net.Conn, error) { return svc.Forward(ctx, name, port) })
}

func (r *Router) NetStatus(ctx context.Context, name string) (session.NetStatus, error) {
	return on(r, ctx, name, func(svc session.Service, ctx context.Context) (session.NetStatus, error) {
		return svc.NetStatus(ctx, name)
	})
}

func (r *Router) StartRun(ctx context.Context, name string, opts session.RunOptions) (session.Run, error) {
	return on(r, ctx, name, func(svc session.Service, ctx context.Context) (session.Run, error) {
		return svc.StartRun(ctx, name, opts)
	})
}

func (r *Router) EndRun(ctx context.Context, runID string, status session.RunStatus) (session.Run, error) {
	return byID(r, ctx, func(svc session.Service, ctx context.Context) (session.Run, error) {
		return svc.EndRun(ctx, runID, status)
	})
}

func (r *Router) Runs(ctx context.Context, name string) ([]session.Run, error) {
	return on(r, ctx, name, func(svc session.Service, ctx context.Context) ([]session.Run, error) { return svc.Runs(ctx, name) })
}

func (r *Router) GetRun(ctx context.Context, runID string) (session.Run, error) {
	return byID(r, ctx, func(svc session.Service, ctx context.Context) (session.Run, error) { return svc.GetRun(ctx, runID) })
}

func (r *Router) RemoveRun(ctx context.Context, runID string) (session.RemovedRun, error) {
	return byID(r, ctx, func(svc session.Service, ctx context.Context) (session.RemovedRun, error) {
		return svc.RemoveRun(ctx, runID)
	})
}

func (r *Router) AddSchedule(ctx context.Context, name string, req session.ScheduleRequest) (session.Schedule, error) {
	return on(r, ctx, name, func(svc session.Service, ctx context.Context) (session.Schedule, error) {
		return svc.AddSchedule(ctx, name, req)
	})
}

func (r *Router) Schedules(ctx context.Context, name string) ([]session.Schedule, error) {
	return on(r, ctx, name, func(svc session.Service, ctx context.Context) ([]session.Schedule, error) {
		return svc.Schedules(ctx, name)
	})
}

func (r *Router) RemoveSchedule(ctx context.Context, name, id string) error {
	return onErr(r, ctx, name, func(svc session.Service, ctx context.Context) error { return svc.RemoveSchedule(ctx, name, id) })
}

// Open opens a file handle on the session's owner (the socket client has
// none: a remote session's says ErrUnsupported).
func (r *Router) Open(ctx context.Context, name, path string, flags int, perm fs.FileMode) (session.File, error) {
	return on(r, ctx, name, func(svc session.Service, ctx context.Context) (session.File, error) {
		return svc.Open(ctx, name, path, flags, perm)
	})
}

func (r *Router) Setstat(ctx context.Context, name, path string, a session.Attrs) error {
	return onErr(r, ctx, name, func(svc session.Service, ctx context.Context) error { return svc.Setstat(ctx, name, path, a) })
}

func (r *Router) StatFollow(ctx context.Context, name, path string) (session.FileInfo, error) {
	return on(r, ctx, name, func(svc session.Service, ctx context.Context) (session.FileInfo, error) {
		return svc.StatFollow(ctx, name, path)
	})
}

func (r *Router) Symlink(ctx context.Context, name, target, path string) error {
	return onErr(r, ctx, name, func(svc session.Service, ctx context.Context) error { return svc.Symlink(ctx, name, target, path) })
}

func (r *Router) Link(ctx context.Context, name, oldpath, newpath string) error {
	return onErr(r, ctx, name, func(svc session.Service, ctx context.Context) error { return svc.Link(ctx, name, oldpath, newpath) })
}

func (r *Router) Statfs(ctx context.Context, name, path string) (session.FSStat, error) {
	return on(r, ctx, name, func(svc session.Service, ctx context.Context) (session.FSStat, error) {
		return svc.Statfs(ctx, name, path)
	})
}

func (r *Router) Rmdir(ctx context.Context, name, path string) error {
	return onErr(r, ctx, name, func(svc session.Service, ctx context.Context) error { return svc.Rmdir(ctx, name, path) })
}

// Images are this host's: each host keeps its own (host ls lists which
// host has which).
func (r *Router) Images(ctx context.Context) ([]session.ImageInfo, error) {
	return r.cfg.Local.Images(ctx)
}

func (r *Router) BuildImage(ctx context.Context, req session.BuildRequest, progress func(session.BuildProgress)) (session.ImageInfo, error) {
	return r.cfg.Local.BuildImage(ctx, req, progress)
}

func (r *Router) ImportImage(ctx context.Context, req session.ImportRequest, src io.Reader, progress func(session.BuildProgress)) (session.ImageInfo, error) {
	return r.cfg.Local.ImportImage(ctx, req, src, progress)
}

func (r *Router) ExportImage(ctx context.Context, req session.ExportRequest, open func(session.ImageExport) (io.Writer, error), progress func(session.BuildProgress)) (session.ImageExport, error) {
	return r.cfg.Local.ExportImage(ctx, req, open, progress)
}

// CommitImage commits on the session's owner, where its system disk is:
// the image is that host's.
func (r *Router) CommitImage(ctx context.Context, req session.CommitRequest) (session.CommitResult, error) {
	if req.Session == "" {
		return r.cfg.Local.CommitImage(ctx, req)
	}
	return on(r, ctx, req.Session, func(svc session.Service, ctx context.Context) (session.CommitResult, error) {
		return svc.CommitImage(ctx, req)
	})
}

func (r *Router) RemoveImage(ctx context.Context, name string) error {
	return r.cfg.Local.RemoveImage(ctx, name)
}

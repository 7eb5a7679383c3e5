package sshd

import (
	"context"
	"fmt"
	"io/fs"

	"github.com/berthvm/berth/session"
)

// The guard's session.Handles, with the role table's entries for them:
// opening for reading, stats and the filesystem's figures are reads;
// opening for writing, attribute changes, links and rmdir need an
// operator. A guard always has these methods; when the service it wraps
// has no Handles they fail with errNoHandles.

// errNoHandles is a service that cannot open files (a socket client).
var errNoHandles = fmt.Errorf("this berth service cannot open files in sessions (sftp needs the daemon's own session manager): %w", session.ErrUnavailable)

// writeFlags are the open flags that change a file.
const writeFlags = session.OpenWrite | session.OpenAppend | session.OpenCreate | session.OpenTruncate | session.OpenExclusive

// Open is a read, or a write when flags would change the file; the file
// checks the role again on every write and setstat.
func (g *guard) Open(ctx context.Context, name, path string, flags int, perm fs.FileMode) (session.File, error) {
	o := session.ActionRead
	if flags&writeFlags != 0 {
		o = session.ActionWriteFile
	}
	ctx, err := g.enter(ctx, o)
	if err != nil {
		return nil, err
	}
	f, err := g.svc.Open(ctx, name, path, flags, perm)
	if err != nil {
		return nil, err
	}
	return &guardedFile{File: f, g: g}, nil
}

func (g *guard) Setstat(ctx context.Context, name, path string, a session.Attrs) error {
	return call0(g, ctx, session.ActionSetattr, func(ctx context.Context) error { return g.svc.Setstat(ctx, name, path, a) })
}

func (g *guard) StatFollow(ctx context.Context, name, path string) (session.FileInfo, error) {
	return call(g, ctx, session.ActionRead, func(ctx context.Context) (session.FileInfo, error) { return g.svc.StatFollow(ctx, name, path) })
}

func (g *guard) Symlink(ctx context.Context, name, target, path string) error {
	return call0(g, ctx, session.ActionLink, func(ctx context.Context) error { return g.svc.Symlink(ctx, name, target, path) })
}

func (g *guard) Link(ctx context.Context, name, oldpath, newpath string) error {
	return call0(g, ctx, session.ActionLink, func(ctx context.Context) error { return g.svc.Link(ctx, name, oldpath, newpath) })
}

func (g *guard) Statfs(ctx context.Context, name, path string) (session.FSStat, error) {
	return call(g, ctx, session.ActionRead, func(ctx context.Context) (session.FSStat, error) { return g.svc.Statfs(ctx, name, path) })
}

func (g *guard) Rmdir(ctx context.Context, name, path string) error {
	return call0(g, ctx, session.ActionRemoveFile, func(ctx context.Context) error { return g.svc.Rmdir(ctx, name, path) })
}

// guardedFile checks the caller's current role before each change to an
// open file, as guardedStdin does for input: writes and setstat stop at
// the first one after the key lost the right. Reads, Stat, Sync (which
// only makes durable what was written) and Close are always allowed.
type guardedFile struct {
	session.File
	g *guard
}

func (f *guardedFile) WriteAt(p []byte, off int64) (int, error) {
	if _, err := f.g.enter(context.Background(), session.ActionWriteFile); err != nil {
		return 0, err
	}
	return f.File.WriteAt(p, off)
}

func (f *guardedFile) Setstat(ctx context.Context, a session.Attrs) error {
	ctx, err := f.g.enter(ctx, session.ActionSetattr)
	if err != nil {
		return err
	}
	return f.File.Setstat(ctx, a)
}

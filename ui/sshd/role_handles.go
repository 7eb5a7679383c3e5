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

var _ session.Handles = (*guard)(nil)

// errNoHandles is a service that cannot open files (a socket client).
var errNoHandles = fmt.Errorf("this berth service cannot open files in sessions (sftp needs the daemon's own session manager): %w", session.ErrUnavailable)

func (g *guard) handles() (session.Handles, error) {
	h, ok := g.svc.(session.Handles)
	if !ok {
		return nil, errNoHandles
	}
	return h, nil
}

// writeFlags are the open flags that change a file.
const writeFlags = session.OpenWrite | session.OpenAppend | session.OpenCreate | session.OpenTruncate | session.OpenExclusive

// Open is a read, or a write when flags would change the file; the file
// checks the role again on every write and setstat.
func (g *guard) Open(ctx context.Context, name, path string, flags int, perm fs.FileMode) (session.File, error) {
	o := opRead
	if flags&writeFlags != 0 {
		o = opWriteFile
	}
	ctx, err := g.enter(ctx, o)
	if err != nil {
		return nil, err
	}
	h, err := g.handles()
	if err != nil {
		return nil, err
	}
	f, err := h.Open(ctx, name, path, flags, perm)
	if err != nil {
		return nil, err
	}
	return &guardedFile{File: f, g: g}, nil
}

func (g *guard) Setstat(ctx context.Context, name, path string, a session.Attrs) error {
	ctx, err := g.enter(ctx, opSetattr)
	if err != nil {
		return err
	}
	h, err := g.handles()
	if err != nil {
		return err
	}
	return h.Setstat(ctx, name, path, a)
}

func (g *guard) StatFollow(ctx context.Context, name, path string) (session.FileInfo, error) {
	ctx, err := g.enter(ctx, opRead)
	if err != nil {
		return session.FileInfo{}, err
	}
	h, err := g.handles()
	if err != nil {
		return session.FileInfo{}, err
	}
	return h.StatFollow(ctx, name, path)
}

func (g *guard) Symlink(ctx context.Context, name, target, path string) error {
	ctx, err := g.enter(ctx, opLink)
	if err != nil {
		return err
	}
	h, err := g.handles()
	if err != nil {
		return err
	}
	return h.Symlink(ctx, name, target, path)
}

func (g *guard) Link(ctx context.Context, name, oldpath, newpath string) error {
	ctx, err := g.enter(ctx, opLink)
	if err != nil {
		return err
	}
	h, err := g.handles()
	if err != nil {
		return err
	}
	return h.Link(ctx, name, oldpath, newpath)
}

func (g *guard) Statfs(ctx context.Context, name, path string) (session.FSStat, error) {
	ctx, err := g.enter(ctx, opRead)
	if err != nil {
		return session.FSStat{}, err
	}
	h, err := g.handles()
	if err != nil {
		return session.FSStat{}, err
	}
	return h.Statfs(ctx, name, path)
}

func (g *guard) Rmdir(ctx context.Context, name, path string) error {
	ctx, err := g.enter(ctx, opRemoveFile)
	if err != nil {
		return err
	}
	h, err := g.handles()
	if err != nil {
		return err
	}
	return h.Rmdir(ctx, name, path)
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
	if _, err := f.g.enter(context.Background(), opWriteFile); err != nil {
		return 0, err
	}
	return f.File.WriteAt(p, off)
}

func (f *guardedFile) Setstat(ctx context.Context, a session.Attrs) error {
	ctx, err := f.g.enter(ctx, opSetattr)
	if err != nil {
		return err
	}
	return f.File.Setstat(ctx, a)
}

package engine

import (
	"context"
	"errors"
	"io"
	"io/fs"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/session"
)

var _ session.Handles = (*Manager)(nil)

// Open opens a workspace file on the session's agent: the handle is one
// stream to the agent for its whole life (see guest.File). Nothing is
// recorded per call; an open file counts as activity, so an idle session
// holding one does not sleep.
func (m *Manager) Open(ctx context.Context, name, path string, flags int, perm fs.FileMode) (session.File, error) {
	s, c, err := m.sessAgent(name)
	if err != nil {
		return nil, err
	}
	gf, err := c.Open(ctx, path, flags, perm)
	if err != nil {
		return nil, agentErr(name, err)
	}
	s.files.Add(1)
	go func() { // ends with the File's stream: Close, ctx, or the VM gone
		<-gf.Done()
		s.files.Add(-1)
		s.touch()
	}()
	return &file{f: gf, s: s, name: name}, nil
}

// file is a File on the agent.
type file struct {
	f    *guest.File
	s    *sess
	name string
}

// err classes an error; io.EOF stays as it is for io.ReaderAt callers.
func (f *file) err(err error) error {
	switch {
	case err == nil, err == io.EOF:
		return err
	case errors.Is(err, fs.ErrClosed):
		return classed{session.ErrInvalid, err}
	}
	return agentErr(f.name, err)
}

func (f *file) ReadAt(p []byte, off int64) (int, error) {
	f.s.touch()
	n, err := f.f.ReadAt(p, off)
	return n, f.err(err)
}

func (f *file) WriteAt(p []byte, off int64) (int, error) {
	f.s.touch()
	n, err := f.f.WriteAt(p, off)
	return n, f.err(err)
}

func (f *file) Stat(ctx context.Context) (session.FileInfo, error) {
	fi, err := f.f.Stat(ctx)
	if err != nil {
		return session.FileInfo{}, f.err(err)
	}
	return fileInfo(fi), nil
}

func (f *file) Setstat(ctx context.Context, a session.Attrs) error {
	f.s.touch()
	return f.err(f.f.Setstat(ctx, guestAttrs(a)))
}

func (f *file) Sync(ctx context.Context) error {
	return f.err(f.f.Sync(ctx))
}

func (f *file) Close() error {
	f.s.touch()
	return f.err(f.f.Close())
}

func guestAttrs(a session.Attrs) guest.Attrs {
	g := guest.Attrs{Size: a.Size, Atime: a.Atime, Mtime: a.Mtime, UID: a.UID, GID: a.GID}
	if a.Mode != nil {
		m := uint32(*a.Mode)
		g.Mode = &m
	}
	return g
}

// Setstat changes a workspace path's attributes, following symlinks.
func (m *Manager) Setstat(ctx context.Context, name, path string, a session.Attrs) error {
	c, err := m.agentFor(name)
	if err != nil {
		return err
	}
	return agentErr(name, c.Setstat(ctx, path, guestAttrs(a)))
}

// StatFollow describes a workspace path, following symlinks.
func (m *Manager) StatFollow(ctx context.Context, name, path string) (session.FileInfo, error) {
	c, err := m.agentFor(name)
	if err != nil {
		return session.FileInfo{}, err
	}
	fi, err := c.StatFollow(ctx, path)
	if err != nil {
		return session.FileInfo{}, agentErr(name, err)
	}
	return fileInfo(fi), nil
}

// Symlink makes path a symlink to target, stored as given.
func (m *Manager) Symlink(ctx context.Context, name, target, path string) error {
	c, err := m.agentFor(name)
	if err != nil {
		return err
	}
	return agentErr(name, c.Symlink(ctx, target, path))
}

// Link makes newpath a hard link to oldpath.
func (m *Manager) Link(ctx context.Context, name, oldpath, newpath string) error {
	c, err := m.agentFor(name)
	if err != nil {
		return err
	}
	return agentErr(name, c.Link(ctx, oldpath, newpath))
}

// Statfs reports the figures of the filesystem holding path.
func (m *Manager) Statfs(ctx context.Context, name, path string) (session.FSStat, error) {
	c, err := m.agentFor(name)
	if err != nil {
		return session.FSStat{}, err
	}
	st, err := c.Statfs(ctx, path)
	if err != nil {
		return session.FSStat{}, agentErr(name, err)
	}
	return session.FSStat{
		BlockSize: st.BlockSize, FragmentSize: st.FragmentSize,
		Blocks: st.Blocks, BlocksFree: st.BlocksFree, BlocksAvail: st.BlocksAvail,
		Files: st.Files, FilesFree: st.FilesFree, FilesAvail: st.FilesAvail,
		FSID: st.FSID, Flags: st.Flags, NameMax: st.NameMax,
	}, nil
}

// Rmdir removes an empty workspace directory.
func (m *Manager) Rmdir(ctx context.Context, name, path string) error {
	c, err := m.agentFor(name)
	if err != nil {
		return err
	}
	return agentErr(name, c.Rmdir(ctx, path))
}

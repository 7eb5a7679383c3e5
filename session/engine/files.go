package engine

import (
	"context"
	"io"
	"io/fs"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/session"
)

// agentFor returns the agent of a running session, for file calls.
func (m *Manager) agentFor(name string) (*guest.Client, error) {
	_, c, err := m.sessAgent(name)
	return c, err
}

// sessAgent is agentFor that returns the session too.
func (m *Manager) sessAgent(name string) (*sess, *guest.Client, error) {
	return m.awakeAgent(context.Background(), name, session.ActionFiles)
}

// awakeAgent is the agent of session name for action, woken first if it
// sleeps; the action is checked again after the wake, since the state
// may have changed while it waited.
func (m *Manager) awakeAgent(ctx context.Context, name string, action session.Action) (*sess, *guest.Client, error) {
	s, err := m.get(name)
	if err != nil {
		return nil, nil, err
	}
	if err := s.check(action); err != nil {
		return nil, nil, err
	}
	if err := m.ensureAwake(ctx, s); err != nil {
		return nil, nil, err
	}
	if err := s.check(action); err != nil {
		return nil, nil, err
	}
	s.touch()
	c, err := s.connectedAgent()
	return s, c, err
}

func fileInfo(fi guest.FileInfo) session.FileInfo {
	return session.FileInfo{Name: fi.Name, Size: fi.Size, Mode: fs.FileMode(fi.Mode), ModTime: fi.ModTime, Link: fi.Link}
}

// ListDir lists a workspace directory.
func (m *Manager) ListDir(ctx context.Context, name, path string) ([]session.FileInfo, error) {
	c, err := m.agentFor(name)
	if err != nil {
		return nil, err
	}
	l, err := c.List(ctx, path)
	if err != nil {
		return nil, agentErr(name, err)
	}
	out := make([]session.FileInfo, len(l))
	for i, fi := range l {
		out[i] = fileInfo(fi)
	}
	return out, nil
}

// Stat describes a workspace path.
func (m *Manager) Stat(ctx context.Context, name, path string) (session.FileInfo, error) {
	c, err := m.agentFor(name)
	if err != nil {
		return session.FileInfo{}, err
	}
	fi, err := c.Stat(ctx, path)
	if err != nil {
		return session.FileInfo{}, agentErr(name, err)
	}
	return fileInfo(fi), nil
}

// ReadFile streams a workspace file.
func (m *Manager) ReadFile(ctx context.Context, name, path string) (io.ReadCloser, error) {
	c, err := m.agentFor(name)
	if err != nil {
		return nil, err
	}
	r, err := c.ReadFile(ctx, path)
	if err != nil {
		return nil, agentErr(name, err)
	}
	return r, nil
}

// WriteFile replaces a workspace file durably: it returns once the bytes
// are on the workspace volume and survive a VM crash.
func (m *Manager) WriteFile(ctx context.Context, name, path string, r io.Reader) (int64, error) {
	c, err := m.agentFor(name)
	if err != nil {
		return 0, err
	}
	runID, err := m.useRun(ctx, name)
	if err != nil {
		return 0, err
	}
	n, err := c.WriteFile(ctx, path, r, 0)
	if err == nil {
		m.addRunBytes(runID, n)
	}
	return n, agentErr(name, err)
}

// Mkdir creates a directory and its parents.
func (m *Manager) Mkdir(ctx context.Context, name, path string) error {
	c, err := m.agentFor(name)
	if err != nil {
		return err
	}
	return agentErr(name, c.Mkdir(ctx, path, true))
}

// Remove removes a file or a directory tree.
func (m *Manager) Remove(ctx context.Context, name, path string) error {
	c, err := m.agentFor(name)
	if err != nil {
		return err
	}
	return agentErr(name, c.Remove(ctx, path, true))
}

// Rename renames within the workspace.
func (m *Manager) Rename(ctx context.Context, name, from, to string) error {
	c, err := m.agentFor(name)
	if err != nil {
		return err
	}
	return agentErr(name, c.Rename(ctx, from, to))
}

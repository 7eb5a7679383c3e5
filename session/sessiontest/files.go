package sessiontest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"path"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/session"
)

// node is a file, directory or symlink in a fake workspace.
type node struct {
	dir      bool
	data     []byte
	link     string // symlink target, when mode has fs.ModeSymlink
	mode     fs.FileMode
	mtime    time.Time
	children map[string]*node
}

func (n *node) isLink() bool { return n.mode&fs.ModeSymlink != 0 }

func newDir(now time.Time) *node {
	return &node{dir: true, mode: fs.ModeDir | 0o755, mtime: now, children: map[string]*node{}}
}

// cleanPath turns a workspace path (relative to /workspace, or absolute
// under it) into a slash-separated relative path, "" for the root.
func cleanPath(p string) (string, error) {
	full := p
	if !path.IsAbs(p) {
		full = "/workspace/" + p
	}
	full = path.Clean(full)
	if full == "/workspace" {
		return "", nil
	}
	if !strings.HasPrefix(full, "/workspace/") {
		e := session.OutsideWorkspace(p)
		e.Err = guest.ErrEscape
		return "", e
	}
	return strings.TrimPrefix(full, "/workspace/"), nil
}

// lookup finds p, following symlinks on the way but not p itself (as
// lstat); it returns the node and p's cleaned relative path.
func (s *fakeSession) lookup(p string) (*node, string, error) {
	return s.find(p, false)
}

// find is lookup that follows p itself too when followLast is set.
func (s *fakeSession) find(p string, followLast bool) (*node, string, error) {
	rel, err := cleanPath(p)
	if err != nil {
		return nil, "", err
	}
	n, _, err := s.resolve(rel, followLast)
	return n, rel, err
}

// maxLinks bounds the symlinks followed for one path, as Linux does.
const maxLinks = 40

// resolve walks rel from the workspace root, following symlinks on the
// way (and at its end when followLast), and returns the node and its
// real relative path. A symlink leading out of /workspace (absolute
// ones included: the guest resolves paths inside its /workspace root) is
// ErrInvalid, as the guest refuses it.
func (s *fakeSession) resolve(rel string, followLast bool) (*node, string, error) {
	parts := splitPath(rel)
	n, real, links := s.root, []string{}, 0
	for len(parts) > 0 {
		part := parts[0]
		parts = parts[1:]
		if !n.dir {
			return nil, "", withErrno(fmt.Errorf("%s: a parent is not a directory: %w", displayPath(rel), session.ErrInvalid), syscall.ENOTDIR)
		}
		c, ok := n.children[part]
		if !ok {
			return nil, "", withErrno(fmt.Errorf("%s: %w", displayPath(rel), session.ErrNotFound), syscall.ENOENT)
		}
		if c.isLink() && (len(parts) > 0 || followLast) {
			if links++; links > maxLinks {
				return nil, "", withErrno(fmt.Errorf("%s: too many levels of symlinks: %w", displayPath(rel), session.ErrInvalid), syscall.ELOOP)
			}
			to := path.Join(append(append([]string{"/workspace"}, real...), c.link)...)
			if path.IsAbs(c.link) || (to != "/workspace" && !strings.HasPrefix(to, "/workspace/")) {
				return nil, "", &session.Error{Class: session.ErrInvalid, Code: session.CodeEscape, Err: guest.ErrEscape,
					Msg: fmt.Sprintf("%s: symlink %s → %s leads out of /workspace", displayPath(rel), displayPath(path.Join(append(real, part)...)), c.link)}
			}
			parts = append(splitPath(strings.TrimPrefix(strings.TrimPrefix(to, "/workspace"), "/")), parts...)
			n, real = s.root, real[:0]
			continue
		}
		n, real = c, append(real, part)
	}
	return n, strings.Join(real, "/"), nil
}

func splitPath(rel string) []string {
	if rel == "" || rel == "." {
		return nil
	}
	return strings.Split(rel, "/")
}

// parent finds the directory that holds p and p's base name.
func (s *fakeSession) parent(p string) (*node, string, string, error) {
	rel, err := cleanPath(p)
	if err != nil {
		return nil, "", "", err
	}
	if rel == "" {
		return nil, "", "", fmt.Errorf("/workspace itself cannot be changed: %w", session.ErrInvalid)
	}
	dir, base := path.Split(rel)
	d, _, err := s.find(dir, true)
	if err != nil {
		return nil, "", "", fmt.Errorf("%s: parent directory: %w", displayPath(rel), err)
	}
	if !d.dir {
		return nil, "", "", withErrno(fmt.Errorf("%s: parent is not a directory: %w", displayPath(rel), session.ErrInvalid), syscall.ENOTDIR)
	}
	return d, base, rel, nil
}

func displayPath(rel string) string { return path.Join("/workspace", rel) }

func info(name string, n *node) session.FileInfo {
	if n.isLink() {
		return session.FileInfo{Name: name, Size: int64(len(n.link)), Mode: n.mode, ModTime: n.mtime, Link: n.link}
	}
	return session.FileInfo{Name: name, Size: int64(len(n.data)), Mode: n.mode, ModTime: n.mtime}
}

func (s *fakeSession) updateUsed() {
	var used func(*node) int64
	used = func(n *node) int64 {
		total := int64(len(n.data))
		for _, c := range n.children {
			total += used(c)
		}
		return total
	}
	s.info.WorkspaceUsed = used(s.root)
}

// files begins a call of method and runs do on a usable session under the
// lock.
func (f *Fake) files(ctx context.Context, method, name string, do func(s *fakeSession) error) error {
	if err := f.enter(ctx, method); err != nil {
		return err
	}
	return f.onUsable(ctx, name, do)
}

// onUsable runs do on a usable session under the lock.
func (f *Fake) onUsable(ctx context.Context, name string, do func(s *fakeSession) error) error {
	if err := f.checkOpen(ctx); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	s, err := f.usableLocked(ctx, name, session.ActionFiles)
	if err != nil {
		return err
	}
	return do(s)
}

// ListDir lists a directory, sorted by name.
func (f *Fake) ListDir(ctx context.Context, name, p string) ([]session.FileInfo, error) {
	var out []session.FileInfo
	err := f.files(ctx, "ListDir", name, func(s *fakeSession) error {
		n, rel, err := s.find(p, true)
		if err != nil {
			return err
		}
		if !n.dir {
			return fmt.Errorf("list %s: not a directory: %w", displayPath(rel), session.ErrInvalid)
		}
		out = make([]session.FileInfo, 0, len(n.children))
		for cname, c := range n.children {
			out = append(out, info(cname, c))
		}
		sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
		return nil
	})
	return out, err
}

// Stat describes one file; the root is named "workspace".
func (f *Fake) Stat(ctx context.Context, name, p string) (session.FileInfo, error) {
	var fi session.FileInfo
	err := f.files(ctx, "Stat", name, func(s *fakeSession) error {
		n, rel, err := s.lookup(p)
		if err != nil {
			return err
		}
		fi = info(path.Base(displayPath(rel)), n)
		return nil
	})
	return fi, err
}

// ReadFile returns a snapshot of a file's content.
func (f *Fake) ReadFile(ctx context.Context, name, p string) (io.ReadCloser, error) {
	var data []byte
	err := f.files(ctx, "ReadFile", name, func(s *fakeSession) error {
		n, rel, err := s.find(p, true)
		if err != nil {
			return err
		}
		if n.dir {
			return fmt.Errorf("read %s: is a directory: %w", displayPath(rel), session.ErrInvalid)
		}
		data = bytes.Clone(n.data) // a snapshot: open Files write in place
		return nil
	})
	if err != nil {
		return nil, err
	}
	return io.NopCloser(bytes.NewReader(data)), nil
}

// WriteFile replaces a file atomically with r's content: on any error the
// old content stays. The parent directory must exist.
func (f *Fake) WriteFile(ctx context.Context, name, p string, r io.Reader) (int64, error) {
	check := func(s *fakeSession) error {
		d, base, rel, err := s.parent(p)
		if err != nil {
			return err
		}
		if c, ok := d.children[base]; ok && c.dir {
			return fmt.Errorf("write %s: is a directory: %w", displayPath(rel), session.ErrInvalid)
		}
		return nil
	}
	if err := f.files(ctx, "WriteFile", name, check); err != nil {
		return 0, err
	}
	var buf bytes.Buffer
	if _, err := io.Copy(&buf, ctxReader{ctx, r}); err != nil {
		return 0, fmt.Errorf("write %s: reading content: %w", p, err)
	}
	err := f.onUsable(ctx, name, func(s *fakeSession) error {
		if err := check(s); err != nil {
			return err
		}
		run, err := f.useRunLocked(ctx, name)
		if err != nil {
			return err
		}
		d, base, rel, _ := s.parent(p)
		old := int64(0)
		if c, ok := d.children[base]; ok {
			old = int64(len(c.data))
		}
		if s.info.WorkspaceUsed-old+int64(buf.Len()) > s.info.DiskBytes {
			return fmt.Errorf("write %s: no space left on the workspace volume", displayPath(rel))
		}
		d.children[base] = &node{data: buf.Bytes(), mode: 0o644, mtime: f.now()}
		d.mtime = f.now()
		s.updateUsed()
		if run != nil {
			run.BytesWritten += int64(buf.Len())
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return int64(buf.Len()), nil
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(b []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(b)
}

// Mkdir creates a directory and any missing parents; an existing directory
// is fine, an existing file is ErrExists.
func (f *Fake) Mkdir(ctx context.Context, name, p string) error {
	return f.files(ctx, "Mkdir", name, func(s *fakeSession) error {
		rel, err := cleanPath(p)
		if err != nil {
			return err
		}
		n := s.root
		for i, part := range strings.Split(rel, "/") {
			if part == "" {
				continue
			}
			c, ok := n.children[part]
			if !ok {
				c = newDir(f.now())
				n.children[part] = c
				n.mtime = f.now()
			} else if !c.dir {
				sofar := strings.Join(strings.Split(rel, "/")[:i+1], "/")
				return fmt.Errorf("mkdir %s: %s is a file: %w", displayPath(rel), displayPath(sofar), session.ErrExists)
			}
			n = c
		}
		return nil
	})
}

// Remove deletes a file, or a directory with everything in it.
func (f *Fake) Remove(ctx context.Context, name, p string) error {
	return f.files(ctx, "Remove", name, func(s *fakeSession) error {
		d, base, rel, err := s.parent(p)
		if err != nil {
			return err
		}
		if _, ok := d.children[base]; !ok {
			return fmt.Errorf("remove %s: %w", displayPath(rel), session.ErrNotFound)
		}
		delete(d.children, base)
		d.mtime = f.now()
		s.updateUsed()
		return nil
	})
}

// Rename moves from to to, replacing a file at to; a directory at to is
// ErrExists.
func (f *Fake) Rename(ctx context.Context, name, from, to string) error {
	return f.files(ctx, "Rename", name, func(s *fakeSession) error {
		fd, fbase, frel, err := s.parent(from)
		if err != nil {
			return err
		}
		n, ok := fd.children[fbase]
		if !ok {
			return fmt.Errorf("rename %s: %w", displayPath(frel), session.ErrNotFound)
		}
		td, tbase, trel, err := s.parent(to)
		if err != nil {
			return err
		}
		if trel == frel {
			return nil
		}
		if n.dir && strings.HasPrefix(trel+"/", frel+"/") {
			return fmt.Errorf("rename %s to %s: cannot move a directory into itself: %w", displayPath(frel), displayPath(trel), session.ErrInvalid)
		}
		if c, ok := td.children[tbase]; ok && c.dir {
			return fmt.Errorf("rename %s: %s is a directory: %w", displayPath(frel), displayPath(trel), session.ErrExists)
		}
		delete(fd.children, fbase)
		td.children[tbase] = n
		fd.mtime, td.mtime = f.now(), f.now()
		return nil
	})
}

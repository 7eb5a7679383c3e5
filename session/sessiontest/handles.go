package sessiontest

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/session"
)

// The fake's session.Handles: open Files on the in-memory tree, with the
// staging the real agent does (a file opened to create and truncate it,
// not exclusively, is written aside and put under its name at Close) and
// its errors: an errno-named guest error in a session class, as the
// Manager returns them.

var _ session.Handles = (*Fake)(nil)

// withErrno gives a fake error the errno (or guest error) the agent would
// report beside its class, keeping its text.
func withErrno(err, errno error) error { return errnoErr{err, errno} }

type errnoErr struct{ err, errno error }

func (e errnoErr) Error() string   { return e.err.Error() }
func (e errnoErr) Unwrap() []error { return []error{e.err, e.errno} }

// classedErr gives an agent error a session class without changing its
// text, as the Manager does.
type classedErr struct{ class, err error }

func (c classedErr) Error() string   { return c.err.Error() }
func (c classedErr) Unwrap() []error { return []error{c.class, c.err} }

// strerror is what the guest's libc says for the codes the fake reports.
var strerror = map[string]string{
	"ENOENT":         "no such file or directory",
	"EEXIST":         "file exists",
	"EISDIR":         "is a directory",
	"ENOTDIR":        "not a directory",
	"ENOTEMPTY":      "directory not empty",
	"EINVAL":         "invalid argument",
	"ENOSPC":         "no space left on device",
	"EBADF":          "bad file descriptor",
	"EPERM":          "operation not permitted",
	"EBUSY":          "device or resource busy",
	guest.CodeEscape: "path escapes from parent",
}

// agentError is the error the Manager returns when the agent reports
// code for op on rel (relative to /workspace) in session name.
func agentError(name, code, op, rel string) error {
	ge := &guest.Error{Code: code, Op: op, Path: displayPath(rel), Message: strerror[code]}
	var class error
	switch code {
	case "ENOENT":
		class = session.ErrNotFound
	case "EEXIST":
		class = session.ErrExists
	case "ENOSPC":
		return &session.Error{Class: session.ErrConflict, Code: code, Msg: fmt.Sprintf("workspace of %q is full: %v", name, ge),
			Hint: "free space in it, or create a session with a larger disk", Err: ge}
	case "EISDIR", "ENOTDIR", "ENOTEMPTY", "EINVAL", "EBUSY", guest.CodeEscape:
		class = session.ErrInvalid
	case "EPERM":
		class = session.ErrPermission
	}
	if code == guest.CodeEscape {
		code = session.CodeEscape
	}
	return &session.Error{Class: class, Code: code, Msg: ge.Error(), Err: ge}
}

// fakeFile is an open File. Its fields after ctx are guarded by Fake.mu.
type fakeFile struct {
	f    *Fake
	s    *fakeSession
	name string // session
	rel  string // as opened, relative to /workspace
	ctx  context.Context
	stop func() bool // the release on ctx's end

	read, write, append bool

	n      *node // what is read and written: the tree's node, or the staged one
	staged bool
	dir    *node  // staged: the directory Close puts n in…
	base   string // …under this name
	closed bool
}

// Open opens path (following symlinks inside /workspace) with flags
// (session.Open*) and, when it creates the file, perm less the guest's
// umask 022.
func (f *Fake) Open(ctx context.Context, name, p string, flags int, perm fs.FileMode) (session.File, error) {
	var ff *fakeFile
	err := f.files(ctx, "Open", name, func(s *fakeSession) error {
		var err error
		ff, err = f.openLocked(ctx, s, name, p, flags, perm)
		return err
	})
	if err != nil {
		return nil, err
	}
	ff.stop = context.AfterFunc(ctx, func() { // the caller went away: released, never committed
		f.mu.Lock()
		defer f.mu.Unlock()
		ff.releaseLocked()
	})
	return ff, nil
}

const openFlags = session.OpenRead | session.OpenWrite | session.OpenAppend | session.OpenCreate | session.OpenTruncate | session.OpenExclusive

func (f *Fake) openLocked(ctx context.Context, s *fakeSession, name, p string, flags int, perm fs.FileMode) (*fakeFile, error) {
	rel, err := cleanPath(p)
	if err != nil {
		return nil, err
	}
	if flags&^openFlags != 0 || flags&(session.OpenRead|session.OpenWrite) == 0 {
		return nil, agentError(name, "EINVAL", "open", rel)
	}
	ff := &fakeFile{f: f, s: s, name: name, rel: rel, ctx: ctx,
		read: flags&session.OpenRead != 0, write: flags&session.OpenWrite != 0, append: flags&session.OpenAppend != 0}
	writing := ff.write || flags&session.OpenTruncate != 0
	create, excl := flags&session.OpenCreate != 0, flags&session.OpenExclusive != 0

	var n *node
	var d *node
	var base string
	if rel == "" {
		n = s.root
	} else {
		if d, base, _, err = s.parent(p); err != nil {
			return nil, err
		}
		n = d.children[base]
		if n != nil && n.isLink() {
			if create && excl {
				return nil, agentError(name, "EEXIST", "open", rel)
			}
			// Follow it: the file opened (or staged) is its target.
			var real string
			if n, real, err = s.resolve(rel, true); err != nil {
				return nil, err
			}
			if d, base = nil, ""; real != "" {
				if d, base, _, err = s.parent(real); err != nil {
					return nil, err
				}
			}
		}
	}
	switch {
	case n == nil && !create:
		return nil, agentError(name, "ENOENT", "open", rel)
	case n != nil && create && excl:
		return nil, agentError(name, "EEXIST", "open", rel)
	case n != nil && n.dir && writing:
		return nil, agentError(name, "EISDIR", "open", rel)
	}
	now := f.now()
	mode := perm & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky) &^ 0o022
	switch {
	case session.Staged(flags):
		// Staged: written aside; the name keeps what it has until Close.
		if n != nil {
			mode = n.mode // replacing a file keeps its mode, as truncating it would
		}
		ff.n, ff.staged, ff.dir, ff.base = &node{mode: mode, mtime: now}, true, d, base
	case n == nil:
		ff.n = &node{mode: mode, mtime: now}
		d.children[base] = ff.n
		d.mtime = now
	default:
		ff.n = n
		if flags&session.OpenTruncate != 0 && len(n.data) > 0 {
			s.info.WorkspaceUsed -= int64(len(n.data))
			n.data, n.mtime = nil, now
		}
	}
	if s.open == nil {
		s.open = map[*fakeFile]struct{}{}
	}
	s.open[ff] = struct{}{}
	return ff, nil
}

// releaseLocked ends ff without committing it.
func (ff *fakeFile) releaseLocked() {
	ff.closed = true
	delete(ff.s.open, ff)
}

// do runs one call on ff as method under the lock, after the checks
// every call makes: the session usable, ff open and not released.
func (ff *fakeFile) do(method string, fn func(s *fakeSession) error) error {
	if err := ff.f.enter(ff.ctx, method); err != nil {
		return err
	}
	return ff.f.onUsable(ff.ctx, ff.name, func(s *fakeSession) error {
		if ff.closed {
			return fmt.Errorf("%s: %w (the file is closed: %w)", displayPath(ff.rel), session.ErrInvalid, fs.ErrClosed)
		}
		return fn(s)
	})
}

// stagedBytes is what open staged files hold: it counts against the
// volume before it lands.
func (s *fakeSession) stagedBytes() int64 {
	var n int64
	for ff := range s.open {
		if ff.staged {
			n += int64(len(ff.n.data))
		}
	}
	return n
}

// resize makes n size bytes long (zeros when it grows); false means it
// would not fit on the volume. A staged node's bytes are not in the
// workspace's use until it lands.
func (s *fakeSession) resize(n *node, size int64, staged bool) bool {
	grow := size - int64(len(n.data))
	if grow > 0 && s.info.WorkspaceUsed+s.stagedBytes()+grow > s.info.DiskBytes {
		return false
	}
	if size <= int64(cap(n.data)) {
		n.data = n.data[:size]
		if grow > 0 {
			clear(n.data[size-grow:])
		}
	} else {
		data := make([]byte, size, max(size, 2*int64(cap(n.data))))
		copy(data, n.data)
		n.data = data
	}
	if !staged {
		s.info.WorkspaceUsed += grow
	}
	return true
}

func (ff *fakeFile) ReadAt(p []byte, off int64) (int, error) {
	var n int
	err := ff.do("File.ReadAt", func(*fakeSession) error {
		switch {
		case !ff.read:
			return agentError(ff.name, "EBADF", "read", ff.rel)
		case ff.n.dir:
			return agentError(ff.name, "EISDIR", "read", ff.rel)
		case off < 0:
			return agentError(ff.name, "EINVAL", "read", ff.rel)
		case off >= int64(len(ff.n.data)):
			return io.EOF
		}
		n = copy(p, ff.n.data[off:])
		if n < len(p) {
			return io.EOF
		}
		return nil
	})
	return n, err
}

func (ff *fakeFile) WriteAt(p []byte, off int64) (int, error) {
	err := ff.do("File.WriteAt", func(s *fakeSession) error {
		switch {
		case !ff.write:
			return agentError(ff.name, "EBADF", "write", ff.rel)
		case off < 0:
			return agentError(ff.name, "EINVAL", "write", ff.rel)
		}
		n := ff.n
		if ff.append {
			off = int64(len(n.data))
		}
		if end := off + int64(len(p)); end > int64(len(n.data)) {
			if !s.resize(n, end, ff.staged) {
				return agentError(ff.name, "ENOSPC", "write", ff.rel)
			}
		}
		copy(n.data[off:], p)
		n.mtime = ff.f.now()
		return nil
	})
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

func (ff *fakeFile) Stat(ctx context.Context) (session.FileInfo, error) {
	var fi session.FileInfo
	err := ff.do("File.Stat", func(*fakeSession) error {
		fi = info(path.Base(displayPath(ff.rel)), ff.n)
		return nil
	})
	return fi, err
}

func (ff *fakeFile) Setstat(ctx context.Context, a session.Attrs) error {
	return ff.do("File.Setstat", func(s *fakeSession) error {
		if a.Size != nil && !ff.write {
			return agentError(ff.name, "EINVAL", "truncate", ff.rel) // ftruncate on a read-only descriptor
		}
		return ff.f.setattrLocked(s, ff.n, ff.staged, ff.rel, a)
	})
}

// Sync has nothing to make durable in memory; it checks what the agent
// would.
func (ff *fakeFile) Sync(ctx context.Context) error {
	return ff.do("File.Sync", func(*fakeSession) error { return nil })
}

// Close releases ff; a staged file lands under its name now (replacing
// what is there, unless that is a directory: then nothing lands).
func (ff *fakeFile) Close() error {
	err := ff.do("File.Close", func(s *fakeSession) error {
		ff.releaseLocked()
		if !ff.staged {
			return nil
		}
		if c := ff.dir.children[ff.base]; c != nil && c.dir {
			return agentError(ff.name, "EISDIR", "rename", ff.rel)
		}
		ff.dir.children[ff.base] = ff.n
		ff.dir.mtime = ff.f.now()
		s.updateUsed()
		return nil
	})
	if ff.stop != nil {
		ff.stop()
	}
	// Released whatever happened (a Close that failed commits nothing).
	ff.f.mu.Lock()
	ff.releaseLocked()
	ff.f.mu.Unlock()
	return err
}

// setattrLocked applies a to n (staged: an open File's, outside the
// tree).
func (f *Fake) setattrLocked(s *fakeSession, n *node, staged bool, rel string, a session.Attrs) error {
	name := s.info.Name
	if a.Size != nil {
		switch {
		case n.dir:
			return agentError(name, "EISDIR", "truncate", rel)
		case *a.Size < 0:
			return agentError(name, "EINVAL", "truncate", rel)
		}
		if !s.resize(n, *a.Size, staged) {
			return agentError(name, "ENOSPC", "truncate", rel)
		}
		n.mtime = f.now()
	}
	if (a.UID != nil && *a.UID < -1) || (a.GID != nil && *a.GID < -1) {
		return agentError(name, "EINVAL", "chown", rel)
	}
	// Ownership: the agent runs as root and may give files away; the
	// fake keeps no owners.
	if a.Mode != nil {
		keep := fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky
		n.mode = n.mode&^keep | *a.Mode&keep
	}
	if a.Mtime != nil {
		n.mtime = *a.Mtime
	}
	return nil
}

// Setstat changes path's attributes, following symlinks (as chmod,
// truncate and utimes do).
func (f *Fake) Setstat(ctx context.Context, name, p string, a session.Attrs) error {
	return f.files(ctx, "Setstat", name, func(s *fakeSession) error {
		n, rel, err := s.find(p, true)
		if err != nil {
			return err
		}
		return f.setattrLocked(s, n, false, rel, a)
	})
}

// StatFollow describes path, following a final symlink.
func (f *Fake) StatFollow(ctx context.Context, name, p string) (session.FileInfo, error) {
	var fi session.FileInfo
	err := f.files(ctx, "StatFollow", name, func(s *fakeSession) error {
		n, rel, err := s.find(p, true)
		if err != nil {
			return err
		}
		fi = info(path.Base(displayPath(rel)), n)
		return nil
	})
	return fi, err
}

// Symlink creates path as a symlink to target, which must stay inside
// /workspace (absolute targets under it are kept as they are).
func (f *Fake) Symlink(ctx context.Context, name, target, p string) error {
	return f.files(ctx, "Symlink", name, func(s *fakeSession) error {
		d, base, rel, err := s.parent(p)
		if err != nil {
			return err
		}
		if _, ok := d.children[base]; ok {
			return agentError(name, "EEXIST", "symlink", rel)
		}
		if target == "" || strings.IndexByte(target, 0) >= 0 {
			return agentError(name, "ENOENT", "symlink", rel)
		}
		to := target
		if !path.IsAbs(to) {
			to = path.Join("/workspace", path.Dir(rel), to)
		}
		if to = path.Clean(to); to != "/workspace" && !strings.HasPrefix(to, "/workspace/") {
			return agentError(name, guest.CodeEscape, "symlink", rel)
		}
		d.children[base] = &node{mode: fs.ModeSymlink | 0o777, link: target, mtime: f.now()}
		d.mtime = f.now()
		return nil
	})
}

// Link makes newpath a hard link to oldpath (a symlink itself, not its
// target; never a directory).
func (f *Fake) Link(ctx context.Context, name, oldpath, newpath string) error {
	return f.files(ctx, "Link", name, func(s *fakeSession) error {
		n, orel, err := s.lookup(oldpath)
		if err != nil {
			return err
		}
		if n.dir {
			return agentError(name, "EPERM", "link", orel)
		}
		d, base, rel, err := s.parent(newpath)
		if err != nil {
			return err
		}
		if _, ok := d.children[base]; ok {
			return agentError(name, "EEXIST", "link", rel)
		}
		d.children[base] = n
		d.mtime = f.now()
		return nil
	})
}

// Statfs reports the workspace volume's figures (path must exist).
func (f *Fake) Statfs(ctx context.Context, name, p string) (session.FSStat, error) {
	var st session.FSStat
	err := f.files(ctx, "Statfs", name, func(s *fakeSession) error {
		if _, _, err := s.find(p, true); err != nil {
			return err
		}
		const bs = 4096
		total := uint64(max(s.info.DiskBytes, 0)) / bs
		used := uint64(max(s.info.WorkspaceUsed+s.stagedBytes(), 0)+bs-1) / bs
		free := total - min(used, total)
		st = session.FSStat{
			BlockSize: bs, FragmentSize: bs,
			Blocks: total, BlocksFree: free, BlocksAvail: free,
			Files: 1 << 20, FilesFree: 1<<20 - 1, FilesAvail: 1<<20 - 1,
			FSID: 0xbe27, NameMax: 255,
		}
		return nil
	})
	return st, err
}

// Rmdir removes an empty directory.
func (f *Fake) Rmdir(ctx context.Context, name, p string) error {
	return f.files(ctx, "Rmdir", name, func(s *fakeSession) error {
		rel, err := cleanPath(p)
		if err != nil {
			return err
		}
		if rel == "" {
			return agentError(name, "EBUSY", "rmdir", rel)
		}
		d, base, rel, err := s.parent(p)
		if err != nil {
			return err
		}
		c, ok := d.children[base]
		switch {
		case !ok:
			return agentError(name, "ENOENT", "rmdir", rel)
		case !c.dir:
			return agentError(name, "ENOTDIR", "rmdir", rel)
		case len(c.children) > 0:
			return agentError(name, "ENOTEMPTY", "rmdir", rel)
		}
		delete(d.children, base)
		d.mtime = f.now()
		return nil
	})
}

// OpenFiles is how many Files are open on session name now (0 for a
// session that does not exist): tests wait on it to see a server release
// the handles its client left open.
func (f *Fake) OpenFiles(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s, ok := f.sessions[name]; ok {
		return len(s.open)
	}
	return 0
}

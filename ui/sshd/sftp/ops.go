package sftp

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"

	"github.com/berthvm/berth/session"
)

// wsPath confines a client path to /workspace: relative paths (and "" or
// ".") are taken from /workspace, absolute ones must lie under it.
// Anything else is PERMISSION_DENIED, as a chroot would refuse it; the
// result is absolute and clean.
func wsPath(p string) (string, error) {
	if strings.IndexByte(p, 0) >= 0 {
		return "", status(fxBadMessage, "path %q has a NUL byte", p)
	}
	if !path.IsAbs(p) {
		p = workspace + "/" + p
	}
	p = path.Clean(p)
	if p != workspace && !strings.HasPrefix(p, workspace+"/") {
		return "", status(fxPermissionDenied, "%s is outside %s; only the session's workspace is served", p, workspace)
	}
	return p, nil
}

// pathArg reads and confines a path field.
func pathArg(d *decoder) (string, error) {
	p := d.str()
	if d.err != nil {
		return "", status(fxBadMessage, "malformed request: %v", d.err)
	}
	return wsPath(p)
}

func (c *conn) mutating() error {
	if c.srv.ReadOnly {
		return errReadOnly
	}
	return nil
}

// handleReply is a HANDLE reply.
func handleReply(id uint32, h string) []byte {
	e := newEncoder(fxpHandle, 8+len(h))
	e.u32(id)
	e.str(h)
	return e.finish()
}

func attrsReply(id uint32, fi session.FileInfo) []byte {
	e := newEncoder(fxpAttrs, 40)
	e.u32(id)
	e.attrs(fileAttrs(fi))
	return e.finish()
}

// nameReply is a NAME reply with one name and no attributes (REALPATH,
// READLINK), the name as its long name too, as OpenSSH sends it.
func nameReply(id uint32, name string) []byte {
	e := newEncoder(fxpName, 16+2*len(name))
	e.u32(id)
	e.u32(1)
	e.str(name)
	e.str(name)
	e.attrs(wireAttrs{})
	return e.finish()
}

// addHandle registers h under a fresh id.
func (c *conn) addHandle(h *handle) string {
	c.nextID++
	h.id = strconv.FormatUint(c.nextID, 10)
	c.handles[h.id] = h
	return h.id
}

func (c *conn) tooManyHandles() error {
	if len(c.handles) >= c.maxOpen {
		return status(fxFailure, "too many open handles (the limit is %d per connection); close some first", c.maxOpen)
	}
	return nil
}

// openFlags maps OPEN's pflags onto session.Open's, as OpenSSH's
// flags_from_portable maps them onto open(2)'s: READ and WRITE pick the
// access (neither means read), the rest pass through.
func openFlags(pflags uint32) int {
	var f int
	if pflags&fxfRead != 0 || pflags&fxfWrite == 0 {
		f |= session.OpenRead
	}
	if pflags&fxfWrite != 0 {
		f |= session.OpenWrite
	}
	if pflags&fxfAppend != 0 {
		f |= session.OpenAppend
	}
	if pflags&fxfCreat != 0 {
		f |= session.OpenCreate
	}
	if pflags&fxfTrunc != 0 {
		f |= session.OpenTruncate
	}
	if pflags&fxfExcl != 0 {
		f |= session.OpenExclusive
	}
	return f
}

// open serves OPEN.
func (c *conn) open(id uint32, d *decoder) ([]byte, error) {
	p, err := pathArg(d)
	pflags := d.u32()
	a := d.attrs()
	if err != nil || d.err != nil {
		return nil, err
	}
	if c.srv.ReadOnly && pflags&(fxfWrite|fxfAppend|fxfCreat|fxfTrunc|fxfExcl) != 0 {
		return nil, errReadOnly
	}
	if err := c.tooManyHandles(); err != nil {
		return nil, err
	}
	perm := fs.FileMode(0o666)
	if a.flags&attrPermissions != 0 {
		perm = permMode(a.perm)
	}
	flags := openFlags(pflags)
	hctx, cancel := context.WithCancel(c.keep)
	f, err := c.srv.Handles.Open(hctx, c.srv.Name, p, flags, perm)
	if err != nil {
		cancel()
		return nil, err
	}
	h := &handle{
		path: p, file: f, cancel: cancel,
		read:   flags&session.OpenRead != 0,
		write:  pflags&fxfWrite != 0, // APPEND alone opens read-only, as open(2) would
		append: flags&session.OpenAppend != 0,
		staged: session.Staged(flags),
	}
	hid := c.addHandle(h)
	if h.staged {
		c.staged[p] = h
	}
	return handleReply(id, hid), nil
}

// close serves CLOSE: a staged upload lands under its name now, durably,
// or the close fails and nothing does.
func (c *conn) close(d *decoder) error {
	hb := d.bytes()
	if d.err != nil {
		return nil // reported as malformed
	}
	h, ok := c.handles[string(hb)]
	if !ok {
		return errBadHandle
	}
	delete(c.handles, h.id)
	if c.staged[h.path] == h {
		delete(c.staged, h.path)
	}
	if h.file == nil {
		return nil
	}
	defer h.cancel()
	if h.discard {
		return nil // removed while open: dropped, never lands
	}
	if err := h.file.Close(); err != nil {
		return fmt.Errorf("close %s: %w", h.path, err)
	}
	return nil
}

// stagedAt is this stream's open staged upload of p, if any.
func (c *conn) stagedAt(p string) *handle {
	if h := c.staged[p]; h != nil && !h.discard {
		return h
	}
	return nil
}

// stat serves LSTAT and STAT (which follows a final symlink).
func (c *conn) stat(id uint32, d *decoder, follow bool) ([]byte, error) {
	p, err := pathArg(d)
	if err != nil {
		return nil, err
	}
	var fi session.FileInfo
	switch h := c.stagedAt(p); {
	case h != nil:
		fi, err = h.file.Stat(c.ctx)
	case follow:
		fi, err = c.srv.Handles.StatFollow(c.ctx, c.srv.Name, p)
	default:
		fi, err = c.srv.Files.Stat(c.ctx, c.srv.Name, p)
	}
	if err != nil {
		return nil, err
	}
	return attrsReply(id, fi), nil
}

func (c *conn) anyHandle(d *decoder) (*handle, error) {
	hb := d.bytes()
	if d.err != nil {
		return nil, status(fxBadMessage, "malformed request: %v", d.err)
	}
	h, ok := c.handles[string(hb)]
	if !ok {
		return nil, errBadHandle
	}
	return h, nil
}

// fstat serves FSTAT, of a file or directory handle.
func (c *conn) fstat(id uint32, d *decoder) ([]byte, error) {
	h, err := c.anyHandle(d)
	if err != nil {
		return nil, err
	}
	var fi session.FileInfo
	if h.file != nil {
		fi, err = h.file.Stat(c.ctx)
	} else {
		fi, err = c.srv.Handles.StatFollow(c.ctx, c.srv.Name, h.path)
	}
	if err != nil {
		return nil, err
	}
	return attrsReply(id, fi), nil
}

// setstat serves SETSTAT: size truncates or extends, permissions,
// times, ownership.
func (c *conn) setstat(d *decoder) error {
	p, err := pathArg(d)
	a := d.attrs()
	if err != nil || d.err != nil {
		return err
	}
	if err := c.mutating(); err != nil {
		return err
	}
	sa, ok, err := sessionAttrs(a)
	if err != nil || !ok {
		return badAttrs(err)
	}
	if h := c.stagedAt(p); h != nil {
		return h.file.Setstat(c.ctx, sa)
	}
	return c.srv.Handles.Setstat(c.ctx, c.srv.Name, p, sa)
}

func badAttrs(err error) error {
	if err != nil {
		return status(fxBadMessage, "%v", err)
	}
	return nil
}

// fsetstat serves FSETSTAT, on a file's handle or (unlike OpenSSH) a
// directory's.
func (c *conn) fsetstat(d *decoder) error {
	h, err := c.anyHandle(d)
	a := d.attrs()
	if err != nil || d.err != nil {
		return err
	}
	if err := c.mutating(); err != nil {
		return err
	}
	sa, ok, err := sessionAttrs(a)
	if err != nil || !ok {
		return badAttrs(err)
	}
	if h.file != nil {
		return h.file.Setstat(c.ctx, sa)
	}
	return c.srv.Handles.Setstat(c.ctx, c.srv.Name, h.path, sa)
}

// opendir serves OPENDIR: the listing is read now, then handed out by
// READDIR a page at a time.
func (c *conn) opendir(id uint32, d *decoder) ([]byte, error) {
	p, err := pathArg(d)
	if err != nil {
		return nil, err
	}
	if err := c.tooManyHandles(); err != nil {
		return nil, err
	}
	ents, err := c.srv.Files.ListDir(c.ctx, c.srv.Name, p)
	if err != nil {
		return nil, err
	}
	return handleReply(id, c.addHandle(&handle{path: p, dir: true, ents: ents})), nil
}

// readdir serves READDIR: at most ReaddirPage entries (and half a packet
// of bytes), then EOF.
func (c *conn) readdir(id uint32, d *decoder) ([]byte, error) {
	h, err := c.anyHandle(d)
	if err != nil {
		return nil, err
	}
	if !h.dir {
		return nil, errBadHandle
	}
	if len(h.ents) == 0 {
		h.ents = nil
		return nil, status(fxEOF, "end of directory")
	}
	now := c.now()
	e := newEncoder(fxpName, 8+ReaddirPage*128)
	e.u32(id)
	countAt := len(e.b)
	e.u32(0)
	n := 0
	for n < ReaddirPage && n < len(h.ents) && len(e.b) < MaxPacket/2 {
		fi := h.ents[n]
		e.str(fi.Name)
		e.str(longName(fi, now))
		e.attrs(fileAttrs(fi))
		n++
	}
	h.ents = h.ents[n:]
	b := e.finish()
	b[countAt], b[countAt+1], b[countAt+2], b[countAt+3] = byte(n>>24), byte(n>>16), byte(n>>8), byte(n)
	return b, nil
}

// remove serves REMOVE: files and symlinks, never directories (the file
// API's Remove would take a whole tree).
func (c *conn) remove(d *decoder) error {
	p, err := pathArg(d)
	if err != nil {
		return err
	}
	if err := c.mutating(); err != nil {
		return err
	}
	h := c.stagedAt(p)
	fi, err := c.srv.Files.Stat(c.ctx, c.srv.Name, p)
	switch {
	case err != nil && h != nil && errors.Is(err, session.ErrNotFound):
		h.discard = true // a new upload removed before its close
		return nil
	case err != nil:
		return err
	case fi.IsDir():
		return status(fxFailure, "%s is a directory; remove it with rmdir", p)
	}
	if err := c.srv.Files.Remove(c.ctx, c.srv.Name, p); err != nil {
		return err
	}
	if h != nil {
		h.discard = true
	}
	return nil
}

// mkdir serves MKDIR: the directory must not exist, its parent must.
// Permissions given are applied with sftp-server's usual umask (022).
func (c *conn) mkdir(d *decoder) error {
	p, err := pathArg(d)
	a := d.attrs()
	if err != nil || d.err != nil {
		return err
	}
	if err := c.mutating(); err != nil {
		return err
	}
	if _, err := c.srv.Files.Stat(c.ctx, c.srv.Name, p); err == nil {
		return status(fxFailure, "%s already exists", p)
	} else if !errors.Is(err, session.ErrNotFound) {
		return err
	}
	parent, err := c.srv.Handles.StatFollow(c.ctx, c.srv.Name, path.Dir(p))
	if err != nil {
		return err
	}
	if !parent.IsDir() {
		return status(fxNoSuchFile, "%s is not a directory", path.Dir(p))
	}
	if err := c.srv.Files.Mkdir(c.ctx, c.srv.Name, p); err != nil {
		return err
	}
	if a.flags&attrPermissions != 0 {
		if m := permMode(a.perm) &^ 0o022; m != 0o755 {
			return c.srv.Handles.Setstat(c.ctx, c.srv.Name, p, session.Attrs{Mode: &m})
		}
	}
	return nil
}

func (c *conn) rmdir(d *decoder) error {
	p, err := pathArg(d)
	if err != nil {
		return err
	}
	if err := c.mutating(); err != nil {
		return err
	}
	return c.srv.Handles.Rmdir(c.ctx, c.srv.Name, p)
}

// realpath serves REALPATH, lexically: relative paths (and "" or ".")
// are taken from /workspace. Paths outside it resolve too, so "cd .."
// says where it went, but every use of them is refused.
func (c *conn) realpath(id uint32, d *decoder) ([]byte, error) {
	p := d.str()
	if d.err != nil {
		return nil, nil
	}
	if strings.IndexByte(p, 0) >= 0 {
		return nil, status(fxBadMessage, "path %q has a NUL byte", p)
	}
	if !path.IsAbs(p) {
		p = workspace + "/" + p
	}
	return nameReply(id, path.Clean(p)), nil
}

// rename serves RENAME, which must not replace an existing target (as
// OpenSSH refuses it); posix-rename replaces.
func (c *conn) rename(d *decoder) error {
	from, err := pathArg(d)
	if err != nil {
		return err
	}
	to, err := pathArg(d)
	if err != nil {
		return err
	}
	if err := c.mutating(); err != nil {
		return err
	}
	if _, err := c.srv.Files.Stat(c.ctx, c.srv.Name, to); err == nil {
		return status(fxFailure, "%s already exists", to)
	} else if !errors.Is(err, session.ErrNotFound) {
		return err
	}
	return c.srv.Files.Rename(c.ctx, c.srv.Name, from, to)
}

// readlink serves READLINK.
func (c *conn) readlink(id uint32, d *decoder) ([]byte, error) {
	p, err := pathArg(d)
	if err != nil {
		return nil, err
	}
	fi, err := c.srv.Files.Stat(c.ctx, c.srv.Name, p)
	if err != nil {
		return nil, err
	}
	if fi.Mode&fs.ModeSymlink == 0 {
		// readlink(2)'s EINVAL, which sftp-server sends as BAD_MESSAGE.
		return nil, status(fxBadMessage, "%s is not a symlink", p)
	}
	return nameReply(id, fi.Link), nil
}

// symlink serves SYMLINK with OpenSSH's argument order (target first,
// then the link's path; the draft has them the other way, and every
// client follows OpenSSH). A target that leads out of /workspace is
// refused: nothing could follow it.
func (c *conn) symlink(d *decoder) error {
	target := d.str()
	link, err := pathArg(d)
	if err != nil {
		return err
	}
	if err := c.mutating(); err != nil {
		return err
	}
	if err := linkInside(link, target); err != nil {
		return err
	}
	return c.srv.Handles.Symlink(c.ctx, c.srv.Name, target, link)
}

// linkInside checks that a symlink at link pointing at target stays in
// /workspace, lexically.
func linkInside(link, target string) error {
	if target == "" {
		return status(fxNoSuchFile, "a symlink needs a target")
	}
	t := target
	if !path.IsAbs(t) {
		t = path.Join(path.Dir(link), t)
	}
	if _, err := wsPath(t); err != nil {
		return status(fxPermissionDenied, "symlink %s → %s would lead out of %s", link, target, workspace)
	}
	return nil
}

// extended serves the @openssh.com extensions.
func (c *conn) extended(id uint32, d *decoder) (string, []byte, error) {
	name := d.str()
	if d.err != nil {
		return "extended", nil, nil
	}
	switch name {
	case "posix-rename@openssh.com":
		return name, nil, c.posixRename(d)
	case "statvfs@openssh.com":
		p, err := pathArg(d)
		if err != nil {
			return name, nil, err
		}
		reply, err := c.statvfs(id, p)
		return name, reply, err
	case "fstatvfs@openssh.com":
		h, err := c.anyHandle(d)
		if err != nil {
			return name, nil, err
		}
		reply, err := c.statvfs(id, h.path)
		return name, reply, err
	case "hardlink@openssh.com":
		return name, nil, c.hardlink(d)
	case "fsync@openssh.com":
		return name, nil, c.fsync(d)
	case "limits@openssh.com":
		e := newEncoder(fxpExtendedReply, 4+32)
		e.u32(id)
		e.u64(MaxPacket)
		e.u64(MaxData)
		e.u64(MaxData)
		e.u64(uint64(c.maxOpen))
		return name, e.finish(), nil
	}
	return "extended " + oneLine(name), nil, status(fxOpUnsupported, "extension %q is not supported", oneLine(name))
}

func (c *conn) posixRename(d *decoder) error {
	from, err := pathArg(d)
	if err != nil {
		return err
	}
	to, err := pathArg(d)
	if err != nil {
		return err
	}
	if err := c.mutating(); err != nil {
		return err
	}
	return c.srv.Files.Rename(c.ctx, c.srv.Name, from, to)
}

func (c *conn) hardlink(d *decoder) error {
	from, err := pathArg(d)
	if err != nil {
		return err
	}
	to, err := pathArg(d)
	if err != nil {
		return err
	}
	if err := c.mutating(); err != nil {
		return err
	}
	return c.srv.Handles.Link(c.ctx, c.srv.Name, from, to)
}

// fsync makes a handle's writes durable (for a staged upload: its
// temporary file; it lands at CLOSE).
func (c *conn) fsync(d *decoder) error {
	h, err := c.anyHandle(d)
	if err != nil {
		return err
	}
	if err := c.mutating(); err != nil {
		return err
	}
	if h.file == nil {
		return errBadHandle
	}
	return h.file.Sync(c.ctx)
}

// statvfs is statvfs@openssh.com's reply for p.
func (c *conn) statvfs(id uint32, p string) ([]byte, error) {
	st, err := c.srv.Handles.Statfs(c.ctx, c.srv.Name, p)
	if err != nil {
		return nil, err
	}
	e := newEncoder(fxpExtendedReply, 4+11*8)
	e.u32(id)
	for _, v := range []uint64{st.BlockSize, st.FragmentSize, st.Blocks, st.BlocksFree, st.BlocksAvail,
		st.Files, st.FilesFree, st.FilesAvail, st.FSID, st.Flags & 0x3, st.NameMax} {
		e.u64(v)
	}
	return e.finish(), nil
}

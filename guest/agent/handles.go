package agent

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/guest/tree"
)

// Open files. An OpOpen stream is one handle: after the open's reply the
// host sends read-at, write-at and call frames, and the agent answers each
// in order, one at a time. The handle lives as long as the stream: a close
// call ends both; a stream that ends without one (the host went away, its
// caller gave up, a newer host connection replaced this one) releases the
// descriptor and drops a staged file, so nothing half written appears
// under a final name.
//
// A handle opened for writing with OpenCreate and OpenTruncate, without
// OpenExclusive (an upload), on a missing name or a regular file with one
// link, is staged: it writes a temporary file beside the name,
// and the close call fsyncs it, renames it over the name and fsyncs the
// directory. Readers see the old content (or no file) until then. A
// symlink or a file with several links is written in place, so links stay
// links. Every other open works in place; a close after writes (or
// attribute changes) fsyncs, and a new file's directory is fsynced too.

// maxHandles bounds the files the agent holds open for the host: each is a
// descriptor, and a host that leaks handles must not exhaust the guest's.
const maxHandles = 1024

const openFlags = guest.OpenRead | guest.OpenWrite | guest.OpenAppend | guest.OpenCreate | guest.OpenTruncate | guest.OpenExclusive

// modeBits are the mode bits a host may set: permissions and the
// setuid, setgid and sticky bits.
const modeBits = fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky

// handle is one open file.
type handle struct {
	a       *Agent
	root    *os.Root
	rel     string // the name, relative to the workspace
	tmp     string // staged: the temporary file's name; "" in place
	append  bool
	created bool // created in place: the close fsyncs its directory

	mu     sync.Mutex
	f      *os.File
	dirty  bool  // written or changed since the last fsync
	gone   error // set once released: why later calls fail
	closed bool
}

// tempName is a staged file's temporary name beside base: hidden, and
// unlike any name a person picks.
func tempName(dir, base string) string {
	var rnd [6]byte
	rand.Read(rnd[:])
	name := "." + base + ".berth-" + hex.EncodeToString(rnd[:])
	if len(name) > 255 { // NAME_MAX: a long base keeps only the marker
		name = ".berth-" + hex.EncodeToString(rnd[:])
	}
	return path.Join(dir, name)
}

func nlink(fi fs.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Nlink)
	}
	return 1
}

// openHandle opens p as flags and perm say (see the comment above). A file
// it creates is owner's (nil: root's); one it replaces keeps its owner.
func (a *Agent) openHandle(p string, flags int, mode uint32, owner *tree.Owner) (*handle, guest.OpenResult, error) {
	bad := func(msg string) (*handle, guest.OpenResult, error) {
		return nil, guest.OpenResult{}, &guest.Error{Code: "EINVAL", Op: guest.OpOpen, Path: p, Message: msg}
	}
	if flags&^openFlags != 0 {
		return bad(fmt.Sprintf("unknown open flags %#x", flags&^openFlags))
	}
	root, r, err := a.open(p)
	if err != nil {
		return nil, guest.OpenResult{}, err
	}
	var of int
	switch flags & (guest.OpenRead | guest.OpenWrite) {
	case guest.OpenWrite:
		of = os.O_WRONLY
	case guest.OpenRead | guest.OpenWrite:
		of = os.O_RDWR
	default:
		of = os.O_RDONLY
	}
	write := flags&guest.OpenWrite != 0
	create := flags&guest.OpenCreate != 0
	excl := create && flags&guest.OpenExclusive != 0
	trunc := flags&guest.OpenTruncate != 0
	perm := fs.FileMode(mode) & modeBits
	if perm == 0 {
		perm = 0o644
	}
	h := &handle{a: a, root: root, rel: r, append: flags&guest.OpenAppend != 0}
	if h.append {
		of |= os.O_APPEND
	}

	old, lerr := root.Lstat(r)
	if lerr != nil && !errors.Is(lerr, fs.ErrNotExist) {
		return nil, guest.OpenResult{}, escapeErr(lerr)
	}
	missing := lerr != nil
	staged := write && create && trunc && !excl && r != "." &&
		(missing || old.Mode().IsRegular() && nlink(old) == 1)
	if staged {
		dir, base := path.Split(r)
		if dir == "" {
			dir = "."
		}
		h.tmp = tempName(dir, base)
		if !missing {
			perm = old.Mode() & modeBits
		}
		f, err := root.OpenFile(h.tmp, of|os.O_CREATE|os.O_EXCL, perm)
		if err != nil {
			return nil, guest.OpenResult{}, escapeErr(err)
		}
		h.f, h.dirty = f, true
		if missing {
			if err := tree.Own(f, nil, owner); err != nil {
				f.Close()
				root.Remove(h.tmp)
				return nil, guest.OpenResult{}, err
			}
		} else {
			// O_TRUNC keeps the file's mode and owner: so does the
			// file that replaces it. The umask trimmed the mode.
			err := f.Chmod(perm)
			if st, ok := old.Sys().(*syscall.Stat_t); ok && err == nil {
				if cerr := f.Chown(int(st.Uid), int(st.Gid)); cerr != nil && !errors.Is(cerr, syscall.EPERM) {
					err = cerr
				}
			}
			if err != nil {
				f.Close()
				root.Remove(h.tmp)
				return nil, guest.OpenResult{}, err
			}
		}
	} else {
		if create {
			of |= os.O_CREATE
		}
		if excl {
			of |= os.O_EXCL
		}
		if trunc {
			of |= os.O_TRUNC
		}
		// Non-blocking: opening a FIFO must not hang the stream's
		// goroutine waiting for a peer. Regular files ignore it.
		f, err := root.OpenFile(r, of|syscall.O_NONBLOCK, perm)
		if err != nil {
			return nil, guest.OpenResult{}, escapeErr(err)
		}
		h.f = f
		h.created = create && missing
		h.dirty = h.created || trunc
		if h.created {
			// Lstat saw nothing there: the file is the one just made.
			if err := tree.Own(f, nil, owner); err != nil {
				f.Close()
				root.Remove(r)
				return nil, guest.OpenResult{}, err
			}
		}
	}
	if err := a.addHandle(h); err != nil {
		h.release(err)
		return nil, guest.OpenResult{}, err
	}
	return h, guest.OpenResult{Staged: staged}, nil
}

func (a *Agent) addHandle(h *handle) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closing || a.root == nil {
		return fmt.Errorf("%w: the agent is shutting down", guest.ErrNoWorkspace)
	}
	if len(a.handles) >= maxHandles {
		return &guest.Error{Code: "EMFILE", Op: guest.OpOpen, Message: fmt.Sprintf("the host holds %d files open in the guest, the most it may", maxHandles)}
	}
	if a.handles == nil {
		a.handles = map[*handle]struct{}{}
	}
	a.handles[h] = struct{}{}
	return nil
}

// releaseHandles releases every open handle: their later calls fail with
// why. Shutdown uses it before unmounting the workspace.
func (a *Agent) releaseHandles(why error) {
	a.mu.Lock()
	hs := make([]*handle, 0, len(a.handles))
	for h := range a.handles {
		hs = append(hs, h)
	}
	a.mu.Unlock()
	for _, h := range hs {
		h.release(why)
	}
}

// openHandles counts the handles open now.
func (a *Agent) openHandles() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.handles)
}

// release closes the descriptor without committing: a staged file is
// removed. Calls after it fail with why. Releasing twice is harmless.
func (h *handle) release(why error) {
	h.mu.Lock()
	if h.gone == nil { // not closed: nothing was committed
		h.gone = why
		h.f.Close()
		if h.tmp != "" {
			h.root.Remove(h.tmp)
		}
	}
	h.mu.Unlock()
	h.a.mu.Lock()
	delete(h.a.handles, h)
	h.a.mu.Unlock()
}

// errReleased is why calls on a handle whose stream ended fail (only the
// agent's own bookkeeping sees it: the stream is gone).
var errReleased = errors.New("file handle released")

func (h *handle) readAt(p []byte, off int64) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.gone != nil {
		return 0, h.gone
	}
	n, err := h.f.ReadAt(p, off)
	if err == io.EOF {
		err = nil
	}
	return n, err
}

func (h *handle) writeAt(p []byte, off int64) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.gone != nil {
		return 0, h.gone
	}
	h.dirty = true
	if h.append {
		return h.f.Write(p) // O_APPEND: the end, whatever the offset
	}
	return h.f.WriteAt(p, off)
}

func (h *handle) stat() (guest.FileInfo, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.gone != nil {
		return guest.FileInfo{}, h.gone
	}
	fi, err := h.f.Stat()
	if err != nil {
		return guest.FileInfo{}, err
	}
	return info(path.Base(h.rel), fi, ""), nil
}

func (h *handle) setstat(at *guest.Attrs) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.gone != nil {
		return h.gone
	}
	h.dirty = true
	return setAttrs(h.f, at)
}

func (h *handle) sync() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.gone != nil {
		return h.gone
	}
	if err := h.f.Sync(); err != nil {
		return err
	}
	h.dirty = false
	return nil
}

// close commits the handle: a staged file is made durable and renamed
// into place; writes in place are made durable. On an error a staged file
// is dropped and the name keeps what it had.
func (h *handle) close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.gone != nil {
		return h.gone
	}
	h.gone, h.closed = errReleased, true
	var err error
	if h.dirty {
		err = h.f.Sync()
	}
	if cerr := h.f.Close(); err == nil {
		err = cerr
	}
	if h.tmp != "" {
		if err == nil {
			err = escapeErr(h.root.Rename(h.tmp, h.rel))
		}
		if err != nil {
			h.root.Remove(h.tmp)
		}
	}
	if err == nil && (h.tmp != "" || h.created) {
		err = syncDir(h.root, parent(h.rel))
	}
	return err
}

// readBufs hold read-at replies: a frame header and a data chunk. Shared,
// so memory follows the reads in progress, not the handles open.
var readBufs = sync.Pool{New: func() any {
	b := make([]byte, guest.FrameHeader+guest.DataChunk)
	return &b
}}

// serveOpen runs one handle's stream.
func (a *Agent) serveOpen(s *stream, req *guest.Request, owner *tree.Owner) error {
	h, res, err := a.openHandle(req.Path, req.Flags, req.Mode, owner)
	if err != nil {
		return err
	}
	defer h.release(errReleased)
	if s.sendJSON(guest.FrameResult, res) != nil {
		return nil
	}
	for {
		t, p, err := s.fr.Next()
		if err != nil {
			return nil // the host went away: the deferred release drops a staged file
		}
		var (
			op    string
			reply any
		)
		switch t {
		case guest.FrameReadAt:
			op = "read"
			if len(p) != 12 {
				return &guest.Error{Code: guest.CodeBadRequest, Op: op, Message: "a read-at frame is 12 bytes"}
			}
			off, n := int64(binary.BigEndian.Uint64(p)), min(int(binary.BigEndian.Uint32(p[8:])), guest.DataChunk)
			if off < 0 {
				err = syscall.EINVAL
				break
			}
			bp := readBufs.Get().(*[]byte)
			buf := *bp
			if n, err = h.readAt(buf[guest.FrameHeader:guest.FrameHeader+n], off); err == nil {
				err = s.sendBuf(guest.FrameData, buf[:guest.FrameHeader+n])
				readBufs.Put(bp)
				if err != nil {
					return nil
				}
				continue
			}
			readBufs.Put(bp)
		case guest.FrameWriteAt:
			op = "write"
			if len(p) < 8 {
				return &guest.Error{Code: guest.CodeBadRequest, Op: op, Message: "a write-at frame starts with an 8-byte offset"}
			}
			off := int64(binary.BigEndian.Uint64(p))
			if off < 0 {
				err = syscall.EINVAL
				break
			}
			var n int
			n, err = h.writeAt(p[8:], off)
			reply = guest.WriteAtResult{N: n}
		case guest.FrameCall:
			var c guest.HandleCall
			if json.Unmarshal(p, &c) != nil {
				return &guest.Error{Code: guest.CodeBadRequest, Message: "unreadable handle call"}
			}
			op = c.Op
			switch c.Op {
			case guest.HandleStat:
				reply, err = h.stat()
			case guest.HandleSetstat:
				if c.Attrs == nil || c.Attrs.Owner != "" {
					return &guest.Error{Code: guest.CodeBadRequest, Op: op, Message: "setstat without attributes, or with an owner (a path setstat's only)"}
				}
				reply, err = struct{}{}, h.setstat(c.Attrs)
			case guest.HandleSync:
				reply, err = struct{}{}, h.sync()
			case guest.HandleClose:
				if err := h.close(); err != nil {
					s.fail(op, req.Path, err)
					return nil
				}
				s.sendJSON(guest.FrameResult, struct{}{})
				return nil
			default:
				return &guest.Error{Code: guest.CodeBadRequest, Op: c.Op, Message: "unknown handle call; host and agent versions differ?"}
			}
		default:
			return &guest.Error{Code: guest.CodeBadRequest, Message: fmt.Sprintf("unexpected frame %d on an open file", t)}
		}
		if err != nil {
			// An error answers one request; the handle stays open.
			if s.fail(op, req.Path, err) != nil {
				return nil
			}
			continue
		}
		if s.sendJSON(guest.FrameResult, reply) != nil {
			return nil
		}
	}
}

// setAttrs applies at to f in the order that keeps each change: size,
// then owner (a chown clears setuid and setgid), then mode, then times
// (which the others would move).
func setAttrs(f *os.File, at *guest.Attrs) error {
	if at.Size != nil {
		if err := f.Truncate(*at.Size); err != nil {
			return err
		}
	}
	if at.UID != nil || at.GID != nil {
		uid, gid := -1, -1
		if at.UID != nil {
			uid = *at.UID
		}
		if at.GID != nil {
			gid = *at.GID
		}
		if err := f.Chown(uid, gid); err != nil {
			return err
		}
	}
	if at.Mode != nil {
		if err := f.Chmod(fs.FileMode(*at.Mode) & modeBits); err != nil {
			return err
		}
	}
	if at.Atime != nil || at.Mtime != nil {
		if err := futimens(f, at.Atime, at.Mtime); err != nil {
			return &fs.PathError{Op: "chtimes", Path: f.Name(), Err: err}
		}
	}
	return nil
}

// futimens sets f's times; nil leaves one as it is.
func futimens(f *os.File, atime, mtime *time.Time) error {
	ts := [2]unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_OMIT}}
	for i, t := range []*time.Time{atime, mtime} {
		if t == nil {
			continue
		}
		var err error
		if ts[i], err = unix.TimeToTimespec(*t); err != nil {
			return syscall.EINVAL
		}
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var errno syscall.Errno
	err = rc.Control(func(fd uintptr) {
		// utimensat(fd, NULL, ts, 0) is futimens(3): the descriptor's file.
		_, _, errno = unix.Syscall6(unix.SYS_UTIMENSAT, fd, 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0)
	})
	if err != nil {
		return err
	}
	if errno != 0 {
		return errno
	}
	return nil
}

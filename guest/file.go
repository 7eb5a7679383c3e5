package guest

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"sync"
)

// maxInFlight bounds the requests one File has sent and not yet seen
// answered: callers beyond it wait their turn to send.
const maxInFlight = 64

// File is a file open in the guest's /workspace: one stream held for the
// handle's life (see OpOpen). Requests from concurrent callers are
// pipelined on it, and the agent answers them in order, so many reads or
// writes can be in flight on one handle. It is safe for concurrent use.
//
// The context given to Open bounds the File: when it ends, the stream
// ends and the agent releases the file without committing it (a staged
// file is dropped). Close commits it.
type File struct {
	path   string
	staged bool
	cl     *call
	ctx    context.Context // Open's, made cancellable: Close ends it
	cancel context.CancelFunc

	// mu serialises sending a request with queueing its waiter. Lock order:
	// mu → the call's wmu (sendLocked); the reader never takes mu.
	mu      sync.Mutex
	closed  bool
	waiters chan *waiter  // in the order their requests were sent
	dead    chan struct{} // closed when the reader has ended; err says why
	err     error
}

type waiter struct {
	buf []byte // a read's destination
	ch  chan reply
}

type reply struct {
	n   int    // bytes read into the waiter's buf
	p   []byte // a result's JSON
	err error
}

// Open opens path in the workspace as flags (Open*) say; perm is a new
// file's mode (permission, setuid, setgid and sticky bits; 0 means 0644).
// ctx bounds the File's whole life, as for Exec.
func (c *Client) Open(ctx context.Context, path string, flags int, perm fs.FileMode) (*File, error) {
	fctx, cancel := context.WithCancel(ctx)
	cl, err := c.open(fctx, &Request{Op: OpOpen, Path: path, Flags: flags, Mode: uint32(perm), User: c.owner})
	if err != nil {
		cancel()
		return nil, err
	}
	fail := func(err error) (*File, error) {
		cl.close()
		cancel()
		return nil, err
	}
	t, p, err := cl.fr.Next()
	if err != nil {
		return fail(cl.err(ctx, OpOpen, err))
	}
	var res OpenResult
	switch t {
	case FrameResult:
		if err := json.Unmarshal(p, &res); err != nil {
			return fail(fmt.Errorf("open %s: agent sent an unreadable reply: %w", path, err))
		}
	case FrameError:
		return fail(decodeError(p))
	default:
		return fail(fmt.Errorf("open %s: agent sent frame %d, want a result", path, t))
	}
	f := &File{path: path, staged: res.Staged, cl: cl, ctx: fctx, cancel: cancel,
		waiters: make(chan *waiter, maxInFlight), dead: make(chan struct{})}
	go f.read() // ends with the stream: Close, ctx, or the connection
	return f, nil
}

// Staged reports whether the File writes a temporary file that Close
// renames into place.
func (f *File) Staged() bool { return f.staged }

// Done is closed once the File's stream has ended.
func (f *File) Done() <-chan struct{} { return f.dead }

// read hands each reply to the request it answers.
func (f *File) read() {
	defer close(f.dead)
	for {
		t, p, err := f.cl.fr.Next()
		if err != nil {
			f.err = f.cl.err(f.ctx, "open "+f.path, err)
			f.cl.close()
			return
		}
		var w *waiter
		select {
		case w = <-f.waiters:
		case <-f.ctx.Done():
			f.err = fmt.Errorf("open %s: %w", f.path, f.ctx.Err())
			f.cl.close()
			return
		}
		var r reply
		switch t {
		case FrameData:
			if len(p) > len(w.buf) {
				r.err = fmt.Errorf("read %s: agent sent %d bytes for a read of %d", f.path, len(p), len(w.buf))
				w.ch <- r
				f.err = r.err
				f.cl.close()
				return
			}
			r.n = copy(w.buf, p)
		case FrameResult:
			r.p = append([]byte(nil), p...)
		case FrameError:
			r.err = decodeError(p)
		default:
			r.err = fmt.Errorf("%s: agent sent frame %d on an open file", f.path, t)
		}
		w.ch <- r
	}
}

// sendLocked sends one request and queues its waiter; f.mu is held.
func (f *File) sendLocked(buf []byte, t FrameType, dst []byte) (*waiter, error) {
	if f.closed {
		return nil, &fs.PathError{Op: "use", Path: f.path, Err: fs.ErrClosed}
	}
	select {
	case <-f.dead:
		return nil, f.err
	default:
	}
	if err := f.cl.sendBuf(t, buf); err != nil {
		return nil, f.cl.err(f.ctx, "open "+f.path, err)
	}
	w := &waiter{buf: dst, ch: make(chan reply, 1)}
	select {
	case f.waiters <- w:
	case <-f.dead:
		return nil, f.err
	}
	return w, nil
}

// wait waits for w's reply, or for the stream's end, or for ctx (nil: no
// bound but the File's own).
func (f *File) wait(ctx context.Context, w *waiter) reply {
	var done <-chan struct{}
	if ctx != nil {
		done = ctx.Done()
	}
	select {
	case r := <-w.ch:
		return r
	case <-f.dead:
		select {
		case r := <-w.ch: // answered before the end
			return r
		default:
			return reply{err: f.err}
		}
	case <-done:
		return reply{err: ctx.Err()}
	}
}

func (cl *call) sendBuf(t FrameType, buf []byte) error {
	cl.wmu.Lock()
	defer cl.wmu.Unlock()
	return WriteFrameBuf(cl.st, t, buf)
}

func (f *File) badOffset(op string, off int64) error {
	if off < 0 {
		return &Error{Code: "EINVAL", Op: op, Path: f.path, Message: fmt.Sprintf("negative offset %d", off)}
	}
	return nil
}

// ReadAt reads len(p) bytes at off, as io.ReaderAt: fewer only with an
// error, io.EOF at the end of the file. A large read travels as several
// pipelined requests of at most DataChunk.
func (f *File) ReadAt(p []byte, off int64) (int, error) {
	if err := f.badOffset("read", off); err != nil {
		return 0, err
	}
	if len(p) == 0 {
		return 0, nil
	}
	var ws []*waiter
	var serr error
	f.mu.Lock()
	for i := 0; i < len(p); i += DataChunk {
		chunk := p[i:min(i+DataChunk, len(p))]
		buf := make([]byte, FrameHeader+12)
		binary.BigEndian.PutUint64(buf[FrameHeader:], uint64(off+int64(i)))
		binary.BigEndian.PutUint32(buf[FrameHeader+8:], uint32(len(chunk)))
		w, err := f.sendLocked(buf, FrameReadAt, chunk)
		if err != nil {
			serr = err
			break
		}
		ws = append(ws, w)
	}
	f.mu.Unlock()
	// Every reply is awaited, even after a short one or an error: the
	// reader must not copy into p once ReadAt has returned.
	n, short, err := 0, false, error(nil)
	for _, w := range ws {
		r := f.wait(nil, w)
		switch {
		case err != nil || short:
		case r.err != nil:
			err = r.err
		default:
			n += r.n
			short = r.n < len(w.buf)
		}
	}
	if err == nil {
		err = serr
	}
	if err == nil && n < len(p) {
		err = io.EOF
	}
	return n, err
}

// WriteAt writes p at off, as io.WriterAt (on a File opened with
// OpenAppend, at the end whatever off). A large write travels as several
// pipelined requests of at most DataChunk.
func (f *File) WriteAt(p []byte, off int64) (int, error) {
	if err := f.badOffset("write", off); err != nil {
		return 0, err
	}
	if len(p) == 0 {
		return 0, nil
	}
	var ws []*waiter
	var serr error
	f.mu.Lock()
	for i := 0; i < len(p); i += DataChunk {
		chunk := p[i:min(i+DataChunk, len(p))]
		buf := make([]byte, FrameHeader+8+len(chunk))
		binary.BigEndian.PutUint64(buf[FrameHeader:], uint64(off+int64(i)))
		copy(buf[FrameHeader+8:], chunk)
		w, err := f.sendLocked(buf, FrameWriteAt, nil)
		if err != nil {
			serr = err
			break
		}
		w.buf = chunk // its length, for the check below
		ws = append(ws, w)
	}
	f.mu.Unlock()
	n, err := 0, error(nil)
	for _, w := range ws {
		r := f.wait(nil, w)
		if err != nil {
			continue
		}
		if r.err != nil {
			err = r.err
			continue
		}
		var res WriteAtResult
		if jerr := json.Unmarshal(r.p, &res); jerr != nil {
			err = fmt.Errorf("write %s: agent sent an unreadable reply: %w", f.path, jerr)
			continue
		}
		n += res.N
		if res.N < len(w.buf) {
			err = io.ErrShortWrite
		}
	}
	if err == nil {
		err = serr
	}
	return n, err
}

// call sends a HandleCall and decodes its result into out (may be nil).
func (f *File) call(ctx context.Context, c HandleCall, out any) error {
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	f.mu.Lock()
	w, err := f.sendLocked(append(make([]byte, FrameHeader), b...), FrameCall, nil)
	f.mu.Unlock()
	if err != nil {
		return err
	}
	r := f.wait(ctx, w)
	if r.err != nil {
		return r.err
	}
	if out != nil {
		if err := json.Unmarshal(r.p, out); err != nil {
			return fmt.Errorf("%s %s: agent sent an unreadable reply: %w", c.Op, f.path, err)
		}
	}
	return nil
}

// Stat describes the open file (Name is the base of the path opened).
func (f *File) Stat(ctx context.Context) (FileInfo, error) {
	var fi FileInfo
	err := f.call(ctx, HandleCall{Op: HandleStat}, &fi)
	return fi, err
}

// Setstat changes the open file's attributes; Sync or Close makes the
// change durable.
func (f *File) Setstat(ctx context.Context, a Attrs) error {
	return f.call(ctx, HandleCall{Op: HandleSetstat, Attrs: &a}, nil)
}

// Sync makes what was written durable (a staged file's temporary file:
// it is not under its name before Close).
func (f *File) Sync(ctx context.Context) error {
	return f.call(ctx, HandleCall{Op: HandleSync}, nil)
}

// Close commits the file (a staged one is made durable and renamed into
// place; writes in place are fsynced) and ends the stream. An error means
// a staged file was not put in place. Calls after Close, Close included,
// fail with fs.ErrClosed.
func (f *File) Close() error {
	b, _ := json.Marshal(HandleCall{Op: HandleClose})
	f.mu.Lock()
	w, err := f.sendLocked(append(make([]byte, FrameHeader), b...), FrameCall, nil)
	if !f.closed {
		f.closed = true
		defer func() { f.cancel(); <-f.dead }()
	}
	f.mu.Unlock()
	if err != nil {
		return err
	}
	return f.wait(nil, w).err
}

// Setstat changes the attributes of the file at path, following
// symlinks, and returns once the change is durable.
func (c *Client) Setstat(ctx context.Context, path string, a Attrs) error {
	return c.do(ctx, &Request{Op: OpSetstat, Path: path, Attrs: &a}, nil)
}

// StatFollow describes path following a final symlink (inside the
// workspace).
func (c *Client) StatFollow(ctx context.Context, path string) (FileInfo, error) {
	var fi FileInfo
	err := c.do(ctx, &Request{Op: OpStatFollow, Path: path}, &fi)
	return fi, err
}

// Symlink makes path a symlink to target, stored as given.
func (c *Client) Symlink(ctx context.Context, target, path string) error {
	return c.do(ctx, &Request{Op: OpSymlink, Path: path, Target: target, User: c.owner}, nil)
}

// Link makes newpath a hard link to oldpath.
func (c *Client) Link(ctx context.Context, oldpath, newpath string) error {
	return c.do(ctx, &Request{Op: OpLink, Path: oldpath, To: newpath}, nil)
}

// Statfs reports the figures of the filesystem holding path.
func (c *Client) Statfs(ctx context.Context, path string) (FSStat, error) {
	var st FSStat
	err := c.do(ctx, &Request{Op: OpStatfs, Path: path}, &st)
	return st, err
}

// Rmdir removes an empty directory (never a file).
func (c *Client) Rmdir(ctx context.Context, path string) error {
	return c.do(ctx, &Request{Op: OpRmdir, Path: path}, nil)
}

package guest

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
)

// Client is the host side of one agent connection. It is safe for
// concurrent use; each call runs on its own yamux stream.
type Client struct {
	conn net.Conn
	sess *yamux.Session
	// owner is Request.User of the file calls that create (Owned).
	owner string
}

// Owned returns a client on c's connection whose file calls (WriteFile,
// Mkdir, Open, Symlink, Unpack) give what they create to user: NAME or
// UID, with an optional :GROUP or :GID, resolved in the guest as a
// command's user is ("" is root). What they replace keeps its owner. It
// shares c's connection: closing either closes both.
func (c *Client) Owned(user string) *Client {
	return &Client{conn: c.conn, sess: c.sess, owner: user}
}

// YamuxConfig tunes yamux for one host on a local channel, on both ends:
// no keepalives (the channel's EOF tells the guest its host went away), and
// a large window so a stream can fill the channel.
func YamuxConfig() *yamux.Config {
	c := yamux.DefaultConfig()
	c.EnableKeepAlive = false
	c.MaxStreamWindowSize = 4 << 20
	c.ConnectionWriteTimeout = 30 * time.Second
	c.StreamCloseTimeout = 30 * time.Second
	c.LogOutput = io.Discard
	c.Logger = nil
	return c
}

// Connect runs the handshake on a fresh raw connection and starts the
// multiplexer. ctx bounds the handshake only. The client owns conn.
func Connect(ctx context.Context, conn net.Conn) (*Client, error) {
	c, err := HostHandshake(ctx, conn)
	if err != nil {
		conn.Close()
		return nil, err
	}
	sess, err := yamux.Client(c, YamuxConfig())
	if err != nil {
		conn.Close()
		return nil, err
	}
	return &Client{conn: conn, sess: sess}, nil
}

// Close drops the connection. Executions in the guest keep running.
func (c *Client) Close() error { return c.sess.Close() }

// Done is closed when the connection ends (host close, VM gone).
func (c *Client) Done() <-chan struct{} { return c.sess.CloseChan() }

// Ping measures a round trip through the multiplexer, without the agent's
// request handling.
func (c *Client) Ping() (time.Duration, error) { return c.sess.Ping() }

// call is one stream. Its context bounds every read and write on it.
type call struct {
	st   *yamux.Stream
	fr   *FrameReader
	wmu  sync.Mutex
	stop func() bool
}

func (c *Client) open(ctx context.Context, req *Request) (*call, error) {
	st, err := c.sess.OpenStream()
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %v", req.Op, ErrDisconnected, err)
	}
	cl := &call{st: st, fr: NewFrameReader(st)}
	cl.stop = context.AfterFunc(ctx, func() {
		st.SetDeadline(time.Now())
		st.Close()
	})
	if err := cl.sendJSON(FrameRequest, req); err != nil {
		cl.close()
		return nil, cl.err(ctx, req.Op, err)
	}
	return cl, nil
}

func (cl *call) send(t FrameType, p []byte) error {
	cl.wmu.Lock()
	defer cl.wmu.Unlock()
	return WriteFrame(cl.st, t, p)
}

func (cl *call) sendJSON(t FrameType, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return cl.send(t, b)
}

func (cl *call) close() {
	cl.stop()
	cl.st.Close()
}

// err explains a stream failure: the caller's context, or a lost agent.
func (cl *call) err(ctx context.Context, op string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%s: %w", op, ctx.Err())
	}
	return fmt.Errorf("%s: %w: %v", op, ErrDisconnected, err)
}

// decodeError parses an Error frame.
func decodeError(p []byte) error {
	var e Error
	if err := json.Unmarshal(p, &e); err != nil {
		return fmt.Errorf("agent sent an unreadable error: %w", err)
	}
	return &e
}

// do runs a unary call and decodes its result into out (may be nil).
func (c *Client) do(ctx context.Context, req *Request, out any) error {
	cl, err := c.open(ctx, req)
	if err != nil {
		return err
	}
	defer cl.close()
	t, p, err := cl.fr.Next()
	if err != nil {
		return cl.err(ctx, req.Op, err)
	}
	switch t {
	case FrameResult:
		if out != nil {
			if err := json.Unmarshal(p, out); err != nil {
				return fmt.Errorf("%s: agent sent an unreadable reply: %w", req.Op, err)
			}
		}
		return nil
	case FrameError:
		return decodeError(p)
	}
	return fmt.Errorf("%s: agent sent frame %d, want a result", req.Op, t)
}

// Hello describes the agent and its workspace.
func (c *Client) Hello(ctx context.Context) (Hello, error) {
	var h Hello
	err := c.do(ctx, &Request{Op: OpHello}, &h)
	return h, err
}

// Stats returns the guest's live figures.
func (c *Client) Stats(ctx context.Context) (Stats, error) {
	var s Stats
	err := c.do(ctx, &Request{Op: OpStats}, &s)
	return s, err
}

// Flush makes every pending workspace write durable.
func (c *Client) Flush(ctx context.Context) (FlushResult, error) {
	var r FlushResult
	err := c.do(ctx, &Request{Op: OpFlush}, &r)
	return r, err
}

// Shutdown stops commands (TERM, then KILL after grace), flushes and
// unmounts the workspace and powers the VM off. It returns once the agent
// confirmed the flush; the VMM exits shortly after.
func (c *Client) Shutdown(ctx context.Context, grace time.Duration) (FlushResult, error) {
	var r FlushResult
	err := c.do(ctx, &Request{Op: OpShutdown, Wait: grace}, &r)
	return r, err
}

// Freeze flushes the workspace and blocks its writers until Thaw.
func (c *Client) Freeze(ctx context.Context) (FlushResult, error) {
	var r FlushResult
	err := c.do(ctx, &Request{Op: OpFreeze}, &r)
	return r, err
}

// Thaw lets the workspace's writers continue.
func (c *Client) Thaw(ctx context.Context) error {
	return c.do(ctx, &Request{Op: OpThaw}, nil)
}

// ThawAt sets the guest clock to now and reseeds its RNG with seed, then
// thaws the workspace: what a VM restored from a snapshot needs, in one
// round trip (right after a restore every round trip is slow, the guest's
// code being translated afresh under TCG).
func (c *Client) ThawAt(ctx context.Context, now time.Time, seed []byte) error {
	return c.do(ctx, &Request{Op: OpThaw, Time: now.UnixNano(), Data: seed}, nil)
}

// Mount asks the agent to mount the volume with uuid at /workspace.
func (c *Client) Mount(ctx context.Context, uuid string) (Workspace, error) {
	var w Workspace
	err := c.do(ctx, &Request{Op: OpMount, ID: uuid}, &w)
	return w, err
}

// MountAt sets the guest clock and reseeds its RNG, as ThawAt, then
// mounts what spec names: the system disk as the root overlay's upper
// layer, the workspace at /workspace, and sets the VM's identity.
func (c *Client) MountAt(ctx context.Context, spec MountSpec, now time.Time, seed []byte) (Workspace, error) {
	var w Workspace
	err := c.do(ctx, &Request{Op: OpMount, ID: spec.Workspace, Mount: &spec, Time: now.UnixNano(), Data: seed}, &w)
	return w, err
}

// Execs lists the executions the agent knows.
func (c *Client) Execs(ctx context.Context) ([]ExecInfo, error) {
	var l []ExecInfo
	err := c.do(ctx, &Request{Op: OpExecs}, &l)
	return l, err
}

// Signal sends sig to an execution's process group.
func (c *Client) Signal(ctx context.Context, id string, sig int) error {
	return c.do(ctx, &Request{Op: OpSignal, ID: id, Signal: sig}, nil)
}

// Forget tells the agent the host has everything of a finished execution.
func (c *Client) Forget(ctx context.Context, id string) error {
	return c.do(ctx, &Request{Op: OpForget, ID: id}, nil)
}

// Stat describes a workspace path without following a final symlink.
func (c *Client) Stat(ctx context.Context, path string) (FileInfo, error) {
	var fi FileInfo
	err := c.do(ctx, &Request{Op: OpStat, Path: path}, &fi)
	return fi, err
}

// Mkdir creates a directory (and its parents with all).
func (c *Client) Mkdir(ctx context.Context, path string, all bool) error {
	return c.do(ctx, &Request{Op: OpMkdir, Path: path, All: all, User: c.owner}, nil)
}

// Remove removes a file or empty directory (everything below with all).
func (c *Client) Remove(ctx context.Context, path string, all bool) error {
	return c.do(ctx, &Request{Op: OpRemove, Path: path, All: all}, nil)
}

// Rename renames within the workspace.
func (c *Client) Rename(ctx context.Context, from, to string) error {
	return c.do(ctx, &Request{Op: OpRename, Path: from, To: to}, nil)
}

// maxListEntries bounds a listing the host accepts from the guest.
const maxListEntries = 1 << 20

// List returns a directory's entries.
func (c *Client) List(ctx context.Context, path string) ([]FileInfo, error) {
	cl, err := c.open(ctx, &Request{Op: OpList, Path: path})
	if err != nil {
		return nil, err
	}
	defer cl.close()
	var out []FileInfo
	for {
		t, p, err := cl.fr.Next()
		if err != nil {
			return nil, cl.err(ctx, OpList, err)
		}
		switch t {
		case FrameData:
			var batch []FileInfo
			if err := json.Unmarshal(p, &batch); err != nil {
				return nil, fmt.Errorf("list: unreadable reply: %w", err)
			}
			if len(out)+len(batch) > maxListEntries {
				return nil, fmt.Errorf("list %s: more than %d entries", path, maxListEntries)
			}
			out = append(out, batch...)
		case FrameEnd:
			return out, nil
		case FrameError:
			return nil, decodeError(p)
		default:
			return nil, fmt.Errorf("list: unexpected frame %d", t)
		}
	}
}

// ReadFile streams a file's content. Errors such as ENOENT are returned by
// ReadFile itself, not by the first Read.
func (c *Client) ReadFile(ctx context.Context, path string) (io.ReadCloser, error) {
	cl, err := c.open(ctx, &Request{Op: OpRead, Path: path})
	if err != nil {
		return nil, err
	}
	r := &fileReader{cl: cl, ctx: ctx}
	if err := r.fill(); err != nil && err != io.EOF {
		cl.close()
		return nil, err
	}
	return r, nil
}

type fileReader struct {
	cl  *call
	ctx context.Context
	buf []byte
	err error
}

func (r *fileReader) fill() error {
	t, p, err := r.cl.fr.Next()
	if err != nil {
		r.err = r.cl.err(r.ctx, OpRead, err)
		return r.err
	}
	switch t {
	case FrameData:
		r.buf = p
	case FrameEnd:
		r.err = io.EOF
	case FrameError:
		r.err = decodeError(p)
	default:
		r.err = fmt.Errorf("read: unexpected frame %d", t)
	}
	return r.err
}

func (r *fileReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		r.fill()
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

func (r *fileReader) Close() error {
	r.cl.close()
	return nil
}

// WriteFile replaces path with r's bytes and returns once they are durable.
// On any error the file keeps its previous content. mode 0 keeps the
// existing file's permissions (0644 for a new file).
func (c *Client) WriteFile(ctx context.Context, path string, r io.Reader, mode fs.FileMode) (int64, error) {
	cl, err := c.open(ctx, &Request{Op: OpWrite, Path: path, Mode: uint32(mode.Perm()), User: c.owner})
	if err != nil {
		return 0, err
	}
	defer cl.close()
	res, sent, err := upload[WriteResult](ctx, cl, OpWrite, r)
	if err != nil {
		if errors.Is(err, errSource) {
			return sent, fmt.Errorf("write %s: %w", path, err)
		}
		return sent, err
	}
	return res.Size, nil
}

// errSource marks an upload that failed reading its local source.
var errSource = errors.New("reading the source")

// upload sends r as data frames on cl, then the end frame, and returns
// the agent's result and the bytes sent. The reply is read concurrently:
// it can come early (a refused path, a full disk), and the upload then
// stops instead of blocking on a window no one drains. If r fails, the
// stream is closed (the agent drops what it was writing) and the error
// wraps errSource.
func upload[T any](ctx context.Context, cl *call, op string, r io.Reader) (T, int64, error) {
	type reply struct {
		res T
		err error
	}
	done := make(chan reply, 1)
	go func() { // ends with the stream's next frame, or its close
		var rep reply
		t, p, err := cl.fr.Next()
		switch {
		case err != nil:
			rep.err = cl.err(ctx, op, err)
		case t == FrameResult:
			rep.err = json.Unmarshal(p, &rep.res)
		case t == FrameError:
			rep.err = decodeError(p)
		default:
			rep.err = fmt.Errorf("%s: unexpected frame %d", op, t)
		}
		done <- rep
		cl.st.SetWriteDeadline(time.Now()) // unblock a pending upload
	}()
	// The header goes in front of the bytes: one write, one multiplexer
	// frame per data frame (not a 5-byte one before each).
	buf := make([]byte, FrameHeader+DataChunk)
	var sent int64
	var werr error
	for werr == nil {
		n, err := io.ReadFull(r, buf[FrameHeader:])
		if n > 0 {
			if werr = cl.sendBuf(FrameData, buf[:FrameHeader+n]); werr != nil {
				break
			}
			sent += int64(n)
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			werr = cl.send(FrameEnd, nil)
			break
		}
		if err != nil {
			cl.close()
			<-done
			var zero T
			return zero, sent, fmt.Errorf("%w: %w", errSource, err)
		}
	}
	rep := <-done
	if rep.err != nil {
		return rep.res, sent, rep.err
	}
	if werr != nil {
		return rep.res, sent, cl.err(ctx, op, werr)
	}
	return rep.res, sent, nil
}

// Output is a piece of an execution's output.
type Output struct {
	Stream FrameType // FrameStdout or FrameStderr
	Offset int64     // of Data[0] within its stream
	Data   []byte
}

// ExecOption configures Exec and Attach.
type ExecOption func(*Exec)

// ManualAck makes the caller acknowledge output with Ack once it is stored.
// By default output is acknowledged as it is delivered on Output.
func ManualAck() ExecOption { return func(e *Exec) { e.manualAck = true } }

// Exec is a stream attached to one execution in the guest. Closing it (or
// losing the connection) leaves the command running; Attach resumes.
type Exec struct {
	Info ExecInfo // as of the start or attach

	cl        *call
	out       chan Output
	done      chan struct{}
	manualAck bool
	closeOnce sync.Once

	mu      sync.Mutex
	exit    *ExecInfo
	err     error
	acked   Ack
	pending Ack
}

// Exec starts a command. ctx bounds the start and the whole stream: cancel
// it, or call Close, to detach.
func (c *Client) Exec(ctx context.Context, req ExecRequest, opts ...ExecOption) (*Exec, error) {
	return c.execStream(ctx, &Request{Op: OpExec, Exec: &req}, opts)
}

// Attach follows an execution's output from the given offsets.
func (c *Client) Attach(ctx context.Context, id string, stdout, stderr int64, opts ...ExecOption) (*Exec, error) {
	return c.execStream(ctx, &Request{Op: OpAttach, ID: id, Stdout: stdout, Stderr: stderr}, opts)
}

func (c *Client) execStream(ctx context.Context, req *Request, opts []ExecOption) (*Exec, error) {
	cl, err := c.open(ctx, req)
	if err != nil {
		return nil, err
	}
	t, p, err := cl.fr.Next()
	if err != nil {
		cl.close()
		return nil, cl.err(ctx, req.Op, err)
	}
	switch t {
	case FrameStarted:
	case FrameError:
		cl.close()
		return nil, decodeError(p)
	default:
		cl.close()
		return nil, fmt.Errorf("%s: unexpected frame %d", req.Op, t)
	}
	e := &Exec{cl: cl, out: make(chan Output, 64), done: make(chan struct{})}
	if err := json.Unmarshal(p, &e.Info); err != nil {
		cl.close()
		return nil, fmt.Errorf("%s: unreadable start: %w", req.Op, err)
	}
	e.acked = Ack{Stdout: req.Stdout, Stderr: req.Stderr}
	for _, o := range opts {
		o(e)
	}
	go e.read(ctx)
	return e, nil
}

// ackEvery is how much output the host acknowledges at once in automatic
// mode: a fraction of the agent's buffer, so the command never waits on it.
const ackEvery = 512 << 10

func (e *Exec) read(ctx context.Context) {
	defer close(e.out)
	defer close(e.done)
	for {
		t, p, err := e.cl.fr.Next()
		if err != nil {
			e.finish(nil, e.cl.err(ctx, "exec "+e.Info.ID, err))
			return
		}
		switch t {
		case FrameStdout, FrameStderr:
			if len(p) < 8 {
				e.finish(nil, fmt.Errorf("exec %s: short output frame", e.Info.ID))
				return
			}
			o := Output{Stream: t, Offset: int64(binary.BigEndian.Uint64(p)), Data: append([]byte(nil), p[8:]...)}
			select {
			case e.out <- o:
			case <-ctx.Done():
				e.finish(nil, fmt.Errorf("exec %s: %w", e.Info.ID, ctx.Err()))
				return
			}
			if !e.manualAck {
				e.autoAck(o)
			}
		case FrameExit:
			var in ExecInfo
			if err := json.Unmarshal(p, &in); err != nil {
				e.finish(nil, fmt.Errorf("exec %s: unreadable exit: %w", e.Info.ID, err))
				return
			}
			e.finish(&in, nil)
			return
		case FrameError:
			e.finish(nil, decodeError(p))
			return
		}
	}
}

func (e *Exec) autoAck(o Output) {
	e.mu.Lock()
	end := o.Offset + int64(len(o.Data))
	if o.Stream == FrameStdout {
		e.pending.Stdout = end
	} else {
		e.pending.Stderr = end
	}
	send := e.pending.Stdout-e.acked.Stdout+e.pending.Stderr-e.acked.Stderr >= ackEvery
	a := e.pending
	e.mu.Unlock()
	if send {
		e.Ack(a.Stdout, a.Stderr)
	}
}

func (e *Exec) finish(exit *ExecInfo, err error) {
	e.mu.Lock()
	e.exit, e.err = exit, err
	e.mu.Unlock()
	e.cl.close()
}

// Output yields output in order; it is closed when the stream ends.
func (e *Exec) Output() <-chan Output { return e.out }

// Done is closed when the stream has ended; Result then tells how.
func (e *Exec) Done() <-chan struct{} { return e.done }

// Result returns the execution's end (nil if the stream ended otherwise)
// and the stream's error. Valid after Done.
func (e *Exec) Result() (*ExecInfo, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.exit, e.err
}

// Wait drains nothing: the caller must keep reading Output. It blocks until
// the stream ends and returns the exit, or ErrDisconnected when the
// connection was lost while the command may still run.
func (e *Exec) Wait(ctx context.Context) (ExecInfo, error) {
	select {
	case <-e.done:
	case <-ctx.Done():
		return ExecInfo{}, ctx.Err()
	}
	exit, err := e.Result()
	if err != nil {
		return ExecInfo{}, err
	}
	return *exit, nil
}

// Write sends bytes to the command's stdin.
func (e *Exec) Write(p []byte) (int, error) {
	for off := 0; off < len(p); {
		n := min(len(p)-off, DataChunk)
		if err := e.cl.send(FrameStdin, p[off:off+n]); err != nil {
			return off, err
		}
		off += n
	}
	return len(p), nil
}

// CloseStdin sends EOF to the command's stdin.
func (e *Exec) CloseStdin() error { return e.cl.send(FrameStdinEOF, nil) }

// Resize changes the command's terminal size.
func (e *Exec) Resize(rows, cols int) error {
	return e.cl.sendJSON(FrameResize, WinSize{Rows: rows, Cols: cols})
}

// Ack tells the agent output up to these offsets is stored.
func (e *Exec) Ack(stdout, stderr int64) error {
	e.mu.Lock()
	e.acked = Ack{Stdout: max(stdout, e.acked.Stdout), Stderr: max(stderr, e.acked.Stderr)}
	a := e.acked
	e.mu.Unlock()
	return e.cl.sendJSON(FrameAck, a)
}

// Close detaches from the execution; the command keeps running.
func (e *Exec) Close() error {
	e.closeOnce.Do(func() { e.cl.close() })
	return nil
}

// Dial connects to an agent that may still be booting: it retries dial
// until it succeeds, then runs the handshake, which waits for the guest to
// answer. ctx bounds the whole wait.
//
// A connection whose handshake goes unanswered for a while is dropped and
// another one made, the wait doubling each time. A host connection made
// after the previous host died while the VM was paused can stay mute from
// the guest for good: the guest's agent sees the SYNC and writes its ACK,
// but nothing it writes arrives (measured with QEMU 7.2: 11 of 100 such
// reconnects), while a new connection is answered at once. Dropping the
// mute one costs a second instead of the whole ctx.
func Dial(ctx context.Context, dial func(context.Context) (net.Conn, error)) (*Client, error) {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	wait := handshakeWait
	for {
		conn, err := dial(ctx)
		if err == nil {
			hctx, cancel := context.WithTimeout(ctx, wait)
			c, err := Connect(hctx, conn)
			unanswered := err != nil && (hctx.Err() != nil || isTimeout(err))
			cancel()
			switch {
			case !unanswered:
				return c, err
			case ctx.Err() != nil:
				return nil, fmt.Errorf("connect to agent: %w (last error: %v)", ctx.Err(), err)
			}
			wait = min(2*wait, handshakeWaitMax)
			continue
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("connect to agent: %w (last error: %v)", ctx.Err(), err)
		case <-t.C:
		}
	}
}

// Unpack writes the tar stream r into the directory path (created if
// missing) and returns once every file is durable. Entries must stay
// inside the directory and symlinks inside the tree.
func (c *Client) Unpack(ctx context.Context, path string, r io.Reader) (TreeResult, error) {
	cl, err := c.open(ctx, &Request{Op: OpUnpack, Path: path, User: c.owner})
	if err != nil {
		return TreeResult{}, err
	}
	defer cl.close()
	res, _, err := upload[TreeResult](ctx, cl, OpUnpack, r)
	if errors.Is(err, errSource) {
		return res, fmt.Errorf("unpack into %s: %w", path, err)
	}
	return res, err
}

// Pack streams the tree (or file) at path as a tar. The reader's Close
// ends the stream; Result reports what was sent once Read returned EOF.
func (c *Client) Pack(ctx context.Context, path string) (*TreeReader, error) {
	cl, err := c.open(ctx, &Request{Op: OpPack, Path: path})
	if err != nil {
		return nil, err
	}
	r := &TreeReader{fileReader: fileReader{cl: cl, ctx: ctx}}
	if err := r.fill(); err != nil && err != io.EOF {
		cl.close()
		return nil, err
	}
	return r, nil
}

// TreeReader reads a packed tree.
type TreeReader struct {
	fileReader
	res TreeResult
}

// Result reads what is left of the stream and returns what the agent
// reports after the last byte.
func (r *TreeReader) Result() (TreeResult, error) {
	// A tar reader stops at the archive's end marker; the padding after
	// it is still to be read.
	if _, err := io.Copy(io.Discard, &r.fileReader); err != nil {
		return TreeResult{}, err
	}
	t, p, err := r.cl.fr.Next()
	if err != nil {
		return TreeResult{}, r.cl.err(r.ctx, OpPack, err)
	}
	if t != FrameResult {
		return TreeResult{}, fmt.Errorf("pack: unexpected frame %d", t)
	}
	err = json.Unmarshal(p, &r.res)
	return r.res, err
}

// How long Dial waits for one connection's handshake before it tries a new
// connection: long enough for a loaded host running TCG guests to answer
// (a handshake takes milliseconds), short enough that a mute connection
// costs little. A guest still booting is waited for across connections.
const (
	handshakeWait    = time.Second
	handshakeWaitMax = 8 * time.Second
)

// Fork tells the agent of a VM restored from another session's memory
// snapshot that it is a new machine: it thaws the disks, sets the clock,
// reseeds the RNG, and takes spec's hostname, machine id and filesystem
// UUIDs, a new boot id, and forgets the executions it inherited (they keep
// running, their output drained).
func (c *Client) Fork(ctx context.Context, spec MountSpec, now time.Time, seed []byte) (ForkResult, error) {
	var r ForkResult
	err := c.do(ctx, &Request{Op: OpFork, Mount: &spec, Time: now.UnixNano(), Data: seed}, &r)
	return r, err
}

// maxScanEntries bounds a scan the host accepts from the guest.
const maxScanEntries = 4 << 20

// Scan describes paths under /workspace (with walk, everything under
// those that are directories), with content hashes when sums is set.
func (c *Client) Scan(ctx context.Context, paths []string, walk, sums bool) ([]ScanEntry, error) {
	var out []ScanEntry
	err := c.batches(ctx, &Request{Op: OpScan, Paths: paths, All: walk, Sums: sums}, nil, func(p []byte) error {
		var batch []ScanEntry
		if err := json.Unmarshal(p, &batch); err != nil {
			return fmt.Errorf("scan: unreadable reply: %w", err)
		}
		if len(out)+len(batch) > maxScanEntries {
			return fmt.Errorf("scan: more than %d entries", maxScanEntries)
		}
		out = append(out, batch...)
		return nil
	})
	return out, err
}

// Track starts recording which paths change under /workspace, as id,
// holding at most limit entries (0: the agent's bound) before it
// overflows.
func (c *Client) Track(ctx context.Context, id string, limit int) error {
	return c.do(ctx, &Request{Op: OpTrack, ID: id, Limit: limit}, nil)
}

// Untrack drops record id.
func (c *Client) Untrack(ctx context.Context, id string) error {
	return c.do(ctx, &Request{Op: OpUntrack, ID: id}, nil)
}

// maxChangedPaths bounds the record the host accepts.
const maxChangedPaths = 1 << 20

// Changes reads record id: its state and the paths (relative to
// /workspace) changed since it started.
func (c *Client) Changes(ctx context.Context, id string) (TrackState, []string, error) {
	var st TrackState
	var paths []string
	err := c.batches(ctx, &Request{Op: OpChanges, ID: id}, &st, func(p []byte) error {
		var batch []string
		if err := json.Unmarshal(p, &batch); err != nil {
			return fmt.Errorf("changes: unreadable reply: %w", err)
		}
		if len(paths)+len(batch) > maxChangedPaths {
			return fmt.Errorf("changes: more than %d paths", maxChangedPaths)
		}
		paths = append(paths, batch...)
		return nil
	})
	return st, paths, err
}

// batches reads a streamed reply: a FrameResult into head first when head
// is set, then data frames handed to each until FrameEnd.
func (c *Client) batches(ctx context.Context, req *Request, head any, each func([]byte) error) error {
	cl, err := c.open(ctx, req)
	if err != nil {
		return err
	}
	defer cl.close()
	for {
		t, p, err := cl.fr.Next()
		if err != nil {
			return cl.err(ctx, req.Op, err)
		}
		switch t {
		case FrameResult:
			if head == nil {
				return fmt.Errorf("%s: unexpected result frame", req.Op)
			}
			if err := json.Unmarshal(p, head); err != nil {
				return fmt.Errorf("%s: unreadable reply: %w", req.Op, err)
			}
		case FrameData:
			if err := each(p); err != nil {
				return err
			}
		case FrameEnd:
			return nil
		case FrameError:
			return decodeError(p)
		default:
			return fmt.Errorf("%s: unexpected frame %d", req.Op, t)
		}
	}
}

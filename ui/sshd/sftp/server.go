// Package sftp serves SFTP (version 3, draft-ietf-secsh-filexfer-02, with
// OpenSSH's extensions) onto one berth session's /workspace, as OpenSSH's
// sftp-server serves a chrooted directory.
//
// A Server speaks the protocol over one stream (an SSH channel) and maps
// every request onto session.Files and session.Handles: open files with
// reads and writes at any offset, attributes, links, renames, directory
// listings paged to the client, and the extensions posix-rename, statvfs,
// fstatvfs, hardlink, fsync and limits (all @openssh.com). Everything the
// peer controls is bounded: packet length, read length, open handles,
// directory page size and requests in flight.
//
// Durability follows session.File: an upload opened to create and
// truncate (sftp put, scp) is staged and lands under its name only at
// CLOSE, made durable first; other writes go in place and are durable
// after fsync@openssh.com or CLOSE. A client that goes away with a staged
// upload open leaves nothing under the name; its in-place handles are
// closed.
package sftp

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/berthvm/berth/session"
)

// Limits. They are what limits@openssh.com reports, so OpenSSH clients
// size their requests to them.
const (
	// MaxPacket is the longest request accepted (its length field,
	// which excludes itself), as OpenSSH's SFTP_MAX_MSG_LENGTH; a longer
	// one ends the connection.
	MaxPacket = 256 << 10
	// MaxData is the most data one READ returns (longer requests are
	// answered short) and one WRITE should carry.
	MaxData = MaxPacket - 1024
	// DefaultMaxHandles bounds the files and directories a connection
	// holds open; further opens fail until some are closed.
	DefaultMaxHandles = 256
	// DefaultMaxInflight bounds the READs and WRITEs run at once; further
	// requests wait in the stream (SSH flow control holds the client).
	DefaultMaxInflight = 16
	// ReaddirPage is the most entries one READDIR reply carries.
	ReaddirPage = 100
)

// workspace is the only directory served.
const workspace = "/workspace"

// Server serves SFTP for one session. Set its fields, then call Serve
// once per stream; the zero value of each optional field is its default.
type Server struct {
	Files   session.Files   // required
	Handles session.Handles // required
	// Name is the session served.
	Name string
	// ReadOnly refuses every request that would change the workspace
	// (writes, opens for writing, setstat, remove, mkdir, rmdir, rename,
	// links, fsync) with PERMISSION_DENIED, as sftp-server -R does: the
	// viewer role.
	ReadOnly bool
	// Logger gets one line per failed request at debug level and a
	// line when a connection leaves handles open; nil discards.
	Logger *slog.Logger
	// MaxHandles bounds open handles per stream; 0 means
	// DefaultMaxHandles.
	MaxHandles int
	// MaxInflight bounds concurrent READs and WRITEs per stream; 0 means
	// DefaultMaxInflight, 1 runs every request in order.
	MaxInflight int
	// Now dates READDIR's long names; nil means time.Now.
	Now func() time.Time
}

// Serve speaks SFTP on rwc until the client ends the stream (then it
// returns nil), the stream fails or breaks the protocol, or ctx ends (it
// closes rwc then, to stop reading, and returns ctx's error). Handles
// still open at the end are released: staged uploads are dropped,
// leaving nothing under their names, and other files are closed.
func (s *Server) Serve(ctx context.Context, rwc io.ReadWriteCloser) error {
	if s.Files == nil || s.Handles == nil {
		return fmt.Errorf("sftp: Server needs Files and Handles: %w", session.ErrInvalid)
	}
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { rwc.Close() })
	defer stop()

	c := &conn{
		srv:      s,
		ctx:      ctx,
		keep:     context.WithoutCancel(ctx),
		log:      s.Logger,
		w:        rwc,
		handles:  map[string]*handle{},
		staged:   map[string]*handle{},
		now:      s.Now,
		maxOpen:  s.MaxHandles,
		maxSched: s.MaxInflight,
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if c.now == nil {
		c.now = time.Now
	}
	if c.maxOpen <= 0 {
		c.maxOpen = DefaultMaxHandles
	}
	if c.maxSched <= 0 {
		c.maxSched = DefaultMaxInflight
	}
	c.done = make(chan *dataOp, c.maxSched)

	err := c.serve(bufio.NewReaderSize(rwc, 64<<10))
	c.release()
	if perr := parent.Err(); perr != nil {
		return perr
	}
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// conn is one stream's state. Only the serving goroutine touches the
// handle tables and the scheduler; workers running READs and WRITEs get
// their handle passed in and only send their reply.
type conn struct {
	srv  *Server
	ctx  context.Context // path calls; ends with the stream
	keep context.Context // parent of the handles' contexts: outlives ctx until release
	log  *slog.Logger
	now  func() time.Time

	wmu   sync.Mutex
	w     io.Writer
	werr  error
	order []*slot // replies not yet written, in request order

	handles map[string]*handle
	// staged holds, per path, the latest staged upload open on this
	// stream: until its CLOSE the file is not under its name, so this
	// stream's STAT, LSTAT and SETSTAT of the path go to the handle
	// (sshfs stats a file right after creating it).
	staged  map[string]*handle
	nextID  uint64
	maxOpen int

	maxSched int
	inflight []*dataOp
	done     chan *dataOp
	wg       sync.WaitGroup // workers
}

// handle is an open file or directory.
type handle struct {
	id   string
	path string // absolute, under /workspace
	// A file:
	file    session.File
	read    bool // opened for reading
	write   bool // opened for writing (or appending)
	append  bool
	staged  bool // written to a temporary file, renamed into place at CLOSE
	discard bool // removed while open: CLOSE drops it
	cancel  context.CancelFunc
	// A directory: its entries, read at OPENDIR, handed out in pages.
	dir  bool
	ents []session.FileInfo
}

// serve runs the protocol until the stream ends or breaks.
func (c *conn) serve(r io.Reader) error {
	pkt, err := readPacket(r, MaxPacket)
	if err != nil {
		return err
	}
	if pkt[0] != fxpInit {
		return fmt.Errorf("sftp: the client sent request type %d before INIT", pkt[0])
	}
	if err := c.send(versionPacket()); err != nil {
		return err
	}
	for {
		pkt, err := readPacket(r, MaxPacket)
		if err != nil {
			return err
		}
		if err := c.dispatch(pkt); err != nil {
			return err
		}
		if err := c.writeErr(); err != nil {
			return err
		}
	}
}

// versionPacket answers INIT: version 3 and the extensions served.
func versionPacket() []byte {
	e := newEncoder(fxpVersion, 256)
	e.u32(protocolVersion)
	for _, ext := range [][2]string{
		{"posix-rename@openssh.com", "1"},
		{"statvfs@openssh.com", "2"},
		{"fstatvfs@openssh.com", "2"},
		{"hardlink@openssh.com", "1"},
		{"fsync@openssh.com", "1"},
		{"limits@openssh.com", "1"},
	} {
		e.str(ext[0])
		e.str(ext[1])
	}
	return e.finish()
}

// A slot is one request's place in the order replies go out. OpenSSH's
// client counts an upload as far as its WRITEs were acknowledged in order
// (and truncates the file there), so replies leave in request order even
// when READs and WRITEs run concurrently: a reply waits for the replies
// of the requests before it.
type slot struct {
	pkt   []byte
	ready bool
}

// reserve takes the next place in the reply order.
func (c *conn) reserve() *slot {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	s := &slot{}
	c.order = append(c.order, s)
	return s
}

// fill gives s its reply (nil: none) and writes every reply now first in
// line. The first write failure sticks (the serving loop then ends) and
// later replies are dropped.
func (c *conn) fill(s *slot, pkt []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	s.pkt, s.ready = pkt, true
	for len(c.order) > 0 && c.order[0].ready {
		next := c.order[0]
		c.order[0] = nil
		c.order = c.order[1:]
		if next.pkt == nil || c.werr != nil {
			continue
		}
		if _, err := c.w.Write(next.pkt); err != nil {
			c.werr = fmt.Errorf("sftp: writing a reply: %w", err)
		}
	}
	return c.werr
}

// send queues one reply behind those of earlier requests.
func (c *conn) send(pkt []byte) error { return c.fill(c.reserve(), pkt) }

func (c *conn) writeErr() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.werr
}

// statusPacket is the STATUS reply for err (OK for nil).
func (c *conn) statusPacket(id uint32, op string, err error) []byte {
	code, msg := statusOf(err)
	if code != fxOK && code != fxEOF {
		c.log.Debug("sftp: request failed", "op", op, "status", code, "err", msg)
	}
	if code == fxOK {
		msg = "Success"
	}
	e := newEncoder(fxpStatus, 16+len(msg))
	e.u32(id)
	e.u32(code)
	e.str(msg)
	e.str("en")
	return e.finish()
}

// sendStatus replies with err's status.
func (c *conn) sendStatus(id uint32, op string, err error) {
	c.send(c.statusPacket(id, op, err))
}

// dispatch serves one request. READ and WRITE may run concurrently
// (scheduler); every other request first waits for those in flight, so
// it sees their effects as a client that pipelines expects. Only a
// broken protocol returns an error.
func (c *conn) dispatch(pkt []byte) error {
	typ := pkt[0]
	d := &decoder{b: pkt[1:]}
	if typ == fxpInit {
		return errors.New("sftp: the client sent INIT again")
	}
	id := d.u32()
	if d.err != nil {
		return fmt.Errorf("sftp: request type %d without an id", typ)
	}
	switch typ {
	case fxpRead:
		c.read(id, d)
		return nil
	case fxpWrite:
		c.write(id, d)
		return nil
	}
	if err := c.barrier(); err != nil {
		return err
	}
	op, reply, err := c.request(typ, id, d)
	if err == nil && d.err != nil {
		err = status(fxBadMessage, "malformed %s request: %v", op, d.err)
	}
	if err != nil || reply == nil {
		c.sendStatus(id, op, err)
		return nil
	}
	c.send(reply)
	return nil
}

// request serves every request but READ and WRITE. It returns the
// request's name, and a reply or an error (nil, nil is STATUS OK).
func (c *conn) request(typ byte, id uint32, d *decoder) (string, []byte, error) {
	switch typ {
	case fxpOpen:
		reply, err := c.open(id, d)
		return "open", reply, err
	case fxpClose:
		return "close", nil, c.close(d)
	case fxpLstat:
		reply, err := c.stat(id, d, false)
		return "lstat", reply, err
	case fxpStat:
		reply, err := c.stat(id, d, true)
		return "stat", reply, err
	case fxpFstat:
		reply, err := c.fstat(id, d)
		return "fstat", reply, err
	case fxpSetstat:
		return "setstat", nil, c.setstat(d)
	case fxpFsetstat:
		return "fsetstat", nil, c.fsetstat(d)
	case fxpOpendir:
		reply, err := c.opendir(id, d)
		return "opendir", reply, err
	case fxpReaddir:
		reply, err := c.readdir(id, d)
		return "readdir", reply, err
	case fxpRemove:
		return "remove", nil, c.remove(d)
	case fxpMkdir:
		return "mkdir", nil, c.mkdir(d)
	case fxpRmdir:
		return "rmdir", nil, c.rmdir(d)
	case fxpRealpath:
		reply, err := c.realpath(id, d)
		return "realpath", reply, err
	case fxpRename:
		return "rename", nil, c.rename(d)
	case fxpReadlink:
		reply, err := c.readlink(id, d)
		return "readlink", reply, err
	case fxpSymlink:
		return "symlink", nil, c.symlink(d)
	case fxpExtended:
		return c.extended(id, d)
	}
	return fmt.Sprintf("type %d", typ), nil, status(fxOpUnsupported, "request type %d is not supported", typ)
}

// release ends the stream's handles: staged uploads are dropped (their
// contexts end without a Close, so nothing lands under their names),
// then, once the workers are done, other files are closed.
func (c *conn) release() {
	var dropped, closed int
	for _, h := range c.handles {
		if h.file != nil && (h.staged || h.discard) {
			h.cancel()
			dropped++
		}
	}
	// Once Serve's context ends, nothing may wait on a call: not the
	// workers, not the closes below, even if it ends while they run.
	cancels := make([]context.CancelFunc, 0, len(c.handles))
	for _, h := range c.handles {
		if h.cancel != nil {
			cancels = append(cancels, h.cancel)
		}
	}
	cancelAll := func() {
		for _, cancel := range cancels {
			cancel()
		}
	}
	if c.ctx.Err() != nil {
		cancelAll()
	} else {
		stop := context.AfterFunc(c.ctx, cancelAll)
		defer stop()
	}
	c.wg.Wait()
	for _, h := range c.handles {
		if h.file != nil && !h.staged && !h.discard {
			if err := h.file.Close(); err != nil {
				c.log.Info("sftp: closing a file the client left open", "path", h.path, "err", err)
			}
			h.cancel()
			closed++
		}
	}
	if dropped+closed > 0 {
		c.log.Info("sftp: the client left files open", "uploads_dropped", dropped, "closed", closed)
	}
	clear(c.handles)
	clear(c.staged)
}

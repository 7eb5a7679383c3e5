package sftp

import (
	"errors"
	"io"
	"math"
)

// dataOp is a READ or WRITE in flight.
type dataOp struct {
	key      string // the file's path: ops on other files never conflict
	write    bool
	append   bool // lands wherever the end is: conflicts with every op on the file
	off, end uint64
}

// conflicts reports whether a and b must not run at once: on one file,
// reads run beside reads and writes beside writes to other ranges;
// anything else runs in request order. (A read next to a write may see
// the file's size change, so the two never overlap in time.)
func (a *dataOp) conflicts(b *dataOp) bool {
	if a.key != b.key {
		return false
	}
	if !a.write && !b.write {
		return false
	}
	if a.write && b.write && !a.append && !b.append {
		return a.off < b.end && b.off < a.end
	}
	return true
}

// admit waits until op may run, retiring finished ops meanwhile, and
// counts it in flight. It fails only when the stream's context ends.
func (c *conn) admit(op *dataOp) error {
	for {
		c.reap()
		if len(c.inflight) < c.maxSched && !c.conflicting(op) {
			c.inflight = append(c.inflight, op)
			return nil
		}
		select {
		case d := <-c.done:
			c.retire(d)
		case <-c.ctx.Done():
			return c.ctx.Err()
		}
	}
}

func (c *conn) conflicting(op *dataOp) bool {
	for _, x := range c.inflight {
		if op.conflicts(x) {
			return true
		}
	}
	return false
}

// reap retires the ops that finished, without waiting.
func (c *conn) reap() {
	for {
		select {
		case d := <-c.done:
			c.retire(d)
		default:
			return
		}
	}
}

func (c *conn) retire(d *dataOp) {
	for i, x := range c.inflight {
		if x == d {
			c.inflight = append(c.inflight[:i], c.inflight[i+1:]...)
			return
		}
	}
}

// barrier waits until no READ or WRITE is in flight.
func (c *conn) barrier() error {
	for len(c.inflight) > 0 {
		select {
		case d := <-c.done:
			c.retire(d)
		case <-c.ctx.Done():
			return c.ctx.Err()
		}
	}
	return nil
}

// run starts op's work on a worker once admitted; the reply work returns
// goes out in the request's place in the reply order, and op is reported
// done. If the stream's context ends first, the request is not run (the
// stream is going away).
func (c *conn) run(op *dataOp, work func() []byte) {
	s := c.reserve()
	if c.admit(op) != nil {
		c.fill(s, nil)
		return
	}
	c.wg.Add(1)
	go func() { // ends when work returns: a File call with the handle's context
		defer c.wg.Done()
		c.fill(s, work())
		c.done <- op
	}()
}

// fileHandle finds the file handle a READ or WRITE names.
func (c *conn) fileHandle(b []byte) (*handle, error) {
	h, ok := c.handles[string(b)]
	if !ok || h.file == nil {
		return nil, errBadHandle
	}
	return h, nil
}

// read serves READ: at most MaxData bytes from any offset; EOF status
// at or past the end.
func (c *conn) read(id uint32, d *decoder) {
	hb, off, n := d.bytes(), d.u64(), d.u32()
	if d.err != nil {
		c.sendStatus(id, "read", status(fxBadMessage, "malformed read request: %v", d.err))
		return
	}
	h, err := c.fileHandle(hb)
	if err == nil && !h.read {
		err = status(fxPermissionDenied, "%s was not opened for reading", h.path)
	}
	if err == nil && off > math.MaxInt64-MaxData {
		err = status(fxBadMessage, "read offset %d is out of range", off)
	}
	if err != nil {
		c.sendStatus(id, "read", err)
		return
	}
	n = min(n, MaxData)
	op := &dataOp{key: h.path, off: off, end: off + uint64(n)}
	c.run(op, func() []byte {
		// The DATA reply is built around the buffer read into: no copy.
		const hdr = 4 + 1 + 4 + 4
		e := newEncoder(fxpData, 4+4+int(n))
		e.u32(id)
		e.u32(0) // the length, once known
		buf := e.b[hdr : hdr+int(n)]
		got, err := h.file.ReadAt(buf, int64(off))
		switch {
		case got > 0 || (n == 0 && err == nil):
			e.b = e.b[:hdr+got]
			e.b[9], e.b[10], e.b[11], e.b[12] = byte(got>>24), byte(got>>16), byte(got>>8), byte(got)
			return e.finish()
		case err == nil, errors.Is(err, io.EOF):
			return c.statusPacket(id, "read", io.EOF)
		default:
			return c.statusPacket(id, "read", err)
		}
	})
}

// write serves WRITE at any offset (or at the end, for a handle opened
// to append).
func (c *conn) write(id uint32, d *decoder) {
	hb, off, data := d.bytes(), d.u64(), d.bytes()
	if d.err != nil {
		c.sendStatus(id, "write", status(fxBadMessage, "malformed write request: %v", d.err))
		return
	}
	h, err := c.fileHandle(hb)
	switch {
	case err != nil:
	case c.srv.ReadOnly:
		err = errReadOnly
	case !h.write:
		err = status(fxPermissionDenied, "%s was not opened for writing", h.path)
	case off > math.MaxInt64-uint64(len(data)):
		err = status(fxBadMessage, "write offset %d is out of range", off)
	}
	if err != nil {
		c.sendStatus(id, "write", err)
		return
	}
	op := &dataOp{key: h.path, write: true, append: h.append, off: off, end: off + uint64(len(data))}
	c.run(op, func() []byte {
		n, err := h.file.WriteAt(data, int64(off))
		if err == nil && n < len(data) {
			err = status(fxFailure, "short write: %d of %d bytes", n, len(data))
		}
		return c.statusPacket(id, "write", err)
	})
}

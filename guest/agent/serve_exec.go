package agent

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"sync"
	"time"

	"github.com/creack/pty"

	"github.com/berthvm/berth/guest"
)

// maxStdinQueue bounds stdin the agent holds for a command that is not
// reading it. Stdin is queued rather than written inline so that acks on
// the same stream keep flowing while the command is blocked.
const maxStdinQueue = 16 << 20

func (a *Agent) serveExec(ctx context.Context, s *stream, req *guest.Request) error {
	if _, err := a.workspace(); err != nil {
		return err
	}
	if req.Exec == nil {
		return &guest.Error{Code: guest.CodeBadRequest, Op: "exec", Message: "missing exec request"}
	}
	e, _, err := a.execs.start(req.Exec)
	if err != nil {
		return err
	}
	a.stream(ctx, s, e, 0, 0)
	return nil
}

func (a *Agent) serveAttach(ctx context.Context, s *stream, req *guest.Request) error {
	e, err := a.execs.get(req.ID)
	if err != nil {
		return err
	}
	a.stream(ctx, s, e, req.Stdout, req.Stderr)
	return nil
}

// stream sends e's output from the given offsets until the execution ends
// (then an Exit frame) or the host goes away, while applying the host's
// stdin, resize and ack frames. Requesting offset N acknowledges
// everything before it.
func (a *Agent) stream(ctx context.Context, s *stream, e *execution, outOff, errOff int64) {
	e.mu.Lock()
	e.stdout.ack(outOff)
	if e.stderr != nil {
		e.stderr.ack(errOff)
	}
	e.cond.Broadcast()
	info := e.infoLocked()
	e.mu.Unlock()
	if s.sendJSON(guest.FrameStarted, info) != nil {
		return
	}

	gone := false // guarded by e.mu: the host's side of the stream ended
	stdin := newStdinQueue(e)
	defer stdin.close()
	go func() {
		defer func() {
			e.mu.Lock()
			gone = true
			e.cond.Broadcast()
			e.mu.Unlock()
		}()
		for {
			t, p, err := s.fr.Next()
			if err != nil {
				return
			}
			switch t {
			case guest.FrameStdin:
				if !stdin.push(p) {
					return
				}
			case guest.FrameStdinEOF:
				stdin.push(nil)
			case guest.FrameResize:
				var ws guest.WinSize
				if json.Unmarshal(p, &ws) == nil && e.tty != nil && ws.Rows > 0 && ws.Cols > 0 {
					pty.Setsize(e.tty, &pty.Winsize{Rows: uint16(ws.Rows), Cols: uint16(ws.Cols)})
				}
			case guest.FrameAck:
				var ack guest.Ack
				if json.Unmarshal(p, &ack) == nil {
					e.mu.Lock()
					e.stdout.ack(ack.Stdout)
					if e.stderr != nil {
						e.stderr.ack(ack.Stderr)
					}
					e.cond.Broadcast()
					e.mu.Unlock()
				}
			}
		}
	}()

	const hdr = guest.FrameHeader + 8 // frame header, then the output offset
	buf := make([]byte, hdr+guest.DataChunk)
	for {
		e.mu.Lock()
		var b *outBuf
		var off *int64
		var ft guest.FrameType
		for {
			if gone || ctx.Err() != nil {
				e.mu.Unlock()
				return
			}
			if outOff < e.stdout.end {
				b, off, ft = e.stdout, &outOff, guest.FrameStdout
				break
			}
			if e.stderr != nil && errOff < e.stderr.end {
				b, off, ft = e.stderr, &errOff, guest.FrameStderr
				break
			}
			if e.done {
				info := e.infoLocked()
				e.mu.Unlock()
				s.sendJSON(guest.FrameExit, info)
				return
			}
			e.cond.Wait()
		}
		if start := b.start(); *off < start {
			*off = start // only after a forget; the frame offset shows the gap
		}
		n := b.readAt(*off, buf[hdr:])
		e.mu.Unlock()
		binary.BigEndian.PutUint64(buf[guest.FrameHeader:], uint64(*off))
		if s.sendBuf(ft, buf[:hdr+n]) != nil {
			return
		}
		*off += int64(n)
	}
}

// stdinQueue feeds a command's stdin from its own goroutine.
type stdinQueue struct {
	e      *execution
	mu     sync.Mutex
	cond   *sync.Cond
	q      [][]byte
	size   int
	closed bool
}

func newStdinQueue(e *execution) *stdinQueue {
	q := &stdinQueue{e: e}
	q.cond = sync.NewCond(&q.mu)
	go q.run()
	return q
}

// stdinRecheck is how often a push waiting for room looks again whether
// the command's output waits for acknowledgements.
const stdinRecheck = 50 * time.Millisecond

// push queues p; nil means EOF. While the queue is over its bound it
// waits for the command to take some, so the host's sending stops at its
// window: back-pressure, as a pipe gives. (It used to end the stream,
// and a host sending faster than a busy guest's command read, 100 MB to
// `cat` under load, then hung on a stream no one read.) It reports false,
// which ends the stream, when the queue is closed (the execution's stream
// ended), or when the command's output waits for acknowledgements that
// could only come after this frame on the stream: a command that neither
// reads its stdin nor can write its output would otherwise never move.
// A push waits at most as long as the execution lives.
func (q *stdinQueue) push(p []byte) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for q.size > 0 && q.size+len(p) > maxStdinQueue {
		if q.closed {
			return false
		}
		q.mu.Unlock()
		stalled := q.e.outputStalled()
		q.mu.Lock()
		if stalled {
			return false
		}
		t := time.AfterFunc(stdinRecheck, func() {
			q.mu.Lock()
			q.cond.Broadcast()
			q.mu.Unlock()
		})
		q.cond.Wait()
		t.Stop()
	}
	if q.closed {
		return false
	}
	var c []byte
	if p != nil {
		c = append([]byte{}, p...)
	}
	q.q = append(q.q, c)
	q.size += len(p)
	q.cond.Broadcast()
	return true
}

func (q *stdinQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.cond.Broadcast()
	q.mu.Unlock()
}

func (q *stdinQueue) run() {
	for {
		q.mu.Lock()
		for len(q.q) == 0 && !q.closed {
			q.cond.Wait()
		}
		if len(q.q) == 0 {
			q.mu.Unlock()
			return
		}
		p := q.q[0]
		q.q = q.q[1:]
		q.size -= len(p)
		q.cond.Broadcast() // room for a waiting push
		q.mu.Unlock()
		w := q.e.stdin
		if w == nil {
			continue
		}
		if p == nil {
			if q.e.tty != nil {
				w.Write([]byte{4}) // ^D: a terminal has no half-close
			} else {
				w.Close()
			}
			continue
		}
		w.Write(p)
	}
}

// outputStalled reports whether e's output is held up waiting for the
// host's acknowledgements (its ring is full of unacknowledged bytes).
func (e *execution) outputStalled() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.stdout.free() <= 0 || (e.stderr != nil && e.stderr.free() <= 0)
}

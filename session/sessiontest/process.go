package sessiontest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync"

	"github.com/berthvm/berth/session"
)

// process is a caller's handle on an execution, from Exec or Attach.
type process struct {
	e   *fakeExec
	ctx context.Context // the caller's: ends Output and blocks no stdin write past it
	out chan session.Chunk
}

var _ session.Process = (*process)(nil)

// openLocked returns a handle whose Output delivers chunks from seq from.
// Its goroutine ends when the output is complete, ctx ends or the Fake is
// closed.
func (e *fakeExec) openLocked(ctx context.Context, from uint64) *process {
	p := &process{e: e, ctx: ctx, out: make(chan session.Chunk)}
	go e.pump(ctx, from, p.out)
	return p
}

func (e *fakeExec) pump(ctx context.Context, next uint64, out chan<- session.Chunk) {
	defer close(out)
	f := e.f
	for {
		f.mu.Lock()
		batch := e.chunksFromLocked(next, 64)
		done := e.rec.State.Done()
		wake := e.changed
		f.mu.Unlock()
		for _, c := range batch {
			select {
			case out <- c:
				next = c.Seq + 1
			case <-ctx.Done():
				return
			case <-f.life.Done():
				return
			}
		}
		if len(batch) > 0 {
			continue
		}
		if done {
			return
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return
		case <-f.life.Done():
			return
		}
	}
}

func (p *process) ID() string                   { return p.e.rec.ID }
func (p *process) Output() <-chan session.Chunk { return p.out }

func (p *process) Stdin() io.WriteCloser {
	if p.e.stdin == nil {
		return noStdin{p.e.rec.ID}
	}
	return &stdinWriter{pipe: p.e.stdin, ctx: p.ctx}
}

func (p *process) Resize(ctx context.Context, rows, cols int) error {
	f := p.e.f
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case !p.e.rec.TTY:
		return fmt.Errorf("resize %s: the command has no terminal: %w", p.e.rec.ID, session.ErrInvalid)
	case rows <= 0 || cols <= 0:
		return fmt.Errorf("resize %s: bad size %dx%d: %w", p.e.rec.ID, cols, rows, session.ErrInvalid)
	case p.e.rec.State.Done():
		return fmt.Errorf("resize %s: it already ended (%s): %w", p.e.rec.ID, p.e.rec.State, session.ErrInvalidState)
	}
	p.e.rows, p.e.cols = rows, cols
	select {
	case p.e.resized <- struct{}{}:
	default:
	}
	return nil
}

func (p *process) Cancel(ctx context.Context) error { return p.e.f.Cancel(ctx, p.e.rec.ID) }

// Wait works after the handle's context ended too: it waits with its own.
func (p *process) Wait(ctx context.Context) (session.Execution, error) {
	select {
	case <-p.e.done:
	case <-ctx.Done():
		return session.Execution{}, ctx.Err()
	}
	f := p.e.f
	f.mu.Lock()
	defer f.mu.Unlock()
	return cloneExec(p.e.rec), nil
}

type noStdin struct{ id string }

func (n noStdin) Write([]byte) (int, error) {
	return 0, fmt.Errorf("stdin of %s: the command was started without stdin: %w", n.id, session.ErrInvalid)
}
func (noStdin) Close() error { return nil }

// stdinPipe hands caller writes to the command's reads, one at a time.
// Writes block until the command reads, stdin is closed, the command ends
// or the writer's context ends.
type stdinPipe struct {
	data    chan []byte
	eof     chan struct{}
	eofOnce sync.Once
	ended   <-chan struct{} // the execution's done
}

func newStdinPipe(ended <-chan struct{}) *stdinPipe {
	return &stdinPipe{data: make(chan []byte), eof: make(chan struct{}), ended: ended}
}

type stdinWriter struct {
	pipe *stdinPipe
	ctx  context.Context
}

func (w *stdinWriter) Write(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	select {
	case <-w.pipe.eof:
		return 0, fmt.Errorf("stdin: write after close: %w", io.ErrClosedPipe)
	case <-w.pipe.ended:
		return 0, fmt.Errorf("stdin: the command ended: %w", io.ErrClosedPipe)
	default:
	}
	select {
	case w.pipe.data <- bytes.Clone(b):
		return len(b), nil
	case <-w.pipe.ended:
		return 0, fmt.Errorf("stdin: the command ended: %w", io.ErrClosedPipe)
	case <-w.ctx.Done():
		return 0, w.ctx.Err()
	}
}

func (w *stdinWriter) Close() error {
	w.pipe.eofOnce.Do(func() { close(w.pipe.eof) })
	return nil
}

// stdinReader is the command's end of the pipe.
type stdinReader struct {
	pipe *stdinPipe
	ctx  context.Context
	buf  []byte
}

func (e *fakeExec) stdinReader(ctx context.Context) io.Reader {
	if e.stdin == nil {
		return eofReader{}
	}
	return &stdinReader{pipe: e.stdin, ctx: ctx}
}

func (r *stdinReader) Read(b []byte) (int, error) {
	if len(r.buf) == 0 {
		select {
		case r.buf = <-r.pipe.data:
		case <-r.pipe.eof:
			// A write racing Close has already been handed over or failed.
			select {
			case r.buf = <-r.pipe.data:
			default:
				return 0, io.EOF
			}
		case <-r.ctx.Done():
			return 0, r.ctx.Err()
		}
	}
	n := copy(b, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

type eofReader struct{}

func (eofReader) Read([]byte) (int, error) { return 0, io.EOF }

package api

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/berthvm/berth/session"
)

// Exec starts a command and streams it. The returned Process's output
// stream, stdin and Resize live as long as ctx; the command itself keeps
// running after ctx ends (Cancel stops it), and Wait still works then.
func (c *Client) Exec(ctx context.Context, name string, req session.ExecRequest) (session.Process, error) {
	p, err := sessionPath(name, "/exec")
	if err != nil {
		return nil, err
	}
	return c.openStream(ctx, p, nil, frame(inFrame{Request: &req}), req.Stdin, req.Stdin || req.TTY)
}

// Attach follows an execution's output from fromSeq (0 = live only); a
// finished execution's retained output is replayed and the stream ends.
func (c *Client) Attach(ctx context.Context, execID string, fromSeq uint64) (session.Process, error) {
	p, err := execPath(execID, "/attach")
	if err != nil {
		return nil, err
	}
	q := url.Values{"from": {strconv.FormatUint(fromSeq, 10)}}
	return c.openStream(ctx, p, q, nil, true, true)
}

// openStream posts a duplex request whose body starts with first and then
// carries frames the process sends (only first when !duplex), and reads
// the first response frame.
func (c *Client) openStream(ctx context.Context, path string, q url.Values, first []byte, stdin, duplex bool) (*process, error) {
	pr, pw := io.Pipe()
	if !duplex {
		pw.Close()
	}
	body := &duplexBody{Reader: io.MultiReader(bytes.NewReader(first), pr), pipe: pr}
	req, err := c.newRequest(ctx, http.MethodPost, path, q, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/x-ndjson")
	// End the body when the connection dies (see watchedConn).
	ended := make(chan struct{})
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) {
			wc, ok := info.Conn.(*watchedConn)
			if !ok {
				return
			}
			go func() {
				select {
				case <-wc.dead:
					pw.CloseWithError(fmt.Errorf("the daemon closed the connection: %w", session.ErrUnavailable))
				case <-ended:
				}
			}()
		},
	}))
	resp, err := c.do(req)
	if err != nil {
		close(ended)
		pw.CloseWithError(err)
		return nil, err
	}
	in := newFrameReader(resp.Body)
	var head outFrame
	if err := in.next(&head); err != nil || head.ID == "" {
		close(ended)
		pw.Close()
		resp.Body.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("starting %s: the daemon's stream began without an execution id (%v): %w", path, err, session.ErrUnavailable)
	}
	p := &process{
		c:     c,
		id:    head.ID,
		tty:   head.TTY,
		stdin: stdin,
		out:   make(chan session.Chunk),
		done:  make(chan struct{}),
		send:  &frameSender{w: pw},
	}
	go func() {
		p.run(ctx, resp.Body, in)
		close(ended)
	}()
	return p, nil
}

// duplexBody is an exec request body; the transport's Close ends the pipe
// so pending sends fail instead of blocking.
type duplexBody struct {
	io.Reader
	pipe *io.PipeReader
}

func (b *duplexBody) Close() error { return b.pipe.Close() }

// frameSender writes frames into the request body, one at a time.
type frameSender struct {
	mu     sync.Mutex
	w      *io.PipeWriter
	closed bool
}

var errStreamEnded = errors.New("the exec stream has ended")

func (s *frameSender) send(f inFrame) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errStreamEnded
	}
	if _, err := s.w.Write(frame(f)); err != nil {
		return errStreamEnded
	}
	return nil
}

// close ends the request body: cleanly when cause is nil, so the daemon
// sees the body's end and closes the stream at once (the transport shows
// the caller a response's end only once the request is fully written,
// waiting up to 50 ms for it), else aborted. It unblocks a send in
// progress; a second close does nothing.
func (s *frameSender) close(cause error) {
	s.w.CloseWithError(cause)
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
}

// process is a remote execution. run owns the response body and ends when
// the stream ends: final record, daemon gone, or ctx done.
type process struct {
	c     *Client
	id    string
	tty   bool
	stdin bool
	out   chan session.Chunk
	send  *frameSender

	done     chan struct{} // closed after final or streamErr is set
	final    *session.Execution
	finalErr error // an error the daemon sent instead of the record
}

var _ session.Process = (*process)(nil)

func (p *process) run(ctx context.Context, body io.ReadCloser, in *frameReader) {
	defer func() {
		var cause error // after a final record nothing more will be sent
		if p.final == nil && p.finalErr == nil {
			cause = errStreamEnded
		}
		p.send.close(cause)
		// The caller learns of the end first: closing the body can wait on
		// the transport finishing the request side of the connection.
		close(p.out)
		close(p.done)
		body.Close()
	}()
	for {
		var f outFrame
		if err := in.next(&f); err != nil {
			return
		}
		switch {
		case f.Chunk != nil:
			select {
			case p.out <- *f.Chunk:
			case <-ctx.Done():
				return
			}
		case f.Exit != nil:
			p.final = f.Exit
			return
		case f.Error != nil:
			p.finalErr = fromWire(0, *f.Error)
			return
		}
	}
}

func (p *process) ID() string                   { return p.id }
func (p *process) Output() <-chan session.Chunk { return p.out }

func (p *process) Stdin() io.WriteCloser {
	if !p.stdin {
		return noStdin{p.id}
	}
	return &stdinWriter{p: p}
}

func (p *process) Resize(ctx context.Context, rows, cols int) error {
	if !p.tty {
		return fmt.Errorf("resize %s: the command has no terminal: %w", p.id, session.ErrInvalid)
	}
	if rows <= 0 || cols <= 0 {
		return fmt.Errorf("resize %s: bad size %dx%d: %w", p.id, cols, rows, session.ErrInvalid)
	}
	if err := p.send.send(inFrame{Resize: &termSize{Rows: rows, Cols: cols}}); err != nil {
		return fmt.Errorf("resize %s: %w: %w", p.id, err, session.ErrInvalidState)
	}
	return nil
}

func (p *process) Cancel(ctx context.Context) error { return p.c.Cancel(ctx, p.id) }

// Wait returns the final record from the stream, or, when the stream ended
// early or nobody drains Output, asks the daemon until the execution is
// final.
func (p *process) Wait(ctx context.Context) (session.Execution, error) {
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	done := p.done
	for {
		select {
		case <-done:
			if p.final != nil {
				return *p.final, nil
			}
			if p.finalErr != nil {
				return session.Execution{}, p.finalErr
			}
			done = nil // the stream is gone: ask from now on
		case <-tick.C:
		case <-ctx.Done():
			return session.Execution{}, ctx.Err()
		}
		x, err := p.c.Execution(ctx, p.id)
		if err != nil {
			return session.Execution{}, err
		}
		if x.State.Done() {
			return x, nil
		}
	}
}

type noStdin struct{ id string }

func (n noStdin) Write([]byte) (int, error) {
	return 0, fmt.Errorf("stdin of %s: the command was started without stdin: %w", n.id, session.ErrInvalid)
}
func (noStdin) Close() error { return nil }

// stdinWriter sends stdin frames; Close sends EOF.
type stdinWriter struct {
	p      *process
	closed bool
}

func (w *stdinWriter) Write(b []byte) (int, error) {
	if w.closed {
		return 0, fmt.Errorf("stdin of %s: write after close: %w", w.p.id, io.ErrClosedPipe)
	}
	n := 0
	for len(b) > 0 {
		k := min(len(b), maxStdinFrame)
		if err := w.p.send.send(inFrame{Stdin: b[:k]}); err != nil {
			return n, fmt.Errorf("stdin of %s: %w", w.p.id, io.ErrClosedPipe)
		}
		n += k
		b = b[k:]
	}
	return n, nil
}

func (w *stdinWriter) Close() error {
	if w.closed {
		return nil
	}
	w.closed = true
	if err := w.p.send.send(inFrame{EOF: true}); err != nil {
		return fmt.Errorf("stdin of %s: %w", w.p.id, err)
	}
	if !w.p.tty {
		w.p.send.close(nil) // nothing but resizes could follow, and those need a terminal
	}
	return nil
}

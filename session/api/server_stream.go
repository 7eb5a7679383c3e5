package api

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sync"
	"time"

	"github.com/berthvm/berth/session"
)

// streamWriter writes NDJSON frames and flushes each one.
type streamWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func startStream(w http.ResponseWriter, rc *http.ResponseController) *streamWriter {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	return &streamWriter{w: w, rc: rc}
}

func (sw *streamWriter) send(v any) error {
	if _, err := sw.w.Write(frame(v)); err != nil {
		return err
	}
	return sw.rc.Flush()
}

// watch streams events; ?since_rev=N (a fleet's front door only) adds
// the fleet's changes after revision N.
func (s *server) watch(w http.ResponseWriter, r *http.Request) {
	since, err := queryUint(r, "since_rev")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var events <-chan session.Event
	fw, fleet := s.svc.(session.FleetWatcher)
	switch {
	case since == 0:
		events, err = s.svc.Watch(r.Context())
	case !fleet:
		err = &session.Error{Class: session.ErrInvalid, Msg: "since_rev: this berth is not in a fleet, so its events have no revisions",
			Hint: "leave out --since-rev"}
	case since > math.MaxInt64:
		err = &session.Error{Class: session.ErrInvalid, Msg: fmt.Sprintf("since_rev %d is out of range", since)}
	default:
		events, err = fw.WatchSince(r.Context(), int64(since))
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := startStream(w, http.NewResponseController(w))
	if err := out.rc.Flush(); err != nil { // headers out now, before the first event
		return
	}
	for ev := range events {
		if err := out.send(ev); err != nil {
			return // client gone: r.Context() ends, and with it the watch
		}
	}
}

// exec runs a command and streams it in full duplex: the request body
// starts with {"request": ExecRequest}.
func (s *server) exec(w http.ResponseWriter, r *http.Request) {
	recv := time.Now()
	rc := http.NewResponseController(w)
	if err := rc.EnableFullDuplex(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		s.writeError(w, r, err)
		return
	}
	defer endBody(rc, r)
	in := newFrameReader(r.Body)
	var first inFrame
	if err := in.next(&first); err != nil || first.Request == nil {
		s.writeError(w, r, errBadExecBody)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	p, err := s.svc.Exec(ctx, r.PathValue("name"), *first.Request)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.stream(ctx, cancel, w, rc, p, in, first.Request.TTY, recv)
}

// attach follows an execution from ?from= (0 = live only). With POST the
// request body may carry stdin and resize frames, as for exec.
func (s *server) attach(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	if err := rc.EnableFullDuplex(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		s.writeError(w, r, err)
		return
	}
	defer endBody(rc, r)
	from, err := queryUint(r, "from")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	id := r.PathValue("id")
	x, err := s.svc.Execution(r.Context(), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	p, err := s.svc.Attach(ctx, id, from)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.stream(ctx, cancel, w, rc, p, newFrameReader(r.Body), x.TTY, time.Time{})
}

// endBody closes a full-duplex request's body before its handler returns.
// Left to net/http, a body the handler did not read to its end is closed
// after the handler, and when that close reaches the end it starts the
// connection's background read where nothing stops it: the server then
// panics reading the next request on the connection ("invalid concurrent
// Body.Read call", golang/go#68560) and drops it, and the client's next
// call fails with EOF. It happens whenever a stream is refused (or cut
// short) and the client's body ends only after that. The response is
// flushed first, as the server would: a client may end its body only once
// it has the answer.
func endBody(rc *http.ResponseController, r *http.Request) {
	rc.Flush()
	r.Body.Close()
}

// stream sends p's output, then its final record, while a goroutine feeds
// request frames to p. Before it returns, stream stops that goroutine:
// cancelling ctx unblocks a stdin write, a past read deadline unblocks a
// body read.
//
// After the final record a client ends its request body, and stream waits
// for that end (briefly) rather than cutting the body off: a body read to
// its end keeps the connection reusable, and a client whose body is still
// being written waits up to 50 ms before it sees the response end.
//
// A command that does not read stdin holds back the request body, so a
// client that vanished then is noticed only when output fails to send or
// the command ends.
//
// With recv set (an exec's arrival) and the log at debug level, it logs
// when each phase of the stream ended, for taking an exec's time apart.
func (s *server) stream(ctx context.Context, cancel context.CancelFunc, w http.ResponseWriter, rc *http.ResponseController, p session.Process, in *frameReader, tty bool, recv time.Time) {
	out := startStream(w, rc)
	var wg sync.WaitGroup
	fed := make(chan struct{})
	final := false
	var head, drained, replied time.Time
	defer func() {
		if !recv.IsZero() && !replied.IsZero() {
			defer func() {
				s.log.Debug("exec stream phases", "exec", p.ID(), "recv", recv.UnixNano(), "head", head.Sub(recv),
					"output", drained.Sub(head), "reply", replied.Sub(drained), "body_end", time.Since(replied))
			}()
		}
		cancel()
		if final {
			t := time.NewTimer(bodyEndGrace)
			select {
			case <-fed:
			case <-t.C:
			}
			t.Stop()
		}
		select {
		case <-fed:
		default:
			rc.SetReadDeadline(time.Now())
		}
		wg.Wait()
	}()
	if err := out.send(outFrame{ID: p.ID(), TTY: tty}); err != nil {
		close(fed)
		return
	}
	head = time.Now()
	wg.Go(func() {
		defer close(fed)
		s.feed(ctx, p, in)
	})

	for c := range p.Output() {
		if err := out.send(outFrame{Chunk: &c}); err != nil {
			return
		}
	}
	if ctx.Err() != nil {
		return
	}
	drained = time.Now()
	x, err := p.Wait(ctx)
	if err != nil {
		_, body := toWire(err)
		final = out.send(outFrame{Error: &body}) == nil
		return
	}
	final = out.send(outFrame{Exit: &x}) == nil
	replied = time.Now()
}

// bodyEndGrace is how long a stream waits, after its final record, for the
// client to end its request body.
const bodyEndGrace = time.Second

// feed applies request frames to p until the body ends or fails. Stdin that
// the command no longer takes is dropped, so the client never blocks.
func (s *server) feed(ctx context.Context, p session.Process, in *frameReader) {
	stdin := p.Stdin()
	stdinOK := true
	for {
		var f inFrame
		if err := in.next(&f); err != nil {
			return
		}
		switch {
		case len(f.Stdin) > 0 && stdinOK:
			if _, err := stdin.Write(f.Stdin); err != nil {
				s.log.Debug("stdin write failed", "exec", p.ID(), "err", err)
				stdinOK = false
			}
		case f.EOF && stdinOK:
			stdin.Close()
			stdinOK = false
		case f.Resize != nil:
			if err := p.Resize(ctx, f.Resize.Rows, f.Resize.Cols); err != nil {
				s.log.Debug("resize failed", "exec", p.ID(), "err", err)
			}
		}
	}
}

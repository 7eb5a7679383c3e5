package sessiontest

import (
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/berthvm/berth/session"
)

// Causes with which the fake ends a command's context.
var (
	errCancelled = errors.New("cancelled")
	errTimedOut  = errors.New("timed out")
	errStopped   = errors.New("session stopped")
	errDeleted   = errors.New("session deleted")
	errLost      = errors.New("VM crashed; the command's outcome is unknown")
)

const maxChunk = 32 << 10

// fakeExec is one execution. Its fields are guarded by Fake.mu, except the
// channels, which are safe to use on their own.
type fakeExec struct {
	f   *Fake
	s   *fakeSession
	rec session.Execution

	chunks   []session.Chunk // retained output, seq firstSeq..nextSeq-1
	starts   []int64         // byte offset of every chunk ever recorded, by seq-1
	firstSeq uint64
	nextSeq  uint64
	kept     int64 // bytes in chunks
	// gen, when set, computes chunk seq instead of chunks holding it
	// (AddGenerated): output too large to keep is served page by page.
	gen func(seq uint64) session.Chunk

	changed chan struct{} // closed and replaced when output or state changes
	done    chan struct{} // closed when the execution is final
	cancel  context.CancelCauseFunc
	stdin   *stdinPipe // nil unless the caller asked to send stdin

	rows, cols int
	resized    chan struct{} // capacity 1
}

// Exec starts req.Argv[0] from the fake's Commands. An unknown command is
// recorded as failed, as a real agent would when exec fails.
func (f *Fake) Exec(ctx context.Context, name string, req session.ExecRequest) (session.Process, error) {
	if err := f.enter(ctx, "Exec"); err != nil {
		return nil, err
	}
	switch {
	case len(req.Argv) == 0 || req.Argv[0] == "":
		return nil, fmt.Errorf("exec in session %q: empty command: %w", name, session.ErrInvalid)
	case req.Timeout < 0:
		return nil, fmt.Errorf("exec in session %q: negative timeout %s: %w", name, req.Timeout, session.ErrInvalid)
	case req.Rows < 0 || req.Cols < 0:
		return nil, fmt.Errorf("exec in session %q: bad terminal size %dx%d: %w", name, req.Cols, req.Rows, session.ErrInvalid)
	}
	for k := range req.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return nil, fmt.Errorf("exec in session %q: bad environment variable name %q: %w", name, k, session.ErrInvalid)
		}
	}
	if req.User != "" {
		if err := session.ValidateUser(req.User); err != nil {
			return nil, err
		}
	}

	f.mu.Lock()
	defer f.mu.Unlock()
	s, err := f.usableLocked(ctx, name, session.ActionExec)
	if err != nil {
		return nil, err
	}
	run, err := f.useRunLocked(ctx, name)
	if err != nil {
		return nil, err
	}
	f.execSeq++
	e := &fakeExec{
		f:        f,
		s:        s,
		firstSeq: 1,
		nextSeq:  1,
		changed:  make(chan struct{}),
		done:     make(chan struct{}),
		rows:     req.Rows,
		cols:     req.Cols,
		resized:  make(chan struct{}, 1),
	}
	if req.TTY && e.rows == 0 {
		e.rows = 24
	}
	if req.TTY && e.cols == 0 {
		e.cols = 80
	}
	cwd := req.Cwd
	if cwd == "" {
		cwd = "/workspace"
	} else if !path.IsAbs(cwd) {
		cwd = path.Join("/workspace", cwd)
	}
	envNames := make([]string, 0, len(req.Env))
	for k := range req.Env {
		envNames = append(envNames, k)
	}
	sort.Strings(envNames)
	e.rec = session.Execution{
		ID:        fmt.Sprintf("e%04d", f.execSeq),
		Session:   name,
		Argv:      slices.Clone(req.Argv),
		EnvNames:  envNames,
		Cwd:       cwd,
		TTY:       req.TTY,
		Outside:   req.Outside,
		User:      req.User,
		By:        session.Actor(ctx),
		State:     session.ExecRunning,
		StartedAt: f.now(),
	}
	if req.Stdin {
		e.stdin = newStdinPipe(e.done)
	}
	s.execs = append(s.execs, e)
	f.execs[e.rec.ID] = e
	if run != nil {
		run.Executions++
		run.ExecIDs = append(run.ExecIDs, e.rec.ID)
	}
	s.info.Running++
	f.publishExecLocked(e, "started: "+strings.Join(e.rec.Argv, " "))

	cmd := f.commands[path.Base(req.Argv[0])]
	if msg := s.cwdProblem(cwd); msg != "" {
		f.finishLocked(e, session.ExecFailed, nil, "", msg)
	} else if msg := unknownUser(req.User); msg != "" {
		f.finishLocked(e, session.ExecFailed, nil, "", msg)
	} else if cmd == nil {
		f.finishLocked(e, session.ExecFailed, nil, "", fmt.Sprintf("exec %q: executable file not found in $PATH", req.Argv[0]))
	} else {
		f.startLocked(e, cmd, req)
	}
	return e.openLocked(ctx, 1), nil
}

// cwdProblem says what is wrong with a working directory in /workspace,
// as the agent does, or "" when nothing is. Elsewhere the fake has no
// filesystem: any directory is taken to exist.
func (s *fakeSession) cwdProblem(cwd string) string {
	rel, err := cleanPath(cwd)
	if err != nil {
		return ""
	}
	n, _, err := s.resolve(rel, true)
	switch {
	case errors.Is(err, session.ErrNotFound):
		return "working directory " + cwd + " does not exist"
	case err != nil, !n.dir:
		return "working directory " + cwd + " is not a directory"
	}
	return ""
}

// startLocked runs cmd in a goroutine that ends when cmd returns; the
// command's context ends on Cancel, timeout, Stop, Delete, Crash or Close.
func (f *Fake) startLocked(e *fakeExec, cmd Command, req session.ExecRequest) {
	cctx, cancel := context.WithCancelCause(f.life)
	e.cancel = cancel
	runCtx, stopTimer := cctx, context.CancelFunc(func() {})
	if req.Timeout > 0 {
		runCtx, stopTimer = context.WithTimeoutCause(cctx, req.Timeout, errTimedOut)
	}
	p := &Proc{
		Args:   slices.Clone(req.Argv),
		Env:    cloneEnv(req.Env),
		Cwd:    e.rec.Cwd,
		TTY:    req.TTY,
		Pid:    100 + f.execSeq,
		Stdin:  e.stdinReader(runCtx),
		Stdout: outWriter{e, session.Stdout},
		Stderr: outWriter{e, session.Stderr},
		e:      e,
	}
	timeout := req.Timeout
	f.wg.Go(func() {
		defer cancel(nil)
		defer stopTimer()
		code, err := cmd(runCtx, p)
		f.end(e, code, err, context.Cause(runCtx), timeout)
	})
}

// end records how a command ended.
func (f *Fake) end(e *fakeExec, code int, err, cause error, timeout time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.endLocked(e, code, err, cause, timeout)
}

func (f *Fake) endLocked(e *fakeExec, code int, err, cause error, timeout time.Duration) {
	var sig Signal
	switch {
	case errors.Is(cause, errCancelled):
		f.finishLocked(e, session.ExecCancelled, nil, "SIGKILL", "")
	case errors.Is(cause, errTimedOut):
		f.finishLocked(e, session.ExecTimedOut, nil, "SIGKILL", fmt.Sprintf("timed out after %s", timeout))
	case errors.Is(cause, errStopped), errors.Is(cause, errDeleted):
		f.finishLocked(e, session.ExecCancelled, nil, "SIGKILL", cause.Error())
	case errors.Is(cause, errLost):
		f.finishLocked(e, session.ExecLost, nil, "", cause.Error())
	case cause != nil:
		f.finishLocked(e, session.ExecLost, nil, "", "the service shut down; the command's outcome is unknown")
	case errors.As(err, &sig):
		f.finishLocked(e, session.ExecExited, nil, string(sig), "")
	case err != nil:
		f.finishLocked(e, session.ExecFailed, nil, "", err.Error())
	default:
		f.finishLocked(e, session.ExecExited, &code, "", "")
	}
}

func (f *Fake) finishLocked(e *fakeExec, st session.ExecState, code *int, signal, msg string) {
	if e.rec.State.Done() {
		return
	}
	e.rec.State = st
	e.rec.ExitCode = code
	e.rec.Signal = signal
	e.rec.Error = msg
	e.rec.EndedAt = f.now()
	e.s.info.Running--
	e.s.info.LastActivity = e.rec.EndedAt
	close(e.done)
	e.broadcastLocked()
	f.publishExecLocked(e, describeEnd(e.rec))
}

func describeEnd(x session.Execution) string {
	switch {
	case x.Signal != "":
		return fmt.Sprintf("%s (%s)", x.State, x.Signal)
	case x.ExitCode != nil:
		return fmt.Sprintf("%s %d", x.State, *x.ExitCode)
	case x.Error != "":
		return fmt.Sprintf("%s: %s", x.State, x.Error)
	}
	return string(x.State)
}

func (f *Fake) publishExecLocked(e *fakeExec, msg string) {
	x := cloneExec(e.rec)
	f.publishLocked(context.Background(), e.s, session.Event{Kind: session.EventExec, Message: msg, By: e.rec.By, Exec: &x})
}

func (e *fakeExec) broadcastLocked() {
	close(e.changed)
	e.changed = make(chan struct{})
}

// endExecsLocked cancels s's running commands with cause and returns them.
func (f *Fake) endExecsLocked(s *fakeSession, cause error) []*fakeExec {
	var running []*fakeExec
	for _, e := range s.execs {
		if !e.rec.State.Done() && e.cancel != nil {
			e.cancel(cause)
			running = append(running, e)
		}
	}
	return running
}

func waitExecs(execs []*fakeExec) {
	for _, e := range execs {
		<-e.done
	}
}

// recordLocked appends output, splitting it into chunks and trimming by
// retention.
func (e *fakeExec) recordLocked(stream session.Stream, b []byte) {
	for len(b) > 0 {
		n := min(len(b), maxChunk)
		var offset int64
		if k := len(e.starts); k > 0 {
			last := e.chunkAtLocked(uint64(k))
			offset = e.starts[k-1] + int64(len(last))
		}
		c := session.Chunk{Exec: e.rec.ID, Seq: e.nextSeq, Stream: stream, Time: e.f.now(), Data: slices.Clone(b[:n])}
		e.chunks = append(e.chunks, c)
		e.starts = append(e.starts, offset)
		e.nextSeq++
		e.kept += int64(n)
		if stream == session.Stderr {
			e.rec.StderrBytes += int64(n)
		} else {
			e.rec.StdoutBytes += int64(n)
		}
		b = b[n:]
	}
	if limit := e.f.opts.OutputRetention; limit > 0 {
		for e.kept > limit && len(e.chunks) > 1 {
			e.kept -= int64(len(e.chunks[0].Data))
			e.chunks = e.chunks[1:]
			e.firstSeq++
		}
	}
	e.broadcastLocked()
}

// chunkAtLocked returns the data of chunk seq when it is retained; it is
// used only for the last chunk, which retention always keeps.
func (e *fakeExec) chunkAtLocked(seq uint64) []byte {
	if seq < e.firstSeq || seq >= e.nextSeq {
		return nil
	}
	return e.chunks[seq-e.firstSeq].Data
}

// chunksFromLocked returns retained chunks with seq >= from, at most limit
// (all when limit <= 0).
func (e *fakeExec) chunksFromLocked(from uint64, limit int) []session.Chunk {
	from = max(from, e.firstSeq)
	if from >= e.nextSeq {
		return nil
	}
	if e.gen != nil {
		n := e.nextSeq - from
		if limit > 0 {
			n = min(n, uint64(limit))
		}
		cs := make([]session.Chunk, n)
		for i := range cs {
			seq := from + uint64(i)
			cs[i] = e.gen(seq)
			cs[i].Exec, cs[i].Seq = e.rec.ID, seq
		}
		return cs
	}
	cs := e.chunks[from-e.firstSeq:]
	if limit > 0 && len(cs) > limit {
		cs = cs[:limit]
	}
	return slices.Clone(cs)
}

type outWriter struct {
	e      *fakeExec
	stream session.Stream
}

func (w outWriter) Write(b []byte) (int, error) {
	f := w.e.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if w.e.rec.State.Done() {
		return 0, fmt.Errorf("write %s of %s: execution ended", w.stream, w.e.rec.ID)
	}
	stream := w.stream
	if w.e.rec.TTY {
		stream = session.Stdout // a terminal merges both
	}
	w.e.recordLocked(stream, b)
	return len(b), nil
}

func (f *Fake) lookupExecLocked(id string) (*fakeExec, error) {
	e, ok := f.execs[id]
	if !ok {
		return nil, fmt.Errorf("execution %q: %w", id, session.ErrNotFound)
	}
	return e, nil
}

// Attach follows an execution's output from fromSeq (0 = live only). For a
// finished execution it replays the retained output and ends.
func (f *Fake) Attach(ctx context.Context, execID string, fromSeq uint64) (session.Process, error) {
	if err := f.enter(ctx, "Attach"); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	e, err := f.lookupExecLocked(execID)
	if err != nil {
		return nil, err
	}
	if fromSeq == 0 {
		fromSeq = e.nextSeq
	}
	return e.openLocked(ctx, fromSeq), nil
}

// Executions lists a session's executions in start order: the running ones,
// or all recorded ones.
func (f *Fake) Executions(ctx context.Context, name string, all bool) ([]session.Execution, error) {
	s, err := f.enterSession(ctx, "Executions", name)
	if err != nil {
		return nil, err
	}
	defer f.mu.Unlock()
	out := []session.Execution{}
	for _, e := range s.execs {
		if all || !e.rec.State.Done() {
			out = append(out, cloneExec(e.rec))
		}
	}
	return out, nil
}

// Execution returns one execution's record.
func (f *Fake) Execution(ctx context.Context, execID string) (session.Execution, error) {
	if err := f.enter(ctx, "Execution"); err != nil {
		return session.Execution{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	e, err := f.lookupExecLocked(execID)
	if err != nil {
		return session.Execution{}, err
	}
	return cloneExec(e.rec), nil
}

// Output returns retained output from fromSeq (0 = the first), at most
// limit chunks (all when limit <= 0), and the bytes trimmed in between.
func (f *Fake) Output(ctx context.Context, execID string, fromSeq uint64, limit int) (session.OutputPage, error) {
	if err := f.enter(ctx, "Output"); err != nil {
		return session.OutputPage{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	e, err := f.lookupExecLocked(execID)
	if err != nil {
		return session.OutputPage{}, err
	}
	fromSeq = max(fromSeq, 1)
	page := session.OutputPage{Chunks: e.chunksFromLocked(fromSeq, limit), Next: fromSeq}
	if fromSeq < e.firstSeq && fromSeq < e.nextSeq {
		page.Gap = e.starts[e.firstSeq-1] - e.starts[fromSeq-1]
		page.Next = e.firstSeq
	}
	if n := len(page.Chunks); n > 0 {
		page.Next = page.Chunks[n-1].Seq + 1
	}
	if page.Chunks == nil {
		page.Chunks = []session.Chunk{}
	}
	return page, nil
}

// Cancel kills a running execution. Cancelling a finished one is an
// ErrInvalidState.
func (f *Fake) Cancel(ctx context.Context, execID string) error {
	if err := f.enter(ctx, "Cancel"); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	e, err := f.lookupExecLocked(execID)
	if err != nil {
		return err
	}
	if e.rec.State.Done() || e.cancel == nil {
		return fmt.Errorf("cannot cancel execution %s: it already ended (%s): %w", execID, e.rec.State, session.ErrInvalidState)
	}
	e.cancel(errCancelled)
	return nil
}

// unknownUser says why a command cannot run as user, as the agent says
// it; "" when it can. The fake's guests are the mini image's: root is
// their only user and group, and a bare id needs no entry.
func unknownUser(user string) string {
	if user == "" {
		return ""
	}
	name, group, _ := strings.Cut(user, ":")
	known := func(s string) bool {
		if s == "" || s == "root" {
			return true
		}
		_, err := strconv.ParseUint(s, 10, 32)
		return err == nil
	}
	switch {
	case !known(name):
		return fmt.Sprintf("exec: cannot run as user %q: the VM's /etc/passwd does not have it", name)
	case !known(group):
		return fmt.Sprintf("exec: cannot run as group %q: the VM's /etc/group does not have it", group)
	}
	return ""
}

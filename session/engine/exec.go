package engine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"sort"
	"syscall"
	"time"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/engine/internal/lock"
	"github.com/berthvm/berth/store"
)

// run is an execution the Manager records: it owns the stream from the
// agent, writes output to the store and acknowledges it to the agent only
// once stored, so a daemon killed at any point resumes from the stored
// offsets with nothing lost or duplicated.
type run struct {
	m  *Manager
	s  *sess
	id string

	mu      lock.Mutex
	rec     store.Exec
	gx      *guest.Exec       // current stream; nil while reattaching
	changed chan struct{}     // closed and replaced whenever output or state changes
	reason  session.ExecState // cancelled or timed-out when berth ended it
	why     string
	timer   *time.Timer
	held    string // why output is not being stored now, or ""
	// finishing is set once finish has begun: the end is being stored,
	// and only then shown in rec.
	finishing bool
	trace     execTrace
}

// execTrace is when an execution this daemon started passed each phase,
// logged at debug level (berth serve -v) when it ends, so an exec's time
// can be taken apart without a profiler. Guarded by run.mu.
type execTrace struct {
	start        time.Time // Exec called
	recorded     time.Time // the starting record stored
	agentStarted time.Time // the agent reported the command started
	exited       time.Time // the agent's exit frame arrived, all output stored
}

func (m *Manager) newRun(s *sess, rec store.Exec) *run {
	r := &run{m: m, s: s, id: rec.ID, rec: rec, changed: make(chan struct{})}
	r.mu.Watch(m.locks, "run.mu "+rec.ID)
	return r
}

// execution is the run's record as the Service shows it.
func (r *run) execution() session.Execution {
	r.mu.Lock()
	defer r.mu.Unlock()
	x := toExecution(r.rec)
	x.Held = r.held
	return x
}

func newExecID() string {
	var b [6]byte
	rand.Read(b[:])
	return "x" + hex.EncodeToString(b[:])
}

func (r *run) notifyLocked() {
	close(r.changed)
	r.changed = make(chan struct{})
}

func (r *run) snapshot() (store.Exec, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rec, r.changed
}

func toExecution(e store.Exec) session.Execution {
	return session.Execution{
		ID: e.ID, Session: e.Session, Argv: e.Argv, EnvNames: e.EnvNames, Cwd: e.Cwd, TTY: e.TTY, By: e.By,
		Outside: e.Outside, User: e.User, State: session.ExecState(e.State), ExitCode: e.ExitCode, Signal: e.Signal, Error: e.Error,
		StartedAt: e.StartedAt, EndedAt: e.EndedAt, StdoutBytes: e.StdoutBytes, StderrBytes: e.StderrBytes,
	}
}

// runningCount is how many of the session's executions are being
// recorded. It takes no lock: snapshotLocked reads it with s.mu held.
func (m *Manager) runningCount(s *sess) int {
	return int(s.running.Load())
}

// addRun makes r one of the executions being recorded, unless one with its
// id already is; it reports whether it did.
func (m *Manager) addRun(r *run) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.runs[r.id]; ok {
		return false
	}
	m.runs[r.id] = r
	r.s.running.Add(1)
	return true
}

// dropRun ends r's recording, once.
func (m *Manager) dropRun(r *run) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.runs[r.id] == r {
		delete(m.runs, r.id)
		r.s.running.Add(-1)
	}
}

func (m *Manager) runsOf(name string) []*run {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*run
	for _, r := range m.runs {
		if r.s.name == name {
			out = append(out, r)
		}
	}
	return out
}

// withImageDefaults gives a command what its image's config asks for:
// the image's Env under the command's own, its working directory when the
// command names none, and its user when the command names none.
func withImageDefaults(req session.ExecRequest, d execDefaults) session.ExecRequest {
	if req.User == "" {
		req.User = d.User
	}
	if len(d.Env) > 0 {
		env := maps.Clone(d.Env)
		maps.Copy(env, req.Env)
		req.Env = env
	}
	if req.Cwd == "" {
		req.Cwd = d.Cwd
	}
	return req
}

// Exec records and starts a command. The record exists before the command
// starts; a command that cannot start ends as failed. The returned Process
// follows the output; ending ctx stops following, not the command.
func (m *Manager) Exec(ctx context.Context, name string, req session.ExecRequest) (session.Process, error) {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return nil, fmt.Errorf("no command given: %w", session.ErrInvalid)
	}
	if req.User != "" {
		if err := session.ValidateUser(req.User); err != nil {
			return nil, err
		}
	}
	s, c, err := m.awakeAgent(ctx, name, session.ActionExec)
	if err != nil {
		return nil, err
	}
	runID, err := m.useRun(ctx, name)
	if err != nil {
		return nil, err
	}
	s.touch()
	// The record names the variables the caller gave, not the image's.
	var envNames []string
	for k := range req.Env {
		envNames = append(envNames, k)
	}
	sort.Strings(envNames)
	req = withImageDefaults(req, s.execDefaults())
	cwd := req.Cwd
	if cwd == "" {
		cwd = "/workspace"
	}
	by := session.Actor(ctx)
	if by == "" {
		by = "api"
	}
	start := time.Now()
	rec := store.Exec{
		ID: newExecID(), Session: name, Argv: req.Argv, EnvNames: envNames, Cwd: cwd, TTY: req.TTY,
		Outside: req.Outside, User: req.User, By: by, State: string(session.ExecStarting), StartedAt: time.Now(),
	}
	if err := m.st.PutExec(rec); err != nil {
		return nil, fmt.Errorf("record execution: %w", err)
	}
	r := m.newRun(s, rec)
	r.trace = execTrace{start: start, recorded: time.Now()}
	m.addRun(r)
	m.addRunExec(name, runID, rec.ID)

	gx, err := c.Exec(m.ctx, guest.ExecRequest{
		ID: rec.ID, Argv: req.Argv, Env: req.Env, Cwd: req.Cwd, TTY: req.TTY, Rows: req.Rows, Cols: req.Cols, Stdin: req.Stdin,
		User: req.User,
	}, guest.ManualAck())
	if err != nil {
		var ge *guest.Error
		if errors.As(err, &ge) || errors.Is(err, guest.ErrNoWorkspace) {
			// The agent refused: the command never ran.
			r.finish(session.ExecFailed, nil, "", agentErr(name, err).Error())
			return m.follow(ctx, r, 1), nil
		}
		r.finish(session.ExecLost, nil, "", "the agent connection failed while starting: "+err.Error())
		return nil, agentErr(name, err)
	}
	r.mu.Lock()
	r.trace.agentStarted = time.Now()
	r.gx = gx
	r.rec.State = string(session.ExecRunning)
	if req.Timeout > 0 {
		r.timer = time.AfterFunc(req.Timeout, func() { r.cancel(session.ExecTimedOut, fmt.Sprintf("timed out after %s", req.Timeout)) })
	}
	rec = r.rec
	r.mu.Unlock()
	m.st.PutExec(rec)
	ex := toExecution(rec)
	m.event(session.Event{Kind: session.EventExec, Name: name, By: by, Exec: &ex, Message: "started " + quoteArgv(req.Argv)})
	m.wg.Go(func() { r.record(gx) })
	return m.follow(ctx, r, 1), nil
}

func quoteArgv(argv []string) string {
	s := fmt.Sprintf("%q", argv)
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// storeBatch bounds the output written in one store transaction.
const storeBatch = 1 << 20

// record moves output from the agent stream into the store until the
// execution ends, reattaching when the stream breaks but the VM lives.
func (r *run) record(gx *guest.Exec) {
	for {
		exit, err := r.drain(gx)
		if exit != nil {
			state, why := session.ExecExited, ""
			r.mu.Lock()
			r.trace.exited = time.Now()
			if r.reason != "" {
				state, why = r.reason, r.why
			}
			r.mu.Unlock()
			code := &exit.ExitCode
			if exit.Signal != "" {
				code = nil
			}
			r.finish(state, code, exit.Signal, why)
			if c, cerr := r.s.connectedAgent(); cerr == nil {
				fctx, cancel := context.WithTimeout(r.m.ctx, 5*time.Second)
				c.Forget(fctx, r.id)
				cancel()
			}
			return
		}
		if r.m.ctx.Err() != nil {
			return // the daemon is shutting down: the next one reattaches
		}
		// The stream broke. If the VM is alive, pick up from what is stored.
		gx, err = r.reattach(err)
		if err != nil {
			r.finish(session.ExecLost, nil, "", err.Error())
			return
		}
	}
}

// drain stores gx's output; it returns the exit, or the stream's error.
func (r *run) drain(gx *guest.Exec) (*guest.ExecInfo, error) {
	out := gx.Output()
	for {
		o, ok := <-out
		if !ok {
			return gx.Result()
		}
		batch := []guest.Output{o}
		size := len(o.Data)
	more:
		for size < storeBatch {
			select {
			case o, ok := <-out:
				if !ok {
					break more
				}
				batch = append(batch, o)
				size += len(o.Data)
			default:
				break more
			}
		}
		err := r.store(gx, batch)
		if errors.Is(err, syscall.ENOSPC) {
			err = r.hold(gx, batch, err)
		}
		if err != nil {
			r.m.log.Error("store output", "exec", r.id, "err", err)
			gx.Close()
			return nil, err
		}
	}
}

// hold retries storing a batch the host disk had no room for. Until it
// is stored it is not acknowledged, so the agent keeps it (and what
// follows) in its buffer and the command blocks on its pipe: nothing is
// lost, nothing stored twice. The execution shows why meanwhile.
func (r *run) hold(gx *guest.Exec, batch []guest.Output, cause error) error {
	start := time.Now()
	r.setHeld(heldMessage(cause, r.m.freeSpace()))
	r.m.log.Warn("output held: the host disk is full", "exec", r.id, "err", cause)
	wait := 50 * time.Millisecond
	for {
		select {
		case <-r.m.ctx.Done():
			return r.m.ctx.Err() // the next daemon resumes from what is stored
		case <-time.After(wait):
		}
		err := r.store(gx, batch)
		if err == nil {
			r.setHeld("")
			r.m.event(session.Event{Kind: session.EventNote, Name: r.s.name, Message: fmt.Sprintf("output of %s stored again after %s held (the host disk had no room)", r.id, time.Since(start).Round(time.Millisecond))})
			return nil
		}
		if !errors.Is(err, syscall.ENOSPC) {
			return err
		}
		wait = min(wait*2, 200*time.Millisecond)
	}
}

// heldMessage says why output is held, with the store's figures when it
// gave them: `output held: host disk full (N free of the M kept free)`.
func heldMessage(cause error, free int64) string {
	var se *store.SpaceError
	if !errors.As(cause, &se) {
		return fmt.Sprintf("output held: host disk full (%s free)", session.FormatBytes(free))
	}
	if se.Noisy {
		return fmt.Sprintf("output held: host disk filling, and this session wrote the most (%s in the last 10s): held first (%s free of the %s kept free for the others)",
			session.FormatBytes(se.Recent), session.FormatBytes(se.Free), session.FormatBytes(se.Floor))
	}
	return fmt.Sprintf("output held: host disk full (%s free of the %s kept free)", session.FormatBytes(se.Free), session.FormatBytes(se.Floor))
}

func (r *run) heldWhy() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.held
}

func (r *run) setHeld(why string) {
	r.mu.Lock()
	was := r.held
	r.held = why
	r.notifyLocked()
	r.mu.Unlock()
	switch {
	case was == "" && why != "":
		r.s.heldOut.Add(1)
	case was != "" && why == "":
		r.s.heldOut.Add(-1)
	}
	x := r.execution()
	r.m.hub.publish(session.Event{Time: time.Now(), Kind: session.EventExec, Name: r.s.name, Exec: &x, Message: why})
}

func (r *run) store(gx *guest.Exec, batch []guest.Output) error {
	r.mu.Lock()
	outOff, errOff := r.rec.StdoutOffset, r.rec.StderrOffset
	r.mu.Unlock()
	chunks := make([]store.Chunk, 0, len(batch))
	now := time.Now()
	for _, o := range batch {
		off, stream := &outOff, uint8(session.Stdout)
		if o.Stream == guest.FrameStderr {
			off, stream = &errOff, uint8(session.Stderr)
		}
		data := o.Data
		if o.Offset < *off { // already stored before a reattach
			skip := *off - o.Offset
			if skip >= int64(len(data)) {
				continue
			}
			data = data[skip:]
		}
		chunks = append(chunks, store.Chunk{Exec: r.id, Stream: stream, Time: now, Data: data})
		*off = max(*off, o.Offset+int64(len(o.Data)))
	}
	if len(chunks) == 0 {
		return nil
	}
	rec, err := r.m.st.AppendOutput(r.id, chunks, outOff, errOff)
	if err != nil {
		return err
	}
	r.mu.Lock()
	rec.State, rec.ExitCode, rec.Signal, rec.Error, rec.EndedAt = r.rec.State, r.rec.ExitCode, r.rec.Signal, r.rec.Error, r.rec.EndedAt
	r.rec = rec
	r.notifyLocked()
	r.mu.Unlock()
	gx.Ack(outOff, errOff)
	return nil
}

func (r *run) reattach(cause error) (*guest.Exec, error) {
	for attempt := 0; ; attempt++ {
		if r.m.ctx.Err() != nil {
			return nil, r.m.ctx.Err()
		}
		r.s.mu.Lock()
		vm := r.s.vm
		r.s.mu.Unlock()
		if vm == nil {
			return nil, fmt.Errorf("the VM is gone (%v)", cause)
		}
		select {
		case <-vm.Done():
			return nil, fmt.Errorf("the VM %s while the command ran", vm.Exit())
		default:
		}
		if r.s.state() == session.StatePaused {
			return nil, errPaused
		}
		c, err := r.s.connectedAgent()
		if err == nil {
			r.mu.Lock()
			outOff, errOff := r.rec.StdoutOffset, r.rec.StderrOffset
			r.mu.Unlock()
			// The stream lives as long as the Manager: its context must
			// not be a short-lived one, which would close it when done.
			gx, aerr := c.Attach(r.m.ctx, r.id, outOff, errOff, guest.ManualAck())
			if aerr == nil {
				r.mu.Lock()
				r.gx = gx
				r.mu.Unlock()
				return gx, nil
			}
			if errors.Is(aerr, guest.ErrUnknownExec) {
				return nil, errors.New("the agent no longer knows this execution (the VM restarted?)")
			}
			err = aerr
		}
		if attempt >= 5 {
			return nil, fmt.Errorf("could not reattach: %v", err)
		}
		select {
		case <-time.After(time.Duration(attempt+1) * 200 * time.Millisecond):
		case <-r.m.ctx.Done():
		}
	}
}

var errPaused = errors.New("session paused")

// endWait is how long finish waits for a full disk to take an
// execution's end before it reports the end as not yet recorded.
const endWait = 5 * time.Second

// storeEnd stores an execution's end. A store refusing for space (a full
// disk) is asked again for endWait; past that the end is reported as not
// recorded and kept being tried in the background until it is stored or
// the Manager closes.
func (m *Manager) storeEnd(rec store.Exec) error {
	err := m.st.PutExec(rec)
	if err == nil || !errors.Is(err, syscall.ENOSPC) {
		return err
	}
	retry := func(until time.Time) error {
		for time.Now().Before(until) {
			select {
			case <-time.After(250 * time.Millisecond):
			case <-m.ctx.Done():
				return err
			}
			if err = m.st.PutExec(rec); err == nil || !errors.Is(err, syscall.ENOSPC) {
				return err
			}
		}
		return err
	}
	if err := retry(time.Now().Add(endWait)); err == nil || !errors.Is(err, syscall.ENOSPC) {
		return err
	}
	m.wg.Go(func() {
		if err := retry(time.Now().Add(24 * time.Hour)); err == nil {
			m.log.Info("execution end recorded after the disk had room", "exec", rec.ID)
		}
	})
	return err
}

// finish makes the execution final, exactly once.
func (r *run) finish(state session.ExecState, code *int, signal, why string) {
	r.mu.Lock()
	if r.finishing || session.ExecState(r.rec.State).Done() {
		r.mu.Unlock()
		return
	}
	r.finishing = true
	if r.timer != nil {
		r.timer.Stop()
	}
	rec := r.rec
	rec.State, rec.ExitCode, rec.Signal, rec.Error, rec.EndedAt = string(state), code, signal, why, time.Now()
	r.gx = nil
	r.mu.Unlock()
	// The end is stored before anyone sees it (Wait, a stream's final
	// record, a listing): whoever is told a command ended can find its
	// record after a daemon crash. The output fields are the store's own.
	if err := r.m.storeEnd(rec); err != nil {
		// Told a command ended, a client must also be told that a daemon
		// crash now would lose that end (the record says lost after it).
		r.m.log.Error("record execution end", "exec", r.id, "err", err)
		if rec.Error == "" {
			rec.Error = session.EndNotRecorded(err)
		}
	}
	r.mu.Lock()
	r.rec.State, r.rec.ExitCode, r.rec.Signal, r.rec.Error, r.rec.EndedAt = rec.State, rec.ExitCode, rec.Signal, rec.Error, rec.EndedAt
	rec = r.rec
	r.notifyLocked()
	r.mu.Unlock()
	r.logTrace()
	r.m.dropRun(r)
	r.m.cfg.Observer.ExecEnded(state)
	ex := toExecution(rec)
	msg := string(state)
	switch {
	case code != nil:
		msg += fmt.Sprintf(" with code %d", *code)
	case signal != "":
		msg += " by " + signal
	}
	if why != "" {
		msg += ": " + why
	}
	r.m.event(session.Event{Kind: session.EventExec, Name: r.s.name, Exec: &ex, Message: quoteArgv(rec.Argv) + " " + msg})
	r.m.execEnded(rec)
}

// logTrace logs the phases of an execution this daemon started, each as
// the time since the one before, at debug level.
func (r *run) logTrace() {
	if !r.m.log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	r.mu.Lock()
	t := r.trace
	r.mu.Unlock()
	if t.start.IsZero() || t.exited.IsZero() {
		return // reattached, or never started: no phases to tell
	}
	r.m.log.Debug("exec phases", "exec", r.id, "start", t.start.UnixNano(),
		"record", t.recorded.Sub(t.start), "agent_start", t.agentStarted.Sub(t.recorded),
		"run", t.exited.Sub(t.agentStarted), "end_record", time.Since(t.exited))
}

// cancel kills the command's process group and records why.
func (r *run) cancel(state session.ExecState, why string) error {
	r.mu.Lock()
	if st := session.ExecState(r.rec.State); st.Done() {
		r.mu.Unlock()
		return fmt.Errorf("execution %q already %s: %w", r.id, st, session.ErrInvalidState)
	}
	if r.reason == "" {
		r.reason, r.why = state, why
	}
	r.mu.Unlock()
	c, err := r.s.connectedAgent()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(r.m.ctx, 10*time.Second)
	defer cancel()
	return agentErr(r.s.name, c.Signal(ctx, r.id, int(syscall.SIGKILL)))
}

// cancelRuns marks every execution of a session as ended by berth, so that
// their exit (the agent TERMs them on shutdown) records the right state.
func (m *Manager) cancelRuns(name string, state session.ExecState, why string) {
	for _, r := range m.runsOf(name) {
		r.mu.Lock()
		if r.reason == "" {
			r.reason, r.why = state, why
		}
		r.mu.Unlock()
	}
}

// loseRuns ends every open execution of a session as lost: their VM is
// gone, so their outcome is unknown. Records left open by an earlier
// daemon are included.
func (m *Manager) loseRuns(name, why string) {
	for _, r := range m.runsOf(name) {
		r.mu.Lock()
		reason, rwhy := r.reason, r.why
		r.mu.Unlock()
		if reason != "" {
			r.finish(reason, nil, "", rwhy)
		} else {
			r.finish(session.ExecLost, nil, "", why)
		}
	}
	execs, err := m.st.ListExecs(name)
	if err != nil {
		return
	}
	for _, e := range execs {
		if !session.ExecState(e.State).Done() {
			m.mu.Lock()
			_, live := m.runs[e.ID]
			m.mu.Unlock()
			if live {
				continue
			}
			e.State, e.Error, e.EndedAt = string(session.ExecLost), why, time.Now()
			m.st.PutExec(e)
		}
	}
}

// resumeRuns reattaches the open executions of a running session recorded
// by an earlier daemon, catching up their output from the stored offsets.
func (m *Manager) resumeRuns(s *sess) {
	execs, err := m.st.ListExecs(s.name)
	if err != nil {
		return
	}
	for _, e := range execs {
		if session.ExecState(e.State).Done() {
			continue
		}
		r := m.newRun(s, e)
		if !m.addRun(r) {
			continue // already being recorded
		}
		m.wg.Go(func() {
			gx, err := r.reattach(errors.New("daemon restarted"))
			if err != nil {
				if errors.Is(err, errPaused) {
					m.dropRun(r)
					return
				}
				r.finish(session.ExecLost, nil, "", err.Error())
				return
			}
			r.mu.Lock()
			r.rec.State = string(session.ExecRunning)
			r.mu.Unlock()
			r.record(gx)
		})
	}
}

// Attach follows an execution's output from seq (0: from now on).
func (m *Manager) Attach(ctx context.Context, execID string, fromSeq uint64) (session.Process, error) {
	m.mu.Lock()
	r, ok := m.runs[execID]
	m.mu.Unlock()
	if !ok {
		rec, err := m.st.GetExec(execID)
		if err != nil {
			return nil, fmt.Errorf("execution %q: %w", execID, session.ErrNotFound)
		}
		s, _ := m.get(rec.Session)
		r = m.newRun(s, rec)
	}
	if fromSeq == 0 {
		rec, _ := r.snapshot()
		fromSeq = rec.NextSeq + 1
	}
	return m.follow(ctx, r, fromSeq), nil
}

// Executions lists a session's executions, oldest first: the open ones, or
// with all every recorded one.
func (m *Manager) Executions(ctx context.Context, name string, all bool) ([]session.Execution, error) {
	if _, err := m.get(name); err != nil {
		return nil, err
	}
	recs, err := m.st.ListExecs(name)
	if err != nil {
		return nil, err
	}
	out := make([]session.Execution, 0, len(recs))
	for i := len(recs) - 1; i >= 0; i-- { // the store lists newest first
		e := recs[i]
		m.mu.Lock()
		r, live := m.runs[e.ID]
		m.mu.Unlock()
		x := toExecution(e)
		if live {
			x = r.execution()
		}
		if !all && x.State.Done() {
			continue
		}
		out = append(out, x)
	}
	return out, nil
}

// Execution returns one execution's record.
func (m *Manager) Execution(ctx context.Context, execID string) (session.Execution, error) {
	m.mu.Lock()
	r, ok := m.runs[execID]
	m.mu.Unlock()
	if ok {
		return r.execution(), nil
	}
	rec, err := m.st.GetExec(execID)
	if err != nil {
		return session.Execution{}, fmt.Errorf("execution %q: %w", execID, session.ErrNotFound)
	}
	return toExecution(rec), nil
}

// Output reads recorded output.
func (m *Manager) Output(ctx context.Context, execID string, fromSeq uint64, limit int) (session.OutputPage, error) {
	if limit <= 0 || limit > 4096 {
		limit = 256
	}
	// The store numbers chunks from 0; the Service from 1.
	chunks, gap, next, err := m.st.ReadOutput(execID, max(fromSeq, 1)-1, limit)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return session.OutputPage{}, fmt.Errorf("execution %q: %w", execID, session.ErrNotFound)
		}
		return session.OutputPage{}, err
	}
	page := session.OutputPage{Gap: gap, Next: next + 1, Chunks: make([]session.Chunk, 0, len(chunks))}
	for _, c := range chunks {
		page.Chunks = append(page.Chunks, session.Chunk{Exec: c.Exec, Seq: c.Seq + 1, Stream: session.Stream(c.Stream), Time: c.Time, Data: c.Data})
	}
	return page, nil
}

// Cancel kills a running execution's whole process group.
func (m *Manager) Cancel(ctx context.Context, execID string) error {
	m.mu.Lock()
	r, ok := m.runs[execID]
	m.mu.Unlock()
	if !ok {
		rec, err := m.st.GetExec(execID)
		if err != nil {
			return fmt.Errorf("execution %q: %w", execID, session.ErrNotFound)
		}
		return fmt.Errorf("execution %q already %s: %w", execID, rec.State, session.ErrInvalidState)
	}
	return r.cancel(session.ExecCancelled, "cancelled by "+orAPI(session.Actor(ctx)))
}

func orAPI(s string) string {
	if s == "" {
		return "api"
	}
	return s
}

// process follows one execution for one caller: output comes from the
// store (the source of truth), woken by the recorder after each batch.
type process struct {
	r      *run
	out    chan session.Chunk
	ctx    context.Context
	cancel context.CancelFunc
}

func (m *Manager) follow(ctx context.Context, r *run, from uint64) *process {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(m.ctx, cancel)
	p := &process{r: r, out: make(chan session.Chunk, 64), ctx: ctx, cancel: cancel}
	m.wg.Go(func() {
		defer stop()
		defer close(p.out)
		next := from
		var told string // the held notice last sent
		send := func(c session.Chunk) bool {
			select {
			case p.out <- c:
				return true
			case <-ctx.Done():
				return false
			}
		}
		for {
			rec, changed := r.snapshot()
			if held := r.heldWhy(); held != told {
				msg := held
				if held == "" {
					msg = "output stored again: the host disk has room"
				}
				if !send(session.Chunk{Exec: r.id, Stream: session.Notice, Time: time.Now(), Data: []byte(msg)}) {
					return
				}
				told = held
			}
			page, err := m.Output(ctx, r.id, next, 256)
			if err != nil {
				return
			}
			for _, c := range page.Chunks {
				if !send(c) {
					return
				}
			}
			if page.Next > next {
				next = page.Next
				continue
			}
			if session.ExecState(rec.State).Done() && next > rec.NextSeq {
				return
			}
			select {
			case <-changed:
			case <-ctx.Done():
				return
			}
		}
	})
	return p
}

func (p *process) ID() string                   { return p.r.id }
func (p *process) Output() <-chan session.Chunk { return p.out }
func (p *process) Stdin() io.WriteCloser        { return stdinWriter{p.r} }

func (p *process) Resize(ctx context.Context, rows, cols int) error {
	gx := p.r.stream()
	if gx == nil {
		return fmt.Errorf("execution %q is not attached: %w", p.r.id, session.ErrUnavailable)
	}
	return gx.Resize(rows, cols)
}

func (p *process) Cancel(ctx context.Context) error {
	return p.r.cancel(session.ExecCancelled, "cancelled by "+orAPI(session.Actor(ctx)))
}

func (p *process) Wait(ctx context.Context) (session.Execution, error) {
	for {
		rec, changed := p.r.snapshot()
		if session.ExecState(rec.State).Done() {
			return toExecution(rec), nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return session.Execution{}, ctx.Err()
		}
	}
}

func (r *run) stream() *guest.Exec {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.gx
}

type stdinWriter struct{ r *run }

func (w stdinWriter) Write(p []byte) (int, error) {
	gx := w.r.stream()
	if gx == nil {
		return 0, fmt.Errorf("execution %q is not running: %w", w.r.id, session.ErrUnavailable)
	}
	return gx.Write(p)
}

func (w stdinWriter) Close() error {
	gx := w.r.stream()
	if gx == nil {
		return nil
	}
	return gx.CloseStdin()
}

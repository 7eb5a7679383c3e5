package engine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/engine/internal/lock"
	"github.com/berthvm/berth/store"
)

// DefaultRunTimeout is how long an open run may go unused, with nothing
// running in it, before it is ended as abandoned.
const DefaultRunTimeout = 30 * time.Minute

// DefaultRunRecordLimit is the most distinct paths the guest records for
// a run (the daemon's run_record_limit) before its diff falls back to a
// full comparison: the agent's own bound.
const DefaultRunRecordLimit = guest.MaxTrackRecord

// maxRunTitle bounds a run's title.
const maxRunTitle = 200

var _ session.Harness = (*Manager)(nil)

// harness is the Manager's state of runs and schedules. Records are in the
// store, written through on every change; this holds what decisions need
// without reading it: open runs, which run each of their executions is in,
// and the schedules with their parsed timetables.
type harness struct {
	mu      lock.Mutex
	sessOf  map[string]string     // run id → session, every run
	open    map[string]*store.Run // open runs by id
	execRun map[string]string     // exec id → its open run
	scheds  map[string]*schedState
	// putMu orders the store writes of schedules with their removal, so
	// a write racing a remove cannot bring the record back.
	putMu    lock.Mutex
	poke     chan struct{} // wakes the schedule loop
	openedAt time.Time     // when this Manager started
}

func newRunID() string {
	var b [6]byte
	rand.Read(b[:])
	return "r" + hex.EncodeToString(b[:])
}

func toRun(r store.Run) session.Run {
	out := session.Run{
		ID: r.ID, Session: r.Session, Title: r.Title, By: r.By, Status: session.RunStatus(r.Status), Note: r.Note,
		StartedAt: r.StartedAt, EndedAt: r.EndedAt, LastActive: r.LastActive, Executions: r.Executions,
		BytesWritten: r.BytesWritten, Schedule: r.Schedule, Checkpoint: r.Checkpoint,
	}
	if r.Diffed {
		out.Changes = &session.RunChanges{Files: r.Files, Added: r.Added, Removed: r.Removed}
	}
	return out
}

// loadHarness reads every session's runs and schedules, before recovery
// catches up executions (whose ends then count in their runs).
func (m *Manager) loadHarness() error {
	h := &harness{
		sessOf: map[string]string{}, open: map[string]*store.Run{}, execRun: map[string]string{},
		scheds: map[string]*schedState{}, poke: make(chan struct{}, 1), openedAt: time.Now(),
	}
	h.mu.Watch(m.locks, "harness.mu")
	m.hx = h
	for name := range m.sessions {
		if err := m.loadHarnessOf(name); err != nil {
			return err
		}
	}
	return nil
}

// loadHarnessOf loads one session's runs and schedules into the harness:
// at start, and for a session that moved here.
func (m *Manager) loadHarnessOf(name string) error {
	h := m.hx
	h.mu.Lock()
	defer h.mu.Unlock()
	runs, err := m.st.ListRuns(name)
	if err != nil {
		return err
	}
	for _, r := range runs {
		h.sessOf[r.ID] = name
		if r.Status != string(session.RunOpen) {
			continue
		}
		h.open[r.ID] = &r
		xs, err := m.st.RunExecs(name, r.ID)
		if err != nil {
			return err
		}
		for _, x := range xs {
			h.execRun[x] = r.ID
		}
	}
	scs, err := m.st.ListSchedules(name)
	if err != nil {
		return err
	}
	for _, sc := range scs {
		st, err := newSchedState(sc)
		if err != nil {
			m.log.Warn("schedule with a bad spec is ignored", "session", name, "schedule", sc.ID, "err", err)
			continue
		}
		h.scheds[sc.ID] = st
	}
	select {
	case h.poke <- struct{}{}: // the schedule loop learns of them
	default:
	}
	return nil
}

// dropHarness forgets a deleted session's runs and schedules (the store
// deleted their records with the session's).
func (m *Manager) dropHarness(name string) {
	h := m.hx
	h.mu.Lock()
	defer h.mu.Unlock()
	for id, s := range h.sessOf {
		if s == name {
			delete(h.sessOf, id)
			delete(h.open, id)
		}
	}
	for x, r := range h.execRun {
		if _, ok := h.sessOf[r]; !ok {
			delete(h.execRun, x)
		}
	}
	for id, sc := range h.scheds {
		if sc.rec.Session == name {
			delete(h.scheds, id)
		}
	}
}

// StartRun opens an agent run on a session.
func (m *Manager) StartRun(ctx context.Context, name string, opts session.RunOptions) (session.Run, error) {
	if _, err := m.get(name); err != nil {
		return session.Run{}, err
	}
	by := orAPI(session.Actor(ctx))
	keep := m.cfg.KeepRuns
	if opts.Keep != nil {
		keep = *opts.Keep
	}
	if !keep {
		return m.startRun(newRunID(), name, opts.Title, by, "", "")
	}
	id := newRunID()
	if len(opts.Title) > maxRunTitle {
		opts.Title = opts.Title[:maxRunTitle]
	}
	ck, err := m.keepStart(ctx, name, id, opts)
	switch {
	case err != nil && opts.Keep != nil:
		return session.Run{}, fmt.Errorf("run not started on %s: its starting point could not be kept: %w", name, err)
	case err != nil:
		// Kept by the daemon's setting, not asked for: the run (an MCP
		// client's work) goes on without a starting point, and says so.
		m.event(session.Event{Kind: session.EventNote, Name: name, By: by, Message: "run " + id + " keeps no starting point (run_checkpoint): " + err.Error()})
		return m.startRun(id, name, opts.Title, by, "", "")
	}
	return m.startRun(id, name, opts.Title, by, "", ck.ID)
}

func (m *Manager) startRun(id, name, title, by, schedule, ckpt string) (session.Run, error) {
	if len(title) > maxRunTitle {
		title = title[:maxRunTitle]
	}
	now := time.Now()
	rec := store.Run{ID: id, Session: name, Title: title, By: by, Status: string(session.RunOpen), StartedAt: now, LastActive: now, Schedule: schedule, Checkpoint: ckpt}
	if err := m.st.PutRun(rec); err != nil {
		return session.Run{}, fmt.Errorf("record run: %w", err)
	}
	h := m.hx
	h.mu.Lock()
	h.sessOf[rec.ID] = name
	h.open[rec.ID] = &rec
	h.mu.Unlock()
	msg := "run " + rec.ID + " started"
	if title != "" {
		msg += ": " + title
	}
	if ckpt != "" {
		msg += " (its starting point is checkpoint " + ckpt + ")"
	}
	m.event(session.Event{Kind: session.EventNote, Name: name, By: by, Message: msg})
	return toRun(rec), nil
}

// useRun checks the run ctx names (if any) for a call on session name and
// marks it active: it must be this session's and open.
func (m *Manager) useRun(ctx context.Context, name string) (string, error) {
	id := session.RunOf(ctx)
	if id == "" {
		return "", nil
	}
	if err := session.ValidateRunID(id); err != nil {
		return "", err
	}
	h := m.hx
	h.mu.Lock()
	defer h.mu.Unlock()
	s, ok := h.sessOf[id]
	if !ok {
		return "", &session.Error{Class: session.ErrNotFound, Field: session.FieldRun, Msg: fmt.Sprintf("%q: session %q has no such run", id, name), Hint: "start one on it"}
	}
	if s != name {
		return "", fmt.Errorf("run %q belongs to session %q, not %q: %w", id, s, name, session.ErrInvalid)
	}
	r, ok := h.open[id]
	if !ok {
		rec, _ := m.st.GetRun(s, id)
		return "", &session.Error{Class: session.ErrInvalidState, Field: session.FieldRun, Msg: fmt.Sprintf("%q has ended (%s)", id, rec.Status), Hint: "start a new one on session " + name}
	}
	r.LastActive = time.Now()
	return id, nil
}

// addRunExec counts a new execution in its run.
func (m *Manager) addRunExec(name, runID, execID string) {
	if runID == "" {
		return
	}
	rec, err := m.st.AddRunExec(name, runID, execID, time.Now())
	if err != nil {
		m.log.Warn("record execution in run", "run", runID, "exec", execID, "err", err)
		return
	}
	h := m.hx
	h.mu.Lock()
	h.execRun[execID] = runID
	if r, ok := h.open[runID]; ok {
		r.Executions = rec.Executions
	}
	h.mu.Unlock()
}

// addRunBytes counts bytes written through the file API in a run.
func (m *Manager) addRunBytes(runID string, n int64) {
	if runID == "" || n <= 0 {
		return
	}
	h := m.hx
	h.mu.Lock()
	r, ok := h.open[runID]
	var rec store.Run
	if ok {
		r.BytesWritten += n
		r.LastActive = time.Now()
		rec = *r
	}
	h.mu.Unlock()
	if ok {
		if err := m.st.PutRun(rec); err != nil {
			m.log.Warn("record run", "run", runID, "err", err)
		}
	}
}

// execEnded is called once an execution is final: its run was active
// then, and a schedule's run ends with its command.
func (m *Manager) execEnded(rec store.Exec) {
	h := m.hx
	if h == nil {
		return
	}
	h.mu.Lock()
	runID := h.execRun[rec.ID]
	delete(h.execRun, rec.ID)
	r, ok := h.open[runID]
	if ok {
		r.LastActive = time.Now()
	}
	sched := ok && r.Schedule != ""
	h.mu.Unlock()
	if !ok {
		return
	}
	if sched {
		st, note := session.RunOK, ""
		if session.ExecState(rec.State) != session.ExecExited || rec.ExitCode == nil || *rec.ExitCode != 0 {
			st, note = session.RunFailed, "its command ended "+rec.State
		}
		m.endRun(runID, st, note, "schedule")
		select {
		case h.poke <- struct{}{}: // a queued firing may go now
		default:
		}
	}
}

// EndRun ends an open run as the caller says.
func (m *Manager) EndRun(ctx context.Context, runID string, status session.RunStatus) (session.Run, error) {
	if err := session.ValidateRunID(runID); err != nil {
		return session.Run{}, err
	}
	if _, err := session.ParseRunStatus(string(status)); err != nil {
		return session.Run{}, err
	}
	return m.endRun(runID, status, "", orAPI(session.Actor(ctx)))
}

func (m *Manager) endRun(runID string, status session.RunStatus, note, by string) (session.Run, error) {
	h := m.hx
	h.mu.Lock()
	name, known := h.sessOf[runID]
	r, open := h.open[runID]
	if !open {
		h.mu.Unlock()
		if !known {
			return session.Run{}, fmt.Errorf("run %q: %w", runID, session.ErrNotFound)
		}
		rec, _ := m.st.GetRun(name, runID)
		return session.Run{}, fmt.Errorf("run %q already ended (%s): %w", runID, rec.Status, session.ErrInvalidState)
	}
	rec := *r
	rec.Status, rec.Note, rec.EndedAt = string(status), note, time.Now()
	delete(h.open, runID)
	for x, id := range h.execRun {
		if id == runID {
			delete(h.execRun, x)
		}
	}
	h.mu.Unlock()
	if err := m.st.PutRun(rec); err != nil {
		return session.Run{}, fmt.Errorf("record run end: %w", err)
	}
	msg := fmt.Sprintf("run %s ended %s", runID, status)
	if note != "" {
		msg += ": " + note
	}
	m.event(session.Event{Kind: session.EventNote, Name: name, By: by, Message: msg})
	return toRun(rec), nil
}

// Runs lists a session's runs, oldest first.
func (m *Manager) Runs(ctx context.Context, name string) ([]session.Run, error) {
	if _, err := m.get(name); err != nil {
		return nil, err
	}
	recs, err := m.st.ListRuns(name)
	if err != nil {
		return nil, err
	}
	out := make([]session.Run, 0, len(recs))
	h := m.hx
	h.mu.Lock()
	for _, r := range recs {
		if o, ok := h.open[r.ID]; ok {
			r = *o // the freshest LastActive
		}
		out = append(out, toRun(r))
	}
	h.mu.Unlock()
	return out, nil
}

// GetRun returns one run with the ids of its executions.
func (m *Manager) GetRun(ctx context.Context, runID string) (session.Run, error) {
	if err := session.ValidateRunID(runID); err != nil {
		return session.Run{}, err
	}
	h := m.hx
	h.mu.Lock()
	name, ok := h.sessOf[runID]
	h.mu.Unlock()
	if !ok {
		return session.Run{}, fmt.Errorf("run %q: %w", runID, session.ErrNotFound)
	}
	rec, err := m.st.GetRun(name, runID)
	if errors.Is(err, store.ErrNotFound) {
		return session.Run{}, fmt.Errorf("run %q: %w", runID, session.ErrNotFound)
	}
	if err != nil {
		return session.Run{}, err
	}
	h.mu.Lock()
	if o, ok := h.open[runID]; ok {
		rec = *o
	}
	h.mu.Unlock()
	out := toRun(rec)
	if out.ExecIDs, err = m.st.RunExecs(name, runID); err != nil {
		return session.Run{}, err
	}
	// Oldest first: by start time.
	starts := map[string]time.Time{}
	for _, id := range out.ExecIDs {
		if e, err := m.st.GetExec(id); err == nil {
			starts[id] = e.StartedAt
		}
	}
	slices.SortStableFunc(out.ExecIDs, func(a, b string) int { return starts[a].Compare(starts[b]) })
	return out, nil
}

// recording lists the executions being recorded, copied out: Manager.mu
// is a leaf, and the callers go on to take harness.mu, which ranks above
// it (see the package doc).
func (m *Manager) recording() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	ids := make([]string, 0, len(m.runs))
	for id := range m.runs {
		ids = append(ids, id)
	}
	return ids
}

// endLeftRuns ends runs left open: a schedule's once its command is over (it
// ended while no daemon was there to see it), anyone else's as abandoned
// once it has had nothing running and no use for the run timeout.
func (m *Manager) endLeftRuns() {
	live := map[string]bool{} // runs with an execution being recorded
	ids := m.recording()
	h := m.hx
	h.mu.Lock()
	for _, x := range ids {
		if r := h.execRun[x]; r != "" {
			live[r] = true
		}
	}
	type end struct {
		id   string
		st   session.RunStatus
		note string
	}
	var ends []end
	for id, r := range h.open {
		switch {
		case live[id]:
		case r.Schedule != "" && r.Executions > 0:
			ends = append(ends, end{id, session.RunOK, "its command ended while the daemon was down"})
		case time.Since(r.LastActive) > m.cfg.RunTimeout:
			ends = append(ends, end{id, session.RunAbandoned, fmt.Sprintf("unused for %s with nothing running in it: its caller went away", m.cfg.RunTimeout)})
		}
	}
	h.mu.Unlock()
	for _, e := range ends {
		if e.st == session.RunOK {
			e.st = m.lastExecStatus(e.id)
		}
		m.endRun(e.id, e.st, e.note, "berth")
	}
}

// lastExecStatus is ok when a run's last execution exited 0, else failed.
func (m *Manager) lastExecStatus(runID string) session.RunStatus {
	h := m.hx
	h.mu.Lock()
	name := h.sessOf[runID]
	h.mu.Unlock()
	xs, _ := m.st.RunExecs(name, runID)
	var last store.Exec
	for _, id := range xs {
		if e, err := m.st.GetExec(id); err == nil && !e.StartedAt.Before(last.StartedAt) {
			last = e
		}
	}
	if session.ExecState(last.State) == session.ExecExited && last.ExitCode != nil && *last.ExitCode == 0 {
		return session.RunOK
	}
	return session.RunFailed
}

package engine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/schedule"
	"github.com/berthvm/berth/store"
)

// schedState is one schedule as the loop sees it.
type schedState struct {
	rec      store.Schedule
	spec     schedule.Spec
	starting int  // firings between their record and their execution
	queued   bool // overlap queue: fire once the running one ends
	// missed is the due time of a tick missed while no daemon ran, queued
	// behind a command still being caught up.
	missed time.Time
	held   string // why it did not fire at its last due time, or ""
}

func newSchedState(rec store.Schedule) (*schedState, error) {
	spec, err := schedule.ParseSpec(rec.Spec)
	if err != nil {
		return nil, err
	}
	return &schedState{rec: rec, spec: spec}, nil
}

func newScheduleID() string {
	var b [4]byte
	rand.Read(b[:])
	return "c" + hex.EncodeToString(b[:])
}

func (st *schedState) schedule() session.Schedule {
	r := st.rec
	var names []string
	for k := range r.Env {
		names = append(names, k)
	}
	sort.Strings(names)
	return session.Schedule{
		ID: r.ID, Session: r.Session, Spec: r.Spec, Overlap: session.Overlap(r.Overlap), Argv: r.Argv, Cwd: r.Cwd,
		EnvNames: names, By: r.By, Created: r.Created, Next: r.Next, Fired: r.Fired, Count: r.Count,
		Skipped: r.Skipped, LastRun: r.LastRun, LastExec: r.LastExec, Held: st.held,
	}
}

// heldBy says why a session in state s holds its schedules, or "".
func heldBy(s session.State) string {
	switch s {
	case session.StateRunning, session.StateSleeping:
		return ""
	case session.StateStopped, session.StateCrashed:
		return "held: session is " + string(s) + " (berth start runs its schedules again)"
	}
	return "held: session is " + string(s)
}

// AddSchedule adds a schedule to a session.
func (m *Manager) AddSchedule(ctx context.Context, name string, req session.ScheduleRequest) (session.Schedule, error) {
	s, err := m.get(name)
	if err != nil {
		return session.Schedule{}, err
	}
	if err := schedule.Validate(&req); err != nil {
		return session.Schedule{}, err
	}
	now := time.Now()
	rec := store.Schedule{
		ID: newScheduleID(), Session: name, Spec: strings.TrimSpace(req.Spec), Overlap: string(req.Overlap),
		Argv: req.Argv, Cwd: req.Cwd, Env: req.Env, By: orAPI(session.Actor(ctx)), Created: now,
	}
	st, err := newSchedState(rec)
	if err != nil {
		return session.Schedule{}, err
	}
	st.rec.Next = st.spec.Next(now)
	if err := m.st.PutSchedule(st.rec); err != nil {
		return session.Schedule{}, fmt.Errorf("record schedule: %w", err)
	}
	st.held = heldBy(s.state())
	h := m.hx
	h.mu.Lock()
	h.scheds[rec.ID] = st
	out := st.schedule()
	h.mu.Unlock()
	m.pokeSchedules()
	m.event(session.Event{Kind: session.EventNote, Name: name, By: rec.By, Message: fmt.Sprintf("schedule %s added: %s (overlap %s) %s", rec.ID, rec.Spec, rec.Overlap, quoteArgv(rec.Argv))})
	return out, nil
}

// Schedules lists a session's schedules, oldest first.
func (m *Manager) Schedules(ctx context.Context, name string) ([]session.Schedule, error) {
	s, err := m.get(name)
	if err != nil {
		return nil, err
	}
	held := heldBy(s.state())
	h := m.hx
	h.mu.Lock()
	var out []session.Schedule
	for _, st := range h.scheds {
		if st.rec.Session == name {
			sc := st.schedule()
			sc.Held = held
			out = append(out, sc)
		}
	}
	h.mu.Unlock()
	slices.SortFunc(out, func(a, b session.Schedule) int { return a.Created.Compare(b.Created) })
	return out, nil
}

// RemoveSchedule deletes a schedule; a command it started goes on.
func (m *Manager) RemoveSchedule(ctx context.Context, name, id string) error {
	if _, err := m.get(name); err != nil {
		return err
	}
	h := m.hx
	h.putMu.Lock()
	defer h.putMu.Unlock()
	h.mu.Lock()
	st, ok := h.scheds[id]
	if !ok || st.rec.Session != name {
		h.mu.Unlock()
		return &session.Error{Class: session.ErrNotFound, Msg: fmt.Sprintf("schedule %q: session %q has no such schedule", id, name), Hint: "list its schedules to see their ids"}
	}
	delete(h.scheds, id)
	h.mu.Unlock()
	if err := m.st.DeleteSchedule(name, id); err != nil {
		return err
	}
	m.event(session.Event{Kind: session.EventNote, Name: name, By: orAPI(session.Actor(ctx)), Message: "schedule " + id + " removed"})
	return nil
}

// putSchedule stores a schedule's record unless it was removed meanwhile.
func (m *Manager) putSchedule(rec store.Schedule) {
	h := m.hx
	h.putMu.Lock()
	defer h.putMu.Unlock()
	h.mu.Lock()
	_, ok := h.scheds[rec.ID]
	h.mu.Unlock()
	if !ok {
		return
	}
	if err := m.st.PutSchedule(rec); err != nil {
		m.log.Warn("record schedule", "schedule", rec.ID, "err", err)
	}
}

func (m *Manager) pokeSchedules() {
	select {
	case m.hx.poke <- struct{}{}:
	default:
	}
}

// scheduleLoop fires schedules when they fall due. It sleeps until the
// earliest due time (at most a minute), or until a schedule changes or a
// scheduled command ends.
func (m *Manager) scheduleLoop() {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-t.C:
		case <-m.hx.poke:
		}
		now := time.Now()
		t.Reset(schedule.Wait(now, m.fireDue(now)))
	}
}

// liveOf counts, per schedule, its commands being recorded or starting.
func (m *Manager) liveBySchedule() map[string]int {
	ids := m.recording()
	h := m.hx
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[string]int{}
	for _, x := range ids {
		if r, ok := h.open[h.execRun[x]]; ok && r.Schedule != "" {
			out[r.Schedule]++
		}
	}
	for id, st := range h.scheds {
		out[id] += st.starting
	}
	return out
}

// fireDue fires what is due at now and returns the next due time.
func (m *Manager) fireDue(now time.Time) time.Time {
	// An isolated fleet host starts no command: its due schedules are
	// held, as those of a stopped session are, until it rejoins.
	var isolated string
	if m.cfg.Allowed != nil {
		if m.cfg.Allowed(m.ctx) != nil {
			// Said the same way each time: a note is made when it changes.
			isolated = "held: this host is isolated from the fleet (it runs schedules again once it rejoins)"
		}
	}
	live := m.liveBySchedule()
	h := m.hx
	type firing struct {
		rec      store.Schedule
		due      time.Time
		caughtUp bool
	}
	var fire []firing
	var notes []session.Event
	var puts []store.Schedule
	h.mu.Lock()
	next := now.Add(time.Minute)
	for id, st := range h.scheds {
		// A zero Next never comes due (a record from before specs that
		// match no date were refused); it must not read as overdue.
		due := !st.rec.Next.IsZero() && !st.rec.Next.After(now)
		queued := st.queued && live[id] == 0
		if !due && !queued {
			if !st.rec.Next.IsZero() {
				next = minTime(next, st.rec.Next)
			}
			continue
		}
		name := st.rec.Session
		s, err := m.get(name)
		if err != nil { // deleted meanwhile
			delete(h.scheds, id)
			continue
		}
		dueAt := st.rec.Next
		if due {
			// Ticks missed (while the daemon was down, or the session
			// held) are not made up one by one: the next is after now.
			st.rec.Next = st.spec.Next(now)
		}
		if !st.rec.Next.IsZero() {
			next = minTime(next, st.rec.Next)
		}
		why := heldBy(s.state())
		if why == "" {
			why = isolated
		}
		if why != "" {
			if st.held != why {
				notes = append(notes, session.Event{Kind: session.EventNote, Name: name, By: "schedule", Message: "schedule " + id + " " + why})
			}
			st.held, st.queued = why, false
			puts = append(puts, st.rec)
			continue
		}
		st.held = ""
		if live[id] > 0 && !queued {
			switch session.Overlap(st.rec.Overlap) {
			case session.OverlapSkip:
				if dueAt.Before(h.openedAt) {
					// Missed while the daemon was down: it runs once, after
					// the previous command (being caught up, or still
					// running) ends.
					st.queued, st.missed = true, dueAt
					puts = append(puts, st.rec)
					continue
				}
				st.rec.Skipped++
				puts = append(puts, st.rec)
				notes = append(notes, session.Event{Kind: session.EventNote, Name: name, By: "schedule", Message: fmt.Sprintf("schedule %s skipped the run due at %s: the previous one still runs", id, dueAt.Format(time.TimeOnly))})
				continue
			case session.OverlapQueue:
				st.queued = true
				puts = append(puts, st.rec)
				continue
			}
		}
		if queued {
			st.queued = false
			dueAt = now
			if !st.missed.IsZero() {
				dueAt, st.missed = st.missed, time.Time{}
			}
		}
		st.rec.Fired = dueAt
		st.rec.Count++
		st.starting++
		live[id]++
		fire = append(fire, firing{rec: st.rec, due: dueAt, caughtUp: dueAt.Before(h.openedAt)})
	}
	h.mu.Unlock()
	for _, ev := range notes {
		m.event(ev)
	}
	for _, rec := range puts {
		m.putSchedule(rec)
	}
	for _, f := range fire {
		// Recorded as fired before its command starts: a daemon killed
		// from here on does not fire this tick again.
		m.putSchedule(f.rec)
		if f.caughtUp {
			m.event(session.Event{Kind: session.EventNote, Name: f.rec.Session, By: "schedule", Message: fmt.Sprintf("schedule %s was due at %s while the daemon was down: running it once now", f.rec.ID, f.due.Format(time.DateTime))})
		}
		m.wg.Go(func() { m.fire(f.rec) })
	}
	return next
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// fire runs one firing of a schedule: a run of its own, the command in it
// (waking the session if it sleeps). The run ends with the command.
func (m *Manager) fire(rec store.Schedule) {
	h := m.hx
	started := func(runID, execID string) {
		h.mu.Lock()
		if st, ok := h.scheds[rec.ID]; ok {
			st.starting--
			if runID != "" {
				st.rec.LastRun = runID
			}
			if execID != "" {
				st.rec.LastExec = execID
			}
			rec = st.rec
		}
		h.mu.Unlock()
		if runID != "" {
			m.putSchedule(rec)
		}
	}
	by := "schedule:" + rec.ID
	run, err := m.startRun(newRunID(), rec.Session, fmt.Sprintf("schedule %s: %s", rec.ID, rec.Spec), by, rec.ID, "")
	if err != nil {
		started("", "")
		m.event(session.Event{Kind: session.EventNote, Name: rec.Session, By: "schedule", Message: fmt.Sprintf("schedule %s could not run: %v", rec.ID, err)})
		return
	}
	// Following the output is not needed: stop at once, the command goes on.
	ctx, cancel := context.WithCancel(session.WithRun(session.WithActor(m.ctx, by), run.ID))
	p, err := m.Exec(ctx, rec.Session, session.ExecRequest{Argv: rec.Argv, Env: rec.Env, Cwd: rec.Cwd})
	cancel()
	if err != nil {
		started(run.ID, "")
		m.endRun(run.ID, session.RunFailed, "its command could not start: "+err.Error(), "schedule")
		m.event(session.Event{Kind: session.EventNote, Name: rec.Session, By: "schedule", Message: fmt.Sprintf("schedule %s could not run: %v", rec.ID, err)})
		return
	}
	started(run.ID, p.ID())
}

// copySchedules gives a fork its source's schedules (new ids, counts from
// zero). A schedule that cannot be copied is noted in the fork's timeline:
// the fork itself has succeeded.
func (m *Manager) copySchedules(ctx context.Context, from, to string) {
	recs, err := m.st.ListSchedules(from)
	if err != nil {
		m.event(session.Event{Kind: session.EventNote, Name: to, Message: fmt.Sprintf("the schedules of %s were not copied: %v", from, err)})
		return
	}
	for _, rec := range recs {
		req := session.ScheduleRequest{Spec: rec.Spec, Overlap: session.Overlap(rec.Overlap), Argv: rec.Argv, Cwd: rec.Cwd, Env: rec.Env}
		if _, err := m.AddSchedule(ctx, to, req); err != nil {
			m.event(session.Event{Kind: session.EventNote, Name: to, Message: fmt.Sprintf("schedule %s of %s was not copied: %v", rec.ID, from, err)})
		}
	}
}

package sessiontest

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/schedule"
)

// The fake keeps agent runs like the Manager does, in memory. Schedules
// are kept and listed but never fire: tests of firing run on the Manager.

var _ session.Harness = (*Fake)(nil)

type fakeHarness struct {
	runs   map[string]*session.Run // by id
	order  []string                // run ids, oldest first
	scheds map[string][]session.Schedule
	seq    int
}

func (f *Fake) harnessLocked() *fakeHarness {
	if f.hx == nil {
		f.hx = &fakeHarness{runs: map[string]*session.Run{}, scheds: map[string][]session.Schedule{}}
	}
	return f.hx
}

// StartRun opens a run.
func (f *Fake) StartRun(ctx context.Context, name string, opts session.RunOptions) (session.Run, error) {
	s, err := f.enterSession(ctx, "StartRun", name)
	if err != nil {
		return session.Run{}, err
	}
	defer f.mu.Unlock()
	h := f.harnessLocked()
	h.seq++
	now := f.now()
	r := &session.Run{
		ID: fmt.Sprintf("r%012x", h.seq), Session: name, Title: opts.Title, By: session.Actor(ctx),
		Status: session.RunOpen, StartedAt: now, LastActive: now,
	}
	if keepRun(opts, f.opts.KeepRuns) {
		c, err := f.checkpointLocked(ctx, s, session.CheckpointOptions{Label: session.StartLabel(r.ID, r.Title)}, false)
		if err != nil {
			h.seq--
			return session.Run{}, fmt.Errorf("run start: its starting point could not be kept: %w", err)
		}
		s.ckpts[len(s.ckpts)-1].info.Run = r.ID
		r.Checkpoint = c.ID
	}
	h.runs[r.ID] = r
	h.order = append(h.order, r.ID)
	f.publishLocked(ctx, s, session.Event{Kind: session.EventNote, Name: name, Message: "run " + r.ID + " started"})
	return *r, nil
}

// useRunLocked checks the run ctx names for a call on session name.
func (f *Fake) useRunLocked(ctx context.Context, name string) (*session.Run, error) {
	id := session.RunOf(ctx)
	if id == "" {
		return nil, nil
	}
	if err := session.ValidateRunID(id); err != nil {
		return nil, err
	}
	r, ok := f.harnessLocked().runs[id]
	switch {
	case !ok:
		return nil, fmt.Errorf("run %q: %w", id, session.ErrNotFound)
	case r.Session != name:
		return nil, fmt.Errorf("run %q belongs to session %q, not %q: %w", id, r.Session, name, session.ErrInvalid)
	case r.Status != session.RunOpen:
		return nil, fmt.Errorf("run %q has ended (%s): %w", id, r.Status, session.ErrInvalidState)
	}
	r.LastActive = f.now()
	return r, nil
}

// EndRun ends an open run.
func (f *Fake) EndRun(ctx context.Context, runID string, status session.RunStatus) (session.Run, error) {
	if err := f.enter(ctx, "EndRun"); err != nil {
		return session.Run{}, err
	}
	if err := session.ValidateRunID(runID); err != nil {
		return session.Run{}, err
	}
	if _, err := session.ParseRunStatus(string(status)); err != nil {
		return session.Run{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.harnessLocked().runs[runID]
	if !ok {
		return session.Run{}, fmt.Errorf("run %q: %w", runID, session.ErrNotFound)
	}
	if r.Status != session.RunOpen {
		return session.Run{}, fmt.Errorf("run %q already ended (%s): %w", runID, r.Status, session.ErrInvalidState)
	}
	r.Status, r.EndedAt = status, f.now()
	return *r, nil
}

// Runs lists a session's runs, oldest first.
func (f *Fake) Runs(ctx context.Context, name string) ([]session.Run, error) {
	if err := f.enter(ctx, "Runs"); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.getLocked(name); err != nil {
		return nil, err
	}
	h := f.harnessLocked()
	out := []session.Run{}
	for _, id := range h.order {
		if r := h.runs[id]; r.Session == name {
			c := *r
			c.ExecIDs = nil
			out = append(out, c)
		}
	}
	return out, nil
}

// GetRun returns one run with its executions' ids.
func (f *Fake) GetRun(ctx context.Context, runID string) (session.Run, error) {
	if err := f.enter(ctx, "GetRun"); err != nil {
		return session.Run{}, err
	}
	if err := session.ValidateRunID(runID); err != nil {
		return session.Run{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.harnessLocked().runs[runID]
	if !ok {
		return session.Run{}, fmt.Errorf("run %q: %w", runID, session.ErrNotFound)
	}
	c := *r
	c.ExecIDs = slices.Clone(r.ExecIDs)
	return c, nil
}

// RemoveRun removes a run and its starting point; refused while one of
// its commands runs.
func (f *Fake) RemoveRun(ctx context.Context, runID string) (session.RemovedRun, error) {
	res := session.RemovedRun{Run: runID}
	if err := f.enter(ctx, "RemoveRun"); err != nil {
		return res, err
	}
	if err := session.ValidateRunID(runID); err != nil {
		return res, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	h := f.harnessLocked()
	r, ok := h.runs[runID]
	if !ok {
		return res, fmt.Errorf("run %q: %w", runID, session.ErrNotFound)
	}
	running := 0
	for _, id := range r.ExecIDs {
		if e := f.execs[id]; e != nil && !e.rec.State.Done() {
			running++
		}
	}
	if running > 0 {
		return res, session.RunRunning(runID, running)
	}
	if s, err := f.getLocked(r.Session); err == nil && r.Checkpoint != "" {
		if i, err := s.findCkpt(r.Checkpoint); err == nil {
			res.Checkpoint, res.Freed = r.Checkpoint, s.ckpts[i].info.Bytes
			s.ckpts = append(s.ckpts[:i], s.ckpts[i+1:]...)
			s.refreshCkptsLocked()
		}
		f.publishLocked(ctx, s, session.Event{Kind: session.EventNote, Name: s.info.Name, Message: "run " + runID + " removed"})
	}
	delete(h.runs, runID)
	h.order = slices.DeleteFunc(h.order, func(id string) bool { return id == runID })
	return res, nil
}

// AddSchedule validates and keeps a schedule; the fake never fires it.
func (f *Fake) AddSchedule(ctx context.Context, name string, req session.ScheduleRequest) (session.Schedule, error) {
	if err := f.enter(ctx, "AddSchedule"); err != nil {
		return session.Schedule{}, err
	}
	if err := schedule.Validate(&req); err != nil {
		return session.Schedule{}, err
	}
	spec, _ := schedule.ParseSpec(req.Spec)
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.getLocked(name); err != nil {
		return session.Schedule{}, err
	}
	h := f.harnessLocked()
	h.seq++
	now := f.now()
	sc := session.Schedule{
		ID: fmt.Sprintf("c%08x", h.seq), Session: name, Spec: strings.TrimSpace(req.Spec), Overlap: req.Overlap,
		Argv: slices.Clone(req.Argv), Cwd: req.Cwd, By: session.Actor(ctx), Created: now, Next: spec.Next(now),
	}
	h.scheds[name] = append(h.scheds[name], sc)
	return sc, nil
}

// Schedules lists a session's schedules.
func (f *Fake) Schedules(ctx context.Context, name string) ([]session.Schedule, error) {
	s, err := f.enterSession(ctx, "Schedules", name)
	if err != nil {
		return nil, err
	}
	defer f.mu.Unlock()
	out := slices.Clone(f.harnessLocked().scheds[name])
	for i := range out {
		switch s.info.State {
		case session.StateStopped, session.StateCrashed:
			out[i].Held = "held: session is " + string(s.info.State)
		}
	}
	if out == nil {
		out = []session.Schedule{}
	}
	return out, nil
}

// RemoveSchedule deletes a schedule.
func (f *Fake) RemoveSchedule(ctx context.Context, name, id string) error {
	if err := f.enter(ctx, "RemoveSchedule"); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.getLocked(name); err != nil {
		return err
	}
	h := f.harnessLocked()
	i := slices.IndexFunc(h.scheds[name], func(sc session.Schedule) bool { return sc.ID == id })
	if i < 0 {
		return fmt.Errorf("schedule %q of session %q: %w", id, name, session.ErrNotFound)
	}
	h.scheds[name] = slices.Delete(h.scheds[name], i, i+1)
	return nil
}

package engine

import (
	"context"
	"errors"
	"fmt"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/store"
)

// RemoveRun removes a run's record and its starting point's checkpoint.
// Its executions stay: they are the session's, and their output with
// them. An open run is closed to new commands first, so none can join it
// while it goes; one of its commands still running refuses the removal
// (and leaves the run as it was).
func (m *Manager) RemoveRun(ctx context.Context, runID string) (session.RemovedRun, error) {
	res := session.RemovedRun{Run: runID}
	if err := session.ValidateRunID(runID); err != nil {
		return res, err
	}
	h := m.hx
	h.mu.Lock()
	name, ok := h.sessOf[runID]
	open := h.open[runID]
	delete(h.open, runID) // no command joins it from here on
	h.mu.Unlock()
	if !ok {
		return res, &session.Error{Class: session.ErrNotFound, Field: session.FieldRun, Msg: fmt.Sprintf("%q: no such run", runID), Hint: "list a session's runs to see their ids"}
	}
	reopen := func() {
		if open != nil {
			h.mu.Lock()
			h.open[runID] = open
			h.mu.Unlock()
		}
	}
	s, err := m.get(name)
	if err != nil {
		reopen()
		return res, err
	}
	if n, err := m.runningOf(name, runID); err != nil || n > 0 {
		reopen()
		if err != nil {
			return res, err
		}
		return res, session.RunRunning(runID, n)
	}
	rec, err := m.st.GetRun(name, runID)
	if err != nil {
		reopen()
		if errors.Is(err, store.ErrNotFound) {
			return res, fmt.Errorf("run %q: %w", runID, session.ErrNotFound)
		}
		return res, err
	}
	if rec.Checkpoint != "" {
		s.op.Lock()
		ck, err := s.findCheckpoint(rec.Checkpoint)
		if err == nil {
			if err = s.removeCheckpoint(ck.ID); err != nil {
				s.op.Unlock()
				reopen()
				return res, fmt.Errorf("remove run %s: its starting point: %w", runID, err)
			}
			res.Checkpoint, res.Freed = ck.ID, ck.Bytes
		}
		s.op.Unlock()
	}
	m.untrackRun(s, runID) // no diff can ask for its record now
	if err := m.st.DeleteRun(name, runID); err != nil && !errors.Is(err, store.ErrNotFound) {
		return res, fmt.Errorf("remove run %s's record: %w", runID, err)
	}
	h.mu.Lock()
	delete(h.sessOf, runID)
	for x, id := range h.execRun {
		if id == runID {
			delete(h.execRun, x)
		}
	}
	h.mu.Unlock()
	msg := "run " + runID + " removed"
	if res.Checkpoint != "" {
		msg += fmt.Sprintf(", with its starting point, checkpoint %s (%s freed)", res.Checkpoint, session.FormatBytes(res.Freed))
	}
	m.event(session.Event{Kind: session.EventNote, Name: name, By: session.Actor(ctx), Message: msg})
	return res, nil
}

// runningOf counts the run's executions still being recorded, whether
// the run is open or has ended (an ended run's commands can still run).
func (m *Manager) runningOf(name, runID string) (int, error) {
	ids, err := m.st.RunExecs(name, runID)
	if err != nil {
		return 0, fmt.Errorf("run %s's commands: %w", runID, err)
	}
	live := map[string]bool{}
	for _, x := range m.recording() {
		live[x] = true
	}
	n := 0
	for _, x := range ids {
		if live[x] {
			n++
		}
	}
	return n, nil
}

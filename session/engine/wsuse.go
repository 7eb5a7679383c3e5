package engine

import (
	"context"
	"time"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/session"
)

// The workspace's use is measured by the guest (statfs of /workspace)
// with the live figures. The last measurement is kept with the session's
// record, so ls, info and the TUI show it while no VM runs (stopped,
// sleeping, after a daemon restart) instead of 0 B.

const (
	// The record is stored again when its figure is this far off the
	// measured one, or this old: a write per change worth seeing, not per
	// refresh of the live figures.
	wsStoreDelta = 1 << 20
	wsStoreAge   = 10 * time.Minute
)

// keepWorkspaceUseLocked puts a measurement into the session's record, and
// stores the record when the stored figure is off by wsStoreDelta or older
// than wsStoreAge (every state change stores it too). It runs under s.mu,
// so the record stored is the current one: a state change stored
// meanwhile is never overwritten by an older copy, and a deleting session
// is not written back.
func (s *sess) keepWorkspaceUseLocked(st guest.Stats, at time.Time) {
	if st.WorkspaceSize == 0 || session.State(s.rec.State) != session.StateRunning {
		return // no workspace mounted, or no VM to trust: nothing measured
	}
	s.rec.WorkspaceUsed, s.rec.WorkspaceMeasuredAt = st.WorkspaceUsed, at
	stored, err := s.m.st.GetSession(s.name)
	if err != nil {
		return
	}
	off := stored.WorkspaceUsed - st.WorkspaceUsed
	if stored.WorkspaceMeasuredAt.IsZero() || off >= wsStoreDelta || -off >= wsStoreDelta || at.Sub(stored.WorkspaceMeasuredAt) >= wsStoreAge {
		if err := s.m.st.PutSession(s.rec); err != nil {
			s.m.log.Warn("record the workspace's use", "session", s.name, "err", err)
		}
	}
}

// measureWorkspace takes a measurement now, on the agent the session is
// connected to, rather than at the next refresh of the live figures: a
// new (or woken, or started) session shows its use from the start.
func (s *sess) measureWorkspace() {
	s.mu.Lock()
	c := s.agent
	s.mu.Unlock()
	if c == nil {
		return
	}
	s.m.wg.Go(func() {
		ctx, cancel := context.WithTimeout(s.m.ctx, 2*time.Second)
		defer cancel()
		st, err := c.Stats(ctx)
		if err != nil {
			return // the next refresh measures
		}
		s.mu.Lock()
		if s.agent == c {
			s.keepWorkspaceUseLocked(st, time.Now())
		}
		s.mu.Unlock()
		snap := s.snapshot()
		s.m.event(session.Event{Kind: session.EventStats, Name: s.name, Session: &snap})
	})
}

package store

import (
	"cmp"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/dgraph-io/badger/v4"
)

// finished reports whether an exec's State is final. The store does not
// own the states; it follows session.ExecState.Done: "starting" and
// "running" (and a record without a state) are live, anything else is
// final ("exited", "failed", "cancelled", "timed-out", "lost").
func finished(state string) bool {
	switch state {
	case "", "starting", "running":
		return false
	}
	return true
}

// budget bounds the output stored by all sessions together. It keeps the
// total (the sum of the outuse keys, recomputed at Open) and an index, in
// memory, of every exec with stored output: the outorder keys of all
// sessions, each with whether the exec has finished. Both change only
// after the commits they describe, under the session's stripe.
type budget struct {
	limit atomic.Int64 // 0: unlimited
	total atomic.Int64

	// trimMu serialises trimming for the budget; it is taken without any
	// stripe held, and a stripe is taken under it.
	trimMu sync.Mutex

	mu    sync.Mutex
	execs map[string]orderEntry
}

type orderEntry struct {
	session  string
	order    uint64 // start time, as in outorder
	finished bool
}

func newBudget() *budget {
	return &budget{execs: make(map[string]orderEntry)}
}

func (b *budget) add(id string, e orderEntry) {
	b.mu.Lock()
	b.execs[id] = e
	b.mu.Unlock()
}

func (b *budget) remove(id string) {
	b.mu.Lock()
	delete(b.execs, id)
	b.mu.Unlock()
}

// setFinished records an exec's new state, if it has stored output.
func (b *budget) setFinished(id string, fin bool) {
	b.mu.Lock()
	if e, ok := b.execs[id]; ok {
		e.finished = fin
		b.execs[id] = e
	}
	b.mu.Unlock()
}

// oldest returns the exec whose output goes first: the earliest started of
// the finished ones, else the earliest started of those still running.
func (b *budget) oldest() (string, orderEntry, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var id string
	var best orderEntry
	found := false
	for k, e := range b.execs {
		if !found || before(k, e, id, best) {
			id, best, found = k, e, true
		}
	}
	return id, best, found
}

func before(aID string, a orderEntry, bID string, b orderEntry) bool {
	if a.finished != b.finished {
		return a.finished
	}
	if c := cmp.Compare(a.order, b.order); c != 0 {
		return c < 0
	}
	return aID < bID
}

// SetOutputBudget bounds the output stored for all sessions together to n
// bytes (0, the default, means no bound besides each session's
// retention). When the total exceeds it, the oldest output of finished
// executions is trimmed first, by start time, and only then that of the
// oldest still running. A lower budget trims at once.
func (s *Store) SetOutputBudget(n int64) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.closeMu.RUnlock()
	s.budget.limit.Store(max(n, 0))
	_, err := s.enforceBudget("")
	return err
}

// OutputTotal returns the bytes of output stored for all sessions.
func (s *Store) OutputTotal() int64 { return s.budget.total.Load() }

// enforceBudget trims until the total is within the budget. The caller
// holds no stripe. It reports whether it trimmed exec id.
func (s *Store) enforceBudget(id string) (bool, error) {
	b := s.budget
	limit := b.limit.Load()
	if limit <= 0 || b.total.Load() <= limit {
		return false, nil
	}
	b.trimMu.Lock()
	defer b.trimMu.Unlock()
	touched := false
	for {
		limit = b.limit.Load()
		if limit <= 0 || b.total.Load() <= limit {
			return touched, nil
		}
		victim, e, ok := b.oldest()
		if !ok {
			// The total claims output that no exec holds; see trimmer.trim.
			s.log.Warn("output total exceeds the budget but no exec has output", "total", b.total.Load(), "budget", limit)
			return touched, nil
		}
		if err := s.trimForBudget(e.session, victim, limit); err != nil {
			return touched, err
		}
		touched = touched || victim == id
	}
}

// trimForBudget trims exec id's oldest chunks until the total is within
// limit or the exec has nothing left (or one transaction's worth is done).
func (s *Store) trimForBudget(session, id string, limit int64) error {
	mu := s.stripe(session)
	mu.Lock()
	defer mu.Unlock()
	var t *trimmer
	var delta int64
	stale := false
	err := s.update(func(txn *badger.Txn) error {
		t, delta, stale = nil, 0, false
		st, err := getOutState(txn, id)
		if err != nil {
			return err
		}
		var rec Exec
		switch err := getJSON(txn, execKey(id), &rec); {
		case errors.Is(err, badger.ErrKeyNotFound) || err == nil && (!st.Indexed || rec.Session != session):
			// Deleted, or emptied, since it was indexed: forget it.
			stale = true
			return nil
		case err != nil:
			return fmt.Errorf("exec %q: %w", id, err)
		}
		use, err := getUse(txn, session)
		if err != nil {
			return err
		}
		excess := s.budget.total.Load() - limit
		if excess <= 0 {
			return nil
		}
		t = newTrimmer(txn, session)
		t.states[id] = st
		was := use
		target := use - excess
		if err := t.trimExec(id, st, &use, target); err != nil {
			return err
		}
		use = max(use, 0)
		if err := t.flush(); err != nil {
			return err
		}
		delta = use - was
		return putUse(txn, session, use)
	})
	if err != nil {
		return err
	}
	if stale {
		s.budget.remove(id)
		return nil
	}
	s.budget.total.Add(delta)
	s.afterTrim(t)
	return nil
}

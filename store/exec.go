package store

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/dgraph-io/badger/v4"
)

// PutExec creates or replaces an exec's record. The output fields
// (StdoutBytes through TrimmedBytes) belong to AppendOutput and are ignored
// here. An exec stays in the session it was created in.
func (s *Store) PutExec(e Exec) error {
	if err := checkName("exec", e.ID); err != nil {
		return err
	}
	if err := checkName("session", e.Session); err != nil {
		return err
	}
	if err := s.enter(); err != nil {
		return err
	}
	defer s.closeMu.RUnlock()
	val, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("exec %q: %w", e.ID, err)
	}
	mu := s.stripe(e.Session)
	mu.Lock()
	defer mu.Unlock()
	err = s.update(func(txn *badger.Txn) error {
		var old Exec
		switch err := getJSON(txn, execKey(e.ID), &old); {
		case err == nil:
			if old.Session != e.Session {
				return fmt.Errorf("exec %q belongs to session %q, not %q: %w", e.ID, old.Session, e.Session, ErrInvalid)
			}
		case !errors.Is(err, badger.ErrKeyNotFound):
			return err
		}
		if err := txn.Set(execKey(e.ID), val); err != nil {
			return err
		}
		return txn.Set(sessionExecKey(e.Session, e.ID), nil)
	})
	if err != nil {
		return fmt.Errorf("put exec %q: %w", e.ID, err)
	}
	s.execSession.Store(e.ID, e.Session)
	s.budget.setFinished(e.ID, finished(e.State))
	return nil
}

// GetExec returns an exec's record with its output progress.
func (s *Store) GetExec(id string) (Exec, error) {
	if err := checkName("exec", id); err != nil {
		return Exec{}, err
	}
	if err := s.enter(); err != nil {
		return Exec{}, err
	}
	defer s.closeMu.RUnlock()
	var e Exec
	err := s.db.View(func(txn *badger.Txn) error {
		var err error
		e, _, err = loadExec(txn, id)
		return err
	})
	if err != nil {
		return Exec{}, fmt.Errorf("get exec: %w", err)
	}
	return e, nil
}

// ListExecs returns a session's execs, newest (latest StartedAt) first.
func (s *Store) ListExecs(session string) ([]Exec, error) {
	if err := checkName("session", session); err != nil {
		return nil, err
	}
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.closeMu.RUnlock()
	var out []Exec
	err := s.db.View(func(txn *badger.Txn) error {
		ids := keySuffixes(txn, sessionExecPrefix(session))
		out = make([]Exec, 0, len(ids))
		for _, id := range ids {
			e, _, err := loadExec(txn, id)
			if err != nil {
				return err
			}
			out = append(out, e)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list execs of session %q: %w", session, err)
	}
	slices.SortFunc(out, func(a, b Exec) int {
		if c := b.StartedAt.Compare(a.StartedAt); c != 0 {
			return c
		}
		return cmp.Compare(b.ID, a.ID)
	})
	return out, nil
}

// loadExec reads an exec's record and output progress.
func loadExec(txn *badger.Txn, id string) (Exec, *outState, error) {
	var e Exec
	err := getJSON(txn, execKey(id), &e)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return Exec{}, nil, fmt.Errorf("exec %q: %w", id, ErrNotFound)
	}
	if err != nil {
		return Exec{}, nil, fmt.Errorf("exec %q: %w", id, err)
	}
	st, err := getOutState(txn, id)
	if err != nil {
		return Exec{}, nil, err
	}
	st.applyTo(&e)
	return e, st, nil
}

// sessionOf returns the session an exec belongs to.
func (s *Store) sessionOf(id string) (string, error) {
	if v, ok := s.execSession.Load(id); ok {
		return v.(string), nil
	}
	var e Exec
	err := s.db.View(func(txn *badger.Txn) error {
		return getJSON(txn, execKey(id), &e)
	})
	if errors.Is(err, badger.ErrKeyNotFound) {
		return "", fmt.Errorf("exec %q: %w", id, ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("exec %q: %w", id, err)
	}
	s.execSession.Store(id, e.Session)
	return e.Session, nil
}

package store

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/dgraph-io/badger/v4"
)

// PutSession creates or replaces a session's record. A lowered Retention
// trims the session's stored output before PutSession returns.
func (s *Store) PutSession(sess Session) error {
	if err := checkName("session", sess.Name); err != nil {
		return err
	}
	if err := s.enter(); err != nil {
		return err
	}
	defer s.closeMu.RUnlock()
	val, err := json.Marshal(sess)
	if err != nil {
		return fmt.Errorf("session %q: %w", sess.Name, err)
	}
	mu := s.stripe(sess.Name)
	mu.Lock()
	defer mu.Unlock()

	// Mirror what a reader after a restart would get: the decoded record,
	// without monotonic clock readings or the caller's pointers.
	var stored Session
	if err := json.Unmarshal(val, &stored); err != nil {
		return fmt.Errorf("session %q: %w", sess.Name, err)
	}
	s.sessMu.RLock()
	old, existed := s.sessions[sess.Name]
	s.sessMu.RUnlock()
	err = s.update(func(txn *badger.Txn) error {
		return txn.Set(sessionKey(sess.Name), val)
	})
	if err != nil {
		return fmt.Errorf("put session %q: %w", sess.Name, err)
	}
	s.sessMu.Lock()
	s.sessions[sess.Name] = stored
	s.sessMu.Unlock()
	// Creation and state changes must survive power loss: after a reboot
	// berth must know which sessions (and workspaces) exist and whether they
	// were running. Frequent updates such as LastActivity ride on later syncs.
	if !existed || old.State != sess.State {
		if err := s.db.Sync(); err != nil {
			return fmt.Errorf("put session %q: sync: %w", sess.Name, err)
		}
	}
	if err := s.trimLocked(sess.Name, retentionOf(sess)); err != nil {
		return fmt.Errorf("put session %q: %w", sess.Name, err)
	}
	return nil
}

func retentionOf(sess Session) int64 {
	if sess.Retention > 0 {
		return sess.Retention
	}
	return DefaultRetention
}

// deleteRecords deletes, in one write batch, every record of session
// name but the session's own: its executions (those listed with it, and
// extra), their output's index and bookkeeping, events, runs and
// schedules. It returns the executions' ids and the output bytes the
// session had stored; their segment files are the caller's to remove.
// Chunks go before their exec record: a crash mid-way must not leave
// chunks that no exec record leads to.
func (s *Store) deleteRecords(name string, extra []string) (ids []string, use int64, err error) {
	wb := s.db.NewWriteBatch()
	defer wb.Cancel()
	err = s.db.View(func(txn *badger.Txn) error {
		var err error
		if use, err = getUse(txn, name); err != nil {
			return err
		}
		ids = append(keySuffixes(txn, sessionExecPrefix(name)), extra...)
		for _, id := range ids {
			for _, p := range [][]byte{chunkPrefix(id), trimPrefix(id)} {
				if err := deleteUnder(txn, wb, p); err != nil {
					return err
				}
			}
			for _, k := range [][]byte{outStateKey(id), execKey(id), sessionExecKey(name, id)} {
				if err := wb.Delete(k); err != nil {
					return err
				}
			}
		}
		for _, p := range [][]byte{outOrderPrefix(name), eventPrefix(name), runPrefix(name), schedulePrefix(name)} {
			if err := deleteUnder(txn, wb, p); err != nil {
				return err
			}
		}
		return wb.Delete(outUseKey(name))
	})
	if err == nil {
		err = wb.Flush()
	}
	return ids, use, err
}

// retention returns the session's output limit. Output of an exec whose
// session has no record yet is kept under the default.
func (s *Store) retention(name string) int64 {
	s.sessMu.RLock()
	sess := s.sessions[name]
	s.sessMu.RUnlock()
	return retentionOf(sess)
}

// GetSession returns the named session's record.
func (s *Store) GetSession(name string) (Session, error) {
	if err := checkName("session", name); err != nil {
		return Session{}, err
	}
	if err := s.enter(); err != nil {
		return Session{}, err
	}
	defer s.closeMu.RUnlock()
	s.sessMu.RLock()
	sess, ok := s.sessions[name]
	s.sessMu.RUnlock()
	if !ok {
		return Session{}, fmt.Errorf("session %q: %w", name, ErrNotFound)
	}
	return sess.clone(), nil
}

// ListSessions returns every session, ordered by name.
func (s *Store) ListSessions() ([]Session, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.closeMu.RUnlock()
	s.sessMu.RLock()
	out := make([]Session, 0, len(s.sessions))
	for _, sess := range s.sessions {
		out = append(out, sess.clone())
	}
	s.sessMu.RUnlock()
	slices.SortFunc(out, func(a, b Session) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// loadSessions reads every session record, to fill the mirror at Open.
func (s *Store) loadSessions() (map[string]Session, error) {
	out := make(map[string]Session)
	err := s.db.View(func(txn *badger.Txn) error {
		opts := badger.DefaultIteratorOptions
		opts.Prefix = prefix(ownerSession)
		it := txn.NewIterator(opts)
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			var sess Session
			if err := it.Item().Value(func(v []byte) error {
				return json.Unmarshal(v, &sess)
			}); err != nil {
				return fmt.Errorf("session record %q: %w", it.Item().Key(), err)
			}
			out[sess.Name] = sess
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("open store: load sessions: %w", err)
	}
	return out, nil
}

// DeleteSession deletes the session's record with all its execs, their
// output, and its events. The bulk is deleted in as many transactions as it
// takes, the record itself last, so an interrupted delete leaves the session
// listed and calling DeleteSession again finishes it. It returns ErrNotFound
// (after removing any leftovers) when there was no record.
func (s *Store) DeleteSession(name string) error {
	if err := checkName("session", name); err != nil {
		return err
	}
	if err := s.enter(); err != nil {
		return err
	}
	defer s.closeMu.RUnlock()
	mu := s.stripe(name)
	mu.Lock()
	defer mu.Unlock()

	s.sessMu.RLock()
	_, found := s.sessions[name]
	s.sessMu.RUnlock()
	if err := s.space.room(0); err != nil {
		return fmt.Errorf("delete session %q: %w", name, err)
	}
	execIDs, use, err := s.deleteRecords(name, nil)
	if err == nil {
		// The output's index is gone: free its segments. A segment left by
		// a failure here is removed at the next Open.
		s.budget.total.Add(-use)
		for _, id := range execIDs {
			s.execSession.Delete(id)
			s.budget.remove(id)
			if err := s.seg.remove(id); err != nil {
				s.log.Warn("remove output segment", "exec", id, "err", err)
			}
		}
		err = s.update(func(txn *badger.Txn) error {
			return txn.Delete(sessionKey(name))
		})
	}
	if err == nil {
		err = s.db.Sync()
	}
	if err != nil {
		return fmt.Errorf("delete session %q: %w", name, err)
	}
	s.sessMu.Lock()
	delete(s.sessions, name)
	s.sessMu.Unlock()
	if !found {
		return fmt.Errorf("session %q: %w", name, ErrNotFound)
	}
	return nil
}

func getJSON(txn *badger.Txn, k []byte, v any) error {
	item, err := txn.Get(k)
	if err != nil {
		return err
	}
	return item.Value(func(b []byte) error { return json.Unmarshal(b, v) })
}

// keySuffixes returns what follows p in each key under p.
func keySuffixes(txn *badger.Txn, p []byte) []string {
	it := txn.NewIterator(badger.IteratorOptions{Prefix: p})
	defer it.Close()
	var out []string
	for it.Rewind(); it.Valid(); it.Next() {
		out = append(out, string(it.Item().Key()[len(p):]))
	}
	return out
}

func deleteUnder(txn *badger.Txn, wb *badger.WriteBatch, p []byte) error {
	it := txn.NewIterator(badger.IteratorOptions{Prefix: p})
	defer it.Close()
	for it.Rewind(); it.Valid(); it.Next() {
		if err := wb.Delete(it.Item().KeyCopy(nil)); err != nil {
			return err
		}
	}
	return nil
}

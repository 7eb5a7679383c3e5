package store

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// AppendEvent adds ev to its session's event log (an empty Session is the
// daemon-wide log) and returns it with its Seq: 1, 2, 3... per session. A
// zero Time is set to now.
func (s *Store) AppendEvent(ev Event) (Event, error) {
	if ev.Session != "" {
		if err := checkName("session", ev.Session); err != nil {
			return Event{}, err
		}
	}
	if err := s.enter(); err != nil {
		return Event{}, err
	}
	defer s.closeMu.RUnlock()
	if ev.Time.IsZero() {
		ev.Time = time.Now()
	}
	// The stripe makes "read last seq, write the next" atomic: badger's
	// conflict detection does not see a key that was absent when read.
	mu := s.stripe(ev.Session)
	mu.Lock()
	defer mu.Unlock()
	err := s.update(func(txn *badger.Txn) error {
		p := eventPrefix(ev.Session)
		it := txn.NewIterator(badger.IteratorOptions{Prefix: p, Reverse: true})
		it.Seek(appendUint64(slices.Clip(p), ^uint64(0)))
		ev.Seq = 1
		if it.Valid() {
			ev.Seq = binary.BigEndian.Uint64(it.Item().Key()[len(p):]) + 1
		}
		it.Close()
		v, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		return txn.Set(eventKey(ev.Session, ev.Seq), v)
	})
	if err != nil {
		return Event{}, fmt.Errorf("append event to session %q: %w", ev.Session, err)
	}
	return ev, nil
}

// Events returns the session's last limit events (all if limit <= 0),
// oldest first.
func (s *Store) Events(session string, limit int) ([]Event, error) {
	if session != "" {
		if err := checkName("session", session); err != nil {
			return nil, err
		}
	}
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.closeMu.RUnlock()
	var out []Event
	err := s.db.View(func(txn *badger.Txn) error {
		p := eventPrefix(session)
		opts := badger.DefaultIteratorOptions
		opts.Prefix = p
		opts.Reverse = true
		if limit > 0 {
			opts.PrefetchSize = min(limit, opts.PrefetchSize)
		}
		it := txn.NewIterator(opts)
		defer it.Close()
		for it.Seek(appendUint64(slices.Clip(p), ^uint64(0))); it.Valid(); it.Next() {
			if limit > 0 && len(out) >= limit {
				break
			}
			var ev Event
			if err := it.Item().Value(func(v []byte) error {
				return json.Unmarshal(v, &ev)
			}); err != nil {
				return fmt.Errorf("event %q: %w", it.Item().Key(), err)
			}
			out = append(out, ev)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("events of session %q: %w", session, err)
	}
	slices.Reverse(out)
	return out, nil
}

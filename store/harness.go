package store

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// Runs and schedules are stored with their session, each under an owner of
// its own (and so a schema version of its own):
//
//	run/<session>/<id>                    Run, JSON
//	run/<session>/<id>/<exec>             empty; lists a run's execs
//	schedule/<session>/<id>               Schedule, JSON
//
// DeleteSession deletes both with the session.
const (
	ownerRun      = "run"
	ownerSchedule = "schedule"
)

func runPrefix(session string) []byte  { return prefix(ownerRun, session) }
func runKey(session, id string) []byte { return key(ownerRun, session, id) }
func runExecKey(session, id, exec string) []byte {
	return key(ownerRun, session, id, exec)
}
func schedulePrefix(session string) []byte { return prefix(ownerSchedule, session) }
func scheduleKey(session, id string) []byte {
	return key(ownerSchedule, session, id)
}

// Run is one agent run's record: a task a harness performs on a session.
type Run struct {
	ID      string `json:"id"`
	Session string `json:"session"`
	Title   string `json:"title,omitempty"`
	By      string `json:"by,omitempty"`
	// Status is "open" until the run ends: "ok", "failed", "cancelled" or
	// "abandoned".
	Status    string    `json:"status"`
	StartedAt time.Time `json:"started_at,omitzero"`
	EndedAt   time.Time `json:"ended_at,omitzero"`
	// LastActive is the run's last use: its start, an execution started or
	// ended in it, a file written in it.
	LastActive   time.Time `json:"last_active,omitzero"`
	Executions   int       `json:"executions,omitempty"`
	BytesWritten int64     `json:"bytes_written,omitempty"`
	// Schedule is the id of the schedule that started the run, if any.
	Schedule string `json:"schedule,omitempty"`
	// Note says why the run ended as it did ("the caller went away").
	Note string `json:"note,omitempty"`
	// Checkpoint is the id of the checkpoint of the run's starting point,
	// if it kept one.
	Checkpoint string `json:"checkpoint,omitempty"`
	// Files, Added and Removed count what the run changed as its last
	// diff found (Diffed set).
	Diffed  bool `json:"diffed,omitempty"`
	Files   int  `json:"files,omitempty"`
	Added   int  `json:"added,omitempty"`
	Removed int  `json:"removed,omitempty"`
}

// Schedule is a command run on a timetable in a session.
type Schedule struct {
	ID      string            `json:"id"`
	Session string            `json:"session"`
	Spec    string            `json:"spec"`
	Overlap string            `json:"overlap"`
	Argv    []string          `json:"argv"`
	Cwd     string            `json:"cwd,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	By      string            `json:"by,omitempty"`
	Created time.Time         `json:"created,omitzero"`
	// Next is the due time the schedule fires at next; Fired the due time
	// it last fired for (recorded before its command starts, so a daemon
	// killed meanwhile never fires the same tick again).
	Next     time.Time `json:"next,omitzero"`
	Fired    time.Time `json:"fired,omitzero"`
	Count    int       `json:"count,omitempty"` // times fired
	Skipped  int       `json:"skipped,omitempty"`
	LastRun  string    `json:"last_run,omitempty"`
	LastExec string    `json:"last_exec,omitempty"`
}

// putSessionJSON stores v at k if the session exists, durably.
func (s *Store) putSessionJSON(session string, k []byte, v any) error {
	if err := checkName("session", session); err != nil {
		return err
	}
	if err := s.enter(); err != nil {
		return err
	}
	defer s.closeMu.RUnlock()
	val, err := json.Marshal(v)
	if err != nil {
		return err
	}
	mu := s.stripe(session)
	mu.Lock()
	defer mu.Unlock()
	s.sessMu.RLock()
	_, ok := s.sessions[session]
	s.sessMu.RUnlock()
	if !ok {
		return fmt.Errorf("session %q: %w", session, ErrNotFound)
	}
	if err := s.update(func(txn *badger.Txn) error { return txn.Set(k, val) }); err != nil {
		return err
	}
	return s.db.Sync()
}

// PutRun creates or replaces a run's record; the session must exist.
func (s *Store) PutRun(r Run) error {
	if err := checkName("run", r.ID); err != nil {
		return err
	}
	if err := s.putSessionJSON(r.Session, runKey(r.Session, r.ID), r); err != nil {
		return fmt.Errorf("put run %q: %w", r.ID, err)
	}
	return nil
}

// GetRun returns one run of a session.
func (s *Store) GetRun(session, id string) (Run, error) {
	if err := checkName("session", session); err != nil {
		return Run{}, err
	}
	if err := checkName("run", id); err != nil {
		return Run{}, err
	}
	if err := s.enter(); err != nil {
		return Run{}, err
	}
	defer s.closeMu.RUnlock()
	var r Run
	err := s.db.View(func(txn *badger.Txn) error { return getJSON(txn, runKey(session, id), &r) })
	if errors.Is(err, badger.ErrKeyNotFound) {
		return Run{}, fmt.Errorf("run %q: %w", id, ErrNotFound)
	}
	if err != nil {
		return Run{}, fmt.Errorf("get run %q: %w", id, err)
	}
	return r, nil
}

// AddRunExec records that exec belongs to run and counts it in the run's
// record, in one transaction.
func (s *Store) AddRunExec(session, run, exec string, at time.Time) (Run, error) {
	if err := checkName("session", session); err != nil {
		return Run{}, err
	}
	if err := checkName("run", run); err != nil {
		return Run{}, err
	}
	if err := checkName("exec", exec); err != nil {
		return Run{}, err
	}
	if err := s.enter(); err != nil {
		return Run{}, err
	}
	defer s.closeMu.RUnlock()
	mu := s.stripe(session)
	mu.Lock()
	defer mu.Unlock()
	var r Run
	err := s.update(func(txn *badger.Txn) error {
		if err := getJSON(txn, runKey(session, run), &r); err != nil {
			return err
		}
		r.Executions++
		if at.After(r.LastActive) {
			r.LastActive = at
		}
		val, err := json.Marshal(r)
		if err != nil {
			return err
		}
		if err := txn.Set(runKey(session, run), val); err != nil {
			return err
		}
		return txn.Set(runExecKey(session, run, exec), nil)
	})
	if errors.Is(err, badger.ErrKeyNotFound) {
		return Run{}, fmt.Errorf("run %q: %w", run, ErrNotFound)
	}
	if err != nil {
		return Run{}, fmt.Errorf("add exec to run %q: %w", run, err)
	}
	return r, nil
}

// RunExecs returns the ids of a run's execs.
func (s *Store) RunExecs(session, run string) ([]string, error) {
	if err := checkName("session", session); err != nil {
		return nil, err
	}
	if err := checkName("run", run); err != nil {
		return nil, err
	}
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.closeMu.RUnlock()
	var out []string
	err := s.db.View(func(txn *badger.Txn) error {
		out = keySuffixes(txn, prefix(ownerRun, session, run))
		return nil
	})
	return out, err
}

// ListRuns returns a session's runs, oldest first.
func (s *Store) ListRuns(session string) ([]Run, error) {
	out, err := listJSON[Run](s, session, runPrefix(session))
	if err != nil {
		return nil, fmt.Errorf("list runs of %q: %w", session, err)
	}
	slices.SortFunc(out, func(a, b Run) int { return cmp.Or(a.StartedAt.Compare(b.StartedAt), cmp.Compare(a.ID, b.ID)) })
	return out, nil
}

// PutSchedule creates or replaces a schedule; the session must exist.
func (s *Store) PutSchedule(sc Schedule) error {
	if err := checkName("schedule", sc.ID); err != nil {
		return err
	}
	if err := s.putSessionJSON(sc.Session, scheduleKey(sc.Session, sc.ID), sc); err != nil {
		return fmt.Errorf("put schedule %q: %w", sc.ID, err)
	}
	return nil
}

// ListSchedules returns a session's schedules, oldest first.
func (s *Store) ListSchedules(session string) ([]Schedule, error) {
	out, err := listJSON[Schedule](s, session, schedulePrefix(session))
	if err != nil {
		return nil, fmt.Errorf("list schedules of %q: %w", session, err)
	}
	slices.SortFunc(out, func(a, b Schedule) int { return cmp.Or(a.Created.Compare(b.Created), cmp.Compare(a.ID, b.ID)) })
	return out, nil
}

// DeleteRun removes a run's record and its list of execs (the execs'
// own records stay: they are the session's); ErrNotFound when there is
// none.
func (s *Store) DeleteRun(session, id string) error {
	return s.deleteRecord(session, "run", id, runKey(session, id), func(txn *badger.Txn) error {
		for _, x := range keySuffixes(txn, prefix(ownerRun, session, id)) {
			if err := txn.Delete(runExecKey(session, id, x)); err != nil {
				return err
			}
		}
		return nil
	})
}

// DeleteSchedule removes a schedule; ErrNotFound when there is none.
func (s *Store) DeleteSchedule(session, id string) error {
	return s.deleteRecord(session, "schedule", id, scheduleKey(session, id), nil)
}

// deleteRecord removes the record at key, a kind of session's named id,
// with what also (if not nil) removes in the same transaction, and syncs;
// ErrNotFound when there is none.
func (s *Store) deleteRecord(session, kind, id string, key []byte, also func(*badger.Txn) error) error {
	if err := checkName("session", session); err != nil {
		return err
	}
	if err := checkName(kind, id); err != nil {
		return err
	}
	if err := s.enter(); err != nil {
		return err
	}
	defer s.closeMu.RUnlock()
	mu := s.stripe(session)
	mu.Lock()
	defer mu.Unlock()
	err := s.update(func(txn *badger.Txn) error {
		if _, err := txn.Get(key); err != nil {
			return err
		}
		if also != nil {
			if err := also(txn); err != nil {
				return err
			}
		}
		return txn.Delete(key)
	})
	if errors.Is(err, badger.ErrKeyNotFound) {
		return fmt.Errorf("%s %q of session %q: %w", kind, id, session, ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("delete %s %q: %w", kind, id, err)
	}
	return s.db.Sync()
}

func listJSON[T any](s *Store, session string, p []byte) ([]T, error) {
	if err := checkName("session", session); err != nil {
		return nil, err
	}
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.closeMu.RUnlock()
	var out []T
	err := s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: p, PrefetchValues: true})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			if bytes.IndexByte(it.Item().Key()[len(p):], '/') >= 0 {
				continue // a run's exec, not a record
			}
			var v T
			if err := it.Item().Value(func(b []byte) error { return json.Unmarshal(b, &v) }); err != nil {
				return fmt.Errorf("record %q: %w", it.Item().Key(), err)
			}
			out = append(out, v)
		}
		return nil
	})
	return out, err
}

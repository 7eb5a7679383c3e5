package engine

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/berthvm/berth/session"
)

// QuarantineDir is where copies set aside live, under the data directory:
// quarantine/<name>-<time>/, each with the session's directory
// (session/), its records (records.jsonl) and why (why.txt). Nothing
// removes them: an operator reads them and decides.
func QuarantineDir(dataDir string) string { return filepath.Join(dataDir, "quarantine") }

// SetEpoch records the fleet's fencing token for the session's copy
// here: the owner key's mod revision when this host took it.
func (m *Manager) SetEpoch(ctx context.Context, name string, epoch int64) error {
	s, err := m.get(name)
	if err != nil {
		return err
	}
	s.putMu.Lock()
	defer s.putMu.Unlock()
	s.mu.Lock()
	s.rec.Epoch = epoch
	rec := s.rec
	s.mu.Unlock()
	if err := m.st.PutSession(rec); err != nil {
		return fmt.Errorf("record epoch %d of %q: %w", epoch, name, err)
	}
	return nil
}

// Quarantine sets the session's copy aside: a copy another host owns
// now (the fleet moved or recovered it while this host was away) must
// never run again here, nor be merged or lost. Its VM is stopped (a
// sleeping one keeps its memory snapshot: no VM runs), its records are
// written beside its directory, the directory is moved under
// QuarantineDir, and the session is forgotten here. It returns the
// quarantine directory.
func (m *Manager) Quarantine(ctx context.Context, name, why string) (string, error) {
	s, err := m.get(name)
	if err != nil {
		return "", err
	}
	s.op.Lock()
	defer s.op.Unlock()
	if st := s.state(); st == session.StateRunning || st == session.StatePaused || st == session.StateCrashed {
		if err := s.stopVM(ctx, "fleet", "quarantine"); err != nil {
			return "", fmt.Errorf("quarantine %s: stop its VM: %w", name, err)
		}
	}
	dir := filepath.Join(QuarantineDir(m.cfg.DataDir), name+"-"+time.Now().UTC().Format("20060102T150405.000000000Z"))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("quarantine %s: %w", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "why.txt"), []byte(why+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("quarantine %s: %w", name, err)
	}
	if err := m.exportRecords(name, filepath.Join(dir, "records.jsonl")); err != nil {
		return "", fmt.Errorf("quarantine %s: keep its records: %w", name, err)
	}
	if err := os.Rename(s.dir(), filepath.Join(dir, "session")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("quarantine %s: move its directory aside: %w", name, err)
	}
	m.log.Warn("session quarantined: this copy is behind the fleet's owner and will not run here again", "session", name, "dir", dir, "why", why)
	m.removeSession(s, fmt.Sprintf("quarantined in %s: %s", dir, why))
	return dir, nil
}

// exportRecords writes the session's records as JSON lines: the
// session, then its events, runs, schedules, executions and their
// output, each line {"kind": ..., "record": ...}.
func (m *Manager) exportRecords(name, path string) (err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	w := bufio.NewWriter(f)
	enc := json.NewEncoder(w)
	put := func(kind string, rec any) error {
		return enc.Encode(struct {
			Kind   string `json:"kind"`
			Record any    `json:"record"`
		}{kind, rec})
	}
	rec, err := m.st.GetSession(name)
	if err != nil {
		return err
	}
	if err := put("session", rec); err != nil {
		return err
	}
	evs, err := m.st.Events(name, 0)
	if err != nil {
		return err
	}
	for _, e := range evs {
		if err := put("event", e); err != nil {
			return err
		}
	}
	runs, err := m.st.ListRuns(name)
	if err != nil {
		return err
	}
	for _, r := range runs {
		if err := put("run", r); err != nil {
			return err
		}
	}
	scs, err := m.st.ListSchedules(name)
	if err != nil {
		return err
	}
	for _, sc := range scs {
		if err := put("schedule", sc); err != nil {
			return err
		}
	}
	execs, err := m.st.ListExecs(name)
	if err != nil {
		return err
	}
	for _, e := range execs {
		if err := put("exec", e); err != nil {
			return err
		}
		for from := uint64(0); ; {
			chunks, _, next, err := m.st.ReadOutput(e.ID, from, 256)
			if err != nil {
				return err
			}
			for _, c := range chunks {
				if err := put("output", c); err != nil {
					return err
				}
			}
			if len(chunks) == 0 || next <= from {
				break
			}
			from = next
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	return f.Sync()
}

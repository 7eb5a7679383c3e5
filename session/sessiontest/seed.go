package sessiontest

import (
	"context"
	"fmt"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/berthvm/berth/session"
)

// Seeding: a test (or the TUI demo) sets the fake up with sessions in any
// state, recorded executions and workspace files, as a daemon that has run
// for a while would hold them, and then changes them as a guest would.
// These methods take no context and are not Service calls: they are not
// counted and no fault applies to them.

// AddSession adds s as it is given, in any state, and publishes its state.
// Its CreatedAt defaults to now; its Running count is the number of running
// executions later added with AddExecution or AddGenerated.
func (f *Fake) AddSession(s session.Session) error {
	if err := session.ValidateName(s.Name); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.sessions[s.Name]; ok {
		return fmt.Errorf("session %q: %w", s.Name, session.ErrExists)
	}
	if s.CreatedAt.IsZero() {
		s.CreatedAt = f.now()
	}
	s.Running = 0
	fs := &fakeSession{info: s, root: newDir(f.now())}
	f.sessions[s.Name] = fs
	f.publishLocked(context.Background(), fs, session.Event{Kind: session.EventState, Message: s.Cause})
	return nil
}

// Update changes a session's live figures (dirty bytes, workspace use,
// activity, ...) with fn and publishes a stats event, as a guest's stats
// refresh would. Changes fn makes to Name or State are undone: states move
// by the Service's calls and Crash.
func (f *Fake) Update(name string, fn func(*session.Session)) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, err := f.getLocked(name)
	if err != nil {
		return err
	}
	info := s.info
	fn(&info)
	info.Name, info.State = s.info.Name, s.info.State
	s.info = info
	f.publishLocked(context.Background(), s, session.Event{Kind: session.EventStats})
	return nil
}

// Note records an event of kind with msg in the session's timeline and
// publishes it.
func (f *Fake) Note(name string, kind session.EventKind, msg string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, err := f.getLocked(name)
	if err != nil {
		return err
	}
	f.publishLocked(context.Background(), s, session.Event{Kind: kind, Message: msg})
	return nil
}

// AddFile puts a file with data into the session's /workspace, creating
// missing parent directories, all with mtime. It does not change the
// session's figures (WorkspaceUsed stays as AddSession gave it).
func (f *Fake) AddFile(name, p string, data []byte, mtime time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, err := f.getLocked(name)
	if err != nil {
		return err
	}
	dir, base, err := mkdirAll(s, p, mtime, false)
	if err != nil {
		return err
	}
	if c, ok := dir.children[base]; ok && c.dir {
		return fmt.Errorf("add file %s: is a directory: %w", p, session.ErrExists)
	}
	dir.children[base] = &node{data: slices.Clone(data), mode: 0o644, mtime: mtime}
	return nil
}

// AddDir creates a directory and its missing parents in the session's
// /workspace, with mtime.
func (f *Fake) AddDir(name, p string, mtime time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, err := f.getLocked(name)
	if err != nil {
		return err
	}
	_, _, err = mkdirAll(s, p, mtime, true)
	return err
}

// mkdirAll creates the directories on the way to p (p too when all is
// set) and returns p's parent and base name.
func mkdirAll(s *fakeSession, p string, mtime time.Time, all bool) (*node, string, error) {
	rel, err := cleanPath(p)
	if err != nil {
		return nil, "", err
	}
	if rel == "" {
		return nil, "", fmt.Errorf("add %s: /workspace itself exists: %w", p, session.ErrInvalid)
	}
	parts := strings.Split(rel, "/")
	dirs := parts[:len(parts)-1]
	if all {
		dirs = parts
	}
	n := s.root
	for i, part := range dirs {
		c, ok := n.children[part]
		if !ok {
			c = newDir(mtime)
			n.children[part] = c
		} else if !c.dir {
			return nil, "", fmt.Errorf("add %s: %s is a file: %w", p, displayPath(path.Join(parts[:i+1]...)), session.ErrExists)
		}
		if i < len(parts)-1 {
			n = c
		}
	}
	return n, parts[len(parts)-1], nil
}

// AddExecution records x, in any state and with its ID, as an execution
// of x.Session with the given output; chunk Exec and Seq are filled in and
// a zero Time becomes x.StartedAt. No event is published and the byte
// counts stay as x gives them. A running one stays running until Cancel,
// Stop, Delete or Crash ends it; no command runs for it.
func (f *Fake) AddExecution(x session.Execution, chunks ...session.Chunk) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, err := f.seedLocked(x)
	if err != nil {
		return err
	}
	var offset int64
	for i, c := range chunks {
		c.Exec, c.Seq = x.ID, uint64(i+1)
		if c.Time.IsZero() {
			c.Time = x.StartedAt
		}
		c.Data = slices.Clone(c.Data)
		e.chunks = append(e.chunks, c)
		e.starts = append(e.starts, offset)
		offset += int64(len(c.Data))
	}
	e.nextSeq = uint64(len(chunks)) + 1
	e.kept = offset
	return nil
}

// AddGenerated is AddExecution for an output of n chunks computed on
// demand by gen (see Lines), so a test can serve millions of lines without
// holding them. Grow extends it.
func (f *Fake) AddGenerated(x session.Execution, n uint64, gen func(seq uint64) session.Chunk) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, err := f.seedLocked(x)
	if err != nil {
		return err
	}
	e.gen = gen
	e.nextSeq = n + 1
	return nil
}

// Grow extends a running generated execution by n chunks, which reach
// the processes attached to it as live output.
func (f *Fake) Grow(execID string, n uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, err := f.lookupExecLocked(execID)
	if err != nil {
		return err
	}
	switch {
	case e.gen == nil:
		return fmt.Errorf("grow %s: not a generated execution: %w", execID, session.ErrInvalid)
	case e.rec.State.Done():
		return fmt.Errorf("grow %s: it already ended (%s): %w", execID, e.rec.State, session.ErrInvalidState)
	}
	e.nextSeq += n
	e.broadcastLocked()
	return nil
}

// seedLocked registers the record of an execution added by a test.
func (f *Fake) seedLocked(x session.Execution) (*fakeExec, error) {
	if x.ID == "" {
		return nil, fmt.Errorf("add execution: no ID: %w", session.ErrInvalid)
	}
	if _, ok := f.execs[x.ID]; ok {
		return nil, fmt.Errorf("execution %q: %w", x.ID, session.ErrExists)
	}
	s, err := f.getLocked(x.Session)
	if err != nil {
		return nil, err
	}
	e := &fakeExec{
		f:        f,
		s:        s,
		rec:      cloneExec(x),
		firstSeq: 1,
		nextSeq:  1,
		changed:  make(chan struct{}),
		done:     make(chan struct{}),
		resized:  make(chan struct{}, 1),
	}
	if x.State.Done() {
		close(e.done)
	} else {
		// No command runs: ending it records the outcome at once.
		e.cancel = func(cause error) { f.endLocked(e, 0, nil, cause, 0) }
		s.info.Running++
	}
	s.execs = append(s.execs, e)
	f.execs[x.ID] = e
	return e, nil
}

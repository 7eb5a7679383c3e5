package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/guest/image/ext4"
	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/store"
)

// Runs that keep their starting point, and what they changed.
//
// A run started with Keep has a checkpoint taken as it starts (the
// workspace; the system disk too with System), labelled with the run, and
// the guest's agent keeps a record of the paths that change from just
// before it (track.go in the agent).
//
// How the two states are read: the checkpoint's workspace image is read
// on the host by guest/image/ext4, in user space: no mount (which needs
// root and would put an image the guest wrote in front of the host's kernel),
// no VM booted or disk hot-plugged, so two checkpoints compare in any
// state and a diff with now costs only the guest's side. The workspace
// now is read through the agent (a scan, then the files whose bytes a
// patch needs). Both sides are the same filesystem, copied block for
// block: a file with the same inode number, generation and change time on
// both has not changed, whatever its size, so only what differs is hashed
// or read. With the agent's record, only the paths it names (and what is
// under directories that appeared or vanished) are looked at; without it
// (no record: the VM restarted, or none was started; or it overflowed)
// both trees are compared whole, by metadata, and the diff says so.

// keepStart takes a run's starting point: the agent starts recording
// changes first (a change between the two then is recorded and compares
// equal; one after the copy but before the record would be lost), then the
// checkpoint. Checkpoints of runs that ended make room under the limits,
// oldest first.
func (m *Manager) keepStart(ctx context.Context, name, runID string, opts session.RunOptions) (session.Checkpoint, error) {
	var out session.Checkpoint
	by := session.Actor(ctx)
	_, err := m.lifecycle(ctx, name, session.ActionCheckpoint, func(s *sess) error {
		tracked := m.trackRun(ctx, s, runID)
		label := session.StartLabel(runID, opts.Title)
		for {
			c, err := s.checkpoint(ctx, by, session.CheckpointOptions{Label: label}, ckptFor{run: runID, noSystem: !opts.System})
			if err == nil {
				out = c
				return nil
			}
			if !errors.Is(err, &session.Error{Class: session.ErrConflict, Field: session.FieldCheckpoint}) || !m.pruneRunCheckpoint(s, by) {
				if tracked {
					m.untrackRun(s, runID)
				}
				return err
			}
		}
	})
	return out, err
}

// trackRun asks a running session's agent to record changes for runID.
// A session without a running VM has none to ask: its run's diff compares
// whole trees.
func (m *Manager) trackRun(ctx context.Context, s *sess, runID string) bool {
	if s.state() != session.StateRunning {
		return false
	}
	c, err := s.connectedAgent()
	if err == nil {
		tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err = c.Track(tctx, runID)
		cancel()
	}
	if err != nil {
		m.log.Warn("change record not started; the run's diff will compare whole trees", "session", s.name, "run", runID, "err", err)
		return false
	}
	return true
}

func (m *Manager) untrackRun(s *sess, runID string) {
	if c, err := s.connectedAgent(); err == nil {
		ctx, cancel := context.WithTimeout(m.ctx, 10*time.Second)
		c.Untrack(ctx, runID)
		cancel()
	}
}

// pruneRunCheckpoint removes the oldest checkpoint that is the starting
// point of a run that has ended; false when there is none. The caller
// holds s.op.
func (m *Manager) pruneRunCheckpoint(s *sess, by string) bool {
	h := m.hx
	for _, c := range s.loadCheckpoints() {
		if c.Run == "" {
			continue
		}
		h.mu.Lock()
		_, open := h.open[c.Run]
		h.mu.Unlock()
		if open {
			continue
		}
		if err := s.removeCheckpoint(c.ID); err != nil {
			m.log.Warn("remove an old run's checkpoint", "session", s.name, "checkpoint", c.ID, "err", err)
			return false
		}
		m.untrackRun(s, c.Run)
		m.event(session.Event{Kind: session.EventNote, Name: s.name, By: by, Message: fmt.Sprintf("checkpoint %s (run %s's starting point) removed to stay within the checkpoint limits", c.ID, c.Run)})
		return true
	}
	return false
}

// removeCheckpoint removes checkpoint id; the caller holds s.op.
func (s *sess) removeCheckpoint(id string) error {
	// Renamed away first, so a crash mid-removal leaves nothing listed.
	gone := filepath.Join(s.ckptRoot(), "."+id+"-rm")
	if err := os.Rename(s.ckptDir(id), gone); err != nil {
		return fmt.Errorf("remove checkpoint %s: %w", id, err)
	}
	syncDir(s.ckptRoot())
	os.RemoveAll(gone)
	s.refreshCheckpoints()
	return nil
}

// entry is one path's state as a diff compares it.
type entry struct {
	session.DiffEntry
	ctime int64 // unix nanoseconds
}

// same reports that e and o are one file, unchanged: the same identity
// and change time (a write, a rename, a chmod all set the change time).
func (e entry) same(o entry) bool {
	return e.ID != "" && e.ID == o.ID && e.ctime == o.ctime && e.Mode == o.Mode && e.Size == o.Size && e.Link == o.Link
}

// side is one state of a workspace.
type side interface {
	// stat describes paths (missing ones are left out); walk adds
	// everything under those that are directories.
	stat(ctx context.Context, paths []string, walk, sums bool) (map[string]entry, error)
	read(ctx context.Context, p string) ([]byte, error)
}

// ckptSide reads a checkpoint's workspace image.
type ckptSide struct {
	f  *os.File
	fs *ext4.FS
}

func openCkptSide(dir string) (*ckptSide, error) {
	f, err := os.Open(filepath.Join(dir, ckptWorkspace))
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	x, err := ext4.Open(f, fi.Size())
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("read checkpoint %s: %w", filepath.Base(dir), err)
	}
	return &ckptSide{f: f, fs: x}, nil
}

func (c *ckptSide) Close() error { return c.f.Close() }

func (c *ckptSide) entry(rel string, in *ext4.Inode, sums bool) (entry, error) {
	e := entry{DiffEntry: session.DiffEntry{Path: rel, Mode: in.FileMode(), Size: in.Size, ID: in.ID()}, ctime: in.Ctime.UnixNano()}
	switch {
	case in.FileMode().IsDir():
		e.Size = 0
	case in.FileMode().Type() == fs.ModeSymlink:
		l, err := c.fs.Readlink(in)
		if err != nil {
			return e, err
		}
		e.Link = l
	case in.FileMode().IsRegular() && sums:
		r, err := c.fs.Open(in)
		if err != nil {
			return e, err
		}
		h := sha256.New()
		if _, err := io.Copy(h, r); err != nil {
			return e, err
		}
		e.Sum = hex.EncodeToString(h.Sum(nil))
	}
	return e, nil
}

func (c *ckptSide) stat(ctx context.Context, paths []string, walk, sums bool) (map[string]entry, error) {
	out := map[string]entry{}
	for _, p := range paths {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		in, err := c.fs.Lookup(p)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, ext4.ErrSymlinkOnPath) {
			continue // not there (a path through a symlink names no entry of its own)
		}
		if err != nil {
			return nil, err
		}
		if p != "" {
			e, err := c.entry(p, in, sums)
			if err != nil {
				return nil, err
			}
			out[p] = e
		}
		if walk && in.FileMode().IsDir() {
			err := c.fs.Walk(p, in, func(rel string, in *ext4.Inode) error {
				e, err := c.entry(rel, in, sums)
				out[rel] = e
				return err
			})
			if err != nil {
				return nil, err
			}
		}
	}
	delete(out, "lost+found") // mkfs's, in every workspace
	return out, nil
}

func (c *ckptSide) read(ctx context.Context, p string) ([]byte, error) {
	in, err := c.fs.Lookup(p)
	if err != nil {
		return nil, err
	}
	return c.fs.ReadFile(in, session.MaxPatchBytes)
}

// nowSide reads the workspace now through the agent.
type nowSide struct {
	c    *guest.Client
	name string
}

func (n *nowSide) stat(ctx context.Context, paths []string, walk, sums bool) (map[string]entry, error) {
	out := map[string]entry{}
	if len(paths) == 0 {
		return out, nil
	}
	scan := make([]string, len(paths))
	for i, p := range paths {
		scan[i] = p
		if p == "" {
			scan[i] = "."
		}
	}
	es, err := n.c.Scan(ctx, scan, walk, sums)
	if err != nil {
		return nil, agentErr(n.name, err)
	}
	for _, e := range es {
		if e.Missing || e.Path == "." || e.Path == "" {
			continue
		}
		de := session.DiffEntry{Path: e.Path, Mode: fs.FileMode(e.Mode), Size: e.Size, Link: e.Link, Sum: e.Sum}
		if e.Ino != 0 {
			de.ID = fmt.Sprintf("%d:%d", e.Ino, e.Gen)
		}
		out[e.Path] = entry{DiffEntry: de, ctime: e.Ctime}
	}
	delete(out, "lost+found")
	return out, nil
}

func (n *nowSide) read(ctx context.Context, p string) ([]byte, error) {
	r, err := n.c.ReadFile(ctx, p)
	if err != nil {
		return nil, agentErr(n.name, err)
	}
	defer r.Close()
	return io.ReadAll(io.LimitReader(r, session.MaxPatchBytes+1))
}

// compare compares two states: of the paths touched (nil: of every path
// under paths, or of everything).
func compare(ctx context.Context, old, new side, paths, touched []string, patch bool) (session.Diff, error) {
	var oe, ne map[string]entry
	var err error
	if touched == nil {
		roots := paths
		if len(roots) == 0 {
			roots = []string{""}
		}
		if oe, err = old.stat(ctx, roots, true, false); err != nil {
			return session.Diff{}, err
		}
		if ne, err = new.stat(ctx, roots, true, false); err != nil {
			return session.Diff{}, err
		}
	} else {
		if oe, err = old.stat(ctx, touched, false, false); err != nil {
			return session.Diff{}, err
		}
		if ne, err = new.stat(ctx, touched, false, false); err != nil {
			return session.Diff{}, err
		}
		// A directory on one side only (made, removed, renamed, or now of
		// another type): what it holds was not necessarily recorded path
		// by path (a tree moved in), so it is read whole.
		var oDirs, nDirs []string
		for p, o := range oe {
			if n, ok := ne[p]; o.Mode.IsDir() && (!ok || !n.Mode.IsDir()) {
				oDirs = append(oDirs, p)
			}
		}
		for p, n := range ne {
			if o, ok := oe[p]; n.Mode.IsDir() && (!ok || !o.Mode.IsDir()) {
				nDirs = append(nDirs, p)
			}
		}
		if err := expand(ctx, old, oe, oDirs); err != nil {
			return session.Diff{}, err
		}
		if err := expand(ctx, new, ne, nDirs); err != nil {
			return session.Diff{}, err
		}
	}
	session.KeepUnder(oe, paths)
	session.KeepUnder(ne, paths)
	// The same file, unchanged, on both sides: nothing to read.
	var hash []string
	for p, o := range oe {
		n, ok := ne[p]
		switch {
		case !ok:
		case o.same(n):
			delete(oe, p)
			delete(ne, p)
		case o.Mode.IsRegular() && n.Mode.IsRegular() && o.Size == n.Size:
			hash = append(hash, p) // only its bytes can tell
		}
	}
	if len(hash) > 0 {
		slices.Sort(hash)
		if err := sums(ctx, old, oe, hash); err != nil {
			return session.Diff{}, err
		}
		if err := sums(ctx, new, ne, hash); err != nil {
			return session.Diff{}, err
		}
	}
	read := func(s side) func(string) ([]byte, error) {
		return func(p string) ([]byte, error) { return s.read(ctx, p) }
	}
	return session.BuildDiff(plain(oe), plain(ne), paths, patch, read(old), read(new))
}

func expand(ctx context.Context, s side, into map[string]entry, dirs []string) error {
	if len(dirs) == 0 {
		return nil
	}
	slices.Sort(dirs)
	more, err := s.stat(ctx, dirs, true, false)
	if err != nil {
		return err
	}
	for p, e := range more {
		into[p] = e
	}
	return nil
}

func sums(ctx context.Context, s side, into map[string]entry, paths []string) error {
	got, err := s.stat(ctx, paths, false, true)
	if err != nil {
		return err
	}
	for _, p := range paths {
		if e, ok := got[p]; ok {
			into[p] = e
		}
	}
	return nil
}

func plain(m map[string]entry) map[string]session.DiffEntry {
	out := make(map[string]session.DiffEntry, len(m))
	for p, e := range m {
		out[p] = e.DiffEntry
	}
	return out
}

// Diff compares checkpoint from with checkpoint to, or with now.
func (m *Manager) Diff(ctx context.Context, name, from, to string, opts session.DiffOptions) (session.Diff, error) {
	paths, err := session.CleanDiffPaths(opts.Paths)
	if err != nil {
		return session.Diff{}, err
	}
	s, err := m.get(name)
	if err != nil {
		return session.Diff{}, err
	}
	ck, err := s.findCheckpoint(from)
	if err != nil {
		return session.Diff{}, err
	}
	old, err := openCkptSide(s.ckptDir(ck.ID))
	if err != nil {
		return session.Diff{}, err
	}
	defer old.Close()
	var d session.Diff
	if to != "" {
		ck2, err := s.findCheckpoint(to)
		if err != nil {
			return session.Diff{}, err
		}
		nw, err := openCkptSide(s.ckptDir(ck2.ID))
		if err != nil {
			return session.Diff{}, err
		}
		defer nw.Close()
		d, err = compare(ctx, old, nw, paths, nil, opts.Patch)
		if err != nil {
			return d, err
		}
		d.Full, d.Note = true, "two checkpoints: compared whole, by metadata, reading only what differs"
	} else {
		d, err = m.diffNow(ctx, name, old, ck.Run, paths, opts.Patch)
		if err != nil {
			return d, err
		}
	}
	d.Session, d.From, d.To = name, from, to
	return d, nil
}

// diffNow compares a checkpoint with the workspace now, through record
// runID's paths when the agent has it whole.
func (m *Manager) diffNow(ctx context.Context, name string, old *ckptSide, runID string, paths []string, patch bool) (session.Diff, error) {
	c, err := m.agentFor(name)
	if err != nil {
		return session.Diff{}, err
	}
	var touched []string
	note := "no change record was kept for this checkpoint: compared whole trees, by metadata, reading only what differs"
	if runID != "" {
		st, recorded, err := c.Changes(ctx, runID)
		switch {
		case err != nil:
			m.log.Warn("read change record", "session", name, "run", runID, "err", err)
			note = "the guest's change record could not be read: compared whole trees"
		case !st.Known:
			note = "the guest holds no change record for this run (its VM restarted since the run began): compared whole trees"
		case st.Overflow:
			note = "the change record overflowed (too many changed paths to keep): fell back to a full comparison"
		default:
			touched = make([]string, 0, len(recorded))
			for _, p := range recorded {
				if p == "." {
					p = ""
				}
				touched = append(touched, p)
			}
			note = ""
		}
	}
	if touched != nil && len(paths) > 0 {
		// A path named and recorded: only those under the names.
		kept := touched[:0]
		for _, p := range touched {
			if session.Under(p, paths) {
				kept = append(kept, p)
			}
		}
		touched = kept
	}
	d, err := compare(ctx, old, &nowSide{c: c, name: name}, paths, touched, patch)
	if err != nil {
		return d, err
	}
	d.Full, d.Note = touched == nil, note
	return d, nil
}

// runCheckpoint finds a run, its session and its starting point.
func (m *Manager) runCheckpoint(runID string) (*sess, ckptMeta, error) {
	if err := session.ValidateRunID(runID); err != nil {
		return nil, ckptMeta{}, err
	}
	h := m.hx
	h.mu.Lock()
	name, ok := h.sessOf[runID]
	h.mu.Unlock()
	if !ok {
		return nil, ckptMeta{}, &session.Error{Class: session.ErrNotFound, Field: session.FieldRun, Msg: fmt.Sprintf("%q: no such run", runID), Hint: "list a session's runs to see their ids"}
	}
	rec, err := m.st.GetRun(name, runID)
	if err != nil {
		return nil, ckptMeta{}, fmt.Errorf("run %q: %w", runID, session.ErrNotFound)
	}
	s, err := m.get(name)
	if err != nil {
		return nil, ckptMeta{}, err
	}
	if rec.Checkpoint == "" {
		return nil, ckptMeta{}, session.NoStartingPoint(runID, "")
	}
	ck, err := s.findCheckpoint(rec.Checkpoint)
	if err != nil {
		return nil, ckptMeta{}, session.NoStartingPoint(runID, rec.Checkpoint)
	}
	return s, ck, nil
}

// RunDiff compares a run's starting point with the workspace now.
func (m *Manager) RunDiff(ctx context.Context, runID string, opts session.DiffOptions) (session.Diff, error) {
	paths, err := session.CleanDiffPaths(opts.Paths)
	if err != nil {
		return session.Diff{}, err
	}
	s, ck, err := m.runCheckpoint(runID)
	if err != nil {
		return session.Diff{}, err
	}
	old, err := openCkptSide(s.ckptDir(ck.ID))
	if err != nil {
		return session.Diff{}, err
	}
	defer old.Close()
	d, err := m.diffNow(ctx, s.name, old, runID, paths, opts.Patch)
	if err != nil {
		return d, err
	}
	d.Session, d.Run, d.From = s.name, runID, ck.ID
	if len(paths) == 0 {
		m.noteRunChanges(s.name, runID, d)
	}
	return d, nil
}

// noteRunChanges keeps a whole diff's counts with the run, for listings.
func (m *Manager) noteRunChanges(name, runID string, d session.Diff) {
	h := m.hx
	h.mu.Lock()
	var rec store.Run
	r, open := h.open[runID]
	if open {
		r.Diffed, r.Files, r.Added, r.Removed = true, d.Files, d.Added, d.Removed
		rec = *r
	}
	h.mu.Unlock()
	if !open {
		var err error
		if rec, err = m.st.GetRun(name, runID); err != nil {
			return
		}
		rec.Diffed, rec.Files, rec.Added, rec.Removed = true, d.Files, d.Added, d.Removed
	}
	if err := m.st.PutRun(rec); err != nil {
		m.log.Warn("record run changes", "run", runID, "err", err)
	}
}

// runningIn counts the run's executions still being recorded.
func (m *Manager) runningIn(runID string) int {
	ids := m.recording()
	h := m.hx
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, x := range ids {
		if h.execRun[x] == runID {
			n++
		}
	}
	return n
}

// UndoRun puts the workspace, or the paths named, back as the run found
// it.
func (m *Manager) UndoRun(ctx context.Context, runID string, paths []string) (session.UndoResult, error) {
	rels, err := session.CleanDiffPaths(paths)
	if err != nil {
		return session.UndoResult{}, err
	}
	for _, r := range rels {
		if r == "" {
			return session.UndoResult{}, session.Invalid(session.FieldPath, "/workspace itself: name paths under it", "leave the paths out to undo the whole run")
		}
	}
	s, ck, err := m.runCheckpoint(runID)
	if err != nil {
		return session.UndoResult{}, err
	}
	if err := s.check(session.ActionUndo); err != nil {
		return session.UndoResult{}, err
	}
	if n := m.runningIn(runID); n > 0 {
		return session.UndoResult{}, session.RunBusy(runID, n)
	}
	res := session.UndoResult{Run: runID, Checkpoint: ck.ID}
	if len(rels) == 0 {
		rr, err := m.Restore(ctx, s.name, ck.ID)
		if err != nil {
			return res, err
		}
		res.Whole, res.Restore = true, &rr
		return res, nil
	}
	old, err := openCkptSide(s.ckptDir(ck.ID))
	if err != nil {
		return res, err
	}
	defer old.Close()
	// What differs under the paths, from the whole trees under them (an
	// undo must not trust a record to be complete).
	c, err := m.agentFor(s.name)
	if err != nil {
		return res, err
	}
	d, err := compare(ctx, old, &nowSide{c: c, name: s.name}, rels, nil, false)
	if err != nil {
		return res, err
	}
	if err := m.revert(ctx, c, s.name, old, d.Changes, &res); err != nil {
		return res, err
	}
	m.event(session.Event{Kind: session.EventNote, Name: s.name, By: session.Actor(ctx), Message: fmt.Sprintf("run %s undone for %s: %d put back, %d removed",
		runID, strings.Join(rels, ", "), len(res.Restored), len(res.Removed))})
	return res, nil
}

// revert undoes changes: what the run made is removed (deepest first),
// then what it changed or removed is put back as the checkpoint has it
// (shallowest first), each durably; a final flush makes the mode changes
// and removals durable too.
func (m *Manager) revert(ctx context.Context, c *guest.Client, name string, old *ckptSide, changes []session.FileChange, res *session.UndoResult) error {
	var remove, restore []string
	for _, ch := range changes {
		switch ch.Kind {
		case session.ChangeAdded:
			remove = append(remove, ch.Path)
		case session.ChangeRemoved:
			restore = append(restore, ch.Path)
		case session.ChangeRenamed:
			remove = append(remove, ch.Path)
			restore = append(restore, ch.From)
		case session.ChangeModified:
			if ch.Content || ch.OldMode.Type() != ch.NewMode.Type() {
				if ch.OldMode.IsDir() != ch.NewMode.IsDir() || ch.OldMode.Type() != ch.NewMode.Type() {
					remove = append(remove, ch.Path)
				}
				restore = append(restore, ch.Path)
			} else {
				restore = append(restore, ch.Path) // its mode alone
			}
		}
	}
	slices.SortFunc(remove, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	for _, p := range remove {
		if err := c.Remove(ctx, p, true); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("undo: remove %s: %w", p, agentErr(name, err))
		}
		if !slices.Contains(restore, p) {
			res.Removed = append(res.Removed, p)
		}
	}
	slices.SortStableFunc(restore, func(a, b string) int { return strings.Count(a, "/") - strings.Count(b, "/") })
	for _, p := range restore {
		if err := putBack(ctx, c, old, p); err != nil {
			return fmt.Errorf("undo: put back %s: %w", p, agentErr(name, err))
		}
		res.Restored = append(res.Restored, p)
	}
	if _, err := c.Flush(ctx); err != nil {
		return fmt.Errorf("undo: flush: %w", agentErr(name, err))
	}
	return nil
}

// putBack makes p what the checkpoint has: a file written durably (a
// temporary file renamed over it, so a write racing the undo lands
// before or after it, never in a half-restored file), a directory or a
// symlink made, and its mode set.
func putBack(ctx context.Context, c *guest.Client, old *ckptSide, p string) error {
	in, err := old.fs.Lookup(p)
	if err != nil {
		return err
	}
	if dir := path.Dir(p); dir != "." {
		if err := c.Mkdir(ctx, dir, true); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	}
	cur, err := c.Stat(ctx, p)
	exists := err == nil
	switch {
	case in.FileMode().IsRegular():
		if exists && fs.FileMode(cur.Mode).IsDir() {
			if err := c.Remove(ctx, p, true); err != nil {
				return err
			}
		}
		r, err := old.fs.Open(in)
		if err != nil {
			return err
		}
		if _, err := c.WriteFile(ctx, p, r, in.FileMode().Perm()); err != nil {
			return err
		}
	case in.FileMode().IsDir():
		if exists && !fs.FileMode(cur.Mode).IsDir() {
			if err := c.Remove(ctx, p, true); err != nil {
				return err
			}
			exists = false
		}
		if !exists {
			if err := c.Mkdir(ctx, p, false); err != nil && !errors.Is(err, fs.ErrExist) {
				return err
			}
		}
	case in.FileMode().Type() == fs.ModeSymlink:
		target, err := old.fs.Readlink(in)
		if err != nil {
			return err
		}
		if exists {
			if err := c.Remove(ctx, p, true); err != nil {
				return err
			}
		}
		return c.Symlink(ctx, target, p)
	default:
		return fmt.Errorf("%s is a %v, which berth does not put back: %w", p, in.FileMode().Type(), session.ErrInvalid)
	}
	mode := uint32(in.FileMode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky))
	return c.Setstat(ctx, p, guest.Attrs{Mode: &mode})
}

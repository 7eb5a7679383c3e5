package sessiontest

import (
	"context"
	"crypto/sha256"
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/berthvm/berth/session"
)

// Diffs compare the fake's trees whole (it keeps no change record) with
// the contract's rules; an undo of paths copies nodes back from the
// checkpoint's tree.

// entries lists every path of the tree under root, relative to /workspace.
// The fake has no inode numbers: renames are found by content.
func entries(root *node) map[string]session.DiffEntry {
	out := map[string]session.DiffEntry{}
	var walk func(n *node, rel string)
	walk = func(n *node, rel string) {
		if rel != "" {
			e := session.DiffEntry{Path: rel, Mode: n.mode, Link: n.link}
			if !n.dir && !n.isLink() {
				e.Size = int64(len(n.data))
				sum := sha256.Sum256(n.data)
				e.Sum = fmt.Sprintf("%x", sum)
			}
			out[rel] = e
		}
		for name, c := range n.children {
			walk(c, path.Join(rel, name))
		}
	}
	walk(root, "")
	return out
}

// nodeAt finds rel in the tree without following symlinks.
func nodeAt(root *node, rel string) *node {
	n := root
	for _, part := range splitPath(rel) {
		if n == nil || !n.dir {
			return nil
		}
		n = n.children[part]
	}
	return n
}

func diffTrees(old, new *node, opts session.DiffOptions) (session.Diff, error) {
	paths, err := session.CleanDiffPaths(opts.Paths)
	if err != nil {
		return session.Diff{}, err
	}
	read := func(root *node) func(string) ([]byte, error) {
		return func(p string) ([]byte, error) {
			x := nodeAt(root, p)
			if x == nil {
				return nil, fmt.Errorf("%s: %w", p, session.ErrNotFound)
			}
			return slices.Clone(x.data), nil
		}
	}
	d, err := session.BuildDiff(entries(old), entries(new), paths, opts.Patch, read(old), read(new))
	d.Full, d.Note = true, "the fake compares whole trees"
	return d, err
}

// Diff compares two checkpoints, or one with the workspace now.
func (f *Fake) Diff(ctx context.Context, name, from, to string, opts session.DiffOptions) (session.Diff, error) {
	if err := f.enter(ctx, "Diff"); err != nil {
		return session.Diff{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	s, err := f.getLocked(name)
	if err != nil {
		return session.Diff{}, err
	}
	i, err := s.findCkpt(from)
	if err != nil {
		return session.Diff{}, err
	}
	newRoot := s.root
	if to != "" {
		j, err := s.findCkpt(to)
		if err != nil {
			return session.Diff{}, err
		}
		newRoot = s.ckpts[j].root
	} else if !session.Allowed(session.ActionFiles, s.info.State) {
		return session.Diff{}, invalidState(session.ActionFiles, s)
	}
	d, err := diffTrees(s.ckpts[i].root, newRoot, opts)
	d.Session, d.From, d.To = name, from, to
	return d, err
}

// runLocked finds a run with its starting point's checkpoint.
func (f *Fake) runLocked(runID string) (*session.Run, *fakeSession, int, error) {
	if err := session.ValidateRunID(runID); err != nil {
		return nil, nil, 0, err
	}
	r, ok := f.harnessLocked().runs[runID]
	if !ok {
		return nil, nil, 0, fmt.Errorf("run %q: %w", runID, session.ErrNotFound)
	}
	s, err := f.getLocked(r.Session)
	if err != nil {
		return nil, nil, 0, err
	}
	if r.Checkpoint == "" {
		return nil, nil, 0, session.NoStartingPoint(runID, "")
	}
	i, err := s.findCkpt(r.Checkpoint)
	if err != nil {
		return nil, nil, 0, session.NoStartingPoint(runID, r.Checkpoint)
	}
	return r, s, i, nil
}

// RunDiff compares a run's starting point with now.
func (f *Fake) RunDiff(ctx context.Context, runID string, opts session.DiffOptions) (session.Diff, error) {
	if err := f.enter(ctx, "RunDiff"); err != nil {
		return session.Diff{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	r, s, i, err := f.runLocked(runID)
	if err != nil {
		return session.Diff{}, err
	}
	if !session.Allowed(session.ActionFiles, s.info.State) {
		return session.Diff{}, invalidState(session.ActionFiles, s)
	}
	d, err := diffTrees(s.ckpts[i].root, s.root, opts)
	if err != nil {
		return d, err
	}
	d.Session, d.Run, d.From = s.info.Name, runID, r.Checkpoint
	if len(opts.Paths) == 0 {
		r.Changes = &session.RunChanges{Files: d.Files, Added: d.Added, Removed: d.Removed}
	}
	return d, nil
}

// UndoRun restores the run's starting point, whole or path by path.
func (f *Fake) UndoRun(ctx context.Context, runID string, paths []string) (session.UndoResult, error) {
	if err := f.enter(ctx, "UndoRun"); err != nil {
		return session.UndoResult{}, err
	}
	rels, err := session.CleanDiffPaths(paths)
	if err != nil {
		return session.UndoResult{}, err
	}
	f.mu.Lock()
	r, s, i, err := f.runLocked(runID)
	if err != nil {
		f.mu.Unlock()
		return session.UndoResult{}, err
	}
	if !session.Allowed(session.ActionUndo, s.info.State) {
		f.mu.Unlock()
		return session.UndoResult{}, invalidState(session.ActionUndo, s)
	}
	running := 0
	for _, id := range r.ExecIDs {
		if e := f.execs[id]; e != nil && !e.rec.State.Done() {
			running++
		}
	}
	if running > 0 {
		f.mu.Unlock()
		return session.UndoResult{}, session.RunBusy(runID, running)
	}
	res := session.UndoResult{Run: runID, Checkpoint: r.Checkpoint}
	if len(rels) == 0 {
		name, ck := s.info.Name, r.Checkpoint
		f.mu.Unlock()
		rr, err := f.Restore(ctx, name, ck)
		if err != nil {
			return res, err
		}
		res.Whole, res.Restore = true, &rr
		return res, nil
	}
	defer f.mu.Unlock()
	old := s.ckpts[i].root
	for _, rel := range rels {
		if rel == "" {
			return res, session.Invalid(session.FieldPath, "/workspace itself: name paths under it", "leave the paths out to undo the whole run")
		}
		dir, base := path.Split(rel)
		dir = strings.TrimSuffix(dir, "/")
		was := nodeAt(old, rel)
		parent, err := f.parentFor(s, dir, was != nil)
		if err != nil {
			return res, err
		}
		if was == nil {
			if parent != nil && parent.children[base] != nil {
				delete(parent.children, base)
				res.Removed = append(res.Removed, rel)
			}
			continue
		}
		parent.children[base] = cloneTree(was)
		res.Restored = append(res.Restored, rel)
	}
	f.publishLocked(ctx, s, session.Event{Kind: session.EventNote, Message: fmt.Sprintf("run %s undone for %d paths", runID, len(rels))})
	return res, nil
}

// parentFor finds directory dir of the live tree (nil when it is missing
// and need is false), making it (as the checkpoint had it) when need is
// set; a symlink on the way is refused, as the engine refuses it.
func (f *Fake) parentFor(s *fakeSession, dir string, need bool) (*node, error) {
	n := s.root
	for _, part := range splitPath(dir) {
		c := n.children[part]
		switch {
		case c == nil && !need:
			return nil, nil
		case c == nil:
			c = newDir(f.now())
			n.children[part] = c
		case c.isLink():
			e := session.OutsideWorkspace(dir)
			e.Msg = fmt.Sprintf("path %q runs through symlink %s: name the path it points to", dir, part)
			return nil, e
		case !c.dir:
			return nil, fmt.Errorf("%s: a parent is not a directory: %w", displayPath(dir), session.ErrInvalid)
		}
		n = c
	}
	return n, nil
}

// keepRun says whether a run keeps its starting point.
func keepRun(opts session.RunOptions, byDefault bool) bool {
	if opts.Keep == nil {
		return byDefault
	}
	return *opts.Keep
}

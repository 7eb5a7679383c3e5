package sessiontest

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/berthvm/berth/session"
)

// The fake's checkpoints are deep copies of the in-memory /workspace; a
// memory checkpoint also keeps the session's running state. Limits are
// the Manager's defaults.

type fakeCkpt struct {
	info session.Checkpoint
	root *node
	// The VM it was taken of, for a create from it.
	image     string
	cpus, mem int
	vmm       string
}

func cloneTree(n *node) *node {
	c := *n
	c.data = append([]byte(nil), n.data...)
	if n.children != nil {
		c.children = make(map[string]*node, len(n.children))
		for k, v := range n.children {
			c.children[k] = cloneTree(v)
		}
	}
	return &c
}

func treeBytes(n *node) int64 {
	b := int64(len(n.data))
	for _, c := range n.children {
		b += treeBytes(c)
	}
	return b
}

func (s *fakeSession) refreshCkptsLocked() {
	s.info.Checkpoints, s.info.CheckpointBytes = len(s.ckpts), 0
	for _, c := range s.ckpts {
		s.info.CheckpointBytes += c.info.Bytes
	}
}

// Checkpoint copies the session's workspace.
func (f *Fake) Checkpoint(ctx context.Context, name string, opts session.CheckpointOptions) (session.Checkpoint, error) {
	s, err := f.enterSession(ctx, "Checkpoint", name)
	if err != nil {
		return session.Checkpoint{}, err
	}
	defer f.mu.Unlock()
	return f.checkpointLocked(ctx, s, opts, false)
}

func (f *Fake) checkpointLocked(ctx context.Context, s *fakeSession, opts session.CheckpointOptions, auto bool) (session.Checkpoint, error) {
	c := fakeCkpt{root: cloneTree(s.root), image: s.info.Image, cpus: s.info.CPUs, mem: s.info.MemoryMiB, vmm: s.info.VMM}
	limN, limB := f.opts.CheckpointLimit, f.opts.CheckpointBytes
	if limN == 0 {
		limN = session.DefaultCheckpointLimit
	}
	if limB == 0 {
		limB = session.DefaultCheckpointBytes
	}
	if err := session.CheckCheckpoint(opts, session.CheckpointState{
		Name: s.info.Name, State: s.info.State, Count: len(s.ckpts), Bytes: s.info.CheckpointBytes,
		Estimate: treeBytes(c.root), Limit: limN, LimitBytes: limB,
	}); err != nil {
		return session.Checkpoint{}, err
	}
	s.ckptSeq++
	c.info = session.Checkpoint{
		ID: fmt.Sprintf("c%d", s.ckptSeq), Session: s.info.Name, Label: opts.Label, Auto: auto, CreatedAt: f.now(),
		Memory: opts.Memory, Bytes: treeBytes(c.root), Copy: "sparse copy", State: s.info.State, Took: time.Millisecond,
	}
	if s.info.State == session.StateRunning {
		c.info.Frozen = time.Millisecond
	}
	s.ckpts = append(s.ckpts, c)
	s.refreshCkptsLocked()
	f.publishLocked(ctx, s, session.Event{Kind: session.EventNote, Message: fmt.Sprintf("checkpoint %s taken: %s, %s on disk (%s)", c.info.ID, c.info.Holds(), session.FormatBytes(c.info.Bytes), c.info.Copy)})
	return c.info, nil
}

// Checkpoints lists the session's checkpoints.
func (f *Fake) Checkpoints(ctx context.Context, name string) ([]session.Checkpoint, error) {
	s, err := f.enterSession(ctx, "Checkpoints", name)
	if err != nil {
		return nil, err
	}
	defer f.mu.Unlock()
	out := make([]session.Checkpoint, 0, len(s.ckpts))
	for _, c := range s.ckpts {
		out = append(out, c.info)
	}
	return out, nil
}

func (s *fakeSession) findCkpt(id string) (int, error) {
	for i, c := range s.ckpts {
		if c.info.ID == id {
			return i, nil
		}
	}
	return -1, session.NoCheckpoint(s.info.Name, id)
}

// DeleteCheckpoint removes one checkpoint.
func (f *Fake) DeleteCheckpoint(ctx context.Context, name, id string) error {
	s, err := f.enterSession(ctx, "DeleteCheckpoint", name)
	if err != nil {
		return err
	}
	defer f.mu.Unlock()
	i, err := s.findCkpt(id)
	if err != nil {
		return err
	}
	s.ckpts = append(s.ckpts[:i], s.ckpts[i+1:]...)
	s.refreshCkptsLocked()
	f.publishLocked(ctx, s, session.Event{Kind: session.EventNote, Message: "checkpoint " + id + " removed"})
	return nil
}

// Restore takes an automatic checkpoint, ends the session's commands as a
// stop does, and puts the checkpoint's workspace back.
func (f *Fake) Restore(ctx context.Context, name, id string) (session.RestoreResult, error) {
	if err := f.enter(ctx, "Restore"); err != nil {
		return session.RestoreResult{}, err
	}
	f.mu.Lock()
	s, err := f.getLocked(name)
	if err != nil {
		f.mu.Unlock()
		return session.RestoreResult{}, err
	}
	if !session.Allowed(session.ActionRestore, s.info.State) {
		f.mu.Unlock()
		return session.RestoreResult{}, invalidState(session.ActionRestore, s)
	}
	i, err := s.findCkpt(id)
	if err != nil {
		f.mu.Unlock()
		return session.RestoreResult{}, err
	}
	res := session.RestoreResult{Restored: s.ckpts[i].info}
	auto, err := f.checkpointLocked(ctx, s, session.CheckpointOptions{Label: "auto: before restore to " + id}, true)
	if err != nil {
		f.mu.Unlock()
		return res, fmt.Errorf("restore %s to %s: the automatic checkpoint of its current state failed, nothing was changed: %w", name, id, err)
	}
	res.Auto = auto
	f.setStateLocked(ctx, s, session.StateStopping, causeBy(ctx, "restore requested"))
	running := f.endExecsLocked(s, errStopped)
	f.mu.Unlock()
	waitExecs(running)
	f.mu.Lock()
	defer f.mu.Unlock()
	i, _ = s.findCkpt(id)
	s.root = cloneTree(s.ckpts[i].root)
	s.info.DirtyBytes = 0
	f.setStateLocked(ctx, s, session.StateStopped, causeBy(ctx, "restored to checkpoint "+id))
	f.bootLocked(ctx, s, causeBy(ctx, "restored to checkpoint "+id))
	res.Session = s.info
	return res, nil
}

// Fork copies a running or sleeping session into newName, which runs.
func (f *Fake) Fork(ctx context.Context, name, newName string) (session.ForkResult, error) {
	if err := f.enter(ctx, "Fork"); err != nil {
		return session.ForkResult{}, err
	}
	if err := session.ValidateName(newName); err != nil {
		return session.ForkResult{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	src, err := f.getLocked(name)
	if err != nil {
		return session.ForkResult{}, err
	}
	if !session.Allowed(session.ActionFork, src.info.State) {
		return session.ForkResult{}, invalidState(session.ActionFork, src)
	}
	if _, ok := f.sessions[newName]; ok {
		return session.ForkResult{}, fmt.Errorf("session %q: %w", newName, session.ErrExists)
	}
	now := f.now()
	info := src.info
	info.Name, info.State, info.CreatedAt, info.LastActivity = newName, session.StateCreating, now, now
	info.Running, info.Checkpoints, info.CheckpointBytes = 0, 0, 0
	s := &fakeSession{info: info, root: cloneTree(src.root)}
	f.sessions[newName] = s
	f.publishLocked(ctx, s, session.Event{Kind: session.EventState})
	f.publishLocked(ctx, s, session.Event{Kind: session.EventNote, Message: "forked from " + name})
	f.bootLocked(ctx, s, causeBy(ctx, "forked from "+name))
	f.publishLocked(ctx, src, session.Event{Kind: session.EventNote, Message: "forked into " + newName})
	// The fork keeps the source's schedules, with ids of its own.
	h := f.harnessLocked()
	for _, sc := range h.scheds[name] {
		h.seq++
		sc.ID, sc.Session, sc.Created = fmt.Sprintf("c%08x", h.seq), newName, now
		sc.Argv = slices.Clone(sc.Argv)
		h.scheds[newName] = append(h.scheds[newName], sc)
	}
	return session.ForkResult{Session: s.info, Source: name, Copy: "sparse copy", Frozen: time.Millisecond, Took: time.Millisecond}, nil
}

// createFrom is Create with opts.From: a new session on a copy of the
// checkpoint's workspace, by the contract's rules, as the Manager does.
func (f *Fake) createFrom(ctx context.Context, opts session.CreateOptions) (session.Session, error) {
	ref, err := session.CheckCreateFrom(opts)
	if err != nil {
		return session.Session{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	src, err := f.getLocked(ref.Session)
	if err != nil {
		return session.Session{}, session.NoSourceSession(ref)
	}
	list := make([]session.Checkpoint, len(src.ckpts))
	for i, c := range src.ckpts {
		list[i] = c.info
	}
	picked, err := session.PickCheckpoint(ref, list)
	if err != nil {
		return session.Session{}, err
	}
	i, _ := src.findCkpt(picked.ID)
	ck := src.ckpts[i]
	ref.ID = ck.info.ID
	if !slices.Contains(f.opts.Images, ck.image) {
		return session.Session{}, session.SourceImageGone(ref, ck.info, ck.image, "", nil)
	}
	opts, err = opts.FromSource(session.CreateSource{Checkpoint: ck.info, CPUs: ck.cpus, MemoryMiB: ck.mem, VMM: ck.vmm,
		Net: src.info.Net, IdleTimeout: &src.info.IdleTimeout}, f.opts.Limits)
	if err != nil {
		return session.Session{}, err
	}
	if _, ok := f.sessions[opts.Name]; ok {
		return session.Session{}, fmt.Errorf("session %q: %w", opts.Name, session.ErrExists)
	}
	now := f.now()
	info := src.info
	info.Name, info.State, info.Cause, info.CreatedAt, info.LastActivity = opts.Name, session.StateCreating, "", now, now
	info.CPUs, info.MemoryMiB, info.VMM, info.Image, info.Net = opts.CPUs, opts.MemoryMiB, opts.VMM, ck.image, opts.Net
	if opts.IdleTimeout != nil {
		info.IdleTimeout = *opts.IdleTimeout
	}
	info.Running, info.Checkpoints, info.CheckpointBytes, info.DirtyBytes = 0, 0, 0, 0
	s := &fakeSession{info: info, root: cloneTree(ck.root)}
	f.sessions[opts.Name] = s
	f.publishLocked(ctx, s, session.Event{Kind: session.EventState})
	f.publishLocked(ctx, s, session.Event{Kind: session.EventNote, Message: "created from checkpoint " + ref.String()})
	f.bootLocked(ctx, s, causeBy(ctx, "created from checkpoint "+ref.String()))
	f.publishLocked(ctx, src, session.Event{Kind: session.EventNote, Message: "checkpoint " + ck.info.ID + " copied into new session " + opts.Name})
	return s.info, nil
}

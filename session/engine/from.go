package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/store"
)

// Creates from checkpoints. A session made from a checkpoint of another
// gets copies of the checkpoint's disks (reflinks where the data
// directory's filesystem has them, else sparse copies, as a fork's and a
// restore's are) and then the identity a fork gets: its own hostname,
// machine id, boot id, RNG state and filesystem UUIDs, set by its agent
// once it runs. A checkpoint with memory is restored into the new VM as a
// fork's snapshot is, so its processes go on; one without boots the
// copied disks as a start does (from the image's template where it can).
//
// The checkpoint is only read. The source's lifecycle lock is held while
// it is copied, so neither it nor its session can be removed under the
// copy, and released before the new session boots: a slow boot holds up
// nothing of the source's.

// createFrom is Create with opts.From set.
func (m *Manager) createFrom(ctx context.Context, opts session.CreateOptions) (session.Session, error) {
	ref, err := session.CheckCreateFrom(opts)
	if err != nil {
		return session.Session{}, err
	}
	src, err := m.get(ref.Session)
	if err != nil {
		if errors.Is(err, session.ErrNotFound) {
			return session.Session{}, session.NoSourceSession(ref)
		}
		return session.Session{}, err
	}
	start := time.Now()
	src.op.Lock()
	srcHeld := true
	releaseSrc := func() {
		if srcHeld {
			srcHeld = false
			src.op.Unlock()
		}
	}
	defer releaseSrc()
	ck, err := src.pickCheckpoint(ref)
	if err != nil {
		return session.Session{}, err
	}
	ref.ID = ck.ID
	if ck.Memory && ck.WorkspaceOnly {
		// Its memory ran on a system disk it does not hold.
		return session.Session{}, &session.Error{Class: session.ErrInvalid, Field: session.FieldFrom,
			Msg:  fmt.Sprintf("checkpoint %s keeps memory but not the system disk it ran on", ref),
			Hint: "create from a checkpoint taken with the system disk"}
	}
	if _, err := m.resolveImage(ctx, ck.Image, ck.ImageDigest); err != nil {
		if errors.Is(err, session.ErrNotFound) {
			return session.Session{}, session.SourceImageGone(ref, ck.Checkpoint, ck.Image, ck.ImageDigest, err)
		}
		return session.Session{}, err
	}
	src.mu.Lock()
	srec := src.rec
	src.mu.Unlock()
	cs := session.CreateSource{Checkpoint: ck.Checkpoint, CPUs: ck.CPUs, MemoryMiB: ck.MemoryMiB, VMM: ck.VMM, Net: srec.Net, IdleTimeout: srec.IdleTimeout}
	if cs.CPUs == 0 || cs.MemoryMiB == 0 || cs.VMM == "" {
		// Taken before checkpoints kept their VM's size: sessions are
		// never resized, so the session's is the checkpoint's.
		cs.CPUs, cs.MemoryMiB, cs.VMM = srec.CPUs, srec.MemoryMiB, srec.VMM
	}
	if opts, err = opts.FromSource(cs, m.limits()); err != nil {
		return session.Session{}, err
	}
	if _, err := m.driver(opts.VMM); err != nil {
		return session.Session{}, err
	}
	what := "create session " + opts.Name + " from checkpoint " + ref.String()
	if err := m.checkFloor(what); err != nil {
		return session.Session{}, err
	}
	rec := store.Session{
		Name: opts.Name, State: string(session.StateCreating), Cause: "created from checkpoint " + ref.String(),
		Image: ck.Image, ImageDigest: ck.ImageDigest, VMM: opts.VMM,
		CPUs: opts.CPUs, MemoryMiB: opts.MemoryMiB, DiskBytes: ck.DiskBytes, CreatedAt: start, LastActivity: start,
		Retention: m.cfg.Defaults.Retention, Net: opts.Net,
		// The checkpoint's UUIDs find its disks at the first boot; the
		// agent gives them new ones at once (newIdentity).
		WorkspaceUUID: ck.WorkspaceUUID, MachineID: randomMachineID(),
		NICMAC: guest.NewNICMAC(),
	}
	if ck.System {
		rec.SystemUUID, rec.SystemBytes = ck.SystemUUID, ck.SystemBytes
	}
	if opts.IdleTimeout != nil {
		t := *opts.IdleTimeout
		rec.IdleTimeout = &t
	}
	s, err := m.claim(rec)
	if err != nil {
		return session.Session{}, err
	}
	defer s.op.Unlock()

	by := session.Actor(ctx)
	var steps []any
	step := func(name string) { steps = append(steps, name, time.Since(start).Round(time.Millisecond)) }
	defer func() {
		m.log.Info("create from checkpoint", append([]any{"session", opts.Name, "from", ref.String()}, steps...)...)
	}()
	// synced, once set, yields the result of syncing the disk copies,
	// which runs while the new VM starts.
	var synced chan error
	fail := func(err error) (session.Session, error) {
		releaseSrc()
		if synced != nil {
			<-synced
		}
		s.mu.Lock()
		s.intended = true
		vm := s.vm
		s.mu.Unlock()
		if vm != nil {
			vm.Kill(context.Background())
		}
		m.removeSession(s, "")
		return session.Session{}, err
	}
	if err := s.setState(session.StateCreating, "create from checkpoint "+ref.String()+" requested", by); err != nil {
		return fail(err)
	}
	if err := os.MkdirAll(s.vmDir(), 0o755); err != nil {
		return fail(fmt.Errorf("create session directory: %w", err))
	}
	dir := src.ckptDir(ck.ID)
	disks := [][2]string{{filepath.Join(dir, ckptWorkspace), s.wsPath()}}
	if ck.System {
		disks = append(disks, [2]string{filepath.Join(dir, ckptSystem), s.sysPath()})
	}
	pairs := disks
	if ck.Memory {
		if err := os.MkdirAll(s.snapshotDir(), 0o755); err != nil {
			return fail(err)
		}
		// The restore only reads the memory snapshot (QEMU takes it as
		// its incoming migration) and a checkpoint never changes, so a
		// hard link stands in for a copy; it is removed before the
		// session runs, so nothing of the session's ever writes through
		// it. Where it cannot be linked (a snapshot directory), it is
		// copied.
		mem := filepath.Join(dir, ckptMemory)
		if err := os.Link(mem, s.snapshotPath()); err != nil {
			pairs = append(pairs[:len(pairs):len(pairs)], [2]string{mem, s.snapshotPath()})
		}
	}
	dc := m.copier()
	dc.NoSync = true
	if err := dc.CopyAll(ctx, what, pairs); err != nil {
		return fail(err)
	}
	releaseSrc()
	if ck.WorkspaceOnly {
		// A run's starting point keeps the workspace only: the new
		// session gets a fresh system disk on the image, as replace
		// gives one, sized as the source's.
		if err := s.newSystem(ctx, ck.Image, srec.SystemBytes); err != nil {
			return fail(fmt.Errorf("%s: a fresh system disk (the checkpoint holds the workspace only): %w", what, err))
		}
		disks = append(disks, [2]string{"", s.sysPath()})
	}
	step("copied")
	m.crash("from:copied")
	synced = make(chan error, 1)
	go func() {
		var err error
		for _, p := range disks {
			if _, serr := syncFile(p[1]); serr != nil && err == nil {
				err = fmt.Errorf("sync the copy of %s: %w", filepath.Base(p[1]), serr)
			}
		}
		synced <- err
	}()

	var how string
	var id forkIdentity
	if ck.Memory {
		s.mu.Lock()
		s.rec.SnapshotPath, s.rec.Accel = s.snapshotPath(), ck.Accel
		s.mu.Unlock()
		if err := s.restore(ctx); err != nil {
			return fail(fmt.Errorf("%s: restore its memory into a new VM: %w", what, err))
		}
		step("restored")
		if id, err = s.afterFork(ctx, step); err != nil {
			return fail(fmt.Errorf("%s: %w", what, err))
		}
		os.RemoveAll(s.snapshotDir())
		s.mu.Lock()
		s.rec.SnapshotPath = ""
		s.mu.Unlock()
		how = "its memory resumed"
	} else {
		if how, err = s.bootNew(ctx, by); err != nil {
			return fail(err)
		}
		step("booted")
		if id, err = s.newIdentity(ctx, step); err != nil {
			return fail(fmt.Errorf("%s: %w", what, err))
		}
	}
	step("identity")
	m.crash("from:identity")
	err = <-synced
	synced = nil
	step("synced")
	if err != nil {
		return fail(err)
	}
	took := time.Since(start)
	msg := fmt.Sprintf("created from checkpoint %s of %s (%s, taken %s)", ck.ID, ref.Session, ck.Holds(), ck.CreatedAt.Format(time.RFC3339))
	if ck.Memory {
		msg += fmt.Sprintf("; %d commands running then go on here as processes, unrecorded", id.Inherited)
	}
	m.event(session.Event{Kind: session.EventNote, Name: opts.Name, By: by, Message: msg})
	if len(id.Errors) > 0 {
		m.event(session.Event{Kind: session.EventNote, Name: opts.Name, By: by, Message: "identity: " + strings.Join(id.Errors, "; ")})
	}
	cause := fmt.Sprintf("created from checkpoint %s in %s (%s; %s)", ref, took.Round(time.Millisecond), dc.How, how)
	if err := s.setState(session.StateRunning, cause, by); err != nil {
		return fail(err)
	}
	m.event(session.Event{Kind: session.EventNote, Name: ref.Session, By: by, Message: fmt.Sprintf("checkpoint %s copied into new session %s", ck.ID, opts.Name)})
	m.cfg.Observer.Created(took)
	return s.snapshot(), nil
}

// pickCheckpoint finds the checkpoint ref names among the session's, as
// the contract picks it. The caller holds s.op, so it stays.
func (s *sess) pickCheckpoint(ref session.CheckpointRef) (ckptMeta, error) {
	metas := s.loadCheckpoints()
	list := make([]session.Checkpoint, len(metas))
	for i, c := range metas {
		list[i] = c.Checkpoint
	}
	ck, err := session.PickCheckpoint(ref, list)
	if err != nil {
		return ckptMeta{}, err
	}
	for _, c := range metas {
		if c.ID == ck.ID {
			return c, nil
		}
	}
	return ckptMeta{}, session.NoCheckpoint(s.name, ck.ID) // not reached: ck is one of metas
}

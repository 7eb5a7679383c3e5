package engine

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/engine/diskcopy"
	"github.com/berthvm/berth/vmm"
)

// Checkpoints. A checkpoint is a byte-exact copy of a session's disks
// (workspace, and system disk where it has one), taken with the guest's
// filesystems flushed and frozen, and optionally a memory snapshot taken
// in the same freeze, so a restore resumes its processes too. The copies
// are reflinks where the data directory's filesystem has them, else
// sparse copies (diskcopy.go).
//
// On disk: sessions/<name>/checkpoints/<id>/ holds meta.json and the
// copies. A checkpoint is built in a dot-directory and renamed into place
// only when every file and the metadata are synced, so a daemon killed
// mid-way leaves no half-made checkpoint listed (the dot-directory is
// removed at the next start).

// ckptMeta is meta.json: the public record and what a restore needs.
type ckptMeta struct {
	session.Checkpoint
	Image         string `json:"image"`
	ImageDigest   string `json:"image_digest,omitempty"`
	WorkspaceUUID string `json:"workspace_uuid"`
	SystemUUID    string `json:"system_uuid,omitempty"`
	SystemBytes   int64  `json:"system_bytes,omitempty"`
	DiskBytes     int64  `json:"disk_bytes"`
	MachineID     string `json:"machine_id,omitempty"`
	Accel         string `json:"accel,omitempty"`
	// WorkspaceOnly: the session had a system disk that this checkpoint
	// left out (a run's starting point without System); a restore keeps
	// the system disk the session has then.
	WorkspaceOnly bool `json:"workspace_only,omitempty"`
	// The VM the checkpoint was taken of, which a create from a memory
	// checkpoint resumes (0 and "": taken before they were kept; the
	// session's own then, as sessions are never resized).
	CPUs      int    `json:"cpus,omitempty"`
	MemoryMiB int    `json:"memory_mib,omitempty"`
	VMM       string `json:"vmm,omitempty"`
}

// ckptFor says what a checkpoint is taken for beyond its options.
type ckptFor struct {
	auto bool   // by a restore, of the state it leaves
	run  string // the run whose starting point it is
	// noSystem leaves the system disk out.
	noSystem bool
}

const (
	ckptWorkspace = "workspace.img"
	ckptSystem    = "system.img"
	ckptMemory    = "memory.snap"
	ckptMetaFile  = "meta.json"
)

func (s *sess) ckptRoot() string         { return filepath.Join(s.dir(), "checkpoints") }
func (s *sess) ckptDir(id string) string { return filepath.Join(s.ckptRoot(), id) }

// validCkptID: ids are made here ("c" and a number); anything else is
// refused before it reaches a path.
func validCkptID(id string) bool {
	n, ok := strings.CutPrefix(id, "c")
	if !ok || n == "" || len(n) > 9 {
		return false
	}
	_, err := strconv.ParseUint(n, 10, 32)
	return err == nil && n[0] != '0'
}

// loadCheckpoints reads the session's checkpoints, oldest first; half-made
// ones (dot-directories) are skipped.
func (s *sess) loadCheckpoints() []ckptMeta {
	ents, err := os.ReadDir(s.ckptRoot())
	if err != nil {
		return nil
	}
	var out []ckptMeta
	for _, e := range ents {
		if !e.IsDir() || !validCkptID(e.Name()) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(s.ckptRoot(), e.Name(), ckptMetaFile))
		if err != nil {
			continue
		}
		var cm ckptMeta
		if json.Unmarshal(b, &cm) != nil || cm.ID != e.Name() {
			continue
		}
		out = append(out, cm)
	}
	sort.Slice(out, func(i, j int) bool { return ckptNum(out[i].ID) < ckptNum(out[j].ID) })
	return out
}

func ckptNum(id string) uint64 {
	n, _ := strconv.ParseUint(strings.TrimPrefix(id, "c"), 10, 32)
	return n
}

// ckptTotals are the figures info shows.
type ckptTotals struct {
	n     int
	bytes int64
}

// refreshCheckpoints recounts the session's checkpoints for info.
func (s *sess) refreshCheckpoints() {
	var t ckptTotals
	for _, c := range s.loadCheckpoints() {
		t.n++
		t.bytes += c.Bytes
	}
	s.mu.Lock()
	s.ckpt = t
	s.mu.Unlock()
}

func (s *sess) findCheckpoint(id string) (ckptMeta, error) {
	if validCkptID(id) {
		for _, c := range s.loadCheckpoints() {
			if c.ID == id {
				return c, nil
			}
		}
	}
	return ckptMeta{}, session.NoCheckpoint(s.name, id)
}

// cleanCheckpoints removes half-made checkpoints an earlier daemon left.
func (s *sess) cleanCheckpoints() {
	ents, _ := os.ReadDir(s.ckptRoot())
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			os.RemoveAll(filepath.Join(s.ckptRoot(), e.Name()))
		}
	}
}

func (m *Manager) checkpointLimits() (int, int64) {
	n, b := m.cfg.CheckpointLimit, m.cfg.CheckpointBytes
	if n == 0 {
		n = session.DefaultCheckpointLimit
	}
	if b == 0 {
		b = session.DefaultCheckpointBytes
	}
	return n, b
}

// Checkpoint saves the session's disks, and with opts.Memory its memory.
func (m *Manager) Checkpoint(ctx context.Context, name string, opts session.CheckpointOptions) (session.Checkpoint, error) {
	var out session.Checkpoint
	if err := session.ValidateLabel(opts.Label); err != nil {
		return out, err
	}
	_, err := m.lifecycle(ctx, name, session.ActionCheckpoint, func(s *sess) error {
		var err error
		out, err = s.checkpoint(ctx, session.Actor(ctx), opts, ckptFor{})
		return err
	})
	return out, err
}

// checkpoint takes a checkpoint; the caller holds s.op.
func (s *sess) checkpoint(ctx context.Context, by string, opts session.CheckpointOptions, why ckptFor) (session.Checkpoint, error) {
	m := s.m
	start := time.Now()
	st := s.state()
	if opts.Memory && st != session.StateRunning && st != session.StateSleeping {
		// Checked again with the limits below; this one costs no copy.
		return session.Checkpoint{}, session.CheckCheckpoint(opts, session.CheckpointState{Name: s.name, State: st})
	}
	if err := m.checkFloor("checkpoint session " + s.name); err != nil {
		return session.Checkpoint{}, err
	}
	s.mu.Lock()
	rec := s.rec
	s.mu.Unlock()
	existing := s.loadCheckpoints()
	limN, limB := m.checkpointLimits()
	var used int64
	next := uint64(1)
	for _, c := range existing {
		used += c.Bytes
		next = max(next, ckptNum(c.ID)+1)
	}
	pairs := [][2]string{{s.wsPath(), ckptWorkspace}}
	withSystem := rec.SystemUUID != "" && !why.noSystem
	if withSystem {
		pairs = append(pairs, [2]string{s.sysPath(), ckptSystem})
	}
	var est int64
	for _, p := range pairs {
		est += diskcopy.Allocated(p[0])
	}
	if opts.Memory {
		est += int64(rec.MemoryMiB) << 20
	}
	cs := session.CheckpointState{Name: s.name, State: st, Count: len(existing), Bytes: used, Estimate: est, Limit: limN, LimitBytes: limB}
	if err := session.CheckCheckpoint(opts, cs); err != nil {
		return session.Checkpoint{}, err
	}
	id := "c" + strconv.FormatUint(next, 10)
	if err := os.MkdirAll(s.ckptRoot(), 0o755); err != nil {
		return session.Checkpoint{}, err
	}
	tmp, err := os.MkdirTemp(s.ckptRoot(), "."+id+"-")
	if err != nil {
		return session.Checkpoint{}, err
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(tmp)
		}
	}()
	for i := range pairs {
		pairs[i][1] = filepath.Join(tmp, pairs[i][1])
	}
	var memPath string
	if opts.Memory {
		memPath = filepath.Join(tmp, ckptMemory)
	}
	dc := m.copier()
	what := "checkpoint session " + s.name
	var frozen time.Duration
	switch st {
	case session.StateRunning:
		frozen, err = s.frozenCopy(ctx, by, "checkpoint", dc, what, pairs, memPath)
	case session.StateSleeping:
		if memPath != "" {
			pairs = append(pairs, [2]string{rec.SnapshotPath, memPath})
			copyNICMark(rec.SnapshotPath, memPath)
		}
		err = dc.CopyAll(ctx, what, pairs)
	default: // stopped or crashed: nothing writes to the disks
		err = dc.CopyAll(ctx, what, pairs)
	}
	if err == nil && memPath != "" && st == session.StateRunning {
		_, err = syncFile(memPath) // after the VM runs again
	}
	if err != nil {
		return session.Checkpoint{}, err
	}
	m.crash("checkpoint:copied")
	cm := ckptMeta{
		Checkpoint: session.Checkpoint{
			ID: id, Session: s.name, Label: opts.Label, Auto: why.auto, Run: why.run, CreatedAt: start,
			System: withSystem, Memory: opts.Memory, Copy: dc.How.String(), Frozen: frozen, State: st,
		},
		Image: rec.Image, ImageDigest: rec.ImageDigest, WorkspaceUUID: rec.WorkspaceUUID,
		SystemUUID: rec.SystemUUID, SystemBytes: rec.SystemBytes, DiskBytes: rec.DiskBytes,
		MachineID: rec.MachineID, Accel: rec.Accel, WorkspaceOnly: rec.SystemUUID != "" && !withSystem,
		CPUs: rec.CPUs, MemoryMiB: rec.MemoryMiB, VMM: rec.VMM,
	}
	for _, p := range pairs {
		cm.Bytes += diskcopy.Allocated(p[1])
	}
	if memPath != "" && st == session.StateRunning {
		cm.Bytes += diskcopy.Allocated(memPath)
	}
	cm.Took = time.Since(start)
	b, _ := json.MarshalIndent(cm, "", "  ")
	if err := writeSynced(filepath.Join(tmp, ckptMetaFile), b); err != nil {
		return session.Checkpoint{}, fmt.Errorf("write checkpoint metadata: %w", err)
	}
	if err := syncDir(tmp); err != nil {
		return session.Checkpoint{}, err
	}
	m.crash("checkpoint:synced")
	if err := os.Rename(tmp, s.ckptDir(id)); err != nil {
		return session.Checkpoint{}, fmt.Errorf("checkpoint %s: %w", id, err)
	}
	ok = true
	syncDir(s.ckptRoot())
	s.refreshCheckpoints()
	m.crash("checkpoint:renamed")
	msg := fmt.Sprintf("checkpoint %s taken: %s, %s on disk (%s)", id, cm.Holds(), session.FormatBytes(cm.Bytes), cm.Copy)
	if opts.Label != "" {
		msg += " «" + opts.Label + "»"
	}
	if frozen > 0 {
		msg += fmt.Sprintf("; commands frozen for %s", frozen.Round(time.Millisecond))
	}
	m.event(session.Event{Kind: session.EventNote, Name: s.name, By: by, Message: msg})
	return cm.Checkpoint, nil
}

// frozenCopy copies a running session's disks (pairs) with its
// filesystems flushed and frozen and, when memPath is set, its VM paused
// and its memory saved there; then lets it go on. It returns how long the
// session was held. what names the operation for a refusal; step for
// crash points and the timeline.
func (s *sess) frozenCopy(ctx context.Context, by, step string, dc *diskcopy.Copier, what string, pairs [][2]string, memPath string) (time.Duration, error) {
	m := s.m
	vm, err := s.currentVM()
	if err != nil {
		return 0, err
	}
	var snap vmm.Snapshotter
	if memPath != "" {
		var ok bool
		if snap, ok = vm.(vmm.Snapshotter); !ok {
			return 0, fmt.Errorf("the %s driver cannot snapshot VMs: %w", s.rec.VMM, session.ErrInvalid)
		}
	}
	if snap != nil {
		// The memory snapshot is written by the VMM, never reflinked.
		s.mu.Lock()
		mem := int64(s.rec.MemoryMiB) << 20
		s.mu.Unlock()
		if err := m.checkRoom(what+" (its memory snapshot)", mem); err != nil {
			return 0, err
		}
	}
	c, err := s.connectedAgent()
	if err != nil {
		return 0, err
	}
	fctx, cancel := context.WithTimeout(ctx, time.Minute)
	_, err = c.Freeze(fctx)
	cancel()
	start := time.Now()
	paused := false
	// copied yields the disk copy's result; the copy runs while the
	// memory is saved, and the filesystems stay frozen until it is done.
	var copied chan error
	waitCopy := func() error {
		if copied == nil {
			return nil
		}
		err := <-copied
		copied = nil
		return err
	}
	release := func() {
		if paused {
			// Bounded, as the thaw is: a wedged QEMU must not keep the
			// session's lifecycle lock forever.
			rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			vm.Resume(rctx)
			cancel()
			paused = false
		}
		tctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		c.Thaw(tctx)
		cancel()
	}
	cctx, stopCopy := context.WithCancel(ctx)
	defer stopCopy()
	fail := func(doing string, cause error) (time.Duration, error) {
		stopCopy()
		waitCopy()
		release()
		m.event(session.Event{Kind: session.EventNote, Name: s.name, By: by, Message: fmt.Sprintf("%s abandoned while %s: %v; the session keeps running", step, doing, cause)})
		return 0, fmt.Errorf("%s %q: %s: %w", step, s.name, doing, hostFull(cause))
	}
	if err != nil {
		return fail("flushing and freezing its filesystems", agentErr(s.name, err))
	}
	m.crash(step + ":frozen")
	// A frozen filesystem writes nothing to its disk (the freeze waited
	// for writeback; new writers, page faults and ext4's lazy init block),
	// so the disks are copied while the VM runs on, and the VM is paused
	// only to save its memory, which then matches the copied disks.
	copied = make(chan error, 1)
	go func() { copied <- dc.CopyAll(cctx, what, pairs) }()
	if snap != nil {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := vm.Pause(pctx)
		cancel()
		if err != nil {
			return fail("pausing", err)
		}
		paused = true
		sctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		err = snap.Snapshot(sctx, memPath)
		cancel()
		if err != nil {
			return fail("saving memory", err)
		}
		markNIC(vm, memPath)
		m.crash(step + ":saved")
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = vm.Resume(rctx) // still frozen: its disks do not change
		cancel()
		if err != nil {
			return fail("resuming after the memory save", err)
		}
		paused = false
	}
	if err := waitCopy(); err != nil {
		return fail("copying the disks", err)
	}
	m.crash(step + ":copied-frozen")
	frozen := time.Since(start)
	release()
	return frozen, nil
}

func writeSynced(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Checkpoints lists a session's checkpoints, oldest first.
func (m *Manager) Checkpoints(ctx context.Context, name string) ([]session.Checkpoint, error) {
	s, err := m.get(name)
	if err != nil {
		return nil, err
	}
	list := s.loadCheckpoints()
	out := make([]session.Checkpoint, 0, len(list))
	for _, c := range list {
		out = append(out, c.Checkpoint)
	}
	return out, nil
}

// DeleteCheckpoint removes one checkpoint.
func (m *Manager) DeleteCheckpoint(ctx context.Context, name, id string) error {
	s, err := m.get(name)
	if err != nil {
		return err
	}
	s.op.Lock()
	defer s.op.Unlock()
	c, err := s.findCheckpoint(id)
	if err != nil {
		return err
	}
	if err := s.removeCheckpoint(id); err != nil {
		return err
	}
	if c.Run != "" {
		m.untrackRun(s, c.Run) // nothing left to compare its record with
	}
	m.event(session.Event{Kind: session.EventNote, Name: name, By: session.Actor(ctx), Message: fmt.Sprintf("checkpoint %s removed (%s freed)", id, session.FormatBytes(c.Bytes))})
	return nil
}

// restoreIntent is sessions/<name>/restore.json: written before the
// session's disks are swapped for a checkpoint's, removed once the record
// says so. A daemon that finds it finishes the restore (the session stays
// stopped).
const restoreIntent = "restore.json"

// Restore puts the session back on a checkpoint.
func (m *Manager) Restore(ctx context.Context, name, id string) (session.RestoreResult, error) {
	var res session.RestoreResult
	snap, err := m.lifecycle(ctx, name, session.ActionRestore, func(s *sess) error {
		by := session.Actor(ctx)
		ck, err := s.findCheckpoint(id)
		if err != nil {
			return err
		}
		// What the checkpoint runs on must still exist before anything
		// is stopped (a workspace alone runs on the session's image).
		if !ck.WorkspaceOnly {
			if _, err := m.resolveImage(ctx, ck.Image, ck.ImageDigest); err != nil {
				return fmt.Errorf("checkpoint %s needs image %s@%s: %w", id, ck.Image, orDash(ck.ImageDigest), err)
			}
		}
		res.Restored = ck.Checkpoint
		auto, err := s.checkpoint(ctx, by, session.CheckpointOptions{Label: "auto: before restore to " + id}, ckptFor{auto: true})
		if err != nil {
			return fmt.Errorf("restore %s to %s: the automatic checkpoint of its current state failed, nothing was changed: %w", name, id, err)
		}
		res.Auto = auto
		m.crash("restore:auto")
		if err := s.stopVM(ctx, by, "restore"); err != nil {
			return err
		}
		m.crash("restore:stopped")
		if err := s.swapIn(ctx, ck); err != nil {
			return err
		}
		m.event(session.Event{Kind: session.EventNote, Name: name, By: by, Message: fmt.Sprintf("restored to checkpoint %s (%s, taken %s); the state before is checkpoint %s",
			id, ck.Holds(), ck.CreatedAt.Format(time.RFC3339), auto.ID)})
		if ck.Memory {
			if err := s.setState(session.StateSleeping, "restored to checkpoint "+id+": resuming its memory", by); err != nil {
				return err
			}
			return s.wake(ctx, by)
		}
		how, err := s.bootNew(ctx, by)
		if err != nil {
			return err
		}
		m.crash("restore:booted") // a VM runs; the record still says stopped
		return s.setState(session.StateRunning, "restored to checkpoint "+id+": "+how, by)
	})
	res.Session = snap
	return res, err
}

// swapIn replaces the (stopped) session's disks with copies of the
// checkpoint's and records what they are. The caller holds s.op.
func (s *sess) swapIn(ctx context.Context, ck ckptMeta) error {
	m := s.m
	b, _ := json.Marshal(ck)
	if err := writeSynced(filepath.Join(s.dir(), restoreIntent), b); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	syncDir(s.dir())
	dir := s.ckptDir(ck.ID)
	pairs := [][2]string{{filepath.Join(dir, ckptWorkspace), s.wsPath() + ".restore"}}
	if ck.System {
		pairs = append(pairs, [2]string{filepath.Join(dir, ckptSystem), s.sysPath() + ".restore"})
	}
	snapPath := ""
	if ck.Memory {
		os.MkdirAll(s.snapshotDir(), 0o755)
		snapPath = s.snapshotPath()
		pairs = append(pairs, [2]string{filepath.Join(dir, ckptMemory), snapPath + ".restore"})
	}
	for _, p := range pairs {
		os.Remove(p[1])
	}
	dc := m.copier()
	if err := dc.CopyAll(ctx, "restore session "+s.name+" to checkpoint "+ck.ID, pairs); err != nil {
		os.Remove(filepath.Join(s.dir(), restoreIntent))
		return err
	}
	m.crash("restore:copied")
	for _, p := range pairs {
		if err := os.Rename(p[1], strings.TrimSuffix(p[1], ".restore")); err != nil {
			return fmt.Errorf("restore: %w", err)
		}
	}
	syncDir(s.dir())
	if ck.Memory {
		copyNICMark(filepath.Join(dir, ckptMemory), snapPath)
		syncDir(s.snapshotDir())
	}
	m.crash("restore:swapped")
	s.mu.Lock()
	s.rec.WorkspaceUUID = ck.WorkspaceUUID
	if !ck.WorkspaceOnly {
		// The system disk came back with the workspace, and with it the
		// image it was made from.
		s.rec.Image, s.rec.ImageDigest = ck.Image, ck.ImageDigest
		s.rec.SystemUUID, s.rec.SystemBytes = ck.SystemUUID, ck.SystemBytes
	}
	s.rec.DiskBytes = ck.DiskBytes
	// The figure measured was the replaced workspace's: the next boot
	// measures this one.
	s.rec.WorkspaceUsed, s.rec.WorkspaceMeasuredAt = 0, time.Time{}
	if ck.MachineID != "" {
		s.rec.MachineID = ck.MachineID
	}
	s.rec.SnapshotPath, s.rec.SnapshotBytes = "", 0
	if ck.Memory {
		s.rec.SnapshotPath, s.rec.SnapshotBytes, s.rec.Accel = snapPath, diskcopy.Allocated(snapPath), ck.Accel
	}
	s.mu.Unlock()
	if !ck.System && !ck.WorkspaceOnly {
		os.Remove(s.sysPath()) // not under mu: a file system call can wait
	}
	if err := s.setState(session.StateStopped, "restored to checkpoint "+ck.ID, ""); err != nil {
		return err
	}
	os.Remove(filepath.Join(s.dir(), restoreIntent))
	return nil
}

// recoverRestore finishes a restore an earlier daemon was killed in: the
// disks are put on the checkpoint's (again, as copies), and the session
// is left stopped. Called from recover with the session stopped.
func (s *sess) recoverRestore(ctx context.Context) {
	b, err := os.ReadFile(filepath.Join(s.dir(), restoreIntent))
	if err != nil {
		return
	}
	var ck ckptMeta
	if err := json.Unmarshal(b, &ck); err != nil || !validCkptID(ck.ID) {
		os.Remove(filepath.Join(s.dir(), restoreIntent))
		return
	}
	ck.Memory = false // it starts cold, on the restored disks
	os.RemoveAll(s.snapshotDir())
	if err := s.swapIn(ctx, ck); err != nil {
		s.m.event(session.Event{Kind: session.EventNote, Name: s.name, Message: "an interrupted restore to checkpoint " + ck.ID + " could not be finished: " + err.Error()})
		return
	}
	s.m.event(session.Event{Kind: session.EventNote, Name: s.name, Message: "restore to checkpoint " + ck.ID + " finished after a daemon restart; the session is stopped (start it to run it)"})
}

// Fork makes newName a copy of a running or sleeping session: its memory
// (so its processes) and its disks, as of now, with an identity of its own.
func (m *Manager) Fork(ctx context.Context, name, newName string) (session.ForkResult, error) {
	res := session.ForkResult{Source: name}
	if err := session.ValidateName(newName); err != nil {
		return res, err
	}
	src, err := m.get(name)
	if err != nil {
		return res, err
	}
	src.op.Lock()
	defer src.op.Unlock()
	if err := src.check(session.ActionFork); err != nil {
		return res, err
	}
	src.touch()
	src.mu.Lock()
	rec := src.rec
	src.mu.Unlock()
	// The fork is a create of the source's size: the same rules, though
	// its workspace is copied (the floor below bounds that).
	if _, err := session.ValidateCreate(session.CreateOptions{Name: newName, CPUs: rec.CPUs, MemoryMiB: rec.MemoryMiB, DiskBytes: session.MinDiskBytes, Net: rec.Net}, m.limits()); err != nil {
		return res, err
	}
	if err := m.checkFloor("fork session " + name); err != nil {
		return res, err
	}
	start := time.Now()
	now := start
	frec := rec
	frec.Name, frec.State, frec.Cause = newName, string(session.StateCreating), "forked from "+name
	frec.CreatedAt, frec.LastActivity, frec.StartedAt = now, now, time.Time{}
	frec.Pid, frec.SnapshotPath, frec.SnapshotBytes, frec.LastWake, frec.PauseReason = 0, "", 0, 0, ""
	frec.MachineID = randomMachineID()
	frec.NICMAC = guest.NewNICMAC(rec.NICMAC)
	if rec.IdleTimeout != nil {
		t := *rec.IdleTimeout
		frec.IdleTimeout = &t
	}
	f, err := m.claim(frec)
	if err != nil {
		return res, err
	}
	defer f.op.Unlock()
	by := session.Actor(ctx)
	// synced, once set, yields the result of syncing the fork's disk
	// copies, which runs while the fork's VM is restored.
	var synced chan error
	fail := func(err error) (session.ForkResult, error) {
		if synced != nil {
			<-synced
		}
		f.mu.Lock()
		f.intended = true
		vm := f.vm
		f.mu.Unlock()
		if vm != nil {
			vm.Kill(context.Background())
		}
		m.removeSession(f, "")
		return res, err
	}
	if err := f.setState(session.StateCreating, "fork of "+name+" requested", by); err != nil {
		return fail(err)
	}
	if err := os.MkdirAll(f.vmDir(), 0o755); err != nil {
		return fail(err)
	}
	if err := os.MkdirAll(f.snapshotDir(), 0o755); err != nil {
		return fail(err)
	}
	pairs := [][2]string{{src.wsPath(), f.wsPath()}}
	if rec.SystemUUID != "" {
		pairs = append(pairs, [2]string{src.sysPath(), f.sysPath()})
	}
	dc := m.copier()
	dc.NoSync = true
	what := "fork session " + name
	memPath := f.snapshotPath()
	switch src.state() {
	case session.StateRunning:
		res.Frozen, err = src.frozenCopy(ctx, by, "fork", dc, what, pairs, memPath)
	case session.StateSleeping:
		copyNICMark(rec.SnapshotPath, memPath)
		err = dc.CopyAll(ctx, what, append(pairs, [2]string{rec.SnapshotPath, memPath}))
	}
	if err != nil {
		return fail(err)
	}
	res.Copy = dc.How.String()
	var steps []any
	step := func(name string) { steps = append(steps, name, time.Since(start).Round(time.Millisecond)) }
	defer func() { m.log.Info("fork", append([]any{"session", name, "into", newName}, steps...)...) }()
	step("copied")
	m.crash("fork:copied")
	synced = make(chan error, 1)
	go func() {
		var err error
		for _, p := range pairs {
			if _, serr := syncFile(p[1]); serr != nil && err == nil {
				err = fmt.Errorf("sync the fork's copy of %s: %w", filepath.Base(p[0]), serr)
			}
		}
		synced <- err
	}()
	f.mu.Lock()
	f.rec.SnapshotPath = memPath
	f.mu.Unlock()
	if err := f.restore(ctx); err != nil {
		return fail(fmt.Errorf("fork %s: restore the snapshot into a new VM: %w", name, err))
	}
	step("restored")
	m.crash("fork:restored")
	fr, err := f.afterFork(ctx, step)
	if err != nil {
		return fail(fmt.Errorf("fork %s: %w", name, err))
	}
	step("identity")
	res.Inherited, res.Warnings = fr.Inherited, fr.Errors
	os.RemoveAll(f.snapshotDir())
	f.mu.Lock()
	f.rec.SnapshotPath = ""
	f.mu.Unlock()
	res.Took = time.Since(start)
	m.event(session.Event{Kind: session.EventNote, Name: newName, By: by, Message: fmt.Sprintf("forked from %s at %s; the executions before are %s's (%d running then go on here as processes, unrecorded)",
		name, start.Format(time.RFC3339), name, fr.Inherited)})
	if len(fr.Errors) > 0 {
		m.event(session.Event{Kind: session.EventNote, Name: newName, By: by, Message: "fork identity: " + strings.Join(fr.Errors, "; ")})
	}
	m.crash("fork:noted")
	err = <-synced
	synced = nil
	step("synced")
	if err != nil {
		return fail(err)
	}
	cause := fmt.Sprintf("forked from %s in %s (%s; %s held for %s)", name, res.Took.Round(time.Millisecond), res.Copy, name, res.Frozen.Round(time.Millisecond))
	if err := f.setState(session.StateRunning, cause, by); err != nil {
		return fail(err)
	}
	m.event(session.Event{Kind: session.EventNote, Name: name, By: by, Message: fmt.Sprintf("forked into %s (held for %s)", newName, res.Frozen.Round(time.Millisecond))})
	m.copySchedules(ctx, name, newName)
	res.Session = f.snapshot()
	return res, nil
}

// afterFork resumes a VM restored from the source's snapshot and has its
// agent take the fork's identity; the fork's record gets the filesystem
// UUIDs the agent could set.
func (s *sess) afterFork(ctx context.Context, step func(string)) (forkIdentity, error) {
	vm, err := s.currentVM()
	if err != nil {
		return forkIdentity{}, err
	}
	if err := vm.Resume(ctx); err != nil {
		return forkIdentity{}, fmt.Errorf("resume the forked VM: %w", err)
	}
	step("resumed")
	return s.newIdentity(ctx, step)
}

// newIdentity has the agent of a running VM whose disks (and memory) are
// a copy of another session's — a fork's, or a checkpoint's — make it
// this session's machine: its hostname and machine id, a new boot id, a
// reseeded RNG and new filesystem UUIDs, which the record then names.
// The executions the agent knew are forgotten (they are the source's
// records) and counted.
func (s *sess) newIdentity(ctx context.Context, step func(string)) (forkIdentity, error) {
	c, err := s.connectedAgent()
	if err != nil {
		return forkIdentity{}, err
	}
	step("connected")
	vm, err := s.currentVM()
	if err != nil {
		return forkIdentity{}, err
	}
	s.mu.Lock()
	rec := s.rec
	s.mu.Unlock()
	spec := forkSpec(s.name, rec.MachineID, nicMAC(vm, rec), rec.SystemUUID != "")
	seed := make([]byte, 64)
	rand.Read(seed)
	fctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	r, err := c.Fork(fctx, spec, time.Now(), seed)
	if err != nil {
		return forkIdentity{}, agentErr(s.name, err)
	}
	step("fork-op")
	s.mu.Lock()
	if r.WorkspaceUUID {
		s.rec.WorkspaceUUID = spec.Workspace
	}
	if r.SystemUUID {
		s.rec.SystemUUID = spec.System
	}
	s.mu.Unlock()
	// The new UUIDs on disk before the record names them.
	if _, err := c.Flush(fctx); err != nil {
		return forkIdentity{}, agentErr(s.name, err)
	}
	out := forkIdentity{Inherited: r.Inherited, Errors: r.Errors}
	if !r.WorkspaceUUID {
		out.Errors = append(out.Errors, "the workspace keeps the source's filesystem UUID (made before berth formatted workspaces with metadata_csum_seed)")
	}
	return out, nil
}

type forkIdentity struct {
	Inherited int
	Errors    []string
}

func forkSpec(name, machineID, nicMAC string, system bool) guest.MountSpec {
	spec := guest.MountSpec{Workspace: vmm.NewUUID(), Hostname: name, MachineID: machineID, NICMAC: nicMAC}
	if system {
		spec.System = vmm.NewUUID()
	}
	return spec
}

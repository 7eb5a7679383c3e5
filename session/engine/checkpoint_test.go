package engine

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/engine/diskcopy"
	"github.com/berthvm/berth/store"
)

// sparseImage writes a size-byte file with data only at the given offsets.
func sparseImage(t *testing.T, path string, size int64, at map[int64][]byte) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	for off, b := range at {
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
	}
}

func randBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// A sparse copy has the source's bytes and its holes: it allocates what
// the source does, not its size.
func TestSparseCopy(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	const size = 64 << 20
	sparseImage(t, src, size, map[int64][]byte{
		0: randBytes(4096), 16 << 20: randBytes(1 << 20), size - 4096: randBytes(4096),
	})
	if err := diskcopy.SparseCopy(context.Background(), src, dst, true); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(src)
	b, _ := os.ReadFile(dst)
	if !bytes.Equal(a, b) {
		t.Fatal("the copy differs from the source")
	}
	if got, want := diskcopy.Allocated(dst), diskcopy.Allocated(src); got > want+1<<20 || got > 8<<20 {
		t.Errorf("the copy allocates %d bytes, the source %d: not sparse", got, want)
	}
	// dst exists: refused, and left as it is.
	if err := diskcopy.SparseCopy(context.Background(), src, dst, true); !errors.Is(err, os.ErrExist) {
		t.Errorf("copy over an existing file: %v", err)
	}
	// A cancelled copy leaves nothing.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := diskcopy.SparseCopy(ctx, src, filepath.Join(dir, "gone"), true); err == nil {
		t.Error("a cancelled copy succeeded")
	}
	if _, err := os.Stat(filepath.Join(dir, "gone")); !errors.Is(err, os.ErrNotExist) {
		t.Error("a cancelled copy left its file")
	}
	// An empty file and a file of holes only.
	for _, n := range []int64{0, 1 << 20} {
		e := filepath.Join(dir, "e")
		sparseImage(t, e, n, nil)
		os.Remove(e + ".c")
		if err := diskcopy.SparseCopy(context.Background(), e, e+".c", true); err != nil {
			t.Fatal(err)
		}
		if fi, _ := os.Stat(e + ".c"); fi.Size() != n {
			t.Errorf("copy of %d bytes of holes is %d bytes", n, fi.Size())
		}
	}
}

// The copier reflinks where it can and falls back to a sparse copy where
// the filesystem cannot, saying which.
func TestDiskCopierFallsBack(t *testing.T) {
	m := newSpaceManager(t, 0)
	dir := t.TempDir()
	src := filepath.Join(dir, "a")
	sparseImage(t, src, 16<<20, map[int64][]byte{1 << 20: randBytes(8192)})
	dc := m.copier()
	if err := dc.CopyAll(context.Background(), "copy", [][2]string{{src, src + ".1"}}); err != nil {
		t.Fatal(err)
	}
	if dc.How != diskcopy.Reflink && dc.How != diskcopy.Sparse {
		t.Errorf("how = %v", dc.How)
	}
	t.Logf("this filesystem: %s", dc.How)
	dc = m.copier()
	dc.NoReflink = true
	if err := dc.CopyAll(context.Background(), "copy", [][2]string{{src, src + ".2"}}); err != nil || dc.How != diskcopy.Sparse {
		t.Errorf("forced sparse: %v %v", dc.How, err)
	}
	// A failing later file removes the earlier copies.
	dc = m.copier()
	dc.NoReflink = true
	err := dc.CopyAll(context.Background(), "copy", [][2]string{{src, src + ".3"}, {filepath.Join(dir, "missing"), src + ".4"}})
	if err == nil {
		t.Fatal("copy of a missing file succeeded")
	}
	if _, err := os.Stat(src + ".3"); !errors.Is(err, os.ErrNotExist) {
		t.Error("a failed copy left an earlier file")
	}
}

func TestCheckpointIDs(t *testing.T) {
	for id, want := range map[string]bool{"c1": true, "c42": true, "c0": false, "c01": false, "c": false, "1": false,
		"c1/..": false, "../c1": false, ".c1-x": false, "c-1": false, "c12345678901": false} {
		if got := validCkptID(id); got != want {
			t.Errorf("validCkptID(%q) = %v", id, got)
		}
	}
}

// addStopped records a stopped session whose workspace is a sparse image.
func (m *Manager) addStopped(t *testing.T, name string, at map[int64][]byte) *sess {
	t.Helper()
	s := m.newSess(store.Session{Name: name, State: string(session.StateStopped), VMM: "qemu", Image: "mini", WorkspaceUUID: "ws-uuid", DiskBytes: 64 << 20, MemoryMiB: 256})
	if err := os.MkdirAll(s.vmDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	sparseImage(t, s.wsPath(), 64<<20, at)
	if err := m.st.PutSession(s.rec); err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	m.sessions[name] = s
	m.mu.Unlock()
	return s
}

// A stopped session's disks are checkpointed as they are; listing, info
// figures, limits and removal.
func TestCheckpointStopped(t *testing.T) {
	ctx := context.Background()
	m := newSpaceManager(t, 0)
	want := randBytes(64 << 10)
	s := m.addStopped(t, "a", map[int64][]byte{8 << 20: want})
	ck, err := m.Checkpoint(ctx, "a", session.CheckpointOptions{Label: "first"})
	if err != nil {
		t.Fatal(err)
	}
	if ck.ID != "c1" || ck.Label != "first" || ck.Memory || ck.State != session.StateStopped || ck.Bytes == 0 || ck.Bytes > 1<<20 {
		t.Errorf("checkpoint %+v", ck)
	}
	got, _ := os.ReadFile(filepath.Join(s.ckptDir("c1"), ckptWorkspace))
	if !bytes.Equal(got[8<<20:8<<20+len(want)], want) {
		t.Error("the checkpoint's workspace differs")
	}
	if _, err := m.Checkpoint(ctx, "a", session.CheckpointOptions{Memory: true}); !errors.Is(err, session.ErrInvalidState) || session.FieldOf(err) != session.FieldKeepMemory || !strings.Contains(err.Error(), "checkpoint its disks alone") {
		t.Errorf("memory checkpoint of a stopped session: %v", err)
	}
	if _, err := m.Checkpoint(ctx, "a", session.CheckpointOptions{Label: "two\nlines"}); !errors.Is(err, session.ErrInvalid) {
		t.Errorf("label with a newline: %v", err)
	}
	if _, err := m.Checkpoint(ctx, "a", session.CheckpointOptions{}); err != nil {
		t.Fatal(err)
	}
	list, err := m.Checkpoints(ctx, "a")
	if err != nil || len(list) != 2 || list[0].ID != "c1" || list[1].ID != "c2" {
		t.Fatalf("list %+v %v", list, err)
	}
	if info := s.snapshot(); info.Checkpoints != 2 || info.CheckpointBytes != list[0].Bytes+list[1].Bytes {
		t.Errorf("info counts %d checkpoints, %d bytes", info.Checkpoints, info.CheckpointBytes)
	}

	m.cfg.CheckpointLimit = 2
	_, err = m.Checkpoint(ctx, "a", session.CheckpointOptions{})
	if !errors.Is(err, session.ErrConflict) || !strings.Contains(err.Error(), "has 2 checkpoints") || !strings.Contains(err.Error(), "checkpoint_limit") {
		t.Errorf("over the count limit: %v", err)
	}
	m.cfg.CheckpointLimit, m.cfg.CheckpointBytes = 0, list[0].Bytes+list[1].Bytes+1
	_, err = m.Checkpoint(ctx, "a", session.CheckpointOptions{})
	if !errors.Is(err, session.ErrConflict) || !strings.Contains(err.Error(), "checkpoint_bytes") || !strings.Contains(err.Error(), session.FormatBytes(list[0].Bytes+list[1].Bytes)) {
		t.Errorf("over the bytes limit: %v", err)
	}
	m.cfg.CheckpointBytes = 0

	if err := m.DeleteCheckpoint(ctx, "a", "c1"); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"c1", "c9", "../a", ""} {
		if err := m.DeleteCheckpoint(ctx, "a", id); !errors.Is(err, session.ErrNotFound) {
			t.Errorf("delete %q: %v", id, err)
		}
		if _, err := m.Restore(ctx, "a", id); !errors.Is(err, session.ErrNotFound) {
			t.Errorf("restore %q: %v", id, err)
		}
	}
	if list, _ := m.Checkpoints(ctx, "a"); len(list) != 1 || list[0].ID != "c2" {
		t.Errorf("after rm: %+v", list)
	}
	// Ids are not reused while a later one exists.
	if ck, _ := m.Checkpoint(ctx, "a", session.CheckpointOptions{}); ck.ID != "c3" {
		t.Errorf("next id %q", ck.ID)
	}
}

// With no room for the copy, a checkpoint is refused before anything is
// copied, with the figures, and leaves nothing behind.
func TestCheckpointNoRoom(t *testing.T) {
	ctx := context.Background()
	m := newSpaceManager(t, 0)
	s := m.addStopped(t, "a", map[int64][]byte{0: randBytes(4 << 20)})
	free := m.freeSpace()
	m.cfg.Floor = free - 1<<20 // above the floor now, not after a 4 MiB copy
	dc := m.copier()
	err := dc.CopyAll(ctx, "checkpoint session a", [][2]string{{s.wsPath(), filepath.Join(t.TempDir(), "x")}})
	if dc.How == diskcopy.Reflink {
		t.Skip("this filesystem reflinks: a checkpoint needs no room")
	}
	if !errors.Is(err, session.ErrNoSpace) || !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), "needs 4") || !strings.Contains(err.Error(), "free_space_floor") {
		t.Fatalf("copy with no room: %v", err)
	}
	_, err = m.Checkpoint(ctx, "a", session.CheckpointOptions{})
	if !errors.Is(err, session.ErrNoSpace) {
		t.Fatalf("checkpoint with no room: %v", err)
	}
	ents, _ := os.ReadDir(s.ckptRoot())
	if len(ents) != 0 {
		t.Errorf("a refused checkpoint left %v", ents)
	}
}

// A daemon killed mid-checkpoint leaves a dot-directory: never listed,
// removed at the next start. One killed mid-restore finishes the restore
// at the next start, the session stopped on the checkpoint's disks.
func TestCheckpointRecovery(t *testing.T) {
	ctx := context.Background()
	m := newSpaceManager(t, 0)
	old, later := randBytes(4096), randBytes(4096)
	s := m.addStopped(t, "a", map[int64][]byte{0: old})
	if _, err := m.Checkpoint(ctx, "a", session.CheckpointOptions{}); err != nil {
		t.Fatal(err)
	}
	half := filepath.Join(s.ckptRoot(), ".c2-123")
	os.MkdirAll(half, 0o755)
	os.WriteFile(filepath.Join(half, ckptWorkspace), []byte("partial"), 0o600)
	if list, _ := m.Checkpoints(ctx, "a"); len(list) != 1 {
		t.Errorf("a half-made checkpoint is listed: %+v", list)
	}
	// The workspace moved on; a restore was interrupted after its intent.
	f, _ := os.OpenFile(s.wsPath(), os.O_WRONLY, 0)
	f.WriteAt(later, 0)
	f.Close()
	ck, _ := s.findCheckpoint("c1")
	b, _ := jsonMarshal(ck)
	os.WriteFile(filepath.Join(s.dir(), restoreIntent), b, 0o644)
	os.WriteFile(s.wsPath()+".restore", []byte("partial"), 0o600)

	s.recover(ctx)
	if _, err := os.Stat(half); !errors.Is(err, os.ErrNotExist) {
		t.Error("the half-made checkpoint was not removed")
	}
	got, _ := os.ReadFile(s.wsPath())
	if !bytes.Equal(got[:4096], old) {
		t.Error("the interrupted restore was not finished: the workspace is not the checkpoint's")
	}
	if _, err := os.Stat(filepath.Join(s.dir(), restoreIntent)); !errors.Is(err, os.ErrNotExist) {
		t.Error("the restore intent is left")
	}
	if st := s.state(); st != session.StateStopped {
		t.Errorf("state after recovery: %s", st)
	}
}

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }

package engine

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthvm/berth/session"
)

func fileSum(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:8])
}

// scribble writes a marker into a workspace image, past its filesystem's
// first blocks, so the image's bytes say which state it is.
func scribble(t *testing.T, path, marker string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(bytes.Repeat([]byte(marker), 4096), 8<<20); err != nil {
		t.Fatal(err)
	}
}

// A checkpoint of a running session is replicated to another host, which
// keeps it apart from its sessions; the session changes on; the replica
// is staged and committed as a move's staging, and the session is there,
// on the checkpoint's disks, with its records, and starts.
func TestReplicaRecoversACheckpoint(t *testing.T) {
	src, dst := newAgentManager(t, 0), newAgentManager(t, 0)
	ctx := t.Context()
	if _, err := src.Create(ctx, session.CreateOptions{Name: "rp"}); err != nil {
		t.Fatal(err)
	}
	p, err := src.Exec(ctx, "rp", session.ExecRequest{Argv: []string{"echo", "before"}})
	if err != nil {
		t.Fatal(err)
	}
	for range p.Output() {
	}
	p.Wait(ctx)
	if _, err := src.Stop(ctx, "rp"); err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(src.sessionDir("rp"), "workspace.img")
	scribble(t, ws, "at-checkpoint ")
	want := fileSum(t, ws)
	ck, err := src.Checkpoint(ctx, "rp", session.CheckpointOptions{Label: "keep"})
	if err != nil {
		t.Fatal(err)
	}
	scribble(t, ws, "after-it      ")
	if _, err := src.Start(ctx, "rp"); err != nil {
		t.Fatal(err)
	}

	// Sent while the session runs.
	var b bytes.Buffer
	if err := src.SendCheckpoint(ctx, "rp", ck.ID, &b); err != nil {
		t.Fatalf("SendCheckpoint: %v", err)
	}
	bundle := b.Bytes()
	if _, err := dst.ReceiveSession(ctx, bytes.NewReader(bundle)); err == nil {
		t.Fatal("ReceiveSession took a replica bundle as a move")
	}
	if _, err := dst.ReceiveReplica(ctx, bytes.NewReader(sendOf(t, stoppedCopy(t, src), "other"))); err == nil {
		t.Error("ReceiveReplica took a move bundle")
	}
	full := newAgentManager(t, 0)
	full.cfg.Floor = 1 << 62
	if _, err := full.ReceiveReplica(ctx, bytes.NewReader(bundle)); !errors.Is(err, session.ErrNoSpace) {
		t.Errorf("ReceiveReplica below the floor: %v, want the floor's refusal", err)
	}
	rep, err := dst.ReceiveReplica(ctx, bytes.NewReader(bundle))
	if err != nil {
		t.Fatalf("ReceiveReplica: %v", err)
	}
	if rep.Session != "rp" || rep.Checkpoint != ck.ID || rep.Label != "keep" || rep.Bytes == 0 {
		t.Errorf("replica %+v", rep)
	}
	// Again: replaced, one copy.
	if _, err := dst.ReceiveReplica(ctx, bytes.NewReader(bundle)); err != nil {
		t.Fatalf("ReceiveReplica again: %v", err)
	}
	if reps, err := dst.Replicas(ctx, ""); err != nil || len(reps) != 1 || reps[0].Checkpoint != ck.ID {
		t.Errorf("Replicas = %+v, %v", reps, err)
	}
	if l, _ := dst.List(ctx); len(l) != 0 {
		t.Errorf("a replica made a session: %+v", l)
	}
	if _, err := dst.StageReplica(ctx, "rp", "c99"); !errors.Is(err, session.ErrNotFound) {
		t.Errorf("StageReplica of a checkpoint not kept: %v", err)
	}
	if _, err := src.StageReplica(ctx, "rp", ck.ID); err == nil {
		t.Error("StageReplica on a host that has no replica")
	}

	staged, err := dst.StageReplica(ctx, "rp", ck.ID)
	if err != nil {
		t.Fatalf("StageReplica: %v", err)
	}
	if staged.Checkpoint != ck.ID || staged.State != session.StateStopped {
		t.Errorf("staged %+v", staged)
	}
	// Asked again, or raced: the same staging answers; from another
	// checkpoint, refused; discarded, it is made again.
	if again, err := dst.StageReplica(ctx, "rp", ck.ID); err != nil || again != staged {
		t.Errorf("StageReplica again = %+v, %v; want %+v", again, err, staged)
	}
	if _, err := dst.ReceiveReplica(ctx, bytes.NewReader(bundle)); err != nil {
		t.Fatal(err)
	}
	if err := dst.DiscardReceived(ctx, "rp"); err != nil {
		t.Fatal(err)
	}
	if staged, err = dst.StageReplica(ctx, "rp", ck.ID); err != nil {
		t.Fatalf("StageReplica after a discard: %v", err)
	}
	if _, err := src.Stop(ctx, "rp"); err != nil { // the agent's tmpfs does not freeze
		t.Fatal(err)
	}
	ck2, err := src.Checkpoint(ctx, "rp", session.CheckpointOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var b2 bytes.Buffer
	if err := src.SendCheckpoint(ctx, "rp", ck2.ID, &b2); err != nil {
		t.Fatal(err)
	}
	if _, err := dst.ReceiveReplica(ctx, &b2); err != nil {
		t.Fatal(err)
	}
	if _, err := dst.StageReplica(ctx, "rp", ck2.ID); !errors.Is(err, session.ErrExists) || !strings.Contains(err.Error(), "from checkpoint "+ck.ID+" is staged") {
		t.Errorf("StageReplica of %s with %s staged: %v", ck2.ID, ck.ID, err)
	}
	// Kept aside, to play a commit that died between its import and its
	// swap below.
	keep := filepath.Join(t.TempDir(), "staging")
	if err := os.CopyFS(keep, os.DirFS(dst.stagedDir("rp"))); err != nil {
		t.Fatal(err)
	}
	got, err := dst.CommitReceived(ctx, "rp")
	if err != nil {
		t.Fatalf("CommitReceived: %v", err)
	}
	if got.State != session.StateStopped {
		t.Errorf("recovered session is %s", got.State)
	}
	if sum := fileSum(t, filepath.Join(dst.sessionDir("rp"), "workspace.img")); sum != want {
		t.Errorf("recovered workspace %s, want the checkpoint's %s", sum, want)
	}
	if _, err := os.Stat(filepath.Join(dst.sessionDir("rp"), restoreIntent)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("restore intent left: %v", err)
	}
	// A commit that died after its import, before its swap: the records
	// are in, the directory holds the checkpoint and the intent, no
	// workspace. Asked again, the commit does the swap.
	os.RemoveAll(filepath.Join(keep, stagedSession))
	if err := os.Rename(keep, dst.stagedDir("rp")); err != nil {
		t.Fatal(err)
	}
	intent, _ := os.ReadFile(filepath.Join(dst.sessionDir("rp"), "checkpoints", ck.ID, ckptMetaFile))
	os.WriteFile(filepath.Join(dst.sessionDir("rp"), restoreIntent), intent, 0o644)
	os.Remove(filepath.Join(dst.sessionDir("rp"), "workspace.img"))
	if _, err := dst.CommitReceived(ctx, "rp"); err != nil {
		t.Fatalf("CommitReceived after a commit cut before its swap: %v", err)
	}
	if sum := fileSum(t, filepath.Join(dst.sessionDir("rp"), "workspace.img")); sum != want {
		t.Errorf("workspace after the finished swap %s, want the checkpoint's %s", sum, want)
	}
	if left := stagingLeft(t, dst); len(left) != 0 {
		t.Errorf("staging left: %v", left)
	}
	if xs, _ := dst.Executions(ctx, "rp", true); len(xs) != 1 || xs[0].Argv[0] != "echo" {
		t.Errorf("executions after recovery: %+v", xs)
	}
	if cks, _ := dst.Checkpoints(ctx, "rp"); len(cks) != 1 || cks[0].ID != ck.ID {
		t.Errorf("checkpoints after recovery: %+v", cks)
	}
	// The replica stays (another recovery could need it); a second stage
	// is refused, the session being here.
	if reps, _ := dst.Replicas(ctx, "rp"); len(reps) != 2 {
		t.Errorf("replicas after the recovery: %+v, want both kept", reps)
	}
	if _, err := dst.StageReplica(ctx, "rp", ck.ID); !errors.Is(err, session.ErrExists) {
		t.Errorf("StageReplica of a session here: %v, want ErrExists", err)
	}
	if _, err := dst.Start(ctx, "rp"); err != nil {
		t.Fatalf("start the recovered session: %v", err)
	}
	for _, id := range []string{ck.ID, ck2.ID} {
		if err := dst.DropReplica(ctx, "rp", id); err != nil {
			t.Fatal(err)
		}
	}
	if reps, _ := dst.Replicas(ctx, ""); len(reps) != 0 {
		t.Errorf("Replicas after drop: %+v", reps)
	}
}

// stoppedCopy makes a stopped session "other" on m, for a move bundle.
func stoppedCopy(t *testing.T, m *Manager) *Manager {
	t.Helper()
	if _, err := m.Create(t.Context(), session.CreateOptions{Name: "other"}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Stop(t.Context(), "other"); err != nil {
		t.Fatal(err)
	}
	return m
}

// A replica holds its checkpoint and nothing else: a bundle that names a
// checkpoint yet carries another path is refused, and nothing is kept.
func TestReceiveReplicaRefusesStrayPaths(t *testing.T) {
	dst := newAgentManager(t, 0)
	for _, path := range []string{"workspace.img", "checkpoints/c2/workspace.img", "checkpoints/c1/sub/x", "../x"} {
		var out bytes.Buffer
		bw := &bundleWriter{w: bufio.NewWriter(&out), sum: sha256.New()}
		bw.raw([]byte(bundleMagic))
		bw.raw([]byte{0, bundleVersion})
		h, _ := json.Marshal(bundleHeader{Name: "evil", Image: "mini", ImageDigest: "fake", VMM: "qemu", Checkpoint: "c1"})
		bw.frame(bframeHeader, h)
		fh, _ := json.Marshal(bundleFile{Path: path, Size: 1, Mode: 0o644})
		bw.frame(bframeFile, fh)
		bw.chunk(bframeData, make([]byte, 8), []byte("x"))
		bw.chunk(bframeRecords, nil, []byte("records"))
		bw.end()
		if _, err := dst.ReceiveReplica(t.Context(), bytes.NewReader(out.Bytes())); err == nil {
			t.Errorf("path %q: kept", path)
		}
		if reps, _ := dst.Replicas(t.Context(), ""); len(reps) != 0 {
			t.Errorf("path %q: replicas %+v", path, reps)
		}
		if ents, _ := os.ReadDir(filepath.Join(dst.replicasDir(), "evil")); len(ents) != 0 {
			t.Errorf("path %q: left %v", path, ents)
		}
	}
}

// The replica's parser meets a network peer's bytes, as the move's does:
// it refuses, never crashes or writes outside the replicas area, and a
// refusal leaves nothing.
func FuzzReceiveReplica(f *testing.F) {
	src, dst := newAgentManager(f, 0), newAgentManager(f, 0)
	ctx := f.Context()
	if _, err := src.Create(ctx, session.CreateOptions{Name: "rp"}); err != nil {
		f.Fatal(err)
	}
	if _, err := src.Stop(ctx, "rp"); err != nil {
		f.Fatal(err)
	}
	ck, err := src.Checkpoint(ctx, "rp", session.CheckpointOptions{})
	if err != nil {
		f.Fatal(err)
	}
	var b bytes.Buffer
	if err := src.SendCheckpoint(ctx, "rp", ck.ID, &b); err != nil {
		f.Fatal(err)
	}
	f.Add(b.Bytes()[:min(b.Len(), 64<<10)])
	f.Add(hostileBundle("ok", 1))
	outside := filepath.Dir(dst.replicasDir())
	f.Fuzz(func(t *testing.T, in []byte) {
		rep, err := dst.ReceiveReplica(ctx, bytes.NewReader(in))
		if err == nil {
			if err := dst.DropReplica(ctx, rep.Session, rep.Checkpoint); err != nil {
				t.Fatal(err)
			}
		}
		ents, _ := os.ReadDir(dst.replicasDir())
		for _, e := range ents {
			if left, _ := os.ReadDir(filepath.Join(dst.replicasDir(), e.Name())); len(left) != 0 {
				t.Fatalf("replica left (err %v): %s: %v", err, e.Name(), left)
			}
		}
		for _, n := range []string{"x", "evil"} {
			if _, err := os.Lstat(filepath.Join(outside, n)); err == nil {
				t.Fatalf("%s written outside the replicas area", n)
			}
		}
	})
}

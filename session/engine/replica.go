package engine

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/berthvm/berth/session"
)

// Checkpoint replicas (session.Replicator). A replica is a move bundle
// restricted to one checkpoint: its header names the checkpoint, its
// files are those of sessions/<name>/checkpoints/<id>/ (by the same
// relative paths), its records the session's. The receiver keeps it under
// <data>/replicas/<name>/<id>/ as a staging would ({session/, records,
// replica.json}), built in a dot-directory and renamed into place once
// whole and verified. StageReplica copies one into the moves area with
// the checkpoint's metadata as the session's restore intent, so that the
// move's CommitReceived makes it a session whose disks are the
// checkpoint's (and a restart between the two finishes the swap, as an
// interrupted restore is finished).

const (
	replicasDir     = "replicas"
	replicaMetaFile = "replica.json"
)

var _ session.Replicator = (*Manager)(nil)

func (m *Manager) replicasDir() string { return filepath.Join(m.cfg.DataDir, replicasDir) }

func (m *Manager) replicaDir(name, id string) string {
	return filepath.Join(m.replicasDir(), name, id)
}

// removePartialReplicas, at start, removes replicas a crash cut short
// and the links of sends it interrupted.
func (m *Manager) removePartialReplicas() {
	for _, pat := range []string{filepath.Join(m.replicasDir(), ".*"), filepath.Join(m.replicasDir(), "*", ".*")} {
		dirs, _ := filepath.Glob(pat)
		for _, d := range dirs {
			os.RemoveAll(d)
		}
	}
}

func checkReplicaArgs(name, id string) error {
	if err := session.ValidateName(name); err != nil {
		return err
	}
	if !validCkptID(id) {
		return session.NoCheckpoint(name, id)
	}
	return nil
}

// SendCheckpoint writes the replica bundle of checkpoint id of name.
func (m *Manager) SendCheckpoint(ctx context.Context, name, id string, w io.Writer) error {
	if err := checkReplicaArgs(name, id); err != nil {
		return err
	}
	s, err := m.get(name)
	if err != nil {
		return unknownSession(name, err)
	}
	// The checkpoint's files are linked aside under s.op: a delete of the
	// checkpoint during the send takes nothing from it, and the session's
	// lifecycle waits for the links only, not for the send.
	links, hdr, err := func() (string, bundleHeader, error) {
		s.op.Lock()
		defer s.op.Unlock()
		ck, err := s.findCheckpoint(id)
		if err != nil {
			return "", bundleHeader{}, err
		}
		s.mu.Lock()
		r := s.rec
		s.mu.Unlock()
		hdr := bundleHeader{Name: name, State: session.StateStopped, Image: r.Image, ImageDigest: r.ImageDigest, VMM: r.VMM, Checkpoint: id}
		if !ck.WorkspaceOnly {
			hdr.Image, hdr.ImageDigest = ck.Image, ck.ImageDigest
		}
		if ck.VMM != "" {
			hdr.VMM = ck.VMM
		}
		if err := os.MkdirAll(m.replicasDir(), 0o755); err != nil {
			return "", hdr, err
		}
		links, err := os.MkdirTemp(m.replicasDir(), ".send-")
		if err != nil {
			return "", hdr, err
		}
		ents, err := os.ReadDir(s.ckptDir(id))
		for _, e := range ents {
			if err == nil && e.Type().IsRegular() && !strings.HasPrefix(e.Name(), ".") {
				err = os.Link(filepath.Join(s.ckptDir(id), e.Name()), filepath.Join(links, e.Name()))
			}
		}
		if err != nil {
			os.RemoveAll(links)
			return "", hdr, fmt.Errorf("link checkpoint %s of %q for its replica: %w", id, name, err)
		}
		return links, hdr, nil
	}()
	if err != nil {
		return err
	}
	defer os.RemoveAll(links)
	bw := &bundleWriter{w: bufio.NewWriterSize(w, 2*bundleChunk), sum: sha256.New()}
	bw.raw([]byte(bundleMagic))
	bw.raw(binary.BigEndian.AppendUint16(nil, bundleVersion))
	b, _ := json.Marshal(hdr)
	bw.frame(bframeHeader, b)
	buf := make([]byte, bundleChunk)
	ents, err := os.ReadDir(links)
	if err != nil {
		return fmt.Errorf("send checkpoint %s of %q: %w", id, name, err)
	}
	for _, e := range ents {
		if err := ctx.Err(); err != nil {
			return err
		}
		rel := filepath.Join("checkpoints", id, e.Name())
		if err := bw.file(filepath.Join(links, e.Name()), rel, buf); err != nil {
			return fmt.Errorf("send checkpoint %s of %q: %w", id, name, err)
		}
	}
	rw := &recordsWriter{bw: bw}
	if err := m.st.ExportSession(name, rw); err != nil {
		return fmt.Errorf("send checkpoint %s of %q: %w", id, name, err)
	}
	if err := rw.flush(); err != nil {
		return fmt.Errorf("send checkpoint %s of %q: %w", id, name, err)
	}
	bw.end()
	if bw.err != nil {
		return fmt.Errorf("send checkpoint %s of %q: %w", id, name, bw.err)
	}
	return nil
}

// ReceiveReplica keeps a replica bundle from a peer.
func (m *Manager) ReceiveReplica(ctx context.Context, r io.Reader) (_ session.Replica, err error) {
	start := time.Now()
	br, hdr, err := openBundle(r)
	if err != nil {
		return session.Replica{}, err
	}
	if !validCkptID(hdr.Checkpoint) {
		return session.Replica{}, errBundle("a move of %q, not a replica of one of its checkpoints", hdr.Name)
	}
	if err := m.checkFloor(fmt.Sprintf("keep a replica of checkpoint %s of %q here", hdr.Checkpoint, hdr.Name)); err != nil {
		return session.Replica{}, err
	}
	if err := m.refuseBuild(ctx, hdr); err != nil {
		return session.Replica{}, err
	}
	name, id := hdr.Name, hdr.Checkpoint
	parent := filepath.Join(m.replicasDir(), name)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return session.Replica{}, fmt.Errorf("receive a replica of %q: %w", name, err)
	}
	partial, err := os.MkdirTemp(parent, "."+id+".partial-")
	if err != nil {
		return session.Replica{}, fmt.Errorf("receive a replica of %q: %w", name, err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(partial)
		}
	}()
	root := filepath.Join(partial, stagedSession)
	if err := os.Mkdir(root, 0o755); err != nil {
		return session.Replica{}, err
	}
	recs, err := os.OpenFile(filepath.Join(partial, stagedRecords), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return session.Replica{}, err
	}
	defer recs.Close()
	var st session.MoveStaged
	if err := receiveFiles(ctx, br, root, recs, &st); err != nil {
		return session.Replica{}, fmt.Errorf("receive checkpoint %s of %q: %w", id, name, err)
	}
	if st.Records == 0 {
		return session.Replica{}, errBundle("no records")
	}
	ck, err := checkReplicaTree(root, id)
	if err != nil {
		return session.Replica{}, err
	}
	rep := session.Replica{Session: name, Checkpoint: id, Label: ck.Label, Memory: ck.Memory, System: ck.System,
		TakenAt: ck.CreatedAt, CopiedAt: time.Now().UTC(), Bytes: st.Bytes, Files: st.Files, Took: time.Since(start)}
	if err := recs.Sync(); err != nil {
		return rep, err
	}
	b, _ := json.Marshal(rep)
	if err := writeSynced(filepath.Join(partial, replicaMetaFile), b); err != nil {
		return rep, err
	}
	if err := filepath.WalkDir(partial, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			err = syncDir(path)
		}
		return err
	}); err != nil {
		return rep, err
	}
	// An earlier copy of the same checkpoint is replaced: set aside under
	// a dot-name (removed at start if a crash leaves it), then removed.
	final := m.replicaDir(name, id)
	old := ""
	if _, err := os.Lstat(final); err == nil {
		old = filepath.Join(parent, "."+id+".old-"+fmt.Sprint(time.Now().UnixNano()))
		if err := os.Rename(final, old); err != nil {
			return rep, fmt.Errorf("replace the replica of checkpoint %s of %q: %w", id, name, err)
		}
	}
	if err := os.Rename(partial, final); err != nil {
		if old != "" {
			os.Rename(old, final) // the fleet records a replica here: keep the earlier one
		}
		return rep, fmt.Errorf("keep the replica of checkpoint %s of %q: %w", id, name, err)
	}
	syncDir(parent)
	if old != "" {
		os.RemoveAll(old)
	}
	m.log.Info("kept a checkpoint replica", "session", name, "checkpoint", id, "bytes", rep.Bytes)
	return rep, nil
}

// checkReplicaTree checks that a received replica holds checkpoint id
// and nothing else, and returns its metadata.
func checkReplicaTree(root, id string) (ckptMeta, error) {
	var ck ckptMeta
	want := filepath.Join("checkpoints", id)
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if rel == "." || rel == "checkpoints" || rel == want {
				return nil
			}
			return errBundle("a replica of checkpoint %s holds %q", id, rel)
		}
		if filepath.Dir(rel) != want {
			return errBundle("a replica of checkpoint %s holds %q", id, rel)
		}
		return nil
	})
	if err != nil {
		return ck, err
	}
	b, err := readBounded(filepath.Join(root, want, ckptMetaFile), maxCkptMeta)
	if err != nil || json.Unmarshal(b, &ck) != nil || ck.ID != id {
		return ck, errBundle("a replica of checkpoint %s without its metadata", id)
	}
	if _, err := os.Lstat(filepath.Join(root, want, ckptWorkspace)); err != nil {
		return ck, errBundle("a replica of checkpoint %s without its workspace", id)
	}
	return ck, nil
}

// maxCkptMeta bounds a checkpoint's meta.json read from a peer's bundle.
const maxCkptMeta = 1 << 20

// readBounded reads a file of at most max bytes (a peer wrote it: its
// size is refused before it is read).
func readBounded(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err == nil && int64(len(b)) > max {
		err = fmt.Errorf("%s is over %d bytes", path, max)
	}
	return b, err
}

// Replicas lists the replicas kept here.
func (m *Manager) Replicas(ctx context.Context, name string) ([]session.Replica, error) {
	names := []string{name}
	if name == "" {
		ents, err := os.ReadDir(m.replicasDir())
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		names = names[:0]
		for _, e := range ents {
			if e.IsDir() && session.ValidateName(e.Name()) == nil {
				names = append(names, e.Name())
			}
		}
	} else if err := session.ValidateName(name); err != nil {
		return nil, err
	}
	out := []session.Replica{}
	for _, n := range names {
		ents, _ := os.ReadDir(filepath.Join(m.replicasDir(), n))
		for _, e := range ents {
			if !validCkptID(e.Name()) {
				continue
			}
			b, err := os.ReadFile(filepath.Join(m.replicaDir(n, e.Name()), replicaMetaFile))
			var rep session.Replica
			if err != nil || json.Unmarshal(b, &rep) != nil {
				continue
			}
			out = append(out, rep)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Session != out[j].Session {
			return out[i].Session < out[j].Session
		}
		return ckptNum(out[i].Checkpoint) < ckptNum(out[j].Checkpoint)
	})
	return out, nil
}

// DropReplica removes a replica.
func (m *Manager) DropReplica(ctx context.Context, name, id string) error {
	if err := checkReplicaArgs(name, id); err != nil {
		return err
	}
	if err := os.RemoveAll(m.replicaDir(name, id)); err != nil {
		return fmt.Errorf("drop the replica of checkpoint %s of %q: %w", id, name, err)
	}
	os.Remove(filepath.Join(m.replicasDir(), name)) // when it was the last
	return nil
}

// noReplica is the refusal for a replica this host does not keep.
func noReplica(name, id string) error {
	return &session.Error{Class: session.ErrNotFound, Msg: fmt.Sprintf("this host keeps no replica of checkpoint %s of session %s", id, name),
		Hint: "replicate a checkpoint of the session to this host first"}
}

// StageReplica stages the replica as a move's staging.
func (m *Manager) StageReplica(ctx context.Context, name, id string) (_ session.MoveStaged, err error) {
	if err := checkReplicaArgs(name, id); err != nil {
		return session.MoveStaged{}, err
	}
	dir := m.replicaDir(name, id)
	var rep session.Replica
	if b, err := os.ReadFile(filepath.Join(dir, replicaMetaFile)); err != nil || json.Unmarshal(b, &rep) != nil {
		return session.MoveStaged{}, noReplica(name, id)
	}
	ck, err := checkReplicaTree(filepath.Join(dir, stagedSession), id)
	if err != nil {
		return session.MoveStaged{}, fmt.Errorf("the replica of checkpoint %s of %q: %w", id, name, err)
	}
	// Staged already from this checkpoint (a recovery asked again, or
	// raced): the same staging serves; from anything else, refused.
	if b, err := os.ReadFile(filepath.Join(m.stagedDir(name), stagedMetaFile)); err == nil {
		var st session.MoveStaged
		if json.Unmarshal(b, &st) == nil && st.Checkpoint == id {
			return st, nil
		}
		if st.Checkpoint != "" {
			return session.MoveStaged{}, &session.Error{Class: session.ErrExists,
				Msg:  fmt.Sprintf("a recovery of session %s from checkpoint %s is staged here already", name, st.Checkpoint),
				Hint: "recover it from that checkpoint"}
		}
	}
	hdr := bundleHeader{Name: name, Image: ck.Image, ImageDigest: ck.ImageDigest, VMM: ck.VMM}
	if err := m.refuseArrival(ctx, hdr); err != nil {
		return session.MoveStaged{}, err
	}
	if err := os.MkdirAll(m.movesDir(), 0o755); err != nil {
		return session.MoveStaged{}, err
	}
	partial, err := os.MkdirTemp(m.movesDir(), "."+name+".partial-")
	if err != nil {
		return session.MoveStaged{}, err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(partial)
		}
	}()
	from := filepath.Join(dir, stagedSession, "checkpoints", id)
	to := filepath.Join(partial, stagedSession, "checkpoints", id)
	if err := os.MkdirAll(to, 0o755); err != nil {
		return session.MoveStaged{}, err
	}
	// Copies (reflinks where the filesystem has them): the replica stays
	// whole whatever becomes of the staging.
	pairs := [][2]string{{filepath.Join(dir, stagedRecords), filepath.Join(partial, stagedRecords)}}
	ents, err := os.ReadDir(from)
	if err != nil {
		return session.MoveStaged{}, err
	}
	for _, e := range ents {
		pairs = append(pairs, [2]string{filepath.Join(from, e.Name()), filepath.Join(to, e.Name())})
	}
	if err := m.copier().CopyAll(ctx, "stage the replica of checkpoint "+id+" of "+name, pairs); err != nil {
		return session.MoveStaged{}, err
	}
	// The checkpoint is the session's restore intent: a daemon killed
	// after the commit's import and before its swap finishes the swap at
	// start, as it finishes an interrupted restore.
	b, _ := json.Marshal(ck)
	if err := writeSynced(filepath.Join(partial, stagedSession, restoreIntent), b); err != nil {
		return session.MoveStaged{}, err
	}
	recs, err := os.Open(filepath.Join(partial, stagedRecords))
	if err != nil {
		return session.MoveStaged{}, err
	}
	defer recs.Close()
	fi, err := recs.Stat()
	if err != nil {
		return session.MoveStaged{}, err
	}
	staged := session.MoveStaged{Name: name, State: session.StateStopped, Image: ck.Image, ImageDigest: ck.ImageDigest,
		Files: rep.Files, Bytes: rep.Bytes, Records: fi.Size(), Checkpoint: id}
	return staged, m.finishStaging(partial, recs, staged)
}

// recoverOnto puts a session just imported by a recovery on its
// checkpoint's disks: stopped, or sleeping on the checkpoint's memory.
// The caller holds s.op.
func (s *sess) recoverOnto(ctx context.Context, id string) error {
	ck, err := s.findCheckpoint(id)
	if err != nil {
		return err
	}
	// Its commands ran on a host that is gone: their outcome is unknown.
	s.m.loseRuns(s.name, "the session was recovered on another host from checkpoint "+id)
	if err := s.swapIn(ctx, ck); err != nil {
		return err
	}
	if ck.Memory {
		return s.setState(session.StateSleeping, "recovered from checkpoint "+id+": its memory resumes at the next start", "fleet")
	}
	return nil
}

// finishRecoverOnto puts the session on checkpoint id if a recovery's
// swap is still to be done (its restore intent is there): a commit that
// failed in recoverOnto, tried again.
func (s *sess) finishRecoverOnto(ctx context.Context, id string) error {
	s.op.Lock()
	defer s.op.Unlock()
	if _, err := os.Stat(filepath.Join(s.dir(), restoreIntent)); err != nil {
		return nil
	}
	if err := s.recoverOnto(ctx, id); err != nil {
		return err
	}
	s.refreshCheckpoints()
	return nil
}

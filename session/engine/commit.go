package engine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/berthvm/berth/guest/image"
	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/engine/diskcopy"
	"github.com/berthvm/berth/vmm"
)

// Committing a session as an image. A session's system disk is the
// overlay's upper layer over its image's read-only layers, an ext4 volume
// whose tree is under upper/, the layout every layer has; so a copy of
// it, sealed (guest/image.SealCommit), is a layer as it is, and the new
// image is the session's image build with that layer on top.
//
// Consistency: the disk of a running session is copied with the guest's
// filesystems flushed and frozen (FIFREEZE, as a checkpoint does), so the
// copy is a clean filesystem with every write the session made before the
// commit; its commands block only for the copy, which is a reflink where
// the data directory's filesystem has them and a sparse copy of the
// allocated blocks otherwise. Pausing the VM instead would leave dirty
// pages in the guest, and a snapshot in the VMM (a qcow2 overlay) would
// change how every system disk is stored. A stopped or sleeping session's
// disk is copied as it is (it was unmounted or frozen); a crashed one's
// is as the crash left it, and sealing replays its journal. The sealing
// (checks, removals, the journal dropped) runs on the copy after the
// session has let go.

// commitRoom is the room an image's own files need beside its layers:
// a kernel and an initramfs.
const commitRoom = 64 << 20

// CommitImage makes a session's system disk a new image on its image's
// build.
func (m *Manager) CommitImage(ctx context.Context, req session.CommitRequest) (session.CommitResult, error) {
	start := time.Now()
	st := m.cfg.Images
	if st == nil {
		return session.CommitResult{}, fmt.Errorf("no image store configured: %w", session.ErrUnavailable)
	}
	if err := req.Validate(); err != nil {
		return session.CommitResult{}, err
	}
	if image.Shipped(req.Image) {
		return session.CommitResult{}, &session.Error{Class: session.ErrExists, Field: session.FieldNewImage,
			Msg: fmt.Sprintf("%q is one of berth's own images", req.Image), Hint: "choose another name"}
	}
	if _, err := m.get(req.Session); err != nil {
		return session.CommitResult{}, unknownSession(req.Session, err)
	}
	if cur, err := st.Load(req.Image, ""); err == nil && !cur.Committed() {
		return session.CommitResult{}, &session.Error{Class: session.ErrExists, Field: session.FieldNewImage,
			Msg: fmt.Sprintf("%q exists already, from %s", req.Image, cur.Source), Hint: "remove that image first or choose another name"}
	}
	if err := m.roomFor("commit an image", 0); err != nil {
		return session.CommitResult{}, err
	}
	// The new name's lock first: nothing takes it under a session's
	// lifecycle lock (only shipped images are built there, and they are
	// refused above).
	unlock, err := image.LockImage(ctx, st.Dir, req.Image, nil)
	if err != nil {
		return session.CommitResult{}, err
	}
	defer unlock()
	work, err := m.commitWorkDir(st)
	if err != nil {
		return session.CommitResult{}, err
	}
	defer os.RemoveAll(work)
	layerFile := filepath.Join(work, "layer.img")

	res := session.CommitResult{}
	var parent image.Image
	by := session.Actor(ctx)
	_, err = m.lifecycle(ctx, req.Session, session.ActionCommitImage, func(s *sess) error {
		s.mu.Lock()
		imName, digest := s.rec.Image, s.rec.ImageDigest
		s.mu.Unlock()
		res.State = s.state()
		var err error
		if parent, err = st.Load(imName, digest); err != nil {
			return &session.Error{Class: session.ErrNotFound, Field: session.FieldSession,
				Msg: fmt.Sprintf("%q is on image %s@%s, which is gone: %v", req.Session, imName, orDash(digest), err), Err: err}
		}
		if !parent.RootFS() {
			return &session.Error{Class: session.ErrInvalid, Field: session.FieldSession, Code: session.CodeNoSystemDisk,
				Msg:  fmt.Sprintf("%q runs image %s, whose root is its initramfs: it has no system disk to commit", req.Session, imName),
				Hint: "commit a session of an image with a root filesystem, such as debian"}
		}
		if digest == "" {
			// Without the build its disk was made on, which layers are
			// below it is a guess.
			return &session.Error{Class: session.ErrInvalid, Field: session.FieldSession,
				Msg:  fmt.Sprintf("%q does not record the build of image %s its system disk was made on", req.Session, imName),
				Hint: "replacing its VM gives it a system disk on a recorded build"}
		}
		if n := len(parent.Layers); n >= vmm.MaxLayers {
			return &session.Error{Class: session.ErrInvalid, Field: session.FieldSession, Code: session.CodeLayers,
				Msg:  fmt.Sprintf("%q is on image %s, which has %d layers, the most a VM stacks: a commit adds one", req.Session, imName, n),
				Hint: "commit a session of an image with fewer layers"}
		}
		what := fmt.Sprintf("commit session %s as image %s", req.Session, req.Image)
		// No sync: the copy is sealed and synced as a layer before it is
		// used, and a crash leaves only the work directory, removed at
		// the next start.
		dc := &diskcopy.Copier{NoSync: true, Room: func(what string, need int64) error { return m.roomFor(what, need+commitRoom) }}
		pairs := [][2]string{{s.sysPath(), layerFile}}
		if res.State == session.StateRunning {
			res.Frozen, err = s.frozenCopy(ctx, by, "commit", dc, what, pairs, "")
		} else {
			err = dc.CopyAll(ctx, what, pairs)
		}
		if err != nil {
			return err
		}
		res.Copy = dc.How.String()
		return nil
	})
	if err != nil {
		var se *session.Error
		if !errors.As(err, &se) {
			err = unknownSession(req.Session, err) // deleted meanwhile
		}
		return session.CommitResult{}, err
	}
	res.Parent = parent.Name + "@" + parent.Digest
	copied := time.Now()

	uuid := image.NewUUID()
	rep, err := image.SealCommit(ctx, layerFile, uuid)
	if err != nil {
		return session.CommitResult{}, fmt.Errorf("commit session %q: %w", req.Session, err)
	}
	m.crash("commit:sealed")
	// The layers below are held until the image links them, bottom
	// first as every maker takes them, then the new one on top.
	var releases []func()
	defer func() {
		for i := len(releases) - 1; i >= 0; i-- {
			releases[i]()
		}
	}()
	layers := make([]image.Layer, 0, len(parent.Layers)+1)
	for _, l := range parent.Layers {
		release, err := image.HoldLayer(ctx, st.Dir, l.Hash, nil)
		if err != nil {
			return session.CommitResult{}, err
		}
		releases = append(releases, release)
		layers = append(layers, image.Layer{Hash: l.Hash})
	}
	hash := commitHash()
	release, err := image.HoldLayer(ctx, st.Dir, hash, nil)
	if err != nil {
		return session.CommitResult{}, err
	}
	releases = append(releases, release)
	if _, err := image.StoreLayer(st.Dir, layerFile, hash, uuid); err != nil {
		return session.CommitResult{}, err
	}
	m.crash("commit:stored") // a layer no image links: pruned later
	layers = append(layers, image.Layer{Hash: hash})
	sealed := time.Now()
	b, _, err := image.Assemble(ctx, image.Options{ImagesDir: st.Dir, CacheDir: st.CacheDir, Agent: st.Agent}, image.Image{
		Name: req.Image, Source: image.CommittedSource + req.Session, Config: parent.Config, Parent: res.Parent, Label: req.Label, Layers: layers,
	})
	if err != nil {
		image.DropLayer(st.Dir, hash)
		if ctx.Err() != nil {
			return session.CommitResult{}, ctx.Err()
		}
		return session.CommitResult{}, fmt.Errorf("commit session %q as image %q: %w", req.Session, req.Image, err)
	}
	m.pruneImage(req.Image) // an earlier commit of the name no session uses
	info, err := m.imageInfo(ctx, b)
	if err != nil {
		return session.CommitResult{}, err
	}
	res.Image = info
	res.Bytes = diskcopy.Allocated(b.Layers[len(b.Layers)-1].Path)
	res.Files, res.Dirs, res.Deleted = rep.Files, rep.Dirs, rep.Deleted
	res.Top, res.LeftOut = pathBytes(rep.Top), pathBytes(rep.LeftOut)
	res.Took = time.Since(start)
	m.log.Info("session committed as an image", "session", req.Session, "image", b.Name, "digest", b.Digest, "parent", res.Parent,
		"bytes", res.Bytes, "files", res.Files, "copy", res.Copy, "frozen", res.Frozen, "took", res.Took,
		"copying", copied.Sub(start), "sealing", sealed.Sub(copied), "assembling", time.Since(sealed))
	msg := fmt.Sprintf("system disk committed as image %s@%s on %s: %s, %d files", b.Name, b.Digest, res.Parent, session.FormatBytes(res.Bytes), res.Files)
	if len(res.Top) > 0 {
		msg += fmt.Sprintf(", most under %s (%s)", res.Top[0].Path, session.FormatBytes(res.Top[0].Bytes))
	}
	if res.Frozen > 0 {
		msg += fmt.Sprintf("; commands frozen for %s", res.Frozen.Round(time.Millisecond))
	}
	m.event(session.Event{Kind: session.EventNote, Name: req.Session, By: by, Message: msg})
	return res, nil
}

// commitWorkPrefix starts the names of commits' work directories.
const commitWorkPrefix = ".commit-"

// commitWorkDir makes a commit's work directory: in the data directory,
// which is this daemon's alone, so that one a crash left is removed at
// the next start (removeStaleWork); in the layer cache only when that is
// on another filesystem (the layer is renamed into it).
func (m *Manager) commitWorkDir(st *image.Store) (string, error) {
	cache := image.LayerCacheDir(st.Dir)
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", err
	}
	dir := m.cfg.DataDir
	var a, b syscall.Stat_t
	if syscall.Stat(dir, &a) != nil || syscall.Stat(cache, &b) != nil || a.Dev != b.Dev {
		dir = cache
	}
	return os.MkdirTemp(dir, commitWorkPrefix)
}

// removeStaleWork removes what commits a crash interrupted left in the
// data directory.
func (m *Manager) removeStaleWork() {
	dirs, _ := filepath.Glob(filepath.Join(m.cfg.DataDir, commitWorkPrefix+"*"))
	for _, d := range dirs {
		m.log.Info("removing an interrupted commit's work directory", "dir", d)
		os.RemoveAll(d)
	}
}

// commitHash names a committed layer in the layer cache. It is not a
// hash of what the layer holds (that would read it all again): each
// commit is a layer of its own.
func commitHash() string {
	b := make([]byte, 16)
	rand.Read(b)
	return "commit-" + hex.EncodeToString(b)
}

func pathBytes(in []image.PathBytes) []session.PathBytes {
	out := make([]session.PathBytes, len(in))
	for i, p := range in {
		out[i] = session.PathBytes{Path: p.Path, Files: p.Files, Bytes: p.Bytes}
	}
	return out
}

// unknownSession is the refusal of a call naming a session that does not
// exist; err is the lookup's.
func unknownSession(name string, err error) error {
	if !errors.Is(err, session.ErrNotFound) {
		return err
	}
	e := session.UnknownSession(name)
	e.Err = err
	return e
}

// roomFor refuses to write need more bytes for what while that would take
// the data directory below its floor (need 0: while it is below), with
// the figures.
func (m *Manager) roomFor(what string, need int64) error {
	free := m.freeSpace()
	if need <= free && free-need >= m.cfg.Floor {
		return nil
	}
	msg := fmt.Sprintf("cannot %s: the data directory %s has %s free", what, m.cfg.DataDir, session.FormatBytes(free))
	if need > 0 {
		msg = fmt.Sprintf("cannot %s: it needs %s and the data directory %s has %s free", what, session.FormatBytes(need), m.cfg.DataDir, session.FormatBytes(free))
	}
	if m.cfg.Floor > 0 {
		msg += fmt.Sprintf(", and keeps %s free (free_space_floor)", session.FormatBytes(m.cfg.Floor))
	}
	return &session.Error{Class: session.ErrNoSpace, Msg: msg, Hint: "free some space first", Err: syscall.ENOSPC}
}

package engine

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"syscall"
	"time"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/guest/image"
	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/vmm"
)

// System disks. A session of an image with a root filesystem has its own
// system disk: the writable upper layer of the overlay on the image's
// read-only layers. Packages it installs, /etc and /root live there and
// stay with the session across stop/start, sleep/wake and crashes; only
// Replace gives it a fresh one.

// newSystem makes the session's system disk when its image has a root
// filesystem, pinning the image's current build. The caller holds s.op.
func (s *sess) newSystem(ctx context.Context, imageName string, size int64) error {
	im, err := s.m.resolveImage(ctx, imageName, "")
	if err != nil {
		return err
	}
	if err := im.forNewSystem(); err != nil {
		return err
	}
	s.mu.Lock()
	s.rec.Image, s.rec.ImageDigest = im.Name, im.Digest
	s.rec.SystemUUID, s.rec.SystemBytes = "", 0
	s.mu.Unlock()
	if !im.RootFS() {
		os.Remove(s.sysPath())
		return nil
	}
	uuid := guestUUID()
	tmp := s.sysPath() + ".new"
	os.Remove(tmp)
	if err := image.CreateSystemDisk(ctx, tmp, size, uuid); err != nil {
		return err
	}
	if err := os.Rename(tmp, s.sysPath()); err != nil {
		os.Remove(tmp)
		return err
	}
	syncDir(s.dir())
	s.mu.Lock()
	s.rec.SystemUUID, s.rec.SystemBytes = uuid, size
	s.mu.Unlock()
	return nil
}

func guestUUID() string { return vmm.NewUUID() }

// forNewSystem refuses an image whose record lacks its config (an older
// import's): its commands would run as root, without its Env, which is
// not the image. Sessions made on it before keep running.
func (im Image) forNewSystem() error {
	if slices.Contains(im.Lacks, "config") {
		return &session.Error{Class: session.ErrInvalid, Msg: image.LacksError(im.Name, "config", "a new session or replace").Error()}
	}
	return nil
}

// systemAllocated is what the system disk holds on the host's disk.
func (s *sess) systemAllocated() int64 {
	var st syscall.Stat_t
	if syscall.Stat(s.sysPath(), &st) != nil {
		return 0
	}
	return st.Blocks * 512
}

// systemUsedLocked is the system disk's use as the session shows it: the
// guest's own figure while it runs and has been measured, else what the
// disk's file holds on the host (which counts the filesystem's metadata
// too, so it reads higher). Replace reports what it dropped in this same
// measure, so its report agrees with the warning a front end showed.
func (s *sess) systemUsedLocked() int64 {
	if session.State(s.rec.State) == session.StateRunning && s.stats.SystemSize > 0 {
		return s.stats.SystemUsed
	}
	return s.systemAllocated()
}

// Replace gives a session a new VM with a fresh system disk from its
// image (or another one) on the same retained workspace. Running commands
// end as a stop ends them, the workspace is flushed, and the old system
// disk is dropped.
func (m *Manager) Replace(ctx context.Context, name string, opts session.ReplaceOptions) (session.ReplaceResult, error) {
	var res session.ReplaceResult
	snap, err := m.lifecycle(ctx, name, "replace", func(s *sess) error {
		by := session.Actor(ctx)
		newImage := opts.Image
		s.mu.Lock()
		oldImage, oldDigest := s.rec.Image, s.rec.ImageDigest
		s.mu.Unlock()
		if newImage == "" {
			newImage = oldImage
		}
		// The new image must exist, and be one a system disk can be made
		// from, before anything is stopped.
		if im, err := m.resolveImage(ctx, newImage, ""); err != nil {
			return err
		} else if err := im.forNewSystem(); err != nil {
			return err
		}
		// Measured before the stop: once the VM is gone only the host's
		// figure is left, and it is not the one the session showed.
		s.mu.Lock()
		dropped := s.systemUsedLocked()
		s.mu.Unlock()
		if err := s.stopVM(ctx, by, "replace"); err != nil {
			return err
		}
		res.Dropped = dropped
		res.From = oldImage + "@" + orDash(oldDigest)
		if err := s.newSystem(ctx, newImage, s.systemBytesOr(m.cfg.Defaults.SystemBytes)); err != nil {
			return err
		}
		s.mu.Lock()
		s.rec.MachineID = randomMachineID() // a new machine
		res.To = s.rec.Image + "@" + s.rec.ImageDigest
		s.mu.Unlock()
		if err := s.setState(session.StateStopped, "replacing the VM: system disk reset", by); err != nil {
			return err
		}
		m.event(session.Event{Kind: session.EventNote, Name: name, By: by, Message: fmt.Sprintf(
			"replaced the VM: %s of system changes dropped (%s); new system disk from %s; /workspace kept", session.FormatBytes(res.Dropped), res.From, res.To)})
		how, err := s.bootNew(ctx, by)
		if err != nil {
			return err
		}
		if err := s.makeWorkDir(ctx); err != nil {
			return err
		}
		if oldImage != s.rec.Image || oldDigest != s.rec.ImageDigest {
			m.pruneImage(oldImage)
		}
		return s.setState(session.StateRunning, "replaced: a fresh VM from "+res.To+" on its retained workspace: "+how, by)
	})
	res.Session = snap
	return res, err
}

// systemBytesOr is the session's system disk size, or def.
func (s *sess) systemBytesOr(def int64) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rec.SystemBytes > 0 {
		return s.rec.SystemBytes
	}
	return def
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// CopyIn writes the tar stream r into the directory dst of the session's
// workspace (created if missing), durably: each file fsynced and renamed
// into place, each directory fsynced, before it returns.
func (m *Manager) CopyIn(ctx context.Context, name, dst string, r io.Reader) (session.CopyResult, error) {
	c, err := m.agentFor(name)
	if err != nil {
		return session.CopyResult{}, err
	}
	runID, err := m.useRun(ctx, name)
	if err != nil {
		return session.CopyResult{}, err
	}
	start := time.Now()
	res, err := c.Unpack(ctx, dst, r)
	if err != nil {
		return copyResult(res, start), agentErr(name, err)
	}
	m.addRunBytes(runID, res.Bytes)
	m.event(session.Event{Kind: session.EventNote, Name: name, By: session.Actor(ctx), Message: fmt.Sprintf("copied in %d files, %d directories, %d symlinks (%s) to %s", res.Files, res.Dirs, res.Symlinks, session.FormatBytes(res.Bytes), dst)})
	return copyResult(res, start), nil
}

// CopyOut streams the file or tree at src in the session's workspace as a
// tar. Symlinks are kept, never followed; one pointing out of the tree
// ends the stream with an error.
func (m *Manager) CopyOut(ctx context.Context, name, src string) (io.ReadCloser, error) {
	c, err := m.agentFor(name)
	if err != nil {
		return nil, err
	}
	r, err := c.Pack(ctx, src)
	if err != nil {
		return nil, agentErr(name, err)
	}
	return treeReader{r: r, name: name}, nil
}

type treeReader struct {
	r    *guest.TreeReader
	name string
}

func (t treeReader) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if err != nil && err != io.EOF {
		err = agentErr(t.name, err)
	}
	return n, err
}

func (t treeReader) Close() error { return t.r.Close() }

func copyResult(r guest.TreeResult, start time.Time) session.CopyResult {
	return session.CopyResult{Files: r.Files, Dirs: r.Dirs, Symlinks: r.Symlinks, Bytes: r.Bytes, Took: time.Since(start)}
}

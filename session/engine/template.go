package engine

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/vmm"
	"golang.org/x/sys/unix"
)

// Templates. For each image and VM size berth keeps a booted template: a
// memory snapshot of a VM whose agent is up and which has no workspace.
// Create restores it into a new VMM, hot-plugs the new session's
// workspace, and the agent mounts it: no boot at all. The snapshot file is
// only ever read, so sessions share nothing writable through it. A
// template is keyed by the image's files and the size, so a rebuilt image
// gets a new one; a template that fails to restore is removed and the
// create boots cold.

// templateCmdline is a template VM's kernel command line: no workspace and
// no system disk yet, the image's layers (the same for every session of
// the image) already mounted.
func templateCmdline(im Image) string { return bootCmdline("", "", im, "", "") }

// templateFormat changes when templates built before would still restore
// but behave worse (the kernel command line is baked into the snapshot).
// 2: QEMU boots with acpi=noirq. 3: snapshotted with the agent idle.
// 4: the agent mounts a system disk and sets the VM's identity on mount.
const templateFormat = 4

// templateSettle is how long a template VM idles after its host left,
// before it is snapshotted (measured: creates ~200 ms faster than with a
// snapshot taken at once, mid-teardown).
const templateSettle = 500 * time.Millisecond

// templateKey identifies a template: the image's build (its kernel and
// initramfs by size and mtime as well: a rebuilt image differs) and the VM
// size.
func templateKey(im Image, vmmName string, cpus, memMiB int, nic bool) string {
	h := sha256.New()
	fmt.Fprintf(h, "v%d %s %d %d %s@%s\n", templateFormat, vmmName, cpus, memMiB, im.Name, im.Digest)
	if nic {
		// A snapshot restores only into a VM with the same devices.
		fmt.Fprintf(h, "nic\n")
	}
	for _, l := range im.Layers {
		fmt.Fprintf(h, "layer %s\n", l.UUID)
	}
	for _, p := range []string{im.Kernel, im.Initramfs} {
		fi, err := os.Stat(p)
		if err != nil {
			return ""
		}
		fmt.Fprintf(h, "%d %d\n", fi.Size(), fi.ModTime().UnixNano())
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

func (m *Manager) templateDir(key string) string {
	return filepath.Join(m.cfg.DataDir, "templates", key)
}

// template returns the snapshot of a template for rec's image and size,
// building it (one cold boot) if there is none.
func (m *Manager) template(ctx context.Context, s *sess) (string, error) {
	s.mu.Lock()
	rec := s.rec
	s.mu.Unlock()
	d, err := m.driver(rec.VMM)
	if err != nil {
		return "", err
	}
	im, err := m.resolveImage(ctx, rec.Image, rec.ImageDigest)
	if err != nil {
		return "", err
	}
	nic := s.wantsNIC()
	key := templateKey(im, rec.VMM, rec.CPUs, rec.MemoryMiB, nic)
	if key == "" {
		return "", errors.New("image files missing")
	}
	m.tmplMu.Lock()
	defer m.tmplMu.Unlock()
	dir := m.templateDir(key)
	snap := filepath.Join(dir, "memory.snap")
	if _, err := os.Stat(snap); err == nil {
		return snap, nil
	}
	if err := m.checkFloor("build a template of image " + rec.Image); err != nil {
		return "", err
	}
	m.log.Info("building template", "key", key, "image", rec.Image, "cpus", rec.CPUs, "memory_mib", rec.MemoryMiB, "nic", nic)
	start := time.Now()
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", err
	}
	// Another daemon may build the same template at once (tests share
	// them): each builds in its own directory, the first rename wins.
	tmp, err := os.MkdirTemp(filepath.Dir(dir), "."+key+"-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	// The builder's lock, held (never inherited: O_CLOEXEC) until the
	// build ends, tells removePartialTemplates a live build from the
	// leftover of a daemon killed during one, whose VM would run on.
	unlock, err := lockBuild(tmp, d.Name())
	if err != nil {
		return "", err
	}
	defer unlock()
	if err := os.MkdirAll(filepath.Join(tmp, "vm"), 0o755); err != nil {
		return "", err
	}
	bctx, cancel := context.WithTimeout(ctx, m.cfg.BootTimeout)
	defer cancel()
	vm, err := d.Start(bctx, vmm.Config{
		Dir: filepath.Join(tmp, "vm"), Kernel: im.Kernel, Initramfs: im.Initramfs, Cmdline: templateCmdline(im),
		CPUs: rec.CPUs, MemoryMiB: rec.MemoryMiB, Layers: layerPaths(im), Accel: m.cfg.Defaults.Accel,
		// Its NIC is configured by the agent at boot and kept in the
		// snapshot; nothing serves it until a restored copy's supervise
		// does.
		NIC: nic,
	})
	if err != nil {
		return "", fmt.Errorf("boot the template VM: %w", err)
	}
	defer func() {
		vm.Kill(context.Background())
		vm.Close()
	}()
	sn, ok := vm.(vmm.Snapshotter)
	if !ok {
		return "", fmt.Errorf("the %s driver cannot snapshot VMs", rec.VMM)
	}
	c, err := guest.Dial(bctx, vm.DialAgent)
	if err != nil {
		return "", fmt.Errorf("template agent: %w", err)
	}
	_, err = c.Hello(bctx)
	c.Close() // the restored copies connect afresh through the handshake
	if err != nil {
		return "", fmt.Errorf("template agent: %w", err)
	}
	// Let the agent notice the host left and go back to waiting for one,
	// so that every restored copy starts there instead of tearing down a
	// dead session first (in translated-afresh code, on every create).
	select {
	case <-time.After(templateSettle):
	case <-bctx.Done():
		return "", bctx.Err()
	}
	if err := vm.Pause(bctx); err != nil {
		return "", err
	}
	if err := sn.Snapshot(bctx, filepath.Join(tmp, "memory.snap")); err != nil {
		return "", fmt.Errorf("snapshot the template: %w", err)
	}
	if _, err := syncFile(filepath.Join(tmp, "memory.snap")); err != nil {
		return "", err
	}
	if err := writeSynced(filepath.Join(tmp, templateImageFile), templateImage(im)); err != nil {
		return "", err
	}
	// A published template holds its snapshot and image record only;
	// the lock goes once it is published (a build without it would be
	// taken for a dead one).
	os.RemoveAll(filepath.Join(tmp, "vm"))
	os.Remove(filepath.Join(tmp, buildVMMFile))
	if err := os.Rename(tmp, dir); err != nil {
		if _, serr := os.Stat(snap); serr == nil {
			return snap, nil // built meanwhile by someone else
		}
		return "", err
	}
	os.Remove(filepath.Join(dir, buildLockFile))
	syncDir(filepath.Dir(dir))
	m.log.Info("template ready", "key", key, "took", time.Since(start).Round(time.Millisecond))
	return snap, nil
}

// bootFromTemplate restores the template into the session's VM directory,
// plugs in its disks and has the agent mount them.
func (s *sess) bootFromTemplate(ctx context.Context, snap string) error {
	rec, d, im, cfg, err := s.vmSetup(ctx)
	if err != nil {
		return err
	}
	// The template's VM, as it was snapshotted: the image's layers, no
	// disks of the session's own until they are hot-plugged below.
	disks := []struct {
		d    vmm.Disk
		path string
	}{{vmm.DiskSystem, cfg.System}, {vmm.DiskWorkspace, cfg.Workspace}}
	// The template was made with a NIC when the session wants one
	// (templateKey keeps the two apart), so cfg.NIC is left as it is.
	cfg.Cmdline, cfg.Workspace, cfg.System, cfg.Incoming = templateCmdline(im), "", "", snap
	bctx, cancel := context.WithTimeout(ctx, s.m.cfg.BootTimeout)
	defer cancel()
	start := time.Now()
	var steps []any
	step := func(name string) { steps = append(steps, name, time.Since(start).Round(time.Millisecond)) }
	defer func() { s.m.log.Debug("template restore", append([]any{"session", s.name}, steps...)...) }()
	vm, err := d.Start(bctx, cfg)
	step("restored")
	if err != nil {
		return fmt.Errorf("restore the template: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			vm.Kill(context.Background())
			vm.Close()
		}
	}()
	adder, isAdder := vm.(vmm.DiskAdder)
	if !isAdder {
		return fmt.Errorf("the %s driver cannot hot-plug disks", rec.VMM)
	}
	for _, disk := range disks {
		if disk.path == "" {
			continue
		}
		if err := adder.AddDisk(bctx, disk.d, disk.path); err != nil {
			if errors.Is(err, vmm.ErrInUse) {
				return fmt.Errorf("session %q: %w: %w", s.name, session.ErrConflict, err)
			}
			return err
		}
	}
	step("plugged")
	if err := vm.Resume(bctx); err != nil {
		return err
	}
	c, err := guest.Dial(bctx, vm.DialAgent)
	if err != nil {
		return fmt.Errorf("agent of the restored template: %w", err)
	}
	step("connected")
	seed := make([]byte, 64)
	rand.Read(seed)
	spec := guest.MountSpec{Workspace: rec.WorkspaceUUID, System: rec.SystemUUID, Hostname: s.name, MachineID: rec.MachineID, NICMAC: nicMAC(vm, rec)}
	if w, err := c.MountAt(bctx, spec, time.Now(), seed); err != nil || !w.Mounted {
		c.Close()
		if err != nil && im.RootFS() && strings.Contains(err.Error(), "system disk") {
			return fmt.Errorf("the system disk of %q did not mount (%v): it may be corrupt; `berth replace %s` gives the session a fresh one (the workspace is kept): %w", s.name, err, s.name, session.ErrInvalidState)
		}
		return fmt.Errorf("mount the session's disks in the restored template: %v", err)
	}
	step("mounted")
	ok = true
	s.attached(vm, c)
	return nil
}

// bootNew boots a new session's first VM: from a template when possible,
// else cold, saying why in the timeline.
func (s *sess) bootNew(ctx context.Context, by string) (string, error) {
	if s.m.cfg.NoTemplates {
		return "booted", s.boot(ctx)
	}
	snap, err := s.m.template(ctx, s)
	if err == nil {
		start := time.Now()
		if err = s.bootFromTemplate(ctx, snap); err == nil {
			return fmt.Sprintf("restored from a template in %s", time.Since(start).Round(time.Millisecond)), nil
		}
		if errors.Is(err, session.ErrConflict) || errors.Is(err, session.ErrInvalidState) {
			return "", err
		}
		// A broken template must not break every create: drop it.
		os.RemoveAll(filepath.Dir(snap))
	}
	if ctx.Err() != nil {
		return "", ctx.Err()
	}
	s.m.log.Warn("template unusable; cold boot", "session", s.name, "err", err)
	s.m.event(session.Event{Kind: session.EventNote, Name: s.name, By: by, Message: "template unusable (" + err.Error() + "); booting cold"})
	return "booted cold (template unusable)", s.boot(ctx)
}

// templateImageFile names the image build a template was made of, so
// that the template goes with the build: a template is a memory snapshot
// of the VM's size, and an image's builds come and go (rebuilds, imports,
// commits, image rm).
const templateImageFile = "image.json"

type templateOf struct {
	Image  string `json:"image"`
	Digest string `json:"digest"`
}

func templateImage(im Image) []byte {
	b, _ := json.Marshal(templateOf{Image: im.Name, Digest: im.Digest})
	return b
}

// Files of a template being built, besides its vm directory.
const (
	buildLockFile = "builder.lock"
	buildVMMFile  = "vmm" // the driver's name, to find its VM again
)

// lockBuild takes the lock of the template build in dir and names its
// driver there.
func lockBuild(dir, driver string) (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(dir, buildLockFile), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock the template build in %s: %w", dir, err)
	}
	if err := os.WriteFile(filepath.Join(dir, buildVMMFile), []byte(driver), 0o600); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}

// removePartialTemplates ends the builds a killed daemon left: their VMs
// (still running: a VMM outlives its daemon) are killed and their
// directories removed. A build whose lock is held is another daemon's
// that shares the templates (tests do), and so is one just made, whose
// builder may not hold its lock yet.
func (m *Manager) removePartialTemplates(ctx context.Context) {
	dirs, _ := filepath.Glob(filepath.Join(m.cfg.DataDir, "templates", ".*"))
	for _, dir := range dirs {
		fi, err := os.Stat(dir)
		if err != nil || !fi.IsDir() || time.Since(fi.ModTime()) < 5*time.Second {
			continue
		}
		f, err := os.OpenFile(filepath.Join(dir, buildLockFile), os.O_RDWR, 0)
		if err == nil {
			err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
			if err != nil {
				f.Close()
				continue // a live build
			}
		}
		if name, err := os.ReadFile(filepath.Join(dir, buildVMMFile)); err == nil {
			if d, err := m.driver(string(name)); err == nil {
				actx, cancel := context.WithTimeout(ctx, 10*time.Second)
				if vm, err := d.Attach(actx, filepath.Join(dir, "vm")); err == nil {
					m.log.Warn("killing the VM of a template build a daemon left", "dir", dir)
					vm.Kill(actx)
					vm.Close()
				}
				cancel()
			}
		}
		m.log.Info("removing an interrupted template build", "dir", dir)
		os.RemoveAll(dir)
		if f != nil {
			f.Close()
		}
	}
}

// dropTemplates removes the templates of the builds of image name with
// the given digests (gone from the store). Templates made before they
// named their build are left to the fallback that drops a template that
// does not restore.
func (m *Manager) dropTemplates(name string, digests []string) {
	if len(digests) == 0 {
		return
	}
	m.tmplMu.Lock()
	defer m.tmplMu.Unlock()
	files, _ := filepath.Glob(filepath.Join(m.cfg.DataDir, "templates", "*", templateImageFile))
	for _, f := range files {
		if strings.HasPrefix(filepath.Base(filepath.Dir(f)), ".") {
			continue // being built (by another daemon sharing the directory) or removed
		}
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var t templateOf
		if json.Unmarshal(b, &t) != nil || t.Image != name || !slices.Contains(digests, t.Digest) {
			continue
		}
		dir := filepath.Dir(f)
		// Renamed away first, so a create never finds half of one.
		gone := filepath.Join(filepath.Dir(dir), "."+filepath.Base(dir)+"-rm")
		if os.Rename(dir, gone) == nil {
			os.RemoveAll(gone)
			m.log.Info("template removed with its image build", "image", name, "digest", t.Digest, "key", filepath.Base(dir))
		}
	}
}

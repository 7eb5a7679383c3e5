package cloudhypervisor

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/berthvm/berth/vmm"
	"github.com/berthvm/berth/vmm/cloudhypervisor/internal/chapi"
)

// A session's disks in CH: the workspace and the system disk read-write,
// the image's layers read-only, all raw. Their ids name them in CH's
// config, so in every snapshot's config.json, where a restore finds them
// again; their PCI slots are fixed (the QEMU driver's), so a disk
// hot-plugged into a restored template sits where a cold boot puts it.
//
// CH (v53.0) locks each image with an OFD lock when it opens the device:
// a write lock for a writable disk, a shared read lock for a read-only
// one. Any number of VMs can so hold a layer, while a writer is refused,
// and a writer's image is refused to everyone else.
const (
	workspaceDiskID = "workspace"
	systemDiskID    = "system"
	layerDiskID     = "layer" // + the layer's index, from 0
)

// PCI device ids (slots of segment 0) of the disks. CH gives the devices
// berth does not place (virtio-rng, vsock) the lowest free slots.
const (
	workspaceSlot uint8 = 4
	systemSlot    uint8 = 5
	layerSlot0    uint8 = 6
)

// sessionDisk is one disk of a vmm.Config as CH gets it.
type sessionDisk struct {
	id       string
	what     string // for messages: "workspace", "system disk", "layer 0"
	field    string // the vmm.Config field that asks for it
	path     string
	readonly bool
	slot     uint8
}

func (s sessionDisk) config() chapi.DiskConfig {
	// Raw must be explicit: for an auto-detected raw image CH denies guest
	// writes to sector 0.
	raw := chapi.Raw
	return chapi.DiskConfig{Id: &s.id, Path: &s.path, Readonly: &s.readonly, ImageType: &raw, PciDeviceId: &s.slot}
}

// hotPluggable is where vmm.DiskAdder's disks go.
func hotPluggable(d vmm.Disk, path string) (sessionDisk, bool) {
	switch d {
	case vmm.DiskWorkspace:
		return sessionDisk{id: workspaceDiskID, what: "workspace", field: "Workspace", path: path, slot: workspaceSlot}, true
	case vmm.DiskSystem:
		return sessionDisk{id: systemDiskID, what: "system disk", field: "System", path: path, slot: systemSlot}, true
	}
	return sessionDisk{}, false
}

// sessionDisks are the disks cfg asks for, in the order CH gets them.
func sessionDisks(cfg vmm.Config) []sessionDisk {
	var ds []sessionDisk
	for _, d := range []struct {
		d    vmm.Disk
		path string
	}{{vmm.DiskWorkspace, cfg.Workspace}, {vmm.DiskSystem, cfg.System}} {
		if d.path != "" {
			s, _ := hotPluggable(d.d, d.path)
			ds = append(ds, s)
		}
	}
	for i, l := range cfg.Layers {
		ds = append(ds, sessionDisk{
			id:       fmt.Sprintf("%s%d", layerDiskID, i),
			what:     fmt.Sprintf("layer %d", i),
			field:    fmt.Sprintf("Layers[%d]", i),
			path:     l,
			readonly: true,
			slot:     layerSlot0 + uint8(i),
		})
	}
	return ds
}

func diskConfigs(cfg vmm.Config) *[]chapi.DiskConfig {
	ds := sessionDisks(cfg)
	if len(ds) == 0 {
		return nil
	}
	out := make([]chapi.DiskConfig, len(ds))
	for i, d := range ds {
		out[i] = d.config()
	}
	return &out
}

// validateDisks refuses what CH would only refuse at vm.boot, or not at
// all: too many layers, and one image given twice (its second open would
// fail on the first one's lock, or share a writer's image read-only).
func validateDisks(cfg vmm.Config) error {
	if len(cfg.Layers) > vmm.MaxLayers {
		return fmt.Errorf("%d image layers, over the limit of %d", len(cfg.Layers), vmm.MaxLayers)
	}
	seen := make(map[string]string)
	for _, d := range sessionDisks(cfg) {
		if d.path == "" {
			return fmt.Errorf("%s: empty path", d.field)
		}
		p := filepath.Clean(d.path)
		if other, dup := seen[p]; dup {
			return fmt.Errorf("%s is given both as %s and as %s: every disk needs its own image", d.path, other, d.what)
		}
		seen[p] = d.what
	}
	return nil
}

// checkDisksFree refuses, before anything is launched, a disk that CH
// could not lock at vm.boot: a workspace or system disk any other process
// holds, or a layer someone holds for writing. CH would only notice at
// vm.boot. A refused disk yields vmm.ErrInUse.
func checkDisksFree(cfg vmm.Config) error {
	for _, d := range sessionDisks(cfg) {
		if err := d.checkFree(); err != nil {
			return err
		}
	}
	return nil
}

func (d sessionDisk) checkFree() error {
	probe := locked
	if d.readonly {
		probe = writeLocked
	}
	held, err := probe(d.path)
	if err != nil {
		return fmt.Errorf("%s: %w", d.what, err)
	}
	if !held {
		return nil
	}
	holder := "another process"
	if pid := vmm.HolderPid(d.path); pid > 0 {
		holder = fmt.Sprintf("another process (VM pid %d)", pid)
	}
	if d.readonly {
		return fmt.Errorf("%s %s is locked for writing by %s: %w", d.what, d.path, holder, vmm.ErrInUse)
	}
	return fmt.Errorf("%s %s is locked by %s: %w", d.what, d.path, holder, vmm.ErrInUse)
}

var _ vmm.DiskAdder = (*VM)(nil)

// AddDisk implements vmm.DiskAdder with vm.add-disk: the disk gets the id,
// options and PCI slot a cold boot gives it, so snapshots of the VM
// restore with the ordinary Config. Adding a disk the VM already has at
// path returns nil. A disk another process holds yields vmm.ErrInUse.
func (v *VM) AddDisk(ctx context.Context, d vmm.Disk, path string) error {
	const op = "vm.add-disk"
	if err := v.usable(op); err != nil {
		return err
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	disk, ok := hotPluggable(d, abs)
	if !ok {
		return fmt.Errorf("cloud-hypervisor %s: unknown disk %q (want %s or %s)", op, d, vmm.DiskWorkspace, vmm.DiskSystem)
	}
	info, hot, err := v.api.addDisk(ctx, disk.config())
	if err == nil && !hot {
		// 204: CH holds a VM that is not booted, and only added the disk
		// to its config.
		return fmt.Errorf("cloud-hypervisor %s: the VM is not booted, so the %s was only added to its configuration: start the session again: %w",
			op, disk.what, vmm.ErrNotRunning)
	}
	if err == nil {
		v.log.Info("disk hot-plugged", "disk", disk.id, "path", abs, "bdf", info.Bdf)
		return nil
	}
	return v.explainAddDisk(ctx, disk, err)
}

// explainAddDisk applies the vm.info rule to a failed vm.add-disk: the
// disk may be there anyway, under this path (done) or another (refused);
// else a lock someone holds on the image means it is in use.
func (v *VM) explainAddDisk(ctx context.Context, disk sessionDisk, err error) error {
	const op = "vm.add-disk"
	if v.vmmGone(ctx, err) {
		return v.notRunning(op)
	}
	info, ierr := v.api.info(ctx)
	switch {
	case errors.Is(ierr, errNoVM):
		return fmt.Errorf("%w; this cloud-hypervisor holds no VM: kill it and start the session again", err)
	case ierr == nil && info.Config.Disks != nil:
		for _, dc := range *info.Config.Disks {
			if dc.Id == nil || *dc.Id != disk.id {
				continue
			}
			if dc.Path != nil && filepath.Clean(*dc.Path) == disk.path {
				v.log.Debug("vm.add-disk failed but the VM has the disk", "disk", disk.id, "err", err)
				return nil
			}
			have := "?"
			if dc.Path != nil {
				have = *dc.Path
			}
			return fmt.Errorf("the VM already has a %s (%s), so %s cannot be attached as one: %w", disk.what, have, disk.path, err)
		}
	}
	if ferr := disk.checkFree(); errors.Is(ferr, vmm.ErrInUse) {
		return fmt.Errorf("%w (%w)", ferr, err)
	}
	return fmt.Errorf("attach %s %s: %w", disk.what, disk.path, err)
}

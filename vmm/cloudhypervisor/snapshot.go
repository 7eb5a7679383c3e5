package cloudhypervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/berthvm/berth/vmm"
	"github.com/berthvm/berth/vmm/cloudhypervisor/internal/chapi"
)

// Files CH writes into a snapshot directory.
const (
	snapConfig = "config.json"   // the VmConfig, with every host path
	snapState  = "state.json"    // CPU and device state
	snapMemory = "memory-ranges" // guest RAM
)

// Snapshot implements vmm.Snapshotter: it saves the paused VM's memory and
// device state into the directory path (created if missing; it must not
// hold a snapshot already). Disk contents are not saved. The VM stays
// paused. Restore with Config.Incoming = path.
func (v *VM) Snapshot(ctx context.Context, path string) error {
	if err := v.usable("vm.snapshot"); err != nil {
		return err
	}
	if !filepath.IsAbs(path) {
		return fmt.Errorf("snapshot path %q must be absolute", path)
	}
	if _, err := os.Stat(filepath.Join(path, snapConfig)); err == nil {
		return fmt.Errorf("%s already holds a snapshot: remove it or choose another directory", path)
	}
	_, statErr := os.Stat(path)
	created := errors.Is(statErr, fs.ErrNotExist)
	if err := os.MkdirAll(path, 0o700); err != nil {
		return fmt.Errorf("snapshot directory: %w", err)
	}
	err := v.api.snapshot(ctx, path)
	if err == nil {
		v.log.Info("snapshot saved", "path", path)
		return nil
	}
	// A failed snapshot can leave a partial config.json, which would make
	// the next attempt fail: clear what CH may have written.
	if created {
		os.RemoveAll(path)
	} else {
		for _, f := range []string{snapConfig, snapState, snapMemory} {
			os.Remove(filepath.Join(path, f))
		}
	}
	if v.vmmGone(ctx, err) {
		return v.notRunning("vm.snapshot")
	}
	st, ierr := v.api.stateAfter(ctx)
	if ierr == nil && st != chapi.Paused {
		return fmt.Errorf("snapshot needs a paused VM and this one is %s: pause it first: %w", st, err)
	}
	return fmt.Errorf("snapshot to %s: %w", path, err)
}

// prepareRestore checks a snapshot and points the host paths in its
// config.json at this start's directory and disks. CH reopens exactly
// the paths recorded there, so a snapshot restored into another directory
// would otherwise bind the old VM's vsock socket and write the old console.
func prepareRestore(cfg vmm.Config, p paths) error {
	file := filepath.Join(cfg.Incoming, snapConfig)
	raw, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("snapshot %s: %w (not a cloud-hypervisor snapshot directory?)", cfg.Incoming, err)
	}
	// Patched as generic JSON: config.json is CH's internal VmConfig, which
	// carries fields the API model does not, and all must survive.
	var c map[string]any
	if err := json.Unmarshal(raw, &c); err != nil {
		return fmt.Errorf("snapshot %s: malformed %s: %w", cfg.Incoming, snapConfig, err)
	}
	changed := false
	set := func(obj any, key, val string) {
		if m, ok := obj.(map[string]any); ok && m[key] != val {
			m[key] = val
			changed = true
		}
	}
	set(c["vsock"], "socket", p.vsock)
	if s, ok := c["serial"].(map[string]any); ok && s["mode"] == string(chapi.ConsoleModeFile) {
		set(s, "file", p.console)
	}
	// The disks are matched by id: a VM restored from a template and given
	// its disks by AddDisk lists them in another order than a cold boot.
	want := make(map[string]sessionDisk)
	for _, d := range sessionDisks(cfg) {
		want[d.id] = d
	}
	disks, _ := c["disks"].([]any)
	for _, d := range disks {
		m, ok := d.(map[string]any)
		if !ok {
			return fmt.Errorf("snapshot %s: malformed disk %v in %s", cfg.Incoming, d, snapConfig)
		}
		id, _ := m["id"].(string)
		w, ok := want[id]
		if !ok {
			return fmt.Errorf("snapshot %s has a disk %q (%v) that the VM's configuration lacks: restore needs the same disks the VM had", cfg.Incoming, id, m["path"])
		}
		if ro, _ := m["readonly"].(bool); ro != w.readonly {
			return fmt.Errorf("snapshot %s has its %s attached with readonly=%v, not %v as berth attaches it", cfg.Incoming, w.what, ro, w.readonly)
		}
		set(m, "path", w.path)
		delete(want, id)
	}
	for _, d := range sessionDisks(cfg) {
		if _, missing := want[d.id]; missing {
			return fmt.Errorf("snapshot %s has no %s, but Config.%s is set: restore needs the same disks the VM had", cfg.Incoming, d.what, d.field)
		}
	}
	if !changed {
		return nil
	}
	out, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("snapshot %s: %w", cfg.Incoming, err)
	}
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, out, 0o600); err != nil {
		return fmt.Errorf("rewrite snapshot config: %w", err)
	}
	if err := os.Rename(tmp, file); err != nil {
		return fmt.Errorf("rewrite snapshot config: %w", err)
	}
	return nil
}

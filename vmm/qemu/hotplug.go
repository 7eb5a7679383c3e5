package qemu

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/berthvm/berth/vmm"
)

var _ vmm.DiskAdder = (*VM)(nil)

// AddDisk hot-plugs a session disk with the same options and PCI slot as
// a cold boot's -drive/-device pair.
func (v *VM) AddDisk(ctx context.Context, d vmm.Disk, path string) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	slot, drive, dev := diskSlot(d)
	err = v.exec(ctx, "blockdev-add", map[string]any{
		"driver": "raw", "node-name": drive, "discard": "unmap",
		"cache": map[string]any{"direct": false, "no-flush": false},
		"file":  map[string]any{"driver": "file", "filename": abs, "locking": "on"},
	}, nil)
	if err != nil {
		var qe *QMPError
		if errors.As(err, &qe) && strings.Contains(qe.Desc, "lock") {
			holder := ""
			if pid := vmm.HolderPid(abs); pid > 0 {
				holder = fmt.Sprintf(" by VM pid %d", pid)
			}
			return fmt.Errorf("%s %s is in use%s: %w", d, abs, holder, vmm.ErrInUse)
		}
		return fmt.Errorf("attach %s: %w", d, err)
	}
	if err := v.exec(ctx, "device_add", map[string]any{
		"driver": "virtio-blk-pci", "drive": drive, "id": dev, "addr": slot,
		"werror": "enospc", "rerror": "report",
	}, nil); err != nil {
		return fmt.Errorf("plug %s: %w", d, err)
	}
	return nil
}

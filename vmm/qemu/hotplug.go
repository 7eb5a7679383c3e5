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

// AddWorkspace hot-plugs the workspace image with the same options and
// PCI slot as a cold boot's -drive/-device pair.
func (v *VM) AddWorkspace(ctx context.Context, path string) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	err = v.exec(ctx, "blockdev-add", map[string]any{
		"driver": "raw", "node-name": "ws", "discard": "unmap",
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
			return fmt.Errorf("workspace %s is in use%s: %w", abs, holder, vmm.ErrInUse)
		}
		return fmt.Errorf("attach workspace: %w", err)
	}
	if err := v.exec(ctx, "device_add", map[string]any{
		"driver": "virtio-blk-pci", "drive": "ws", "id": "wsdev", "addr": wsSlot,
	}, nil); err != nil {
		return fmt.Errorf("plug workspace: %w", err)
	}
	return nil
}

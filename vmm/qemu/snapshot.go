package qemu

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/berthvm/berth/vmm"
	"golang.org/x/sys/unix"
)

// shellQuote quotes s for the shell QEMU's exec: migration runs.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// Snapshot saves a paused VM's memory and device state to path. QEMU 7.2
// has no file: migration URI, so the stream goes through `exec:cat`. The
// workspace disk is not part of it: the caller keeps the disk untouched
// until the snapshot is restored.
func (v *VM) Snapshot(ctx context.Context, path string) error {
	st, err := v.Status(ctx)
	if err != nil {
		return err
	}
	if st != vmm.StatePaused {
		return fmt.Errorf("snapshot needs a paused VM, this one is %s", st)
	}
	// QEMU caps a migration at 128 MiB/s by default, for sharing a network
	// with a running VM; this one is paused and goes to a local file, so
	// the cap only makes the pause longer.
	if err := v.exec(ctx, "migrate-set-parameters", map[string]any{"max-bandwidth": int64(1) << 40}, nil); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	if err := v.exec(ctx, "migrate", map[string]any{"uri": "exec:cat > " + shellQuote(path)}, nil); err != nil {
		return err
	}
	if err := v.waitMigration(ctx, "snapshot"); err != nil {
		return diskFull(path, err)
	}
	// QEMU reports the migration completed a moment before it leaves the
	// finish-migrate run state, and refuses cont until it has ("Migration
	// is not finalized yet"): a memory checkpoint, which resumes the VM
	// at once, failed so now and then.
	return v.leaveRunState(ctx, "finish-migrate", "snapshot")
}

// diskFull names a full disk as the cause of a failed snapshot. QEMU sees
// only its exec: writer end ("Unable to write to command: Broken pipe"),
// which tells an operator nothing; a filesystem left with almost no room
// where the snapshot was being written says what happened.
func diskFull(path string, err error) error {
	var fs unix.Statfs_t
	if unix.Statfs(filepath.Dir(path), &fs) != nil {
		return err
	}
	if free := int64(fs.Bavail) * fs.Bsize; free < 1<<20 {
		return fmt.Errorf("%w: the disk holding %s is full (%d bytes free): %w", err, filepath.Dir(path), free, syscall.ENOSPC)
	}
	return err
}

// leaveRunState waits until the VM's run state is no longer state.
func (v *VM) leaveRunState(ctx context.Context, state, what string) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		var rs struct {
			Status string `json:"status"`
		}
		if err := v.exec(ctx, "query-status", nil, &rs); err != nil {
			return err
		}
		if rs.Status != state {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: the VM stayed in %s: %w", what, state, ctx.Err())
		case <-t.C:
		}
	}
}

func (v *VM) waitMigration(ctx context.Context, what string) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		var st struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		if err := v.exec(ctx, "query-migrate", nil, &st); err != nil {
			return err
		}
		switch st.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("%s failed: %s", what, st.ErrorDesc)
		case "":
			// Incoming migrations report nothing until done; check the run state.
			var rs struct {
				Status string `json:"status"`
			}
			if err := v.exec(ctx, "query-status", nil, &rs); err == nil && rs.Status == "paused" {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			// Stop the stream, or it keeps writing after the caller gave up.
			cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			v.exec(cctx, "migrate_cancel", nil, nil)
			cancel()
			return fmt.Errorf("%s: %w", what, ctx.Err())
		case <-t.C:
		}
	}
}

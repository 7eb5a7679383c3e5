package vmm

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// NewUUID returns a random RFC 4122 version 4 UUID: the workspace
// filesystem's identity, which the agent checks before mounting.
func NewUUID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// CreateWorkspace makes a sparse raw image of size bytes at path, formatted
// ext4 with the given UUID and label "workspace". The image must not exist.
func CreateWorkspace(ctx context.Context, path string, size int64, uuid string) error {
	if size < 16<<20 {
		return fmt.Errorf("workspace size %d bytes is below the 16 MiB minimum", size)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create workspace image: %w", err)
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		os.Remove(path)
		return fmt.Errorf("size workspace image: %w", err)
	}
	f.Close()
	// metadata_csum_seed: the UUID can be changed while mounted (a fork
	// takes one of its own) without rewriting every checksum.
	cmd := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-L", "workspace", "-U", uuid, "-O", "metadata_csum_seed",
		"-E", "lazy_itable_init=1,lazy_journal_init=1,root_owner=0:0", "-m", "0", path)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 5 * time.Second
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Remove(path)
		if _, lerr := exec.LookPath("mkfs.ext4"); lerr != nil {
			return fmt.Errorf("format workspace: mkfs.ext4 not found (install Debian's e2fsprogs)")
		}
		return fmt.Errorf("format workspace: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

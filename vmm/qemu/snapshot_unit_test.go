package qemu

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// A snapshot whose exec: writer died on a full disk says the disk is full;
// one that failed with room to spare keeps QEMU's own words.
func TestSnapshotNamesAFullDisk(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("mounts a tmpfs: needs root")
	}
	full := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", full).CombinedOutput(); err != nil {
		t.Skipf("mount tmpfs: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", full).Run() })
	f, err := os.Create(filepath.Join(full, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	for err == nil {
		_, err = f.Write(make([]byte, 4096))
	}
	f.Close()
	qemuSaid := errors.New("snapshot failed: Unable to write to command: Broken pipe")
	tests := []struct {
		dir  string
		full bool
	}{
		{full, true},
		{t.TempDir(), false},
	}
	for _, tt := range tests {
		err := diskFull(filepath.Join(tt.dir, "memory.tmp"), qemuSaid)
		if !errors.Is(err, qemuSaid) || errors.Is(err, syscall.ENOSPC) != tt.full {
			t.Errorf("%s: %v (want a full disk named: %v)", tt.dir, err, tt.full)
		}
	}
}

package qemu

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/vmm"
	"github.com/berthvm/berth/vmm/vmmtest"
)

// A VM restored with a NIC has the NIC's client before anyone can resume
// it: QEMU 7.2 dies of SIGSEGV on `cont` when a restored virtio-net has
// frames queued and its stream netdev no client (see Start).
func TestRestoredNICHasClient(t *testing.T) {
	if testing.Short() {
		t.Skip("boots VMs")
	}
	d := driver(t)
	im := vmmtest.Image(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	cfg := vmm.Config{Dir: filepath.Join(dir, "a"), Kernel: im.Kernel, Initramfs: im.Initramfs, CPUs: 1, MemoryMiB: 256, NIC: true, Accel: vmm.AccelAuto}
	v, err := d.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Kill(context.Background())
	if err := v.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	snap := filepath.Join(dir, "memory.snap")
	if err := v.(vmm.Snapshotter).Snapshot(ctx, snap); err != nil {
		t.Fatal(err)
	}
	v.Kill(ctx)

	in := cfg
	in.Dir, in.Incoming = filepath.Join(dir, "b"), snap
	r, err := d.Start(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Kill(context.Background())
	var out string
	if err := r.(*VM).exec(ctx, "human-monitor-command", map[string]string{"command-line": "info network"}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "type=stream,unix:") {
		t.Fatalf("the restored VM's NIC has no client before its resume:\n%s", out)
	}
	if err := r.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	// The client made for the resume is the first DialNIC's.
	c, err := r.(vmm.NICDialer).DialNIC(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if st, err := r.Status(ctx); err != nil || st != vmm.StateRunning {
		t.Fatalf("after the resume: %s, %v", st, err)
	}
}

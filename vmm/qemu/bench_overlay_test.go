package qemu

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/guest/image"
	"github.com/berthvm/berth/vmm"
	"github.com/berthvm/berth/vmm/vmmtest"
)

func allocated(path string) int64 {
	var st syscall.Stat_t
	if syscall.Stat(path, &st) != nil {
		return -1
	}
	return st.Blocks * 512
}

// TestBenchOverlayVsQcow2 measures the two ways to give a session a
// writable root over a shared base: overlayfs in the guest with the
// session's changes on a raw ext4 disk (what berth does), against a qcow2
// overlay whose backing file is the base layer. Same VM, same base, same
// workloads: writing a new 40 MB file (the base layer has little room), and changing one byte of a 7 MB
// file that the base holds (overlayfs copies the whole file up; qcow2
// copies one cluster).
func TestBenchOverlayVsQcow2(t *testing.T) {
	if os.Getenv("BERTH_BENCH") == "" {
		t.Skip("set BERTH_BENCH=1 (make bench)")
	}
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("qemu-img not found")
	}
	deb := vmmtest.Debian(t)
	d := driver(t)
	ctx := context.Background()
	dir := t.TempDir()
	ws, wsUUID := filepath.Join(dir, "ws.img"), vmm.NewUUID()
	sys, sysUUID := filepath.Join(dir, "system.img"), vmm.NewUUID()
	if err := vmm.CreateWorkspace(ctx, ws, 64<<20, wsUUID); err != nil {
		t.Fatal(err)
	}
	if err := image.CreateSystemDisk(ctx, sys, 4<<30, sysUUID); err != nil {
		t.Fatal(err)
	}
	qcow := filepath.Join(dir, "root.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-b", deb.Layers[0].Path, "-F", "raw", qcow, "4G").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v %s", err, out)
	}
	t.Logf("BENCH %-44s system disk %d bytes, qcow2 overlay %d bytes", "new writable root allocated", allocated(sys), allocated(qcow))

	start := time.Now()
	vm, err := d.Start(ctx, vmm.Config{
		Dir: filepath.Join(dir, "vm"), Kernel: deb.Kernel, Initramfs: deb.Initramfs,
		Cmdline: fmt.Sprintf("berth.ws=%s berth.layers=%s berth.sys=%s", wsUUID, deb.Layers[0].UUID, sysUUID),
		CPUs:    1, MemoryMiB: 512, Workspace: ws, System: sys, Layers: []string{deb.Layers[0].Path}, Accel: vmm.AccelAuto,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { vm.Kill(ctx); vm.Close() }()
	c, err := guest.Dial(ctx, vm.DialAgent)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if h, err := c.Hello(ctx); err != nil || !h.System.Mounted {
		t.Fatalf("hello: %+v %v", h, err)
	}
	t.Logf("overlay root booted in %s", time.Since(start).Round(time.Millisecond))
	sh := func(script string) (string, time.Duration) {
		t.Helper()
		start := time.Now()
		r := vmmtest.Run(t, c, "", "/bin/sh", "-c", script)
		if r.Err != nil || r.Exit.ExitCode != 0 {
			t.Fatalf("%s: %v exit %d: %s%s", script, r.Err, r.Exit.ExitCode, r.Stdout, r.Stderr)
		}
		return string(r.Stdout), time.Since(start)
	}

	// The qcow2 overlay, hot-plugged into the same VM and mounted as a
	// second root: its files are the base's, writes go to the qcow2.
	mon := vm.(*VM).Monitor()
	if err := mon.Execute(ctx, "blockdev-add", map[string]any{
		"driver": "qcow2", "node-name": "q", "cache": map[string]any{"direct": false, "no-flush": false},
		"file": map[string]any{"driver": "file", "filename": qcow},
	}, nil); err != nil {
		t.Fatal(err)
	}
	if err := mon.Execute(ctx, "device_add", map[string]any{"driver": "virtio-blk-pci", "drive": "q", "id": "qdev", "addr": "0x10", "serial": "berth-qcow2"}, nil); err != nil {
		t.Fatal(err)
	}
	out, _ := sh(`for i in $(seq 100); do for d in /sys/block/vd*; do [ "$(cat $d/serial 2>/dev/null)" = berth-qcow2 ] && { echo ${d##*/}; exit 0; }; done; sleep 0.05; done; exit 1`)
	dev := "/dev/" + strings.TrimSpace(out)
	sh("mkdir -p /mnt/q && mount -o rw,noatime " + dev + " /mnt/q")

	const big = "usr/bin/python3.11"
	for _, c := range []struct {
		name, root, file string
	}{{"overlayfs + raw system disk", "", sys}, {"qcow2 overlay of the base", "/mnt/q/upper", qcow}} {
		before := allocated(c.file)
		_, write := sh(fmt.Sprintf("dd if=/dev/zero of=%s/root/big bs=1M count=40 conv=fsync 2>/dev/null", c.root))
		afterWrite := allocated(c.file)
		_, touch := sh(fmt.Sprintf("printf x | dd of=%s/%s bs=1 seek=4096 conv=notrunc,fsync 2>/dev/null", c.root, big))
		afterTouch := allocated(c.file)
		t.Logf("BENCH %-44s write 40 MB %6.1f MB/s (+%d MB on host); 1 byte into a 7 MB base file %6s (+%d KB)",
			c.name, 40/write.Seconds(), (afterWrite-before)>>20, touch.Round(time.Millisecond), (afterTouch-afterWrite)>>10)
	}
	size, _ := sh("stat -c %s /" + big)
	n, _ := strconv.Atoi(strings.TrimSpace(size))
	t.Logf("(%s is %d bytes)", big, n)
}

package cloudhypervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthvm/berth/vmm"
	"github.com/berthvm/berth/vmm/cloudhypervisor/chfake"
	"github.com/berthvm/berth/vmm/cloudhypervisor/internal/chapi"
)

// writeImage makes a 1 MiB image at path.
func writeImage(t *testing.T, path string) string {
	t.Helper()
	if err := os.WriteFile(path, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// testLayers makes n layer images, for VMs to share.
func testLayers(t *testing.T, n int) []string {
	t.Helper()
	dir := t.TempDir()
	var ls []string
	for i := range n {
		ls = append(ls, writeImage(t, filepath.Join(dir, fmt.Sprintf("layer%d.img", i))))
	}
	return ls
}

// rootfsConfig is testConfig with a system disk of its own and layers.
func rootfsConfig(t *testing.T, layers []string) vmm.Config {
	t.Helper()
	cfg := testConfig(t)
	cfg.System = writeImage(t, filepath.Join(filepath.Dir(cfg.Dir), "system.img"))
	cfg.Layers = layers
	return cfg
}

// lockOther takes an OFD lock of type typ on path, as another VMM would.
func lockOther(t *testing.T, path string, typ int16) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	lk := unix.Flock_t{Type: typ}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk); err != nil {
		t.Fatal(err)
	}
}

type wantDisk struct {
	id, path string
	readonly bool
	bdf      string
}

// checkDisks compares what CH was asked for with want, in any order:
// ids, paths, read-only, Raw, and each disk's PCI address.
func checkDisks(t *testing.T, v *VM, want []wantDisk) {
	t.Helper()
	info := vmInfo(t, v)
	got := make(map[string]chapi.DiskConfig)
	if info.Config.Disks != nil {
		for _, dc := range *info.Config.Disks {
			got[*dc.Id] = dc
		}
	}
	if len(got) != len(want) {
		t.Errorf("disks = %d, want %d", len(got), len(want))
	}
	addr := bdfs(info)
	for _, w := range want {
		dc, ok := got[w.id]
		switch {
		case !ok:
			t.Errorf("no disk %q", w.id)
		case *dc.Path != w.path || dc.Readonly == nil || *dc.Readonly != w.readonly || dc.ImageType == nil || *dc.ImageType != chapi.Raw:
			t.Errorf("disk %s = path %s readonly %v type %v, want %s readonly %v Raw", w.id, *dc.Path, dc.Readonly, dc.ImageType, w.path, w.readonly)
		case addr[w.id] != w.bdf:
			t.Errorf("disk %s at %q, want %s", w.id, addr[w.id], w.bdf)
		}
	}
}

// bdfs reads each device's PCI address from vm.info's device tree, where
// the virtio-pci node holding it has the device as its child.
func bdfs(info chapi.VmInfo) map[string]string {
	out := make(map[string]string)
	if info.DeviceTree == nil {
		return out
	}
	for _, n := range *info.DeviceTree {
		if n.PciBdf != nil && n.Children != nil && len(*n.Children) == 1 {
			out[(*n.Children)[0]] = *n.PciBdf
		}
	}
	return out
}

func coldDisks(cfg vmm.Config) []wantDisk {
	ds := []wantDisk{
		{"workspace", cfg.Workspace, false, "0000:00:04.0"},
		{"system", cfg.System, false, "0000:00:05.0"},
	}
	for i, l := range cfg.Layers {
		ds = append(ds, wantDisk{fmt.Sprintf("layer%d", i), l, true, fmt.Sprintf("0000:00:%02x.0", 6+i)})
	}
	return ds
}

// TestColdBootDisks: the workspace and system disk go read-write, the
// layers read-only, each at its fixed slot; CH write-locks the writable
// ones and only read-locks the layers.
func TestColdBootDisks(t *testing.T) {
	d := newTestDriver(t, fakeBinary(t), nil)
	cfg := rootfsConfig(t, testLayers(t, 2))
	v := startVM(t, d, cfg)
	checkDisks(t, v, coldDisks(cfg))
	for _, p := range []string{cfg.Workspace, cfg.System} {
		if held, err := writeLocked(p); err != nil || !held {
			t.Errorf("%s: write-locked = %v, %v; want true", p, held, err)
		}
	}
	for _, l := range cfg.Layers {
		held, err := locked(l)
		wheld, werr := writeLocked(l)
		if err != nil || werr != nil || !held || wheld {
			t.Errorf("layer %s: locked %v, write-locked %v (%v, %v); want a read lock only", l, held, wheld, err, werr)
		}
	}
	conn, err := v.DialAgent(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	echoCheck(t, conn)
	conn.Close()
}

// TestDiskInUse: the one-writer rule covers the system disk like the
// workspace; layers are shared read-only, and refuse a writer.
func TestDiskInUse(t *testing.T) {
	fake := fakeBinary(t)
	d := newTestDriver(t, fake, nil)
	ctx := context.Background()
	layers := testLayers(t, 2)
	first := rootfsConfig(t, layers)
	v1 := startVM(t, d, first)

	// A second VM of the same image runs beside the first.
	v2 := startVM(t, d, rootfsConfig(t, layers))
	if st, err := v2.Status(ctx); err != nil || st != vmm.StateRunning {
		t.Fatalf("second VM sharing the layers: %s, %v", st, err)
	}

	for _, tc := range []struct {
		name   string
		cfg    func(c *vmm.Config)
		lock   func(t *testing.T, c vmm.Config) // someone else's lock
		want   string
		holder int // the pid the error must name, if any
	}{
		{"system disk of a running VM", func(c *vmm.Config) { c.System = first.System }, nil, "system disk " + first.System, v1.Pid()},
		{"workspace of a running VM", func(c *vmm.Config) { c.Workspace = first.Workspace }, nil, "workspace " + first.Workspace, v1.Pid()},
		{"layer as a system disk", func(c *vmm.Config) { c.System = layers[1]; c.Layers = layers[:1] }, nil, "system disk " + layers[1], 0},
		{"layer someone writes", func(c *vmm.Config) { c.Layers = testLayers(t, 1) },
			func(t *testing.T, c vmm.Config) { lockOther(t, c.Layers[0], unix.F_WRLCK) }, "is locked for writing by another process", 0},
		{"system disk someone reads", nil, func(t *testing.T, c vmm.Config) { lockOther(t, c.System, unix.F_RDLCK) }, "system disk", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := rootfsConfig(t, layers)
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			if tc.lock != nil {
				tc.lock(t, cfg)
			}
			v, err := d.Start(ctx, cfg)
			if err == nil {
				killVM(t, v)
				t.Fatal("Start succeeded")
			}
			if !errors.Is(err, vmm.ErrInUse) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Start = %v, want ErrInUse naming %q", err, tc.want)
			}
			if tc.holder != 0 && !strings.Contains(err.Error(), "VM pid "+strconv.Itoa(tc.holder)) {
				t.Errorf("error does not name the holder, pid %d: %v", tc.holder, err)
			}
			if _, err := os.Stat(filepath.Join(cfg.Dir, PidFile)); err == nil {
				t.Error("a VMM was launched for the refused start")
			}
		})
	}
}

// TestSystemDiskTakenDuringBoot: as TestWorkspaceTakenDuringBoot, for the
// system disk: locked after Start's check, before vm.boot opens it.
func TestSystemDiskTakenDuringBoot(t *testing.T) {
	d := newTestDriver(t, fakeBinary(t, chfake.EnvBootDelay+"=1s"), nil)
	cfg := rootfsConfig(t, testLayers(t, 1))
	errc := make(chan error, 1)
	go func() {
		v, err := d.Start(context.Background(), cfg)
		if err == nil {
			killVM(t, v)
		}
		errc <- err
	}()
	for {
		if _, err := os.Stat(filepath.Join(cfg.Dir, PidFile)); err == nil {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	lockOther(t, cfg.System, unix.F_WRLCK)
	err := <-errc
	if !errors.Is(err, vmm.ErrInUse) || !strings.Contains(err.Error(), "system disk") {
		t.Fatalf("Start = %v, want ErrInUse naming the system disk", err)
	}
	t.Logf("Start: %v", err)
	if held, _ := locked(cfg.Workspace); held {
		t.Error("workspace still locked after the failed start")
	}
}

func TestStartRefusesDisks(t *testing.T) {
	d := newTestDriver(t, fakeBinary(t), nil)
	for _, tc := range []struct {
		name string
		cfg  func(c *vmm.Config)
		want string
	}{
		{"too many layers", func(c *vmm.Config) { c.Layers = testLayers(t, vmm.MaxLayers+1) }, "over the limit of 8"},
		{"empty layer path", func(c *vmm.Config) { c.Layers = []string{""} }, "Layers[0]: empty path"},
		{"system disk is the workspace", func(c *vmm.Config) { c.System = c.Workspace }, "both as workspace and as system disk"},
		{"layer twice", func(c *vmm.Config) { c.Layers = append(c.Layers, c.Layers[0]) }, "both as layer 0 and as layer 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := rootfsConfig(t, testLayers(t, 1))
			tc.cfg(&cfg)
			v, err := d.Start(context.Background(), cfg)
			if err == nil {
				killVM(t, v)
				t.Fatal("Start succeeded")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q lacks %q", err, tc.want)
			}
			if _, err := os.Stat(filepath.Join(cfg.Dir, PidFile)); err == nil {
				t.Error("a VMM was launched")
			}
		})
	}
}

// templateConfig is cfg as a template VM boots: the image's layers, no
// disks of the session's own.
func templateConfig(cfg vmm.Config) vmm.Config {
	cfg.Workspace, cfg.System = "", ""
	return cfg
}

// TestAddDisk: a VM booted with the layers alone gets the workspace and
// system disk hot-plugged where a cold boot puts them, and a snapshot of
// it restores with the ordinary configuration.
func TestAddDisk(t *testing.T) {
	d := newTestDriver(t, fakeBinary(t), nil)
	ctx := context.Background()
	cfg := rootfsConfig(t, testLayers(t, 2))
	v := startVM(t, d, templateConfig(cfg))
	checkDisks(t, v, coldDisks(cfg)[2:])

	if err := v.AddDisk(ctx, vmm.DiskSystem, cfg.System); err != nil {
		t.Fatalf("AddDisk system: %v", err)
	}
	// A relative path is made absolute, as a cold boot's config has it.
	rel, err := filepath.Rel(mustGetwd(t), cfg.Workspace)
	if err != nil {
		t.Fatal(err)
	}
	if err := v.AddDisk(ctx, vmm.DiskWorkspace, rel); err != nil {
		t.Fatalf("AddDisk workspace: %v", err)
	}
	checkDisks(t, v, coldDisks(cfg))
	for _, p := range []string{cfg.Workspace, cfg.System} {
		if held, _ := writeLocked(p); !held {
			t.Errorf("%s not write-locked after AddDisk", p)
		}
	}

	// Adding a disk the VM has is done already; another image as that
	// disk is refused; so is a disk berth does not know.
	if err := v.AddDisk(ctx, vmm.DiskWorkspace, cfg.Workspace); err != nil {
		t.Errorf("AddDisk of the attached workspace = %v, want nil", err)
	}
	other := writeImage(t, filepath.Join(t.TempDir(), "other.img"))
	if err := v.AddDisk(ctx, vmm.DiskSystem, other); err == nil || !strings.Contains(err.Error(), "already has a system disk") {
		t.Errorf("AddDisk of a second system disk = %v", err)
	}
	if held, _ := locked(other); held {
		t.Error("the refused image is still locked")
	}
	if err := v.AddDisk(ctx, vmm.Disk("swap"), other); err == nil || !strings.Contains(err.Error(), "unknown disk") {
		t.Errorf("AddDisk of an unknown disk = %v", err)
	}

	// Snapshot, then restore elsewhere with the ordinary Config.
	if err := v.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	snap := filepath.Join(t.TempDir(), "snap")
	if err := v.Snapshot(ctx, snap); err != nil {
		t.Fatal(err)
	}
	if err := v.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	in := testConfig(t)
	in.Workspace, in.System, in.Layers, in.Incoming = cfg.Workspace, cfg.System, cfg.Layers, snap
	v2 := startVM(t, d, in)
	checkDisks(t, v2, coldDisks(cfg))
	conn, err := v2.DialAgent(ctx)
	if err != nil {
		t.Fatal(err)
	}
	echoCheck(t, conn)
	conn.Close()

	if err := v2.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v2.AddDisk(ctx, vmm.DiskWorkspace, cfg.Workspace); !errors.Is(err, vmm.ErrNotRunning) {
		t.Errorf("AddDisk after Kill = %v, want ErrNotRunning", err)
	}
}

func mustGetwd(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return wd
}

// TestAddDiskInUse: a disk another VM writes is refused with ErrInUse,
// naming that VM, and the template VM runs on.
func TestAddDiskInUse(t *testing.T) {
	d := newTestDriver(t, fakeBinary(t), nil)
	ctx := context.Background()
	layers := testLayers(t, 1)
	hcfg := rootfsConfig(t, layers)
	holder := startVM(t, d, hcfg)

	cfg := rootfsConfig(t, layers)
	v := startVM(t, d, templateConfig(cfg))
	for _, tc := range []struct {
		disk vmm.Disk
		path string
		want string
	}{
		{vmm.DiskSystem, hcfg.System, "system disk " + hcfg.System},
		{vmm.DiskWorkspace, hcfg.Workspace, "workspace " + hcfg.Workspace},
		{vmm.DiskSystem, layers[0], "system disk " + layers[0]},
	} {
		err := v.AddDisk(ctx, tc.disk, tc.path)
		if !errors.Is(err, vmm.ErrInUse) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("AddDisk(%s, %s) = %v, want ErrInUse naming the %s", tc.disk, tc.path, err, tc.want)
		}
		if tc.path != layers[0] && !strings.Contains(fmt.Sprint(err), "VM pid "+strconv.Itoa(holder.Pid())) {
			t.Errorf("error does not name the holder, pid %d: %v", holder.Pid(), err)
		}
	}
	checkDisks(t, v, coldDisks(cfg)[2:])
	if st, err := v.Status(ctx); err != nil || st != vmm.StateRunning {
		t.Errorf("template VM after refused disks: %s, %v", st, err)
	}
}

// attachFake serves an in-process fake CH in a fresh VM directory and
// attaches to it, for answers a launched VMM cannot be made to give.
// The handle's pid is this test process: never Kill it.
func attachFake(t *testing.T) (*chfake.Server, *VM) {
	t.Helper()
	dir := t.TempDir()
	srv := chfake.New(chfake.Options{Logf: t.Logf})
	if err := srv.Serve(filepath.Join(dir, APISocket)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	if err := vmm.WritePidFile(filepath.Join(dir, PidFile), os.Getpid()); err != nil {
		t.Fatal(err)
	}
	v, err := newTestDriver(t, fakeBinary(t), nil).Attach(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Close() })
	return srv, v.(*VM)
}

// createFake creates (and with boot, boots) a VM with the layers of cfg
// in the fake, as vm.create and vm.boot would.
func createFake(t *testing.T, v *VM, cfg vmm.Config, boot bool) {
	t.Helper()
	ctx := context.Background()
	cfg.Dir = v.Dir()
	if err := v.api.create(ctx, vmConfig(cfg, v.p)); err != nil {
		t.Fatal(err)
	}
	if boot {
		if err := v.api.boot(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

func TestAddDiskAnswers(t *testing.T) {
	ctx := context.Background()
	t.Run("no VM", func(t *testing.T) {
		_, v := attachFake(t)
		err := v.AddDisk(ctx, vmm.DiskWorkspace, writeImage(t, filepath.Join(t.TempDir(), "ws.img")))
		if err == nil || !strings.Contains(err.Error(), "holds no VM") {
			t.Errorf("AddDisk = %v, want a no-VM error", err)
		}
	})
	t.Run("VM not booted", func(t *testing.T) {
		_, v := attachFake(t)
		cfg := rootfsConfig(t, testLayers(t, 1))
		createFake(t, v, templateConfig(cfg), false)
		err := v.AddDisk(ctx, vmm.DiskWorkspace, cfg.Workspace)
		if !errors.Is(err, vmm.ErrNotRunning) || !strings.Contains(err.Error(), "not booted") {
			t.Errorf("AddDisk = %v, want ErrNotRunning: not booted", err)
		}
	})
	t.Run("failed after taking effect", func(t *testing.T) {
		srv, v := attachFake(t)
		cfg := rootfsConfig(t, testLayers(t, 1))
		createFake(t, v, templateConfig(cfg), true)
		srv.Inject("vm.add-disk", chfake.Fault{After: true})
		if err := v.AddDisk(ctx, vmm.DiskSystem, cfg.System); err != nil {
			t.Errorf("AddDisk whose disk is there = %v, want nil", err)
		}
		checkDisks(t, v, append(coldDisks(cfg)[1:2], coldDisks(cfg)[2:]...))
	})
	t.Run("failed", func(t *testing.T) {
		srv, v := attachFake(t)
		cfg := rootfsConfig(t, testLayers(t, 1))
		createFake(t, v, templateConfig(cfg), true)
		srv.Inject("vm.add-disk", chfake.Fault{Messages: []string{"Error from API", "boom"}})
		err := v.AddDisk(ctx, vmm.DiskSystem, cfg.System)
		var ae *APIError
		if !errors.As(err, &ae) || errors.Is(err, vmm.ErrInUse) || !strings.Contains(err.Error(), "attach system disk") {
			t.Errorf("AddDisk = %v, want the APIError", err)
		}
	})
}

// TestRestoreDisks: a restore rewrites every disk's path by its id, and
// refuses a Config whose disks are not the snapshot's.
func TestRestoreDisks(t *testing.T) {
	d := newTestDriver(t, fakeBinary(t), nil)
	ctx := context.Background()
	layers := testLayers(t, 2)
	cfg := rootfsConfig(t, layers)
	v := startVM(t, d, cfg)
	if err := v.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	snap := filepath.Join(t.TempDir(), "snap")
	if err := v.Snapshot(ctx, snap); err != nil {
		t.Fatal(err)
	}
	if err := v.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	pristine, err := os.ReadFile(filepath.Join(snap, snapConfig))
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name  string
		cfg   func(c *vmm.Config)
		patch func(disks []any) // edits the snapshot's disks
		want  string
	}{
		{"no system disk", func(c *vmm.Config) { c.System = "" }, nil, `has a disk "system"`},
		{"no layers", func(c *vmm.Config) { c.Layers = nil }, nil, `has a disk "layer0"`},
		{"no workspace", func(c *vmm.Config) { c.Workspace = "" }, nil, `has a disk "workspace"`},
		{"an extra layer", func(c *vmm.Config) {
			c.Layers = append(c.Layers, writeImage(t, filepath.Join(t.TempDir(), "more.img")))
		}, nil, "has no layer 2, but Config.Layers[2] is set"},
		{"snapshot lacks the system disk", nil, func(disks []any) {
			disks[1].(map[string]any)["id"] = "other"
		}, `has a disk "other"`},
		{"writable layer", nil, func(disks []any) {
			disks[2].(map[string]any)["readonly"] = false
		}, "layer 0 attached with readonly=false"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.WriteFile(filepath.Join(snap, snapConfig), pristine, 0o600); err != nil {
				t.Fatal(err)
			}
			if tc.patch != nil {
				var c map[string]any
				json.Unmarshal(pristine, &c)
				tc.patch(c["disks"].([]any))
				b, _ := json.Marshal(c)
				os.WriteFile(filepath.Join(snap, snapConfig), b, 0o600)
			}
			before, _ := os.ReadFile(filepath.Join(snap, snapConfig))
			in := rootfsConfig(t, layers)
			in.Incoming = snap
			if tc.cfg != nil {
				tc.cfg(&in)
			}
			v, err := d.Start(ctx, in)
			if err == nil {
				killVM(t, v)
				t.Fatal("restore succeeded")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("restore = %v, want %q", err, tc.want)
			}
			if _, err := os.Stat(filepath.Join(in.Dir, PidFile)); err == nil {
				t.Error("a VMM was launched for the refused restore")
			}
			if after, _ := os.ReadFile(filepath.Join(snap, snapConfig)); string(after) != string(before) {
				t.Error("a refused restore rewrote the snapshot's config")
			}
		})
	}

	// The snapshot restored with other images for its disks: each path is
	// rewritten by id.
	os.WriteFile(filepath.Join(snap, snapConfig), pristine, 0o600)
	in := rootfsConfig(t, testLayers(t, 2))
	in.Incoming = snap
	v2 := startVM(t, d, in)
	checkDisks(t, v2, coldDisks(in))
}

package cloudhypervisor

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthvm/berth/vmm"
	"github.com/berthvm/berth/vmm/cloudhypervisor/chfake"
)

// TestMain lets this test binary stand in for cloud-hypervisor: the
// driver under test runs it (through fakeBinary) with chfake.EnvFake set.
func TestMain(m *testing.M) {
	if os.Getenv(chfake.EnvFake) == "1" {
		os.Exit(chfake.Main(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// fakeBinary returns a launcher that runs this test binary as a fake
// cloud-hypervisor with env (KEY=VALUE) set.
func fakeBinary(t *testing.T, env ...string) string {
	t.Helper()
	path, err := chfake.WriteLauncher(t.TempDir(), env...)
	if err != nil {
		t.Fatal(err)
	}
	return path
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func newTestDriver(t *testing.T, binary string, mod func(*Options)) *Driver {
	t.Helper()
	opts := Options{
		Binary:       binary,
		Logger:       testLogger(t),
		KVM:          func(context.Context) bool { return true },
		StartTimeout: 20 * time.Second,
		AgentWait:    10 * time.Second,
	}
	if mod != nil {
		mod(&opts)
	}
	return New(opts)
}

// testConfig returns a config with a dummy kernel and a 1 MiB workspace
// image; the fake only opens them.
func testConfig(t *testing.T) vmm.Config {
	t.Helper()
	dir := t.TempDir()
	kernel := filepath.Join(dir, "vmlinuz")
	ws := filepath.Join(dir, "workspace.img")
	if err := os.WriteFile(kernel, []byte("not a kernel"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ws, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	return vmm.Config{
		Dir:       filepath.Join(dir, "vm"),
		Kernel:    kernel,
		Cmdline:   "quiet",
		CPUs:      2,
		MemoryMiB: 64,
		Workspace: ws,
		Accel:     vmm.AccelAuto,
	}
}

// startVM starts a VM that the test's cleanup kills.
func startVM(t *testing.T, d *Driver, cfg vmm.Config) *VM {
	t.Helper()
	v, err := d.Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { killVM(t, v) })
	return v.(*VM)
}

func killVM(t *testing.T, v vmm.VM) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := v.Kill(ctx)
	if errors.Is(err, net.ErrClosed) {
		// The handle is closed but the VMM runs on: kill it by pid.
		unix.Kill(v.Pid(), unix.SIGKILL)
		if v.(*VM).proc.child {
			// Its reaper closes Done; an attached handle's watcher is gone.
			select {
			case <-v.Done():
			case <-ctx.Done():
			}
		}
		return
	}
	if err != nil {
		t.Errorf("Kill: %v", err)
	}
}

func waitDone(t *testing.T, v vmm.VM) {
	t.Helper()
	select {
	case <-v.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("VMM did not exit")
	}
}

// alive reports whether pid names a process (a zombie counts as gone:
// the driver reaps its children).
func alive(pid int) bool { return unix.Kill(pid, 0) == nil }

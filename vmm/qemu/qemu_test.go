package qemu

import (
	"context"
	"log/slog"
	"os"
	"testing"

	"github.com/berthvm/berth/vmm"
	"github.com/berthvm/berth/vmm/vmmtest"
)

func driver(t *testing.T) *Driver {
	if err := New(Options{}).Available(); err != nil {
		t.Skip(err)
	}
	im := vmmtest.Image(t)
	probe := vmm.KVMProbe{QEMU: "qemu-system-x86_64", Kernel: im.Kernel, Initramfs: im.Initramfs, CacheDir: vmmtest.CacheDir()}
	return New(Options{
		KVM:    func(ctx context.Context) bool { return probe.Run(ctx).Works },
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil)),
	})
}

func TestDriverSuite(t *testing.T) {
	if testing.Short() {
		t.Skip("boots VMs")
	}
	vmmtest.DriverSuite(t, driver(t))
}

func TestMain(m *testing.M) { os.Exit(m.Run()) }

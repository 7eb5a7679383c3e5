package vmm

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// KVMCheck reports whether KVM really runs guests on this host, for
// drivers deciding on Accel auto (qemu) or refusing to start (Cloud
// Hypervisor). The daemon's check runs a KVMProbe once and keeps the verdict.
type KVMCheck func(ctx context.Context) bool

// KVMProbe tells whether KVM really works on this host. /dev/kvm can exist
// and answer ioctls while guests hang (nested PVM hosts), so the only proof
// is a test boot: the guest image with berth.probe on its command line,
// which powers off as soon as init runs.
type KVMProbe struct {
	QEMU      string // qemu-system-x86_64
	Kernel    string
	Initramfs string
	// CacheDir keeps the verdict for the rest of the host's boot.
	CacheDir string
	Timeout  time.Duration // default 15s
}

// KVMResult is a probe's verdict.
type KVMResult struct {
	Works  bool   `json:"works"`
	Reason string `json:"reason"`
	BootID string `json:"boot_id"`
}

// KVMDevice checks /dev/kvm without booting anything.
func KVMDevice() error {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("/dev/kvm: %w", err)
	}
	defer f.Close()
	const kvmGetAPIVersion = 0xAE00
	v, err := unix.IoctlRetInt(int(f.Fd()), kvmGetAPIVersion)
	if err != nil {
		return fmt.Errorf("/dev/kvm does not answer KVM_GET_API_VERSION: %w", err)
	}
	if v != 12 {
		return fmt.Errorf("/dev/kvm reports API version %d, want 12", v)
	}
	return nil
}

func bootID() string {
	b, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	return strings.TrimSpace(string(b))
}

// Run returns the cached verdict for this boot, or probes.
func (p KVMProbe) Run(ctx context.Context) KVMResult {
	cache := filepath.Join(p.CacheDir, "kvm-probe.json")
	id := bootID()
	if b, err := os.ReadFile(cache); err == nil {
		var r KVMResult
		if json.Unmarshal(b, &r) == nil && r.BootID == id && id != "" {
			return r
		}
	}
	r := p.probe(ctx)
	r.BootID = id
	if p.CacheDir != "" && ctx.Err() == nil {
		os.MkdirAll(p.CacheDir, 0o755)
		b, _ := json.Marshal(r)
		// Written aside and renamed: another daemon sharing the cache
		// may read it at any moment.
		if f, err := os.CreateTemp(p.CacheDir, ".kvm-probe-"); err == nil {
			_, werr := f.Write(b)
			if cerr := f.Close(); werr == nil && cerr == nil && os.Chmod(f.Name(), 0o644) == nil && os.Rename(f.Name(), cache) == nil {
				return r
			}
			os.Remove(f.Name())
		}
	}
	return r
}

func (p KVMProbe) probe(ctx context.Context) KVMResult {
	if err := KVMDevice(); err != nil {
		return KVMResult{Reason: err.Error()}
	}
	timeout := p.Timeout
	if timeout == 0 {
		timeout = 15 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, p.QEMU, "-accel", "kvm", "-cpu", "host", "-m", "256", "-nodefaults", "-no-user-config",
		"-display", "none", "-no-reboot", "-kernel", p.Kernel, "-initrd", p.Initramfs,
		"-append", "console=ttyS0 quiet panic=-1 berth.probe")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 2 * time.Second
	start := time.Now()
	out, err := cmd.CombinedOutput()
	switch {
	case ctx.Err() != nil:
		return KVMResult{Reason: fmt.Sprintf("/dev/kvm present but a test boot did not finish in %s", timeout)}
	case err != nil:
		return KVMResult{Reason: fmt.Sprintf("/dev/kvm present but a test boot failed: %v: %s", err, lastLine(string(out)))}
	}
	return KVMResult{Works: true, Reason: fmt.Sprintf("a test boot under KVM finished in %s", time.Since(start).Round(time.Millisecond))}
}

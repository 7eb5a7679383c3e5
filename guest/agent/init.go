package agent

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/mdlayher/vsock"
	"golang.org/x/sys/unix"

	"github.com/berthvm/berth/guest"
)

// Boot holds what PID 1 learned while bringing the VM up.
type Boot struct {
	Cmdline map[string]string
	// Workspace is where the volume is mounted, or "" with WorkspaceError.
	Workspace, Device, UUID, WorkspaceError string
}

// Paths inside the initramfs, written by the image builder.
const (
	ModulesDir   = "/lib/modules"
	ModulesOrder = "/lib/modules/order" // one .ko name per line, dependencies first
	WorkspaceDir = "/workspace"
)

// ParseCmdline splits the kernel command line into key=value pairs.
func ParseCmdline(s string) map[string]string {
	m := map[string]string{}
	for _, f := range strings.Fields(s) {
		k, v, _ := strings.Cut(f, "=")
		m[k] = v
	}
	return m
}

// MountBase mounts the pseudo filesystems every process expects.
func MountBase() error {
	type mnt struct{ src, dst, fstype, data string }
	for _, m := range []mnt{
		{"proc", "/proc", "proc", ""},
		{"sysfs", "/sys", "sysfs", ""},
		{"devtmpfs", "/dev", "devtmpfs", ""},
		{"devpts", "/dev/pts", "devpts", "ptmxmode=0666,mode=0620"},
		{"tmpfs", "/dev/shm", "tmpfs", "mode=1777"},
		{"tmpfs", "/tmp", "tmpfs", "mode=1777"},
		{"tmpfs", "/run", "tmpfs", "mode=0755"},
		{"cgroup2", "/sys/fs/cgroup", "cgroup2", ""},
	} {
		os.MkdirAll(m.dst, 0o755)
		if err := unix.Mount(m.src, m.dst, m.fstype, 0, m.data); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount %s on %s: %w", m.fstype, m.dst, err)
		}
	}
	os.Mkdir(cgroupRoot, 0o755)
	// Controllers are not needed: cgroup.kill works on any cgroup.
	os.MkdirAll("/root", 0o700)
	return nil
}

// LoadModules loads the kernel modules listed in order with finit_module,
// which needs no userspace tools and no modprobe.
func LoadModules(log *slog.Logger) error {
	b, err := os.ReadFile(ModulesOrder)
	if err != nil {
		return fmt.Errorf("read module list: %w", err)
	}
	for _, name := range strings.Fields(string(b)) {
		f, err := os.Open(filepath.Join(ModulesDir, name))
		if err != nil {
			return fmt.Errorf("module %s: %w", name, err)
		}
		err = unix.FinitModule(int(f.Fd()), "", 0)
		f.Close()
		if err != nil && !errors.Is(err, unix.EEXIST) {
			log.Warn("module did not load", "module", name, "err", err)
		}
	}
	return nil
}

// ext4UUID reads the filesystem UUID from an ext4 superblock, or "".
func ext4UUID(dev string) string {
	f, err := os.Open(dev)
	if err != nil {
		return ""
	}
	defer f.Close()
	sb := make([]byte, 1024)
	if _, err := f.ReadAt(sb, 1024); err != nil {
		return ""
	}
	if sb[0x38] != 0x53 || sb[0x39] != 0xEF { // ext2/3/4 magic
		return ""
	}
	u := sb[0x68:0x78]
	h := hex.EncodeToString(u)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// FindVolume looks for the block device carrying the ext4 filesystem with
// the given UUID, waiting up to timeout for it to appear (hot-plug).
func FindVolume(uuid string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		names, _ := filepath.Glob("/sys/class/block/vd*")
		var seen []string
		for _, n := range names {
			base := filepath.Base(n)
			if strings.IndexFunc(base[2:], func(r rune) bool { return r >= '0' && r <= '9' }) >= 0 {
				continue // a partition
			}
			dev := "/dev/" + base
			got := ext4UUID(dev)
			seen = append(seen, fmt.Sprintf("%s (%s)", dev, orNone(got)))
			if strings.EqualFold(got, uuid) {
				return dev, nil
			}
		}
		if time.Now().After(deadline) {
			if len(seen) == 0 {
				return "", fmt.Errorf("no virtio block device found; expected the workspace volume %s", uuid)
			}
			return "", fmt.Errorf("no volume with UUID %s; found %s", uuid, strings.Join(seen, ", "))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func orNone(s string) string {
	if s == "" {
		return "no ext4 filesystem"
	}
	return s
}

// MountWorkspace finds the volume with uuid and mounts it at dir.
func MountWorkspace(uuid, dir string, timeout time.Duration) (dev string, err error) {
	if uuid == "" {
		return "", errors.New("no workspace UUID on the kernel command line (berth.ws=)")
	}
	dev, err = FindVolume(uuid, timeout)
	if err != nil {
		return "", err
	}
	os.MkdirAll(dir, 0o755)
	if err := unix.Mount(dev, dir, "ext4", unix.MS_NOATIME, ""); err != nil {
		return "", fmt.Errorf("mount %s on %s: %w", dev, dir, err)
	}
	// Verify: the mount must be the volume we were asked for, not a stale
	// or look-alike filesystem.
	var st unix.Stat_t
	var pst unix.Stat_t
	if unix.Stat(dir, &st) != nil || unix.Stat(filepath.Dir(dir), &pst) != nil || st.Dev == pst.Dev {
		return "", fmt.Errorf("%s is not a mount point after mounting %s", dir, dev)
	}
	return dev, nil
}

// FindPort returns the virtio-serial port device named name. Without udev
// there is no /dev/virtio-ports/NAME symlink, so sysfs is scanned.
func FindPort(name string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		names, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
		for _, n := range names {
			b, err := os.ReadFile(n)
			if err == nil && string(bytes.TrimSpace(b)) == name {
				return "/dev/" + filepath.Base(filepath.Dir(n)), nil
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no virtio-serial port named %q", name)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// ListenVsock listens on the agent's vsock port, or fails when the VM has
// no vsock device. mdlayher/vsock's listener sits on the runtime poller, so
// Close unblocks an Accept in progress (a raw accept(2) would not return).
func ListenVsock() (net.Listener, error) {
	if _, err := os.Stat("/dev/vsock"); err != nil {
		return nil, fmt.Errorf("no vsock device: %w", err)
	}
	return listenVsock(guest.VsockPort)
}

func listenVsock(port uint32) (net.Listener, error) {
	l, err := vsock.Listen(port, nil)
	if err != nil {
		return nil, fmt.Errorf("listen on vsock port %d: %w", port, err)
	}
	return l, nil
}

// ServeVsock accepts host connections on l until ctx ends; each new
// connection replaces the previous session.
func (a *Agent) ServeVsock(ctx context.Context, l net.Listener) error {
	context.AfterFunc(ctx, func() { l.Close() })
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		a.log.Info("host connected", "channel", "vsock")
		go a.ServeConn(ctx, c)
	}
}

// PowerOff flushes everything and turns the VM off; QEMU and Cloud
// Hypervisor exit when the guest powers off.
func PowerOff() {
	unix.Sync()
	unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
}

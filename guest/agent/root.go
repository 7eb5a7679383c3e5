package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Root filesystem images. Their read-only layers are ext4 volumes whose
// tree lives under /upper; the session's system disk is an ext4 volume on
// which the agent keeps the overlay's upper/ and work/ directories. PID 1
// mounts the layers, stacks the system disk on them with overlayfs, moves
// the pseudo filesystems over and makes the overlay its root: the agent
// stays PID 1, and commands see an ordinary Debian system.

// Where the agent mounts what the overlay is made of. They sit in the
// initramfs, which becomes unreachable once the overlay is the root; the
// agent keeps the system disk's directory open to sync and freeze it.
const (
	berthDir   = "/.berth"
	layersDir  = berthDir + "/layers"
	systemDir  = berthDir + "/system"
	newRootDir = berthDir + "/root"
)

// MountLayers mounts the read-only layers (ext4 filesystem UUIDs, bottom
// first) and returns their tree directories, bottom first.
func MountLayers(uuids []string, timeout time.Duration) ([]string, error) {
	var dirs []string
	for i, uuid := range uuids {
		dev, err := FindVolume(uuid, timeout)
		if err != nil {
			return nil, fmt.Errorf("image layer %d: %w", i, err)
		}
		dir := filepath.Join(layersDir, fmt.Sprint(i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		if err := unix.Mount(dev, dir, "ext4", unix.MS_RDONLY|unix.MS_NOATIME, ""); err != nil {
			return nil, fmt.Errorf("mount image layer %d (%s): %w", i, dev, err)
		}
		tree := filepath.Join(dir, "upper")
		if _, err := os.Stat(tree); err != nil {
			return nil, fmt.Errorf("image layer %d (%s) holds no tree: %w", i, dev, err)
		}
		dirs = append(dirs, tree)
	}
	return dirs, nil
}

// SwitchRoot mounts the system disk with uuid, stacks it on the layers
// (tree directories, bottom first) and makes the overlay the root. It
// returns the system disk's root directory, open, and its device.
func SwitchRoot(layers []string, uuid string, timeout time.Duration) (*os.File, string, error) {
	if len(layers) == 0 {
		return nil, "", errors.New("no image layers mounted")
	}
	dev, err := FindVolume(uuid, timeout)
	if err != nil {
		return nil, "", fmt.Errorf("system disk: %w", err)
	}
	if err := os.MkdirAll(systemDir, 0o755); err != nil {
		return nil, "", err
	}
	if err := unix.Mount(dev, systemDir, "ext4", unix.MS_NOATIME, ""); err != nil {
		return nil, "", fmt.Errorf("mount the system disk (%s): %w; the disk may be corrupt", dev, err)
	}
	for _, d := range []string{"upper", "work"} {
		if err := os.MkdirAll(filepath.Join(systemDir, d), 0o755); err != nil {
			return nil, "", fmt.Errorf("system disk: %w", err)
		}
	}
	lower := make([]string, len(layers))
	for i, l := range layers {
		lower[len(layers)-1-i] = l // overlayfs lists the top layer first
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s/upper,workdir=%s/work", strings.Join(lower, ":"), systemDir, systemDir)
	if err := os.MkdirAll(newRootDir, 0o755); err != nil {
		return nil, "", err
	}
	if err := unix.Mount("overlay", newRootDir, "overlay", 0, opts); err != nil {
		return nil, "", fmt.Errorf("mount the root overlay: %w", err)
	}
	sys, err := os.Open(systemDir)
	if err != nil {
		return nil, "", err
	}
	fail := func(err error) (*os.File, string, error) {
		sys.Close()
		return nil, "", err
	}
	for _, d := range []string{"/dev", "/proc", "/sys", "/run"} {
		target := newRootDir + d
		os.MkdirAll(target, 0o755)
		if err := unix.Mount(d, target, "", unix.MS_MOVE, ""); err != nil {
			return fail(fmt.Errorf("move %s into the new root: %w", d, err))
		}
	}
	os.MkdirAll(newRootDir+"/tmp", 0o1777)
	if err := unix.Mount("tmpfs", newRootDir+"/tmp", "tmpfs", 0, "mode=1777"); err != nil {
		return fail(fmt.Errorf("mount /tmp: %w", err))
	}
	// What switch_root(8) does: make the new root "/" and enter it.
	if err := unix.Chdir(newRootDir); err != nil {
		return fail(err)
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fail(fmt.Errorf("move the new root to /: %w", err))
	}
	if err := unix.Chroot("."); err != nil {
		return fail(fmt.Errorf("chroot into the new root: %w", err))
	}
	if err := unix.Chdir("/"); err != nil {
		return fail(err)
	}
	os.MkdirAll(WorkspaceDir, 0o755)
	return sys, dev, nil
}

// SetIdentity gives the VM its session's hostname and machine id. Both are
// written to the root (on the system disk, where there is one) only when
// they differ, so an unchanged identity costs no write.
func SetIdentity(hostname, machineID string) error {
	if hostname != "" {
		if err := unix.Sethostname([]byte(hostname)); err != nil {
			return fmt.Errorf("set hostname: %w", err)
		}
		writeIfChanged("/etc/hostname", hostname+"\n", 0o644)
		hostsLine(hostname)
	}
	if machineID != "" {
		writeIfChanged("/etc/machine-id", machineID+"\n", 0o444)
	}
	return nil
}

func writeIfChanged(path, content string, perm os.FileMode) {
	if b, err := os.ReadFile(path); err == nil && string(b) == content {
		return
	}
	tmp := path + ".berth-tmp"
	if err := os.WriteFile(tmp, []byte(content), perm); err != nil {
		return
	}
	if os.Rename(tmp, path) != nil {
		os.Remove(tmp)
	}
}

// hostsLine makes the hostname resolve, as Debian's installer does with
// a 127.0.1.1 line.
func hostsLine(hostname string) {
	b, _ := os.ReadFile("/etc/hosts")
	var out []string
	for _, l := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		if !strings.HasPrefix(l, "127.0.1.1") && l != "" {
			out = append(out, l)
		}
	}
	if len(out) == 0 {
		out = append(out, "127.0.0.1\tlocalhost")
	}
	out = append(out, "127.0.1.1\t"+hostname)
	writeIfChanged("/etc/hosts", strings.Join(out, "\n")+"\n", 0o644)
}

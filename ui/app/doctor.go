package app

import (
	"context"
	"flag"
	"fmt"
	"github.com/berthvm/berth/session"
	"golang.org/x/sys/unix"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"text/tabwriter"

	"github.com/berthvm/berth/guest/image"
	"github.com/berthvm/berth/session/daemon"
	"github.com/berthvm/berth/ui/cli"
	"github.com/berthvm/berth/vmm"
	"github.com/berthvm/berth/vmm/cloudhypervisor"
	"github.com/berthvm/berth/vmm/qemu"
)

func doctorCmd() *cli.Command {
	return &cli.Command{
		Name: "doctor", Group: local,
		Summary: "which hypervisors and accelerators work here, and why not",
		Help:    "Checks QEMU, the mini image, KVM (a test boot of the mini image; the verdict is\nkept until the host reboots), TCG, Cloud Hypervisor, the tools image builds need\nand the guest agent, a line each.",
		Example: "berth doctor",
		Setup: func(*flag.FlagSet) cli.RunFunc {
			return func(ctx context.Context, c *cli.Call, _ []string) error {
				return doctor(ctx, globals(c), c.Env().Stdout)
			}
		},
	}
}

// doctor writes to out which hypervisors and accelerators work here, and
// why not, a line each.
func doctor(ctx context.Context, g cli.Globals, out io.Writer) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	ok := func(name string, err error, good string) {
		if err != nil {
			fmt.Fprintf(w, "%s\tno\t%v\n", name, err)
		} else {
			fmt.Fprintf(w, "%s\tyes\t%s\n", name, good)
		}
	}
	qerr := qemu.New(qemu.Options{}).Available()
	qpath, _ := exec.LookPath("qemu-system-x86_64")
	ok("qemu", qerr, qpath)

	im, imErr := image.Load(filepath.Join(g.Data, "images"), "mini")
	ok("image mini", imErr, im.Dir)

	kvmWorks := false
	switch {
	case vmm.KVMDevice() != nil:
		ok("kvm", fmt.Errorf("%v — using TCG", vmm.KVMDevice()), "")
	case imErr != nil || qerr != nil:
		ok("kvm", fmt.Errorf("/dev/kvm present; a test boot needs qemu and the mini image"), "")
	default:
		r := vmm.KVMProbe{QEMU: qpath, Kernel: im.Kernel, Initramfs: im.Initramfs, CacheDir: g.Cache}.Run(ctx)
		kvmWorks = r.Works
		if r.Works {
			ok("kvm", nil, r.Reason)
		} else {
			ok("kvm", fmt.Errorf("%s — using TCG", r.Reason), "")
		}
	}
	ok("tcg", qerr, "software emulation (about 6 s to boot a VM)")
	ok("cloud-hypervisor", cloudhypervisor.Available("", kvmWorks), "found, with a working KVM")
	for _, tool := range []string{"mkfs.ext4", "apt-get", "dpkg-deb"} {
		p, err := exec.LookPath(tool)
		ok(tool, err, p)
	}
	if _, err := os.Stat(daemon.DefaultAgent()); err != nil {
		ok("berth-agent", fmt.Errorf("not next to berth (%v): build with make", err), "")
	} else {
		ok("berth-agent", nil, daemon.DefaultAgent())
	}
	spaceErr, space := dataDirSpace(g.Data)
	ok("data directory", spaceErr, space)
	return w.Flush()
}

// dataDirSpace reports the data directory's free space against the floor
// in its config.toml.
func dataDirSpace(dir string) (error, string) {
	floor := int64(session.DefaultFloor)
	if cfg, err := daemon.LoadConfig(dir); err == nil {
		floor = cfg.Floor
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("%s: %v", dir, err), ""
	}
	free, size := int64(st.Bavail)*st.Bsize, int64(st.Blocks)*st.Bsize
	if floor > 0 && free < floor {
		return fmt.Errorf("%s: %s free of %s, below the %s floor (free_space_floor): creates, cold starts, sleeps and image builds are refused",
			dir, session.FormatBytes(free), session.FormatBytes(size), session.FormatBytes(floor)), ""
	}
	return nil, fmt.Sprintf("%s: %s free of %s (floor %s)", dir, session.FormatBytes(free), session.FormatBytes(size), session.FormatBytes(floor))
}

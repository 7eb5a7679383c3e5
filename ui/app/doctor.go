package app

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/berthvm/berth/session"
	"golang.org/x/sys/unix"

	"github.com/berthvm/berth/guest/image"
	"github.com/berthvm/berth/session/api"
	"github.com/berthvm/berth/session/daemon"
	"github.com/berthvm/berth/ui/cli"
	"github.com/berthvm/berth/vmm"
	"github.com/berthvm/berth/vmm/cloudhypervisor"
	"github.com/berthvm/berth/vmm/qemu"
)

func doctorCmd() *cli.Command {
	return &cli.Command{
		Name: "doctor", Group: hostGroup, Usage: "[--json]",
		Summary: "which hypervisors and accelerators work here, and why not",
		Help: "Checks QEMU, the mini image, KVM (a test boot of the mini image; the verdict is\nkept until the host reboots), TCG, Cloud Hypervisor, the tools image builds need\nand the guest agent, a line each; and, when a daemon runs on the data directory,\nthat its session manager answers within 5 s (a daemon that does not is frozen:\nthe line says how to get its goroutines for a bug report).\n" +
			"--json prints {\"ok\": …, \"checks\": [{\"name\", \"ok\", \"detail\"}…]} for service managers\nand scripts; ok is false when a check berth needs (qemu, tcg, berth-agent, the daemon,\nthe data directory) fails, and the exit code is then 1.",
		Example: "berth doctor\nberth doctor --json | jq '.checks[] | select(.ok | not)'",
		Setup: func(fs *flag.FlagSet) cli.RunFunc {
			asJSON := fs.Bool("json", false, "print JSON")
			return func(ctx context.Context, c *cli.Call, _ []string) error {
				rep := doctor(ctx, globals(c))
				if *asJSON {
					enc := json.NewEncoder(c.Env().Stdout)
					enc.SetIndent("", "  ")
					if err := enc.Encode(rep); err != nil {
						return err
					}
					if !rep.OK {
						return cli.Exit(cli.ExitFailed, "doctor: "+strings.Join(rep.failed(), ", ")+" failed")
					}
					return nil
				}
				return rep.write(c.Env().Stdout)
			}
		},
	}
}

// Check is one line of berth doctor.
type Check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
	// Needed says berth cannot run sessions without it (KVM, Cloud
	// Hypervisor and the image tools are optional).
	Needed bool `json:"needed"`
}

// Report is what berth doctor found.
type Report struct {
	OK     bool    `json:"ok"` // every needed check passed
	Checks []Check `json:"checks"`
}

func (r Report) failed() []string {
	var out []string
	for _, c := range r.Checks {
		if c.Needed && !c.OK {
			out = append(out, c.Name)
		}
	}
	return out
}

func (r Report) write(out io.Writer) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	for _, c := range r.Checks {
		yes := "yes"
		if !c.OK {
			yes = "no"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\n", c.Name, yes, c.Detail)
	}
	return w.Flush()
}

// doctor checks which hypervisors and accelerators work here, and why not.
func doctor(ctx context.Context, g cli.Globals) Report {
	var rep Report
	ok := func(name string, err error, good string, needed ...bool) {
		c := Check{Name: name, OK: err == nil, Detail: good, Needed: len(needed) > 0 && needed[0]}
		if err != nil {
			c.Detail = err.Error()
		}
		rep.Checks = append(rep.Checks, c)
	}
	qerr := qemu.New(qemu.Options{}).Available()
	qpath, _ := exec.LookPath("qemu-system-x86_64")
	ok("qemu", qerr, qpath, true)

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
	ok("tcg", qerr, "software emulation (about 6 s to boot a VM)", true)
	ok("cloud-hypervisor", cloudhypervisor.Available("", kvmWorks), "found, with a working KVM")
	for _, tool := range []string{"mkfs.ext4", "apt-get", "dpkg-deb"} {
		p, err := exec.LookPath(tool)
		ok(tool, err, p, tool == "mkfs.ext4")
	}
	if _, err := os.Stat(daemon.DefaultAgent()); err != nil {
		ok("berth-agent", fmt.Errorf("not next to berth (%v): build with make", err), "", true)
	} else {
		ok("berth-agent", nil, daemon.DefaultAgent(), true)
	}
	derr, dgood := daemonAnswers(ctx, g.Data)
	ok("daemon", derr, dgood, true)
	spaceErr, space := dataDirSpace(g.Data)
	ok("data directory", spaceErr, space, true)
	rep.OK = len(rep.failed()) == 0
	return rep
}

// daemonAnswers checks that the data directory's daemon, if one runs,
// answers, and that its session manager answers within
// daemon.ManagerBound: a daemon whose API answers while its Manager does
// not is frozen.
func daemonAnswers(ctx context.Context, data string) (error, string) {
	sock := daemon.SocketPath(data)
	if _, err := os.Stat(sock); err != nil {
		return nil, "not running (berth starts it when needed)"
	}
	c := api.Dial(sock)
	defer c.Close()
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	version, err := c.Ping(pctx)
	switch {
	case err != nil && version != "":
		return err, "" // another berth's daemon
	case err != nil:
		return nil, fmt.Sprintf("not running (%s does not answer)", sock)
	}
	rep, err := daemon.NewProber(c, version, daemon.ManagerBound).Check(ctx)
	if err != nil {
		return fmt.Errorf("berth serve %s answers on %s, but %w", version, sock, err), ""
	}
	n := 0
	for _, c := range rep.Sessions {
		n += c
	}
	return nil, fmt.Sprintf("berth serve %s answers on %s (%d sessions)", version, sock, n)
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

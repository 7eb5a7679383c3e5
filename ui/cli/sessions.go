package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/berthvm/berth/session"
)

func createCmd() *Command {
	return &Command{
		Name: "create", Action: session.ActionCreate, Group: "Sessions",
		Usage:   "NAME [--cpus N] [--memory SIZE] [--disk SIZE] [--image NAME] [--system-disk SIZE] [--vmm qemu|cloud-hypervisor] [--idle-timeout D] [--net POLICY] [--from SESSION[@ID]] [--on HOST]",
		Args:    []string{"NAME"},
		Summary: "create a session and boot it",
		Help: "Creates the session's workspace volume and boots its VM. Unset flags take the daemon's defaults.\n" +
			"Images with a root filesystem (debian, recipes) also get a system disk of their own, the\n" +
			"writable layer over the image (packages, /etc, /root); it is allocated as it is written.\n" +
			"A SIZE is a number with an optional K, M, G or T suffix, in binary units (1G is 1024M);\n" +
			"a bare number is bytes, so --memory 512 is refused: write 512M.\n\n" +
			"--from SESSION@ID makes the session from checkpoint ID of session SESSION (--from SESSION:\n" +
			"its newest): copies of the checkpoint's workspace and system disk (copy-on-write where the\n" +
			"filesystem can), on its image, with an identity of its own as a fork has (hostname,\n" +
			"machine-id, boot id, RNG state, filesystem UUIDs). A checkpoint taken with --memory resumes\n" +
			"its processes, on a VM of its size. --image, --disk and --system-disk are the checkpoint's;\n" +
			"unset --cpus, --memory, --vmm, --idle-timeout and --net are SESSION's.\n\n" +
			"In a fleet the session is placed on a live, non-draining host with room (one that has the\n" +
			"image first); --on HOST pins it there. A session --from a checkpoint is made where it is.\n\n" + netHelp,
		Example: "berth create demo --cpus 2 --memory 1G --disk 8G\nberth create try --from demo@c3",
		Setup: func(fs *flag.FlagSet) RunFunc {
			cpus := fs.Int("cpus", 0, "`N` virtual CPUs, 1 to 64 (default: the daemon's)")
			var memory memoryFlag
			var disk sizeFlag
			fs.Var(&memory, "memory", "guest memory `SIZE`, a whole number of MiB (512M, 2G)")
			fs.Var(&disk, "disk", "workspace volume `SIZE` (4G)")
			image := fs.String("image", "", "guest image `NAME`: mini, debian, or one built from a recipe")
			var system sizeFlag
			fs.Var(&system, "system-disk", "system disk `SIZE` for images with a root filesystem (8G)")
			vmm := &choiceFlag{choices: []string{"qemu", "cloud-hypervisor"}}
			fs.Var(vmm, "vmm", "hypervisor: `qemu` or cloud-hypervisor")
			idle := fs.String("idle-timeout", "", "sleep after this long idle, e.g. `15m`; 0 never (default: the daemon's)")
			netPolicy := fs.String("net", "", "network `POLICY`: none, open or allow:ENTRY,… (default: the daemon's, none)")
			from := fs.String("from", "", "make it from checkpoint `SESSION@ID` of another session (SESSION: its newest)")
			on := fs.String("on", "", "in a fleet: make it on host `HOST` (berth host ls lists them)")
			return func(ctx context.Context, c *Call, args []string) error {
				// Unset, 0 means the daemon's default; given, it is refused
				// by the same rule the daemon applies.
				if flagGiven(fs, "cpus") {
					if err := session.CheckCPUs(*cpus); err != nil {
						return &exitError{code: ExitUsage, msg: session.Render(err, flagOf)}
					}
				}
				opts := session.CreateOptions{
					Name: args[0], CPUs: *cpus, MemoryMiB: memory.mib, DiskBytes: disk.n,
					Image: *image, VMM: vmm.value, SystemBytes: system.n, Net: *netPolicy, From: *from, On: *on,
				}
				if opts.From != "" {
					// The same rule the daemon applies, before connecting.
					if _, err := session.CheckCreateFrom(opts); err != nil {
						return &exitError{code: ExitUsage, msg: session.Render(err, flagOf)}
					}
				}
				if *idle != "" {
					d, err := time.ParseDuration(*idle)
					if err != nil || d < 0 {
						return usageErrorf("--idle-timeout %q: want a duration like 15m, or 0 for never", *idle)
					}
					opts.IdleTimeout = &d
				}
				svc, err := c.service(ctx)
				if err != nil {
					return err
				}
				s, err := svc.Create(ctx, opts)
				if err != nil {
					return err
				}
				sys := ""
				if s.SystemBytes > 0 {
					sys = ", " + session.FormatBytes(s.SystemBytes) + " system disk"
				}
				where := ""
				if s.Host != "" {
					where = ", host " + s.Host
				}
				fmt.Fprintf(c.env.Stdout, "created %s: %s, %s, %s memory, %s disk%s, image %s on %s%s\n",
					s.Name, s.State, plural(s.CPUs, "CPU"), session.FormatBytes(int64(s.MemoryMiB)<<20), session.FormatBytes(s.DiskBytes), sys, s.Image, s.VMM, where)
				if opts.From != "" {
					fmt.Fprintf(c.env.Stdout, "%s\n", s.Cause)
				}
				if s.Net != "" && s.Net != session.DefaultNet {
					fmt.Fprintf(c.env.Stdout, "network: %s\n", s.Net)
				}
				return nil
			}
		},
	}
}

func lsCmd() *Command {
	return &Command{
		Name: "ls", Action: session.ActionRead, Group: "Sessions", Usage: "[--json]",
		Summary: "list sessions",
		Help: "USED is the workspace's use as last measured (kept while a session is stopped or asleep;\n" +
			"? until it is first measured). DIRTY is what a crash of the VM would lose now; 'berth flush'\n" +
			"makes it durable.",
		Example: "berth ls\nberth ls --json | jq -r '.[].name'",
		Setup: func(fs *flag.FlagSet) RunFunc {
			asJSON := fs.Bool("json", false, "print JSON")
			return func(ctx context.Context, c *Call, args []string) error {
				svc, err := c.service(ctx)
				if err != nil {
					return err
				}
				list, err := svc.List(ctx)
				if err != nil {
					return err
				}
				if *asJSON {
					return writeList(c.env.Stdout, list)
				}
				if h, err := svc.Host(ctx); err == nil && h.Message() != "" {
					fmt.Fprintln(c.env.Stderr, "berth: "+h.Message())
				}
				if len(list) == 0 {
					fmt.Fprintln(c.env.Stderr, "no sessions; create one with 'berth create NAME'")
					return nil
				}
				now := c.env.Now()
				// In a fleet every session has its host, and a HOST column
				// shows it; alone, the table is as it was.
				fleet := slices.ContainsFunc(list, func(s session.Session) bool { return s.Host != "" })
				head := []string{"NAME", "STATE", "IMAGE", "CPUS", "MEMORY", "DISK", "USED", "SYSTEM", "DIRTY", "RUNNING", "CREATED"}
				if fleet {
					head = slices.Insert(head, 1, "HOST")
				}
				t := newTable(c.env.Stdout, head...)
				for _, s := range list {
					row := []string{s.Name, stateText(s), s.Image, fmt.Sprint(s.CPUs), session.FormatBytes(int64(s.MemoryMiB) << 20),
						session.FormatBytes(s.DiskBytes), usedText(s), systemText(s), session.FormatBytes(s.DirtyBytes),
						fmt.Sprint(s.Running), ago(now, s.CreatedAt)}
					if s.State == session.StateUnreachable {
						// Nothing live is known of it: its spec, and dashes.
						row[6], row[7], row[8], row[9], row[10] = "-", "-", "-", "-", "-"
					}
					if fleet {
						row = slices.Insert(row, 1, s.Host)
					}
					t.row(row...)
				}
				return t.flush()
			}
		},
	}
}

func infoCmd() *Command {
	return &Command{
		Name: "info", Action: session.ActionRead, Group: "Sessions", Usage: "NAME [--json]", Args: []string{"NAME"},
		Summary: "show one session in detail",
		Example: "berth info demo",
		Setup: func(fs *flag.FlagSet) RunFunc {
			asJSON := fs.Bool("json", false, "print JSON")
			return func(ctx context.Context, c *Call, args []string) error {
				svc, err := c.service(ctx)
				if err != nil {
					return err
				}
				s, err := svc.Get(ctx, args[0])
				if err != nil {
					return err
				}
				if *asJSON {
					return writeJSON(c.env.Stdout, s)
				}
				writeInfo(c.env.Stdout, c, s)
				writeScheduleInfo(ctx, c.env.Stdout, svc, s)
				return nil
			}
		},
	}
}

// usedText is the workspace's use as last measured, or "?" for a session
// whose workspace has not been measured yet (rather than 0 B).
func usedText(s session.Session) string {
	if !s.WorkspaceKnown() {
		return "?"
	}
	return session.FormatBytes(s.WorkspaceUsed)
}

// systemText is the system disk's use, or "-" for an image without one.
func systemText(s session.Session) string {
	if s.SystemBytes == 0 {
		return "-"
	}
	return session.FormatBytes(s.SystemUsed)
}

// stateText is the state, with the snapshot's size and the time a wake
// took last for a sleeping session.
func stateText(s session.Session) string {
	if s.State != session.StateSleeping || s.SnapshotBytes == 0 {
		return string(s.State)
	}
	wake := ""
	if s.LastWake > 0 {
		wake = ", wakes in ~" + s.LastWake.Round(10*time.Millisecond).String()
	}
	return fmt.Sprintf("sleeping (%s%s)", session.FormatBytes(s.SnapshotBytes), wake)
}

func writeInfo(w io.Writer, c *Call, s session.Session) {
	now := c.env.Now()
	t := newTable(w, "Name:", s.Name)
	state := string(s.State)
	if s.Cause != "" {
		state += " (" + s.Cause + ")"
	}
	t.row("State:", state)
	if s.Host != "" {
		t.row("Host:", s.Host)
	}
	vm := s.VMM
	if s.Accel != "" {
		vm += ", " + s.Accel
	}
	if s.Pid != 0 {
		vm += fmt.Sprintf(", pid %d", s.Pid)
	}
	t.row("VMM:", vm)
	img := s.Image
	if s.ImageDigest != "" {
		img += " (build " + s.ImageDigest + ")"
	}
	t.row("Image:", img)
	t.row("CPUs:", fmt.Sprint(s.CPUs))
	mem := session.FormatBytes(int64(s.MemoryMiB) << 20)
	if s.MemUsedBytes > 0 {
		mem += fmt.Sprintf(" (%s used)", session.FormatBytes(s.MemUsedBytes))
	}
	t.row("Memory:", mem)
	ws := fmt.Sprintf("%s, at %s; its use is not measured yet", session.FormatBytes(s.DiskBytes), s.RootDirectory)
	if s.WorkspaceKnown() {
		ws = fmt.Sprintf("%s used of %s, at %s", session.FormatBytes(s.WorkspaceUsed), session.FormatBytes(s.DiskBytes), s.RootDirectory)
		if !s.WorkspaceMeasuredAt.IsZero() {
			ws += " (measured " + ago(now, s.WorkspaceMeasuredAt) + ")"
		}
	}
	t.row("Workspace:", ws)
	if s.SystemBytes > 0 {
		t.row("System disk:", fmt.Sprintf("%s used of %s (packages, /etc, %s: kept with the VM until replace)", session.FormatBytes(s.SystemUsed), session.FormatBytes(s.SystemBytes), s.HomeDirectory))
	} else {
		t.row("System disk:", "none: the root is in memory ("+s.HomeDirectory+" is lost at every stop)")
	}
	t.row("Dirty:", session.FormatBytes(s.DirtyBytes)+" not yet durable")
	if s.Checkpoints > 0 {
		t.row("Checkpoints:", fmt.Sprintf("%d, %s on disk ('berth checkpoints %s' lists them)", s.Checkpoints, session.FormatBytes(s.CheckpointBytes), s.Name))
	}
	t.row("Running:", plural(s.Running, "command"))
	if s.OutputHeld > 0 {
		t.row("Output held:", plural(s.OutputHeld, "command")+" blocked: the host disk has no room for their output (nothing is lost; they go on once space returns)")
	}
	if s.Net != "" {
		t.row("Network:", s.Net)
	}
	if s.IdleTimeout > 0 {
		t.row("Idle sleep:", "after "+s.IdleTimeout.String())
	} else {
		t.row("Idle sleep:", "never")
	}
	if s.State == session.StateSleeping {
		t.row("Snapshot:", session.FormatBytes(s.SnapshotBytes)+" on disk")
	}
	if s.LastWake > 0 {
		t.row("Last wake:", s.LastWake.Round(time.Millisecond).String())
	}
	stamp := func(at time.Time) string {
		return at.In(now.Location()).Format("2006-01-02 15:04:05") + " (" + ago(now, at) + ")"
	}
	t.row("Created:", stamp(s.CreatedAt))
	if !s.StartedAt.IsZero() {
		t.row("Started:", stamp(s.StartedAt))
	}
	if !s.LastActivity.IsZero() {
		t.row("Last active:", stamp(s.LastActivity))
	}
	t.flush()
}

// lifecycleCmd makes pause, resume, stop and start.
func lifecycleCmd(name, summary, help string) *Command {
	return &Command{
		Name: name, Action: session.Action(name), Group: "Sessions", Usage: "NAME", Args: []string{"NAME"},
		Summary: summary, Help: help,
		Example: "berth " + name + " demo",
		Setup: func(fs *flag.FlagSet) RunFunc {
			return func(ctx context.Context, c *Call, args []string) error {
				svc, err := c.service(ctx)
				if err != nil {
					return err
				}
				call := map[string]func(context.Context, string) (session.Session, error){
					"pause": svc.Pause, "resume": svc.Resume, "stop": svc.Stop, "start": svc.Start, "sleep": svc.Sleep,
				}[name]
				s, err := call(ctx, args[0])
				if err != nil {
					return err
				}
				fmt.Fprintf(c.env.Stdout, "%s: %s\n", s.Name, s.State)
				return nil
			}
		},
	}
}

func flushCmd() *Command {
	return &Command{
		Name: "flush", Action: session.ActionFlush, Group: "Sessions", Usage: "NAME", Args: []string{"NAME"},
		Summary: "make every pending write in /workspace durable",
		Help:    "Writes by commands can sit in the guest's page cache until flushed; a crash loses them.\nFlush syncs /workspace down to the host's disk and prints how much it wrote.",
		Example: "berth flush demo",
		Setup: func(fs *flag.FlagSet) RunFunc {
			return func(ctx context.Context, c *Call, args []string) error {
				svc, err := c.service(ctx)
				if err != nil {
					return err
				}
				res, err := svc.Flush(ctx, args[0])
				if err != nil {
					return err
				}
				flushed := res.DirtyBefore // all of it was written back; DirtyAfter is what came since
				fmt.Fprintf(c.env.Stdout, "%s: flushed %d bytes (%s) in %s", args[0], flushed, session.FormatBytes(flushed), session.FormatDuration(res.Took))
				if res.DirtyAfter > 0 {
					fmt.Fprintf(c.env.Stdout, "; %s written since is not yet durable", session.FormatBytes(res.DirtyAfter))
				}
				fmt.Fprintln(c.env.Stdout)
				return nil
			}
		},
	}
}

func deleteCmd() *Command {
	return &Command{
		Name: "delete", Action: session.ActionDelete, Group: "Sessions", Usage: "NAME [--yes]", Args: []string{"NAME"},
		Summary: "delete a session: its VM and all its storage, permanently",
		Help:    "Without --yes, asks you to type the session's name; without a terminal, --yes is required.",
		Example: "berth delete demo\nberth delete demo --yes",
		Setup: func(fs *flag.FlagSet) RunFunc {
			yes := fs.Bool("yes", false, "do not ask for confirmation")
			return func(ctx context.Context, c *Call, args []string) error {
				name := args[0]
				if !*yes && !c.env.StdinTTY {
					return usageErrorf("refusing to delete %q without confirmation: stdin is not a terminal; add --yes", name)
				}
				svc, err := c.service(ctx)
				if err != nil {
					return err
				}
				s, err := svc.Get(ctx, name)
				if err != nil {
					return err
				}
				if !*yes {
					ckpts := ""
					if s.Checkpoints > 0 {
						ckpts = fmt.Sprintf(" and its %d checkpoint(s) (%s)", s.Checkpoints, session.FormatBytes(s.CheckpointBytes))
					}
					fmt.Fprintf(c.env.Stderr, "Session %s is %s, with %s in /workspace (%s not yet flushed).\n"+
						"Deleting removes its VM and all its files%s permanently.\n"+
						"Type the session name to confirm: ", name, s.State, usedText(s), session.FormatBytes(s.DirtyBytes), ckpts)
					answer, err := readLine(c.env.Stdin)
					if err != nil && answer == "" {
						return fmt.Errorf("delete %s: no confirmation (%v); nothing was deleted", name, err)
					}
					if answer != name {
						return fmt.Errorf("delete %s: confirmation %q does not match; nothing was deleted", name, answer)
					}
				}
				if err := svc.Delete(ctx, name); err != nil {
					return err
				}
				fmt.Fprintf(c.env.Stdout, "deleted %s\n", name)
				return nil
			}
		},
	}
}

func replaceCmd() *Command {
	return &Command{
		Name: "replace", Action: session.ActionReplace, Group: "Sessions", Usage: "NAME [--image IMAGE] [--yes]", Args: []string{"NAME"},
		Summary: "give a session a new VM with a fresh system disk; /workspace is kept",
		Help: `Replaces the session's VM with a new one from its image (or --image IMAGE): running
commands end as a stop ends them, the disks are flushed, and the old system disk, with
every package installed and every change to /etc and /root since the session was made,
is dropped. /workspace is kept as it is. Without --yes, says what is dropped and asks you
to type the session's name; without a terminal, --yes is required.`,
		Example: "berth replace demo\nberth replace demo --image debian --yes",
		Setup: func(fs *flag.FlagSet) RunFunc {
			yes := fs.Bool("yes", false, "do not ask for confirmation")
			image := fs.String("image", "", "the new VM's `IMAGE` (default: the session's, its current build)")
			return func(ctx context.Context, c *Call, args []string) error {
				name := args[0]
				if !*yes && !c.env.StdinTTY {
					return usageErrorf("refusing to replace %q without confirmation: stdin is not a terminal; add --yes", name)
				}
				svc, err := c.service(ctx)
				if err != nil {
					return err
				}
				s, err := svc.Get(ctx, name)
				if err != nil {
					return err
				}
				if !*yes {
					to := *image
					if to == "" {
						to = s.Image
					}
					dropped := "its VM's memory and processes"
					if s.SystemBytes > 0 {
						dropped = fmt.Sprintf("its system disk with %s of changes (packages, /etc, /root)", session.FormatBytes(s.SystemUsed))
					}
					fmt.Fprintf(c.env.Stderr, "Session %s is %s on image %s.\n"+
						"Replacing drops %s and starts a fresh VM from image %s.\n"+
						"/workspace (%s) is kept. Running commands are stopped.\n"+
						"Type the session name to confirm: ", name, s.State, s.Image, dropped, to, usedText(s))
					answer, err := readLine(c.env.Stdin)
					if err != nil && answer == "" {
						return fmt.Errorf("replace %s: no confirmation (%v); nothing was changed", name, err)
					}
					if answer != name {
						return fmt.Errorf("replace %s: confirmation %q does not match; nothing was changed", name, answer)
					}
				}
				res, err := svc.Replace(ctx, name, session.ReplaceOptions{Image: *image})
				if err != nil {
					return err
				}
				fmt.Fprintf(c.env.Stdout, "replaced %s: a new VM from %s (was %s); dropped %s of system changes; /workspace kept\n",
					name, res.To, res.From, session.FormatBytes(res.Dropped))
				return nil
			}
		},
	}
}

// readLine reads one line byte by byte, so nothing after it is consumed.
func readLine(r io.Reader) (string, error) {
	var b strings.Builder
	buf := make([]byte, 1)
	for b.Len() < 1024 {
		n, err := r.Read(buf)
		if n == 1 {
			if buf[0] == '\n' {
				break
			}
			b.WriteByte(buf[0])
		}
		if err != nil {
			return strings.TrimSpace(b.String()), err
		}
	}
	return strings.TrimSpace(b.String()), nil
}

func eventsCmd() *Command {
	return &Command{
		Name: "events", Action: session.ActionRead, Group: "Sessions", Usage: "[NAME] [-n N] [--json] [--follow [--stats] [--since-rev REV]]", Args: []string{"[NAME]"},
		Summary: "show a session's timeline, or follow every session's events",
		Help: "Without --follow, prints NAME's recorded events. With --follow, prints them (without NAME,\n" +
			"every session's, merged in time; -n counts them all) and then every new event as it\n" +
			"happens (of NAME, or of all sessions) until interrupted;\n" +
			"with --json each event is one JSON line, for log shippers. --stats adds the live\n" +
			"figures' refreshes (every few seconds per running session), which are not recorded.\n" +
			"In a fleet, --follow also prints the fleet's changes (kind fleet: a session placed,\n" +
			"moved or released, a host joined, gone, left or draining), each with its etcd revision;\n" +
			"--since-rev REV resumes after the change at REV, through any host, missing none and\n" +
			"repeating none, and prints no recorded timeline again.",
		Example: "berth events demo -n 20\nberth events --follow --json | jq -c 'select(.kind==\"exec\")'",
		Setup: func(fs *flag.FlagSet) RunFunc {
			limit := fs.Int("n", 0, "show only the last `N` events")
			asJSON := fs.Bool("json", false, "print JSON")
			follow := fs.Bool("follow", false, "keep printing new events until interrupted")
			fs.BoolVar(follow, "f", false, "short for --follow")
			withStats := fs.Bool("stats", false, "with --follow: also print the live figures' refreshes")
			since := fs.Int64("since-rev", 0, "with --follow in a fleet: resume after the fleet change at revision `REV`")
			return func(ctx context.Context, c *Call, args []string) error {
				if *limit < 0 {
					return usageErrorf("-n %d: want a positive number", *limit)
				}
				if *withStats && !*follow {
					return usageErrorf("--stats needs --follow")
				}
				if *since != 0 && !*follow {
					return usageErrorf("--since-rev needs --follow")
				}
				if *since < 0 {
					return usageErrorf("--since-rev %d: want a revision an event showed", *since)
				}
				if len(args) == 0 && !*follow {
					return usageErrorf("missing NAME (or --follow for every session's events)")
				}
				svc, err := c.service(ctx)
				if err != nil {
					return err
				}
				if *follow {
					return followEvents(ctx, c, svc, args, followOpts{limit: *limit, asJSON: *asJSON, withStats: *withStats, since: *since})
				}
				evs, err := svc.Timeline(ctx, args[0], *limit)
				if err != nil {
					return err
				}
				if *asJSON {
					return writeList(c.env.Stdout, evs)
				}
				loc := c.env.Now().Location()
				t := newTable(c.env.Stdout, "TIME", "KIND", "BY", "WHAT")
				for _, ev := range evs {
					t.row(ev.Time.In(loc).Format(eventTime), string(ev.Kind), dash(ev.By), describeEvent(ev))
				}
				return t.flush()
			}
		},
	}
}

func describeEvent(ev session.Event) string {
	switch {
	case ev.Kind == session.EventState && ev.Session != nil:
		if strings.HasPrefix(ev.Message, string(ev.Session.State)) {
			return oneLine(ev.Message)
		}
		if ev.Message != "" {
			return fmt.Sprintf("%s (%s)", ev.Session.State, oneLine(ev.Message))
		}
		return string(ev.Session.State)
	case ev.Exec != nil:
		return ev.Exec.ID + " " + oneLine(ev.Message)
	case ev.Kind == session.EventFleet:
		return fmt.Sprintf("rev %d: %s", ev.Rev, oneLine(ev.Message))
	}
	return oneLine(ev.Message)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/berthvm/berth/session"
)

// RunFunc runs a command with its positional arguments; the flags it uses
// were bound by the command's Setup.
type RunFunc func(ctx context.Context, c *Call, args []string) error

// A Command is one entry of the command table. The built-in ones work
// wherever there is a session.Service (locally and over SSH); the caller
// of Run adds those that only make sense where it runs. The overview, each
// command's --help and its usage errors all come from these fields.
type Command struct {
	// Name selects the command: one word ("ls"), or a group and a word
	// ("ssh add-key"). The command named "" runs when the command line
	// names none (the local TUI).
	Name string
	// Aliases are other names that select it ("--version").
	Aliases []string
	// Group is the heading the overview lists it under.
	Group string
	Usage string   // after "berth NAME"
	Args  []string // positional: "NAME", "[PATH]", "CMD..." (rest)
	// Summary is one line: lowercase, no final period.
	Summary string
	Help    string
	Example string
	// Hidden leaves the command out of the overview and completion (the
	// completion scripts' own helper).
	Hidden bool
	// Action is the contract's action the command does, if it does one:
	// its help says from the action table what it needs over SSH.
	Action session.Action
	// Setup binds the command's flags to fs and returns its run function;
	// each Run gets fresh flags.
	Setup func(fs *flag.FlagSet) RunFunc
}

// stopAfter is how many positional arguments end flag parsing: after
// "exec NAME" everything is the command.
func (cmd *Command) stopAfter() int {
	for i, a := range cmd.Args {
		if strings.HasSuffix(a, "...") {
			return i
		}
	}
	return -1
}

// checkArgs checks the number of positional arguments.
func (cmd *Command) checkArgs(pos []string) error {
	required, variadic := 0, false
	for _, a := range cmd.Args {
		switch {
		case strings.HasSuffix(a, "...]"): // "[NAME...]": any number
			variadic = true
		case strings.HasSuffix(a, "..."):
			variadic = true
			required++
		case !strings.HasPrefix(a, "["):
			required++
		}
	}
	if len(pos) < required {
		return usageErrorf("missing %s", strings.TrimSuffix(cmd.Args[len(pos)], "..."))
	}
	if !variadic && len(pos) > len(cmd.Args) {
		return usageErrorf("unexpected argument %q", pos[len(cmd.Args)])
	}
	return nil
}

// synopsis is the short usage: "berth files NAME [PATH] [flags]".
func (cmd *Command) synopsis() string {
	parts := strings.Fields("berth " + cmd.Name)
	var rest []string
	for _, a := range cmd.Args {
		if strings.HasSuffix(a, "...") {
			rest = []string{"--", strings.TrimSuffix(a, "..."), "[ARGS...]"}
			break
		}
		parts = append(parts, a)
	}
	fs := flag.NewFlagSet(cmd.Name, flag.ContinueOnError)
	cmd.Setup(fs)
	if hasFlags(fs) {
		parts = append(parts, "[flags]")
	}
	return strings.Join(append(parts, rest...), " ")
}

// commands returns the built-in commands, in help order.
func commands() []*Command {
	return append([]*Command{
		createCmd(), lsCmd(), infoCmd(),
		lifecycleCmd("pause", "pause a session's VM (keeps memory; does not flush)",
			"Stops the session's vCPUs. Everything stays attached and in memory; nothing is flushed,\nso writes not yet flushed are still at risk. 'berth resume' continues."),
		lifecycleCmd("sleep", "snapshot an idle session to disk and release its VM",
			"Flushes and freezes /workspace, saves the VM's memory to disk and stops the VM.\nThe next action on the session (exec, files, resume…) wakes it where it left off.\nRefused while commands run."),
		lifecycleCmd("resume", "resume a paused session",
			"Continues a paused session, or wakes a sleeping one."),
		lifecycleCmd("stop", "shut a session's VM down cleanly (flushes first)",
			"Stops running commands, flushes /workspace, unmounts it and powers the VM off.\nThe workspace is kept; 'berth start' boots a new VM on it."),
		lifecycleCmd("start", "give a stopped or crashed session a new VM on its disks",
			"Starts a new VM on the session's retained disks: its workspace and, for images with a\nroot filesystem (debian), its system disk with the packages, /etc and /root it had.\nThe VM is restored from the image's booted template when there is one (no boot).\nProcesses and memory start fresh."),
		flushCmd(), replaceCmd(), deleteCmd(), eventsCmd(), statsCmd(), netCmd(),
		execCmd(), shellCmd(), logsCmd(), psCmd(), cancelCmd(),
		filesCmd(), catCmd(), putCmd(), getCmd(), cpCmd(), rmCmd(), mkdirCmd(),
		completionCmd(), completeCmd(),
	}, append(harnessCommands(), checkpointCmds()...)...)
}

// cmdTable is the commands one Run knows: the built-in ones, then the
// caller's.
type cmdTable []*Command

// lookup returns the command args begin with and how many words of args
// its name took; the longest name wins.
func (t cmdTable) lookup(args []string) (*Command, int) {
	var found *Command
	n := 0
	for _, cmd := range t {
		for _, name := range append([]string{cmd.Name}, cmd.Aliases...) {
			words := strings.Fields(name)
			if len(words) > n && len(words) <= len(args) && slices.Equal(words, args[:len(words)]) {
				found, n = cmd, len(words)
			}
		}
	}
	return found, n
}

// named returns the command named name exactly ("" for the default).
func (t cmdTable) named(name string) *Command {
	for _, cmd := range t {
		if cmd.Name == name {
			return cmd
		}
	}
	return nil
}

// group returns the commands whose name has word as its first word of
// several: "ssh" gives "ssh add-key".
func (t cmdTable) group(word string) []*Command {
	var sub []*Command
	for _, cmd := range t {
		if strings.HasPrefix(cmd.Name, word+" ") {
			sub = append(sub, cmd)
		}
	}
	return sub
}

// isHelp reports whether arg asks for help.
func isHelp(arg string) bool {
	switch arg {
	case "help", "-h", "-help", "--help":
		return true
	}
	return false
}

// help prints the overview, or one command's help, to stdout.
func (c *Call) help(args []string) int {
	if len(args) == 0 {
		c.writeOverview(c.env.Stdout)
		return ExitOK
	}
	if cmd, _ := c.table.lookup(args); cmd != nil {
		writeCommandHelp(c.env.Stdout, cmd)
		return ExitOK
	}
	if sub := c.table.group(args[0]); len(sub) > 0 {
		writeGroupHelp(c.env.Stdout, sub)
		return ExitOK
	}
	fmt.Fprintf(c.env.Stderr, "berth: help: unknown command %q (run 'berth help' for the list)\n", args[0])
	return ExitUsage
}

// inGroup answers a command line that names a group of commands but none
// of them ("berth ssh"): their help, on stdout when asked for, else on
// stderr as a usage error.
func (c *Call) inGroup(word string, sub []*Command, args []string) int {
	switch {
	case len(args) > 0 && isHelp(args[0]):
		writeGroupHelp(c.env.Stdout, sub)
		return ExitOK
	case len(args) == 0:
		writeGroupHelp(c.env.Stderr, sub)
		return ExitUsage
	}
	usages := make([]string, len(sub))
	for i, cmd := range sub {
		usages[i] = cmd.synopsis()
	}
	fmt.Fprintf(c.env.Stderr, "berth: %s: unknown subcommand %q (usage: %s; see 'berth help %s')\n",
		word, args[0], strings.Join(usages, " | "), word)
	return ExitUsage
}

func (c *Call) writeOverview(w io.Writer) {
	fmt.Fprint(w, `berth: persistent, VM-isolated work sessions.

A session is a microVM plus a durable volume mounted at /workspace in it.
Sessions stay allocated until deleted.

Usage:
`)
	if cmd := c.table.named(""); cmd != nil {
		fmt.Fprintf(w, "  %-26s%s\n", "berth", cmd.Summary)
	}
	fmt.Fprintf(w, "  %-26s%s\n", "berth COMMAND [ARGS]", "run one command against the daemon")
	var groups []string
	for _, cmd := range c.table {
		if cmd.Name != "" && !cmd.Hidden && !slices.Contains(groups, cmd.Group) {
			groups = append(groups, cmd.Group)
		}
	}
	for _, g := range groups {
		fmt.Fprintf(w, "\n%s:\n", g)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, cmd := range c.table {
			if cmd.Name != "" && !cmd.Hidden && cmd.Group == g {
				fmt.Fprintf(tw, "  %s\t%s\n", cmd.Name, cmd.Summary)
			}
		}
		tw.Flush()
	}
	if c.env.Globals != nil {
		fmt.Fprint(w, "\nGlobal flags, before the command:\n")
		writeFlags(w, globalFlags(&Globals{}))
	}
	fmt.Fprint(w, `
Sizes are like 512M, 4G, 1.5G, 1024K or plain bytes. Session names are 1-63
lowercase letters, digits and dashes.
Run 'berth help COMMAND' or 'berth COMMAND --help' for details.
`)
}

// writeGroupHelp prints the help of each command of a group.
func writeGroupHelp(w io.Writer, sub []*Command) {
	for i, cmd := range sub {
		if i > 0 {
			fmt.Fprintln(w)
		}
		writeCommandHelp(w, cmd)
	}
}

func writeCommandHelp(w io.Writer, cmd *Command) {
	fmt.Fprintf(w, "Usage: %s\n\n%s.\n", strings.Join(strings.Fields("berth "+cmd.Name+" "+cmd.Usage), " "), capitalize(cmd.Summary))
	if cmd.Help != "" {
		fmt.Fprintf(w, "\n%s\n", cmd.Help)
	}
	fs := flag.NewFlagSet(cmd.Name, flag.ContinueOnError)
	cmd.Setup(fs)
	if hasFlags(fs) {
		fmt.Fprint(w, "\nFlags:\n")
		writeFlags(w, fs)
	}
	if v, ok := session.Lookup(cmd.Action); ok {
		what := "reads only"
		if v.Mutates {
			what = "changes what it names"
		}
		fmt.Fprintf(w, "\nOver SSH it needs the %s role or above (it %s).\n", v.Role, what)
	}
	fmt.Fprintf(w, "\nExample:\n%s\n", indent(cmd.Example))
}

func hasFlags(fs *flag.FlagSet) bool {
	has := false
	fs.VisitAll(func(*flag.Flag) { has = true })
	return has
}

// writeFlags lists fs's flags, one a line: "  --name ARG  usage".
func writeFlags(w io.Writer, fs *flag.FlagSet) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fs.VisitAll(func(f *flag.Flag) {
		arg, usage := flag.UnquoteUsage(f)
		name := "--" + f.Name
		if len(f.Name) == 1 {
			name = "-" + f.Name
		}
		if arg != "" {
			name += " " + arg
		}
		fmt.Fprintf(tw, "  %s\t%s\n", name, usage)
	})
	tw.Flush()
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

func indent(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = "  " + l
	}
	return strings.Join(lines, "\n")
}

package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// runFunc runs a command with its positional arguments; the flags it uses
// were bound by the command's setup.
type runFunc func(ctx context.Context, c *cli, args []string) error

// command is one berth subcommand.
type command struct {
	name    string
	group   string
	usage   string   // after "berth NAME"
	args    []string // positional: "NAME", "[PATH]", "CMD..." (rest)
	summary string
	help    string
	example string
	// setup binds the command's flags to fs and returns its run function;
	// each Run gets fresh flags.
	setup func(fs *flag.FlagSet) runFunc
}

// stopAfter is how many positional arguments end flag parsing: after
// "exec NAME" everything is the command.
func (cmd *command) stopAfter() int {
	for i, a := range cmd.args {
		if strings.HasSuffix(a, "...") {
			return i
		}
	}
	return -1
}

// checkArgs checks the number of positional arguments.
func (cmd *command) checkArgs(pos []string) error {
	required, variadic := 0, false
	for _, a := range cmd.args {
		switch {
		case strings.HasSuffix(a, "..."):
			variadic = true
			required++
		case !strings.HasPrefix(a, "["):
			required++
		}
	}
	if len(pos) < required {
		return usageErrorf("missing %s", strings.TrimSuffix(cmd.args[len(pos)], "..."))
	}
	if !variadic && len(pos) > len(cmd.args) {
		return usageErrorf("unexpected argument %q", pos[len(cmd.args)])
	}
	return nil
}

// synopsis is the short usage: "berth files NAME [PATH] [flags]".
func (cmd *command) synopsis() string {
	parts := []string{"berth", cmd.name}
	var rest []string
	for _, a := range cmd.args {
		if strings.HasSuffix(a, "...") {
			rest = []string{"--", strings.TrimSuffix(a, "..."), "[ARGS...]"}
			break
		}
		parts = append(parts, a)
	}
	fs := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
	cmd.setup(fs)
	hasFlags := false
	fs.VisitAll(func(*flag.Flag) { hasFlags = true })
	if hasFlags {
		parts = append(parts, "[flags]")
	}
	return strings.Join(append(parts, rest...), " ")
}

// commands returns every command, in help order.
func commands() []*command {
	return []*command{
		createCmd(), lsCmd(), infoCmd(),
		lifecycleCmd("pause", "pause a session's VM (keeps memory; does not flush)",
			"Stops the session's vCPUs. Everything stays attached and in memory; nothing is flushed,\nso writes not yet flushed are still at risk. 'berth resume' continues."),
		lifecycleCmd("sleep", "snapshot an idle session to disk and release its VM",
			"Flushes and freezes /workspace, saves the VM's memory to disk and stops the VM.\nThe next action on the session (exec, files, resume…) wakes it where it left off.\nRefused while commands run."),
		lifecycleCmd("resume", "resume a paused session",
			"Continues a paused session, or wakes a sleeping one."),
		lifecycleCmd("stop", "shut a session's VM down cleanly (flushes first)",
			"Stops running commands, flushes /workspace, unmounts it and powers the VM off.\nThe workspace is kept; 'berth start' boots a new VM on it."),
		lifecycleCmd("start", "boot a stopped or crashed session",
			"Boots a new VM on the session's retained workspace. VM-local state (home directory,\nprocesses, memory) starts fresh."),
		flushCmd(), deleteCmd(), eventsCmd(),
		execCmd(), shellCmd(), logsCmd(), psCmd(),
		filesCmd(), catCmd(), putCmd(), getCmd(), rmCmd(), mkdirCmd(),
	}
}

func lookup(name string) *command {
	for _, cmd := range commands() {
		if cmd.name == name {
			return cmd
		}
	}
	return nil
}

// help prints the overview, or one command's help, to stdout.
func (c *cli) help(args []string) int {
	if len(args) == 0 {
		writeOverview(c.env.Stdout)
		return ExitOK
	}
	cmd := lookup(args[0])
	if cmd == nil {
		fmt.Fprintf(c.env.Stderr, "berth: help: unknown command %q (run 'berth help' for the list)\n", args[0])
		return ExitUsage
	}
	writeCommandHelp(c.env.Stdout, cmd)
	return ExitOK
}

func writeOverview(w io.Writer) {
	fmt.Fprint(w, `berth: persistent, VM-isolated work sessions.

A session is a microVM plus a durable volume mounted at /workspace in it.
Sessions stay allocated until deleted.

Usage:
  berth                     open the TUI (starts the daemon if none answers)
  berth serve               run the daemon
  berth COMMAND [ARGS]      run one command against the daemon
`)
	groups := []string{"Sessions", "Commands", "Files"}
	for _, g := range groups {
		fmt.Fprintf(w, "\n%s:\n", g)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, cmd := range commands() {
			if cmd.group == g {
				fmt.Fprintf(tw, "  %s\t%s\n", cmd.name, cmd.summary)
			}
		}
		tw.Flush()
	}
	fmt.Fprint(w, `
Sizes are like 512M, 4G, 1.5G, 1024K or plain bytes. Session names are 1-63
lowercase letters, digits and dashes.
Run 'berth help COMMAND' or 'berth COMMAND --help' for details.
`)
}

func writeCommandHelp(w io.Writer, cmd *command) {
	fmt.Fprintf(w, "Usage: berth %s %s\n\n%s.\n", cmd.name, cmd.usage, capitalize(cmd.summary))
	if cmd.help != "" {
		fmt.Fprintf(w, "\n%s\n", cmd.help)
	}
	fs := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
	cmd.setup(fs)
	var lines [][2]string
	fs.VisitAll(func(f *flag.Flag) {
		arg, usage := flag.UnquoteUsage(f)
		name := "--" + f.Name
		if len(f.Name) == 1 {
			name = "-" + f.Name
		}
		if arg != "" {
			name += " " + arg
		}
		lines = append(lines, [2]string{name, usage})
	})
	if len(lines) > 0 {
		fmt.Fprint(w, "\nFlags:\n")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, l := range lines {
			fmt.Fprintf(tw, "  %s\t%s\n", l[0], l[1])
		}
		tw.Flush()
	}
	fmt.Fprintf(w, "\nExample:\n%s\n", indent(cmd.example))
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

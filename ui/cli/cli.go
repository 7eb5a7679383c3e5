// Package cli is berth's command line: the one table of commands, and one
// Run call per command line. The built-in commands run against a
// session.Service (the daemon's socket client locally, the in-process
// Manager over SSH); the caller adds the commands only it can run (locally:
// serve, image build, doctor, ssh add-key, version and the TUI; over SSH
// none). It never touches the process's own stdio or exits.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/berthvm/berth/session"
)

// TermSize is a terminal's size in character cells.
type TermSize struct {
	Rows, Cols int
}

// Env is everything a command may use from its surroundings.
type Env struct {
	// Stdin is forwarded to commands run with exec and shell, and answers
	// delete's confirmation. Run stops using it when it returns, but a Read
	// in progress then can only be ended by its owner (main wraps os.Stdin
	// in a cancelable reader; the SSH server closes the channel).
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	// StdinNull says Stdin is /dev/null: exec starts its command without
	// a stdin to forward (the guest gives it its own /dev/null), which
	// saves the guest a pipe and the end-of-input message.
	StdinNull bool

	// Connect returns the service to use. Run calls it at most once, only
	// for commands that need it.
	Connect func(ctx context.Context) (session.Service, error)
	// ConnectRunning, if set, returns the service only when it already
	// runs: shell completion uses it, so a Tab never starts a daemon. Nil:
	// Connect is used.
	ConnectRunning func(ctx context.Context) (session.Service, error)

	// Whether Stdin, Stdout and Stderr are terminals.
	StdinTTY, StdoutTTY, StderrTTY bool
	// Size is the terminal's size; zero means 24x80.
	Size TermSize
	// SizeChanges, if set, delivers new terminal sizes while a command
	// with a terminal (exec -t, shell) runs; Run stops reading when ctx
	// ends.
	SizeChanges func(ctx context.Context) <-chan TermSize
	// MakeRaw, if set, puts the local terminal in raw mode for exec -t and
	// shell, and returns what restores it.
	MakeRaw func() (restore func(), err error)
	// Term is TERM for commands with a terminal; "" means xterm-256color.
	Term string

	// Who names the caller in records: "cli", "ssh:alice".
	Who string
	// Now is the clock for ages and running durations, and its location
	// the one times are printed in; nil means time.Now.
	Now func() time.Time
	// NoLocalFiles makes put and get accept only "-" (stdin, stdout): set
	// it where the caller's files are not on this machine (SSH).
	NoLocalFiles bool
	// MCP, if set, serves berth's tools over MCP on in and out for the mcp
	// command (ui/mcpserver.Stdio), confined to session name when it is
	// not "", within run when that is not ""; nil: mcp fails. ui/cli does
	// not link the MCP server: berth, which runs ui/cli's commands itself,
	// starts about 1 ms faster without it and hands mcp to berth-host.
	MCP func(ctx context.Context, svc session.Service, name, run string, in io.Reader, out io.Writer) error
	// Trace, if set, gets a debug line per exec with the time each phase
	// took on this side (BERTH_TRACE=1 in the berth command); nil: none.
	Trace *slog.Logger
	// Globals, if set, takes the global flags (--data, --cache,
	// --readonly) from the front of the command line, over the defaults it
	// holds, before anything else runs. Nil (SSH) means there are none.
	Globals *Globals
}

// Exit codes of Run besides a command's own.
const (
	ExitOK          = 0
	ExitFailed      = 1   // an operation failed
	ExitUsage       = 2   // bad command line
	ExitTimedOut    = 124 // exec --timeout expired
	ExitNotStarted  = 127 // exec: the command could not start
	ExitInterrupted = 130 // ctx ended (Ctrl-C), or the command was cancelled
)

// Run runs one berth command line (args excludes the program name) and
// returns the exit code. The commands it knows are the built-in ones plus
// extra. Errors are one line on Stderr: "berth: ...".
func Run(ctx context.Context, env Env, args []string, extra ...*Command) int {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ctx, env = env.defaults(ctx)
	c := &Call{env: env, table: append(commands(), extra...), began: time.Now()}

	if env.Globals != nil {
		rest, err := parseGlobals(env.Globals, args)
		if err != nil {
			fmt.Fprintf(env.Stderr, "berth: %v (run 'berth help' for the global flags)\n", err)
			return ExitUsage
		}
		args = rest
	}
	if len(args) == 0 {
		if cmd := c.table.named(""); cmd != nil {
			return c.finish(ctx, cmd, c.run(ctx, cmd, nil))
		}
		fmt.Fprintln(env.Stderr, "berth: missing command (run 'berth help' for the list)")
		return ExitUsage
	}
	if isHelp(args[0]) {
		return c.help(args[1:])
	}
	cmd, n := c.table.lookup(args)
	if cmd == nil {
		if sub := c.table.group(args[0]); len(sub) > 0 {
			return c.inGroup(args[0], sub, args[1:])
		}
		fmt.Fprintf(env.Stderr, "berth: unknown command %q (run 'berth help' for the list)\n", args[0])
		return ExitUsage
	}
	return c.finish(ctx, cmd, c.run(ctx, cmd, args[n:]))
}

// Handles reports whether Run without extra commands runs the command
// line args (without the program name) as it would with them: one of the
// built-in commands, other than those that read the whole table (help,
// completion) and mcp (see Env.MCP). A binary that has only the built-in commands (berth, which
// links no daemon) hands every other command line to one that has all.
func Handles(args []string) bool {
	args, err := parseGlobals(&Globals{}, args)
	if err != nil || len(args) == 0 || isHelp(args[0]) {
		return false
	}
	cmd, _ := cmdTable(commands()).lookup(args)
	switch {
	case cmd == nil:
		return false
	case cmd.Name == "completion", cmd.Name == "__complete":
		return false // the whole table
	case cmd.Name == "mcp":
		return false // Env.MCP, which berth does not link
	}
	return true
}

// defaults fills env's zero fields and puts its caller on ctx.
func (env Env) defaults(ctx context.Context) (context.Context, Env) {
	if env.Who != "" {
		ctx = session.WithActor(ctx, env.Who)
	}
	if env.Now == nil {
		env.Now = time.Now
	}
	if env.Stdin == nil {
		env.Stdin = strings.NewReader("")
	}
	if env.Size.Rows <= 0 || env.Size.Cols <= 0 {
		env.Size = TermSize{Rows: 24, Cols: 80}
	}
	if env.Term == "" {
		env.Term = "xterm-256color"
	}
	return ctx, env
}

// Execute runs req in session name with env's streams as berth exec does
// (stdin forwarded, stdout and stderr kept apart, the terminal resized,
// the command cancelled when ctx ends) and returns the exit code: the
// command's own, 128+N for signal N, or Run's codes, with Run's one-line
// error on Stderr. The SSH server runs commands in sessions with it.
func Execute(ctx context.Context, env Env, name string, req session.ExecRequest) int {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ctx, env = env.defaults(ctx)
	c := &Call{env: env, began: time.Now()}
	return c.finish(ctx, nil, c.execute(ctx, name, req))
}

// A Call is one Run of a command: what its RunFunc may use.
type Call struct {
	began time.Time // when Run started, for Env.Trace
	env   Env
	table cmdTable
	svc   session.Service
}

// Env is what the command runs with: its streams, terminal and caller.
func (c *Call) Env() Env { return c.env }

// service connects on first use.
// serviceAs is the call's service as T, one of the contract's optional
// interfaces (session.Relocator, session.Recoverer): a connection whose
// service lacks it cannot do what (a verb phrase: "move sessions").
func serviceAs[T any](ctx context.Context, c *Call, what string) (T, error) {
	var zero T
	svc, err := c.service(ctx)
	if err != nil {
		return zero, err
	}
	t, ok := svc.(T)
	if !ok {
		return zero, fmt.Errorf("this connection cannot %s: %w", what, session.ErrUnsupported)
	}
	return t, nil
}

func (c *Call) service(ctx context.Context) (session.Service, error) {
	if c.svc != nil {
		return c.svc, nil
	}
	if c.env.Connect == nil {
		return nil, fmt.Errorf("no berth service to connect to: %w", session.ErrUnavailable)
	}
	svc, err := c.env.Connect(ctx)
	if err != nil {
		return nil, err
	}
	c.svc = svc
	return svc, nil
}

func (c *Call) run(ctx context.Context, cmd *Command, args []string) error {
	fs := flag.NewFlagSet(cmd.Name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	runFn := cmd.Setup(fs)
	pos, err := parseInterleaved(fs, args, cmd.stopAfter())
	if errors.Is(err, flag.ErrHelp) {
		writeCommandHelp(c.env.Stdout, cmd)
		return nil
	}
	if err != nil {
		return usageErrorf("%v", err)
	}
	if err := cmd.checkArgs(pos); err != nil {
		return err
	}
	if len(cmd.Args) > 0 && cmd.Args[0] == "NAME" {
		if err := checkName(pos[0]); err != nil {
			return err
		}
	}
	return runFn(ctx, c, pos)
}

// usageError is a bad command line: exit 2, with the usage line.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usageErrorf(format string, a ...any) error {
	return &usageError{msg: fmt.Sprintf(format, a...)}
}

// UsageErrorf is a bad command line, for a RunFunc to return: Run prints
// it with the command's usage line and exits with ExitUsage.
func UsageErrorf(format string, a ...any) error { return usageErrorf(format, a...) }

// exitError ends Run with code; msg, if any, was not printed yet.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

// Exit is for a RunFunc to end Run with code, printing "berth: msg" first
// unless msg is empty.
func Exit(code int, msg string) error { return &exitError{code: code, msg: msg} }

// finish prints err as one line and picks the exit code.
func (c *Call) finish(ctx context.Context, cmd *Command, err error) int {
	var usage *usageError
	var exit *exitError
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &exit):
		if exit.msg != "" {
			fmt.Fprintf(c.env.Stderr, "berth: %s\n", exit.msg)
		}
		return exit.code
	case errors.As(err, &usage) && cmd != nil:
		fmt.Fprintf(c.env.Stderr, "berth: %s: %s (usage: %s; see 'berth %s --help')\n",
			cmd.Name, usage.msg, cmd.synopsis(), cmd.Name)
		return ExitUsage
	case errors.As(err, &usage):
		fmt.Fprintf(c.env.Stderr, "berth: %s\n", usage.msg)
		return ExitUsage
	case ctx.Err() != nil && errors.Is(err, context.Canceled):
		fmt.Fprintln(c.env.Stderr, "berth: interrupted")
		return ExitInterrupted
	}
	fmt.Fprintf(c.env.Stderr, "berth: %s\n", oneLine(session.Render(err, flagOf)))
	return ExitFailed
}

// flagOf names a field of the contract's errors as the command line
// gives it: "--memory".
func flagOf(field string) string {
	switch field {
	case session.FieldKeepMemory:
		return "--memory"
	case session.FieldSystemDisk:
		return "--system-disk"
	case session.FieldIdleTimeout:
		return "--idle-timeout"
	case session.FieldRef:
		return "--ref"
	case session.FieldFrom:
		return "--from"
	case session.FieldVMM:
		return "--vmm"
	case session.FieldUser:
		return "--user"
	case session.FieldCPUs, session.FieldMemory, session.FieldDisk, session.FieldNet, session.FieldImage, session.FieldLabel:
		return "--" + field
	}
	return strings.ReplaceAll(field, "_", " ") // an argument, not a flag: named in words
}

// oneLine keeps an error on one line, whatever the service put in it.
func oneLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexAny(s, "\r\n"); i >= 0 {
		s = s[:i] + " …"
	}
	return s
}

// Package cli is berth's command line: one Run call per command, against a
// session.Service (the daemon's socket client locally, the in-process
// Manager over SSH). It never touches the process's own stdio or exits.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
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

	// Connect returns the service to use. Run calls it at most once, only
	// for commands that need it.
	Connect func(ctx context.Context) (session.Service, error)

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

// Run runs one berth command (args excludes the program name) and returns
// the exit code. Errors are one line on Stderr: "berth: ...".
func Run(ctx context.Context, env Env, args []string) int {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
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
	c := &cli{env: env}

	if len(args) == 0 {
		fmt.Fprintln(env.Stderr, "berth: missing command (run 'berth help' for the list)")
		return ExitUsage
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		return c.help(args[1:])
	}
	cmd := lookup(args[0])
	if cmd == nil {
		fmt.Fprintf(env.Stderr, "berth: unknown command %q (run 'berth help' for the list)\n", args[0])
		return ExitUsage
	}
	return c.finish(ctx, cmd, c.run(ctx, cmd, args[1:]))
}

// IsCommand reports whether name is a command Run knows, so main can
// dispatch its own (serve, the TUI) first.
func IsCommand(name string) bool {
	return lookup(name) != nil || name == "help"
}

// cli is one Run call.
type cli struct {
	env Env
	svc session.Service
}

// service connects on first use.
func (c *cli) service(ctx context.Context) (session.Service, error) {
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

func (c *cli) run(ctx context.Context, cmd *command, args []string) error {
	fs := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	runFn := cmd.setup(fs)
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
	if len(cmd.args) > 0 && cmd.args[0] == "NAME" {
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

// exitError ends Run with code; msg, if any, was not printed yet.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

// finish prints err as one line and picks the exit code.
func (c *cli) finish(ctx context.Context, cmd *command, err error) int {
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
	case errors.As(err, &usage):
		fmt.Fprintf(c.env.Stderr, "berth: %s: %s (usage: %s; see 'berth %s --help')\n",
			cmd.name, usage.msg, cmd.synopsis(), cmd.name)
		return ExitUsage
	case ctx.Err() != nil && errors.Is(err, context.Canceled):
		fmt.Fprintln(c.env.Stderr, "berth: interrupted")
		return ExitInterrupted
	}
	fmt.Fprintf(c.env.Stderr, "berth: %s\n", oneLine(err.Error()))
	return ExitFailed
}

// oneLine keeps an error on one line, whatever the service put in it.
func oneLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexAny(s, "\r\n"); i >= 0 {
		s = s[:i] + " …"
	}
	return s
}

package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/berthvm/berth/session"
)

func execCmd() *Command {
	return &Command{
		Name: "exec", Action: session.ActionExec, Group: "Commands",
		Usage:   "NAME [--detach] [--timeout D] [--env K=V]... [--cwd DIR] [--user USER] [-t] [--run ID] [--] CMD [ARGS...]",
		Args:    []string{"NAME", "CMD..."},
		Summary: "run a recorded command in a session",
		Help: `Runs CMD in /workspace (or --cwd) and streams its stdout and stderr here; stdin is
forwarded. berth exits with the command's exit code, 128+N when a signal N killed it,
124 when --timeout expired, 127 when it could not start, and 130 when it was cancelled
(Ctrl-C cancels it in the guest). A cancelled or failed command can leave partial changes.
Output is recorded: 'berth logs' replays it, also after --detach.
` + userHelp,
		Example: "berth exec demo -- make test\nberth exec demo --timeout 10m --env GOFLAGS=-race -- go test ./...\nberth exec demo --detach -- ./long-job.sh",
		Setup: func(fs *flag.FlagSet) RunFunc {
			detach := fs.Bool("detach", false, "start the command, print its id and return")
			timeout := fs.Duration("timeout", 0, "kill the command after `D` (30s, 10m)")
			env := envFlag{}
			fs.Var(env, "env", "set environment variable `K=V` (repeatable)")
			cwd := fs.String("cwd", "", "working `DIR` (default /workspace)")
			tty := fs.Bool("t", false, "run the command on a terminal (needs one here)")
			user := userFlag(fs)
			run := runFlag(fs)
			return func(ctx context.Context, c *Call, args []string) error {
				ctx, err := inRun(ctx, *run)
				if err != nil {
					return err
				}
				if *timeout < 0 {
					return usageErrorf("--timeout %s: want a positive duration", *timeout)
				}
				if *tty && !c.env.StdinTTY {
					return usageErrorf("-t needs a terminal on stdin")
				}
				if *tty && *detach {
					return usageErrorf("-t and --detach do not go together")
				}
				if err := checkUser(*user); err != nil {
					return err
				}
				req := session.ExecRequest{
					Argv: args[1:], Env: env, Cwd: *cwd, Timeout: *timeout,
					TTY: *tty, Stdin: !*detach && !c.env.StdinNull, User: *user,
				}
				if len(req.Env) == 0 {
					req.Env = nil
				}
				if *detach {
					return c.detach(ctx, args[0], req)
				}
				return c.execute(ctx, args[0], req)
			}
		},
	}
}

func shellCmd() *Command {
	return &Command{
		Name: "shell", Action: session.ActionExec, Group: "Commands", Usage: "NAME [--user USER]", Args: []string{"NAME"},
		Summary: "open an interactive shell in a session's /workspace",
		Help:    "Runs sh on a terminal, as a recorded command. It needs a terminal here; for scripts use\n'berth exec NAME -- sh -c SCRIPT'.\n" + userHelp,
		Example: "berth shell demo\nberth shell demo --user root",
		Setup: func(fs *flag.FlagSet) RunFunc {
			user := userFlag(fs)
			return func(ctx context.Context, c *Call, args []string) error {
				if err := checkUser(*user); err != nil {
					return err
				}
				if !c.env.StdinTTY {
					return usageErrorf("needs a terminal on stdin; use 'berth exec %s -- sh -c SCRIPT' instead", args[0])
				}
				return c.execute(ctx, args[0], session.ExecRequest{
					Argv: []string{"sh"}, Cwd: "/workspace", TTY: true, Stdin: true, User: *user,
				})
			}
		},
	}
}

func cancelCmd() *Command {
	return &Command{
		Name: "cancel", Action: session.ActionCancel, Group: "Commands", Usage: "NAME EXEC", Args: []string{"NAME", "EXEC"},
		Summary: "cancel a running command, as the TUI's K does",
		Help: `Kills EXEC's whole process group in the guest (SIGKILL), as the TUI's K does, and waits
for its end to be recorded: it ends as cancelled. EXEC is the id 'exec --detach' printed
('berth ps NAME' lists the running ones). What the command changed so far remains: there
is no rollback.`,
		Example: "berth cancel demo e0042\nid=$(berth exec demo --detach -- ./long-job.sh); berth cancel demo $id",
		Setup: func(fs *flag.FlagSet) RunFunc {
			return func(ctx context.Context, c *Call, args []string) error {
				svc, err := c.service(ctx)
				if err != nil {
					return err
				}
				x, err := pickExec(ctx, svc, args)
				if err != nil {
					return err
				}
				if err := svc.Cancel(ctx, x.ID); err != nil {
					return err
				}
				x = waitEnded(ctx, svc, x)
				if !x.State.Done() {
					fmt.Fprintf(c.env.Stdout, "%s: killed; its end is not recorded yet ('berth ps %s --all' shows it)\n", x.ID, x.Session)
					return nil
				}
				fmt.Fprintf(c.env.Stdout, "%s: %s; what it changed so far remains\n", x.ID, x.State)
				return nil
			}
		},
	}
}

// waitEnded waits, at most interruptGrace, for a killed execution's end
// to be recorded, and returns its record as it is then.
func waitEnded(ctx context.Context, svc session.Service, x session.Execution) session.Execution {
	ctx, cancel := context.WithTimeout(ctx, interruptGrace)
	defer cancel()
	if p, err := svc.Attach(ctx, x.ID, 0); err == nil {
		for range p.Output() {
		}
		if final, err := p.Wait(ctx); err == nil {
			return final
		}
	}
	// It ended before the attach, or the wait ran out: the record says.
	if final, err := svc.Execution(ctx, x.ID); err == nil {
		return final
	}
	return x
}

func (c *Call) detach(ctx context.Context, name string, req session.ExecRequest) error {
	svc, err := c.service(ctx)
	if err != nil {
		return err
	}
	// The stream ends when Run returns; the command keeps running.
	p, err := svc.Exec(ctx, name, req)
	if err != nil {
		return err
	}
	fmt.Fprintln(c.env.Stdout, p.ID())
	return nil
}

// interruptGrace is how long an interrupted exec waits for the guest to
// report the cancelled command's end.
const interruptGrace = 10 * time.Second

// execute runs req and streams it until it ends; ctx ending cancels the
// command in the guest. It returns an exitError carrying the command's
// exit status.
func (c *Call) execute(ctx context.Context, name string, req session.ExecRequest) error {
	svc, err := c.service(ctx)
	if err != nil {
		return err
	}
	connected := time.Now()
	if req.TTY {
		req.Rows, req.Cols = c.env.Size.Rows, c.env.Size.Cols
		if req.Env == nil {
			req.Env = map[string]string{}
		}
		if _, ok := req.Env["TERM"]; !ok {
			req.Env["TERM"] = c.env.Term
		}
	}
	// The stream outlives ctx, so that after Ctrl-C the output up to the
	// command's end and its final record still arrive.
	streamCtx, stopStream := context.WithCancel(context.WithoutCancel(ctx))
	p, err := svc.Exec(streamCtx, name, req)
	if err != nil {
		stopStream()
		return err
	}
	started := time.Now()
	var wg sync.WaitGroup
	finished := make(chan struct{})
	defer func() {
		stopStream()
		wg.Wait()
	}()

	if req.TTY && c.env.MakeRaw != nil {
		restore, err := c.env.MakeRaw()
		if err != nil {
			p.Cancel(context.WithoutCancel(ctx))
			return fmt.Errorf("exec: putting the terminal in raw mode: %w", err)
		}
		defer restore()
	}
	// Stdin: this goroutine ends when Env.Stdin's Read returns (see Env).
	go forwardStdin(p, c.env.Stdin)
	if req.TTY && c.env.SizeChanges != nil {
		sizes := c.env.SizeChanges(streamCtx)
		wg.Go(func() {
			for {
				select {
				case sz, ok := <-sizes:
					if !ok {
						return
					}
					p.Resize(streamCtx, sz.Rows, sz.Cols)
				case <-streamCtx.Done():
					return
				}
			}
		})
	}
	wg.Go(func() { // cancels the command when ctx ends first
		select {
		case <-finished:
			return
		case <-ctx.Done():
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), interruptGrace)
		defer cancel()
		if err := p.Cancel(cctx); err != nil && !errors.Is(err, session.ErrInvalidState) {
			fmt.Fprintf(c.env.Stderr, "berth: cancelling %s: %v\n", p.ID(), oneLine(err.Error()))
		}
		select {
		case <-finished:
		case <-cctx.Done():
			stopStream()
		}
	})

	werr := c.copyOutput(p)
	drained := time.Now()
	close(finished)
	if werr != nil {
		p.Cancel(context.WithoutCancel(ctx))
		return werr
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), interruptGrace)
	defer cancel()
	if ctx.Err() == nil {
		wctx, cancel = context.WithCancel(ctx)
		defer cancel()
	}
	x, err := p.Wait(wctx)
	if err != nil {
		return fmt.Errorf("waiting for %s: %w", p.ID(), err)
	}
	if c.env.Trace != nil {
		c.env.Trace.Debug("exec phases", "exec", p.ID(), "began", c.began.UnixNano(), "connect", connected.Sub(c.began),
			"start", started.Sub(connected), "output", drained.Sub(started), "final", time.Since(drained))
	}
	if strings.HasPrefix(x.Error, session.EndNotRecordedNote) {
		fmt.Fprintf(c.env.Stderr, "berth: %s: %s\n", x.ID, oneLine(x.Error))
	}
	return exitFor(x)
}

// forwardStdin copies r to the command's stdin, then sends EOF.
func forwardStdin(p session.Process, r io.Reader) {
	w := p.Stdin()
	io.Copy(w, r)
	w.Close()
}

// copyOutput writes chunks to stdout and stderr until the stream ends.
func (c *Call) copyOutput(p session.Process) error {
	for ch := range p.Output() {
		w := c.env.Stdout
		switch ch.Stream {
		case session.Stderr:
			w = c.env.Stderr
		case session.Notice:
			fmt.Fprintf(c.env.Stderr, "berth: %s\n", ch.Data)
			continue
		}
		if _, err := w.Write(ch.Data); err != nil {
			return fmt.Errorf("writing the output of %s: %w", p.ID(), err)
		}
	}
	return nil
}

// exitFor turns an execution's end into Run's result.
func exitFor(x session.Execution) error {
	partial := "changes it made so far remain"
	switch x.State {
	case session.ExecExited:
		if x.Signal != "" {
			return &exitError{code: 128 + signalNumber(x.Signal), msg: fmt.Sprintf("%s was killed by %s", x.ID, x.Signal)}
		}
		if x.ExitCode != nil && *x.ExitCode != 0 {
			return &exitError{code: *x.ExitCode}
		}
		return nil
	case session.ExecCancelled:
		why := ""
		if x.Error != "" {
			why = " (" + x.Error + ")"
		}
		return &exitError{code: ExitInterrupted, msg: fmt.Sprintf("%s was cancelled%s; %s", x.ID, why, partial)}
	case session.ExecTimedOut:
		return &exitError{code: ExitTimedOut, msg: fmt.Sprintf("%s timed out and was killed; %s", x.ID, partial)}
	case session.ExecFailed:
		return &exitError{code: ExitNotStarted, msg: fmt.Sprintf("%s could not start: %s", x.ID, oneLine(x.Error))}
	case session.ExecLost:
		return &exitError{code: ExitFailed, msg: fmt.Sprintf("%s was lost (%s); its outcome is unknown and it may have made partial changes", x.ID, oneLine(x.Error))}
	}
	return &exitError{code: ExitFailed, msg: fmt.Sprintf("%s ended in state %q", x.ID, x.State)}
}

// signalNumber maps "SIGTERM", "TERM" or "15" to Linux's number.
func signalNumber(sig string) int {
	if n, err := strconv.Atoi(sig); err == nil {
		return n
	}
	nums := map[string]int{
		"HUP": 1, "INT": 2, "QUIT": 3, "ILL": 4, "TRAP": 5, "ABRT": 6, "BUS": 7, "FPE": 8,
		"KILL": 9, "USR1": 10, "SEGV": 11, "USR2": 12, "PIPE": 13, "ALRM": 14, "TERM": 15,
		"STKFLT": 16, "CHLD": 17, "CONT": 18, "STOP": 19, "TSTP": 20, "TTIN": 21, "TTOU": 22,
		"URG": 23, "XCPU": 24, "XFSZ": 25, "VTALRM": 26, "PROF": 27, "WINCH": 28, "IO": 29,
		"PWR": 30, "SYS": 31,
	}
	if n, ok := nums[strings.TrimPrefix(strings.ToUpper(sig), "SIG")]; ok {
		return n
	}
	return 0
}

// userHelp says whom commands run as, for exec and shell.
const userHelp = `It runs as the image's user (the User of an imported image's config), else root;
--user USER runs it as another: NAME or UID, with an optional :GROUP or :GID, as the VM's
own /etc/passwd and /etc/group name them.`

// userFlag is --user of exec and shell.
func userFlag(fs *flag.FlagSet) *string {
	return fs.String("user", "", "run as `USER`: NAME or UID[:GROUP] (default: the image's user, else root)")
}

// checkUser refuses, before connecting, a --user the service would
// refuse: the same rule.
func checkUser(user string) error {
	if user == "" {
		return nil
	}
	if err := session.ValidateUser(user); err != nil {
		return &exitError{code: ExitUsage, msg: session.Render(err, flagOf)}
	}
	return nil
}

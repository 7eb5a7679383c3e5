package cli

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/berthvm/berth/session"
)

func logsCmd() *Command {
	return &Command{
		Name: "logs", Action: session.ActionRead, Group: "Commands",
		Usage:   "NAME [EXEC] [-f] [--since SEQ] [--stream stdout|stderr]",
		Args:    []string{"NAME", "[EXEC]"},
		Summary: "replay a command's recorded output",
		Help: `Replays the output of EXEC (default: the session's latest command): stdout to stdout,
stderr to stderr. Output is recorded as numbered chunks; --since starts at chunk SEQ.
Output trimmed by retention is reported on stderr. With -f, follows the command live
until it ends.`,
		Example: "berth logs demo\nberth logs demo e0042 -f --stream stderr",
		Setup: func(fs *flag.FlagSet) RunFunc {
			follow := fs.Bool("f", false, "follow the output until the command ends")
			since := fs.Uint64("since", 1, "start at output chunk `SEQ`")
			stream := &choiceFlag{choices: []string{"stdout", "stderr"}}
			fs.Var(stream, "stream", "show only one `STREAM`: stdout or stderr")
			return func(ctx context.Context, c *Call, args []string) error {
				svc, err := c.service(ctx)
				if err != nil {
					return err
				}
				x, err := pickExec(ctx, svc, args)
				if err != nil {
					return err
				}
				show := func(ch session.Chunk) error {
					if ch.Stream == session.Notice {
						_, err := fmt.Fprintf(c.env.Stderr, "berth: %s\n", ch.Data)
						return err
					}
					if stream.value != "" && stream.value != ch.Stream.String() {
						return nil
					}
					w := c.env.Stdout
					if ch.Stream == session.Stderr {
						w = c.env.Stderr
					}
					_, err := w.Write(ch.Data)
					return err
				}
				next, err := replay(ctx, svc, x.ID, max(*since, 1), c.env.Stderr, show)
				if err != nil || !*follow {
					return err
				}
				p, err := svc.Attach(ctx, x.ID, next)
				if err != nil {
					return err
				}
				for ch := range p.Output() {
					if err := show(ch); err != nil {
						return err
					}
				}
				return ctx.Err()
			}
		},
	}
}

// pickExec returns the named execution, checking it belongs to the
// session, or the session's latest.
func pickExec(ctx context.Context, svc session.Service, args []string) (session.Execution, error) {
	if len(args) > 1 {
		x, err := svc.Execution(ctx, args[1])
		if err != nil {
			return x, err
		}
		if x.Session != args[0] {
			return x, fmt.Errorf("execution %s belongs to session %s, not %s", x.ID, x.Session, args[0])
		}
		return x, nil
	}
	list, err := svc.Executions(ctx, args[0], true)
	if err != nil {
		return session.Execution{}, err
	}
	if len(list) == 0 {
		return session.Execution{}, fmt.Errorf("session %s has no recorded commands yet; run one with 'berth exec %s -- CMD'", args[0], args[0])
	}
	return list[len(list)-1], nil
}

// replay pages through recorded output from seq from, reporting trimmed
// gaps on errw, and returns the seq after the last chunk.
func replay(ctx context.Context, svc session.Service, id string, from uint64, errw io.Writer, show func(session.Chunk) error) (uint64, error) {
	for {
		page, err := svc.Output(ctx, id, from, 0)
		if err != nil {
			return from, err
		}
		if page.Gap > 0 {
			fmt.Fprintf(errw, "berth: %d bytes of output were trimmed by retention\n", page.Gap)
		}
		for _, ch := range page.Chunks {
			if err := show(ch); err != nil {
				return from, err
			}
		}
		if len(page.Chunks) == 0 || page.Next <= from {
			return max(page.Next, from), nil
		}
		from = page.Next
	}
}

func psCmd() *Command {
	return &Command{
		Name: "ps", Action: session.ActionRead, Group: "Commands", Usage: "NAME [--all] [--json]", Args: []string{"NAME"},
		Summary: "list a session's commands",
		Help:    "Lists running commands, or with --all every recorded one, oldest first.",
		Example: "berth ps demo --all",
		Setup: func(fs *flag.FlagSet) RunFunc {
			all := fs.Bool("all", false, "include finished commands")
			asJSON := fs.Bool("json", false, "print JSON")
			return func(ctx context.Context, c *Call, args []string) error {
				svc, err := c.service(ctx)
				if err != nil {
					return err
				}
				list, err := svc.Executions(ctx, args[0], *all)
				if err != nil {
					return err
				}
				if *asJSON {
					return writeList(c.env.Stdout, list)
				}
				if len(list) == 0 {
					hint := "no running commands"
					if *all {
						hint = "no recorded commands"
					} else {
						hint += " (--all shows finished ones)"
					}
					fmt.Fprintln(c.env.Stderr, hint)
					return nil
				}
				now := c.env.Now()
				t := newTable(c.env.Stdout, "ID", "STATE", "EXIT", "DURATION", "OUTPUT", "BY", "COMMAND")
				for _, x := range list {
					end := x.EndedAt
					if end.IsZero() {
						end = now
					}
					cmd := shellQuote(x.Argv)
					if x.Outside {
						cmd += "  (outside berth)"
					}
					state := string(x.State)
					if x.Held != "" {
						state += " (" + x.Held + ")"
					}
					t.row(x.ID, state, exitColumn(x), session.FormatDuration(end.Sub(x.StartedAt)),
						session.FormatBytes(x.StdoutBytes+x.StderrBytes), dash(x.By), cmd)
				}
				return t.flush()
			}
		},
	}
}

func exitColumn(x session.Execution) string {
	switch {
	case x.Signal != "":
		return x.Signal
	case x.ExitCode != nil:
		return fmt.Sprint(*x.ExitCode)
	}
	return "-"
}

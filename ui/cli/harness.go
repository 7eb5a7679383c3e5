package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/schedule"
)

// harnessCommands are the commands of agent runs and schedules.
func harnessCommands() []*Command {
	return []*Command{runStartCmd(), runEndCmd(), runsCmd(), runDiffCmd(), diffCmd(), runUndoCmd(), scheduleAddCmd(), scheduleLsCmd(), scheduleRmCmd(), mcpCmd()}
}

// harness returns the service's runs and schedules.
func (c *Call) harness(ctx context.Context) (session.Service, session.Harness, error) {
	svc, err := c.service(ctx)
	if err != nil {
		return nil, nil, err
	}
	return svc, svc, nil
}

// runFlag binds --run, which makes a command's calls count in an agent run.
func runFlag(fs *flag.FlagSet) *string {
	return fs.String("run", "", "count the command in agent run `ID` (from 'berth run start')")
}

// inRun returns ctx for calls in run id ("" for none).
func inRun(ctx context.Context, id string) (context.Context, error) {
	if id == "" {
		return ctx, nil
	}
	if err := session.ValidateRunID(id); err != nil {
		return ctx, usageErrorf("--run: %v", strings.TrimSuffix(err.Error(), ": "+session.ErrInvalid.Error()))
	}
	return session.WithRun(ctx, id), nil
}

func runStartCmd() *Command {
	return &Command{
		Name: "run start", Action: session.ActionRun, Group: "Agent runs and schedules", Usage: "NAME [--title T] [--keep [--system]]", Args: []string{"NAME"},
		Summary: "open an agent run on a session and print its id",
		Help: `An agent run is one task a harness (a coding agent, a CI driver) performs on a session.
Commands and file writes made with --run ID count in it ('berth exec --run ID', put, cp);
'berth runs' lists them. 'berth run end ID' ends it; one left open, with nothing running in
it, is ended as abandoned after the daemon's run_timeout (config.toml). Ending a run leaves
the session and its files as they are for the next task.

With --keep the run keeps its starting point: a checkpoint of the workspace (and of the
system disk with --system), labelled with the run, taken as it starts, while the guest
records which paths change. 'berth run diff ID' then shows what the run changed and
'berth run undo ID' takes it back. The checkpoint counts like any other; the oldest
ended run's makes room under the limits. On XFS or btrfs it is a reflink and costs next
to nothing; elsewhere a sparse copy of what the workspace holds. MCP runs keep theirs
when the daemon's run_checkpoint is set (the default).`,
		Example: "berth run start demo --title 'fix the build' --keep\nberth exec --run r3f9a0c1d2e4b demo -- make\nberth run end r3f9a0c1d2e4b --status ok\nberth run diff r3f9a0c1d2e4b --stat",
		Setup: func(fs *flag.FlagSet) RunFunc {
			title := fs.String("title", "", "what the run is for")
			keep := fs.Bool("keep", false, "keep the run's starting point, to diff and undo it")
			system := fs.Bool("system", false, "with --keep, keep the system disk too")
			return func(ctx context.Context, c *Call, args []string) error {
				if *system && !*keep {
					return usageErrorf("--system keeps the system disk in the run's starting point: it needs --keep")
				}
				_, h, err := c.harness(ctx)
				if err != nil {
					return err
				}
				r, err := h.StartRun(ctx, args[0], session.RunOptions{Title: *title, Keep: session.KeepRun(*keep), System: *system})
				if err != nil {
					return err
				}
				fmt.Fprintln(c.env.Stdout, r.ID)
				return nil
			}
		},
	}
}

func runEndCmd() *Command {
	return &Command{
		Name: "run end", Action: session.ActionRun, Group: "Agent runs and schedules", Usage: "ID [--status ok|failed|cancelled]", Args: []string{"ID"},
		Summary: "end an agent run",
		Help:    "Ends an open run with a status (default ok). Commands still running in it go on.",
		Example: "berth run end r3f9a0c1d2e4b --status failed",
		Setup: func(fs *flag.FlagSet) RunFunc {
			status := &choiceFlag{choices: []string{"ok", "failed", "cancelled"}, value: "ok"}
			fs.Var(status, "status", "how the run ended: `ok`, failed or cancelled")
			return func(ctx context.Context, c *Call, args []string) error {
				if _, err := inRun(ctx, args[0]); err != nil {
					return err
				}
				_, h, err := c.harness(ctx)
				if err != nil {
					return err
				}
				r, err := h.EndRun(ctx, args[0], session.RunStatus(status.value))
				if err != nil {
					return err
				}
				fmt.Fprintf(c.env.Stdout, "run %s ended %s: %s, %s written\n", r.ID, r.Status, plural(r.Executions, "execution"), session.FormatBytes(r.BytesWritten))
				return nil
			}
		},
	}
}

func runsCmd() *Command {
	return &Command{
		Name: "runs", Action: session.ActionRead, Group: "Agent runs and schedules", Usage: "NAME [--json]", Args: []string{"NAME"},
		Summary: "list a session's agent runs",
		Help:    "Lists runs oldest first: title, who started it, when it started and ended, its status,\nits executions, the bytes written through the file API in it, the checkpoint of its\nstarting point (--keep) and what it changed as its last 'berth run diff' counted\n(files, lines added and removed; --json carries them as changes).",
		Example: "berth runs demo\nberth runs demo --json",
		Setup: func(fs *flag.FlagSet) RunFunc {
			return listing(fs, session.Service.Runs,
				func(name string) string {
					return fmt.Sprintf("no runs in %s ('berth run start %s' opens one)", name, name)
				},
				func(c *Call, list []session.Run) error {
					now := c.env.Now()
					t := newTable(c.env.Stdout, "ID", "STATUS", "STARTED", "ENDED", "EXECS", "WRITTEN", "START", "CHANGES", "BY", "TITLE")
					for _, r := range list {
						t.row(r.ID, string(r.Status), ago(now, r.StartedAt), ago(now, r.EndedAt), fmt.Sprint(r.Executions),
							session.FormatBytes(r.BytesWritten), dash(r.Checkpoint), runChanges(r), dash(r.By), dash(r.Title))
					}
					return t.flush()
				})
		},
	}
}

func scheduleAddCmd() *Command {
	return &Command{
		Name: "schedule add", Action: session.ActionSchedule, Group: "Agent runs and schedules",
		Usage:   "NAME SPEC [--overlap skip|queue|allow] [--cwd DIR] [--env K=V]... -- CMD [ARGS...]",
		Args:    []string{"NAME", "SPEC", "CMD..."},
		Summary: "run a command in a session on a timetable",
		Help: `SPEC is a five-field cron expression (minute hour day-of-month month day-of-week, in
the daemon's local time: '*/15 * * * *', '0 3 * * 1-5'), a descriptor (@hourly, @daily,
@weekly, @monthly, @yearly) or '@every D' with D of at least 1s ('@every 30s').
Each firing is a recorded execution in an agent run of its own, named for the schedule.
A due schedule wakes a sleeping session, which sleeps again when idle; a stopped session
holds its schedules. --overlap says what a firing does while the previous one still runs:
skip it (the default), queue it (one waits), or allow both. A firing missed while the
daemon was down runs once when it is back, never once per missed tick. Schedules are
deleted with their session; replace keeps them. --env values are kept with the schedule
in the daemon's store (on the host's disk), as it needs them at every firing.`,
		Example: "berth schedule add demo '@every 5m' -- ./sync.sh\nberth schedule add demo '0 3 * * *' --overlap queue -- make nightly",
		Setup: func(fs *flag.FlagSet) RunFunc {
			overlap := &choiceFlag{choices: []string{"skip", "queue", "allow"}, value: "skip"}
			fs.Var(overlap, "overlap", "while the previous firing runs: `skip`, queue or allow")
			cwd := fs.String("cwd", "", "working `DIR` (default /workspace)")
			env := envFlag{}
			fs.Var(env, "env", "set environment variable `K=V` (repeatable)")
			return func(ctx context.Context, c *Call, args []string) error {
				req := session.ScheduleRequest{Spec: args[1], Overlap: session.Overlap(overlap.value), Argv: args[2:], Cwd: *cwd, Env: env}
				if len(req.Env) == 0 {
					req.Env = nil
				}
				if _, err := schedule.ParseSpec(req.Spec); err != nil {
					return usageErrorf("%s", strings.TrimSuffix(err.Error(), ": "+session.ErrInvalid.Error()))
				}
				_, h, err := c.harness(ctx)
				if err != nil {
					return err
				}
				sc, err := h.AddSchedule(ctx, args[0], req)
				if err != nil {
					return err
				}
				fmt.Fprintln(c.env.Stdout, sc.ID)
				if sc.Held != "" {
					fmt.Fprintf(c.env.Stderr, "berth: schedule %s is %s\n", sc.ID, sc.Held)
				}
				return nil
			}
		},
	}
}

func scheduleLsCmd() *Command {
	return &Command{
		Name: "schedule ls", Action: session.ActionRead, Group: "Agent runs and schedules", Usage: "NAME [--json]", Args: []string{"NAME"},
		Summary: "list a session's schedules",
		Help:    "Lists schedules with their timetable, overlap, next due time, how often they fired\nand skipped, their last run, and whether the session's state holds them.",
		Example: "berth schedule ls demo",
		Setup: func(fs *flag.FlagSet) RunFunc {
			return listing(fs, session.Service.Schedules,
				func(name string) string { return "no schedules in " + name },
				func(c *Call, list []session.Schedule) error {
					now := c.env.Now()
					t := newTable(c.env.Stdout, "ID", "SPEC", "OVERLAP", "NEXT", "FIRED", "SKIPPED", "LAST RUN", "COMMAND")
					for _, sc := range list {
						next := "in " + session.FormatDuration(max(sc.Next.Sub(now), 0))
						if sc.Held != "" {
							next = sc.Held
						}
						t.row(sc.ID, sc.Spec, string(sc.Overlap), next, fmt.Sprint(sc.Count), fmt.Sprint(sc.Skipped), dash(sc.LastRun), shellQuote(sc.Argv))
					}
					return t.flush()
				})
		},
	}
}

func scheduleRmCmd() *Command {
	return &Command{
		Name: "schedule rm", Action: session.ActionSchedule, Group: "Agent runs and schedules", Usage: "NAME ID", Args: []string{"NAME", "ID"},
		Summary: "remove a schedule",
		Help:    "Removes the schedule; a command it started goes on.",
		Example: "berth schedule rm demo c1a2b3c4",
		Setup: func(fs *flag.FlagSet) RunFunc {
			return func(ctx context.Context, c *Call, args []string) error {
				_, h, err := c.harness(ctx)
				if err != nil {
					return err
				}
				if err := h.RemoveSchedule(ctx, args[0], args[1]); err != nil {
					return err
				}
				fmt.Fprintf(c.env.Stdout, "removed schedule %s of %s\n", args[1], args[0])
				return nil
			}
		},
	}
}

// writeScheduleInfo adds a session's schedules to 'berth info', saying
// when its state holds them.
func writeScheduleInfo(ctx context.Context, w io.Writer, svc session.Service, s session.Session) {
	list, err := svc.Schedules(ctx, s.Name)
	if err != nil || len(list) == 0 {
		return
	}
	line := plural(len(list), "schedule")
	if list[0].Held != "" {
		line += " (" + list[0].Held + ")"
	}
	fmt.Fprintf(w, "%-14s%s\n", "Schedules:", line)
}

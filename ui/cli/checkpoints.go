package cli

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/berthvm/berth/session"
)

// Checkpoints, restore and fork.

func checkpointCmds() []*Command {
	return []*Command{checkpointCmd(), checkpointsCmd(), checkpointRmCmd(), restoreCmd(), forkCmd(), moveCmd()}
}

func checkpointCmd() *Command {
	return &Command{
		Name: "checkpoint", Action: session.ActionCheckpoint, Group: "Checkpoints", Usage: "NAME [--label L] [--memory]", Args: []string{"NAME"},
		Summary: "save a session's disks (and with --memory its processes) to go back to later",
		Help: `Flushes and freezes the session's filesystems, copies its workspace and system disk
copy-on-write (a reflink where the data directory's filesystem has one, else a sparse
copy of the blocks in use), then thaws them. Commands keep running: they are held for
the copy, and the output says for how long. With --memory the VM's memory is saved in
the same freeze, so 'berth restore' resumes its processes too (running or sleeping
sessions only). A stopped session's disks are copied as they are.
checkpoint_limit and checkpoint_bytes in config.toml bound a session's checkpoints.`,
		Example: "berth checkpoint demo --label 'tests pass'\nberth checkpoint demo --memory",
		Setup: func(fs *flag.FlagSet) RunFunc {
			label := fs.String("label", "", "a `LABEL` to know it by")
			memory := fs.Bool("memory", false, "keep the VM's memory too, so a restore resumes its processes")
			return func(ctx context.Context, c *Call, args []string) error {
				svc, err := c.service(ctx)
				if err != nil {
					return err
				}
				ck, err := svc.Checkpoint(ctx, args[0], session.CheckpointOptions{Label: *label, Memory: *memory})
				if err != nil {
					return err
				}
				held := ""
				if ck.Frozen > 0 {
					held = fmt.Sprintf("; commands held for %s", ck.Frozen.Round(time.Millisecond))
				}
				fmt.Fprintf(c.env.Stdout, "checkpoint %s of %s: %s, %s on disk (%s) in %s%s\n",
					ck.ID, args[0], ck.Holds(), session.FormatBytes(ck.Bytes), ck.Copy, ck.Took.Round(time.Millisecond), held)
				return nil
			}
		},
	}
}

func checkpointsCmd() *Command {
	return &Command{
		Name: "checkpoints", Action: session.ActionRead, Group: "Checkpoints", Usage: "NAME [--json]", Args: []string{"NAME"},
		Summary: "list a session's checkpoints",
		Example: "berth checkpoints demo",
		Setup: func(fs *flag.FlagSet) RunFunc {
			return listing(fs, session.Service.Checkpoints,
				func(name string) string {
					return fmt.Sprintf("%s has no checkpoints ('berth checkpoint %s' takes one)", name, name)
				},
				func(c *Call, list []session.Checkpoint) error {
					t := newTable(c.env.Stdout, "ID", "TAKEN", "SIZE", "HOLDS", "COPY", "LABEL")
					for _, ck := range list {
						t.row(ck.ID, ck.CreatedAt.Local().Format("2006-01-02 15:04:05"), session.FormatBytes(ck.Bytes), ck.Holds(), ck.Copy, ck.Label)
					}
					return t.flush()
				})
		},
	}
}

func checkpointRmCmd() *Command {
	return &Command{
		Name: "checkpoint rm", Action: session.ActionDeleteCheckpoint, Group: "Checkpoints", Usage: "NAME ID", Args: []string{"NAME", "ID"},
		Summary: "remove a checkpoint",
		Example: "berth checkpoint rm demo c3",
		Setup: func(fs *flag.FlagSet) RunFunc {
			return func(ctx context.Context, c *Call, args []string) error {
				svc, err := c.service(ctx)
				if err != nil {
					return err
				}
				if err := svc.DeleteCheckpoint(ctx, args[0], args[1]); err != nil {
					return err
				}
				fmt.Fprintf(c.env.Stdout, "removed checkpoint %s of %s\n", args[1], args[0])
				return nil
			}
		},
	}
}

func restoreCmd() *Command {
	return &Command{
		Name: "restore", Action: session.ActionRestore, Group: "Checkpoints", Usage: "NAME ID [--yes]", Args: []string{"NAME", "ID"},
		Summary: "put a session back on a checkpoint (its current state is checkpointed first)",
		Help: `Takes an automatic checkpoint of the session's current disks (so the restore can be
undone with another restore), stops its VM as 'berth stop' does, puts the checkpoint's
disks in place and starts a new VM on them; a memory checkpoint resumes its processes.
Without --yes, says what happens and asks you to type the session's name; without a
terminal, --yes is required.`,
		Example: "berth restore demo c2\nberth restore demo c2 --yes",
		Setup: func(fs *flag.FlagSet) RunFunc {
			yes := fs.Bool("yes", false, "do not ask for confirmation")
			return func(ctx context.Context, c *Call, args []string) error {
				name, id := args[0], args[1]
				if !*yes && !c.env.StdinTTY {
					return usageErrorf("refusing to restore %q without confirmation: stdin is not a terminal; add --yes", name)
				}
				svc, err := c.service(ctx)
				if err != nil {
					return err
				}
				s, err := svc.Get(ctx, name)
				if err != nil {
					return err
				}
				var ck *session.Checkpoint
				list, err := svc.Checkpoints(ctx, name)
				if err != nil {
					return err
				}
				for i := range list {
					if list[i].ID == id {
						ck = &list[i]
					}
				}
				if ck == nil {
					return fmt.Errorf("session %q has no checkpoint %q (`berth checkpoints %s` lists them): %w", name, id, name, session.ErrNotFound)
				}
				if !*yes {
					fmt.Fprintf(c.env.Stderr, "Session %s is %s with %d running command(s).\n"+
						"Restoring stops its VM and puts it back on checkpoint %s (%s, taken %s).\n"+
						"Its current disks are kept first as an automatic checkpoint.\n"+
						"Type the session name to confirm: ", name, s.State, s.Running, ck.ID, ck.Holds(), ck.CreatedAt.Local().Format("2006-01-02 15:04:05"))
					answer, err := readLine(c.env.Stdin)
					if err != nil && answer == "" {
						return fmt.Errorf("restore %s: no confirmation (%v); nothing was changed", name, err)
					}
					if answer != name {
						return fmt.Errorf("restore %s: confirmation %q does not match; nothing was changed", name, answer)
					}
				}
				res, err := svc.Restore(ctx, name, id)
				if err != nil {
					return err
				}
				fmt.Fprintf(c.env.Stdout, "restored %s to checkpoint %s; it is %s; the state before is checkpoint %s ('berth restore %s %s' goes back)\n",
					name, id, res.Session.State, res.Auto.ID, name, res.Auto.ID)
				return nil
			}
		},
	}
}

func forkCmd() *Command {
	return &Command{
		Name: "fork", Action: session.ActionFork, Group: "Checkpoints", Usage: "NAME NEW", Args: []string{"NAME", "NEW"},
		Summary: "make a new session from a running or sleeping one, processes and all",
		Help: `Saves the session's memory and copies its disks (copy-on-write where it can) in one
short freeze, and starts session NEW from them: the same processes, files and system as
of the fork. NEW gets its own hostname, machine-id, boot id, RNG state and filesystem
UUIDs, and shares no writable file with NAME. Commands running in NAME go on in NEW as
processes; NEW's execution records start empty.`,
		Example: "berth fork demo demo-try",
		Setup: func(fs *flag.FlagSet) RunFunc {
			return func(ctx context.Context, c *Call, args []string) error {
				if err := session.ValidateName(args[1]); err != nil {
					return usageErrorf("%v", err)
				}
				svc, err := c.service(ctx)
				if err != nil {
					return err
				}
				res, err := svc.Fork(ctx, args[0], args[1])
				if err != nil {
					return err
				}
				fmt.Fprintf(c.env.Stdout, "forked %s into %s in %s (%s; %s held for %s)\n",
					args[0], args[1], res.Took.Round(time.Millisecond), res.Copy, args[0], res.Frozen.Round(time.Millisecond))
				for _, w := range res.Warnings {
					fmt.Fprintf(c.env.Stderr, "warning: %s\n", w)
				}
				return nil
			}
		},
	}
}

func moveCmd() *Command {
	return &Command{
		Name: "move", Action: session.ActionMove, Group: "Sessions", Usage: "NAME --to HOST", Args: []string{"NAME"},
		Summary: "move a stopped or sleeping session to another host of the fleet",
		Help: `Moves a stopped or sleeping session to host HOST of the fleet: its disks (sparse), its memory
snapshot, checkpoints and records (executions and their output, events, runs, schedules), and
the image build its disks were made on if HOST lacks it, each chunk checked by its hash, go
straight from the host that owns it into staging on HOST; one etcd transaction then makes HOST
the owner at a new epoch, HOST takes the session, and only then does the old host drop its
copy. A move that fails before that transaction leaves the session where it was, and nothing
on HOST. A sleeping session wakes on HOST with its processes. A running session is refused:
stop it or put it to sleep first.`,
		Example: "berth move demo --to h2",
		Setup: func(fs *flag.FlagSet) RunFunc {
			to := fs.String("to", "", "the `HOST` to move it to (berth host ls lists them)")
			return func(ctx context.Context, c *Call, args []string) error {
				if *to == "" {
					return usageErrorf("--to HOST is needed")
				}
				svc, err := c.service(ctx)
				if err != nil {
					return err
				}
				rl, ok := svc.(session.Relocator)
				if !ok {
					return fmt.Errorf("this connection cannot move sessions: %w", session.ErrUnsupported)
				}
				res, err := rl.MoveTo(ctx, args[0], *to)
				if err != nil {
					return err
				}
				fmt.Fprintf(c.env.Stdout, "moved %s to %s in %s (%d files, %s of data, sent in %s); it is %s there\n",
					args[0], *to, res.Took.Round(time.Millisecond), res.Staged.Files, session.FormatBytes(res.Staged.Bytes),
					res.Sent.Round(time.Millisecond), res.Session.State)
				return nil
			}
		},
	}
}

package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/berthvm/berth/session"
)

// Checkpoints, restore and fork.

func checkpointCmds() []*Command {
	return []*Command{checkpointCmd(), checkpointsCmd(), checkpointRmCmd(), checkpointReplicateCmd(), restoreCmd(), forkCmd(), moveCmd(), recoverCmd()}
}

func checkpointCmd() *Command {
	return &Command{
		Name: "checkpoint", Action: session.ActionCheckpoint, Group: "Checkpoints", Usage: "NAME [--label L] [--memory] [--replicate HOST]", Args: []string{"NAME"},
		Summary: "save a session's disks (and with --memory its processes) to go back to later",
		Help: `Flushes and freezes the session's filesystems, copies its workspace and system disk
copy-on-write (a reflink where the data directory's filesystem has one, else a sparse
copy of the blocks in use), then thaws them. Commands keep running: they are held for
the copy, and the output says for how long. With --memory the VM's memory is saved in
the same freeze, so 'berth restore' resumes its processes too (running or sleeping
sessions only). A stopped session's disks are copied as they are.
checkpoint_limit and checkpoint_bytes in config.toml bound a session's checkpoints.
In a fleet, --replicate HOST then keeps a copy of the checkpoint on HOST, from which
'berth recover' starts the session there if its own host is ever gone (as
'berth checkpoint replicate' does for a checkpoint taken before).`,
		Example: "berth checkpoint demo --label 'tests pass'\nberth checkpoint demo --memory\nberth checkpoint demo --replicate h2",
		Setup: func(fs *flag.FlagSet) RunFunc {
			label := fs.String("label", "", "a `LABEL` to know it by")
			memory := fs.Bool("memory", false, "keep the VM's memory too, so a restore resumes its processes")
			replicate := fs.String("replicate", "", "keep a copy on `HOST` of the fleet, to recover the session there")
			return func(ctx context.Context, c *Call, args []string) error {
				svc, err := c.service(ctx)
				if err != nil {
					return err
				}
				var rc session.Recoverer
				if *replicate != "" {
					var ok bool
					if rc, ok = svc.(session.Recoverer); !ok {
						return fmt.Errorf("this connection cannot replicate checkpoints: %w", session.ErrUnsupported)
					}
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
				if rc == nil {
					return nil
				}
				rep, err := rc.ReplicateCheckpoint(ctx, args[0], ck.ID, *replicate)
				if err != nil {
					return fmt.Errorf("checkpoint %s was taken, but its copy to %s failed ('berth checkpoint replicate %s %s --to %s' tries again): %w", ck.ID, *replicate, args[0], ck.ID, *replicate, err)
				}
				printReplica(c, args[0], rep)
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
					replicas := false
					for _, ck := range list {
						replicas = replicas || len(ck.Replicas) > 0
					}
					head := []string{"ID", "TAKEN", "SIZE", "HOLDS", "COPY", "LABEL"}
					if replicas {
						head = append(head, "REPLICAS")
					}
					t := newTable(c.env.Stdout, head...)
					for _, ck := range list {
						row := []string{ck.ID, ck.CreatedAt.Local().Format("2006-01-02 15:04:05"), session.FormatBytes(ck.Bytes), ck.Holds(), ck.Copy, ck.Label}
						if replicas {
							row = append(row, orNone(strings.Join(ck.Replicas, ",")))
						}
						t.row(row...)
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
				rl, err := serviceAs[session.Relocator](ctx, c, "move sessions")
				if err != nil {
					return err
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

func orNone(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func printReplica(c *Call, name string, rep session.Replica) {
	shipped := ""
	if rep.ImageSent {
		shipped = ", its image build shipped first"
	}
	fmt.Fprintf(c.env.Stdout, "checkpoint %s of %s copied to %s in %s (%d files, %s of data%s)\n",
		rep.Checkpoint, name, rep.Host, rep.Took.Round(time.Millisecond), rep.Files, session.FormatBytes(rep.Bytes), shipped)
}

func checkpointReplicateCmd() *Command {
	return &Command{
		Name: "checkpoint replicate", Action: session.ActionCheckpoint, Group: "Checkpoints", Usage: "NAME ID --to HOST", Args: []string{"NAME", "ID"},
		Summary: "copy a checkpoint to another host of the fleet, to recover the session there",
		Help: `Copies checkpoint ID of session NAME to host HOST of the fleet: its disks (sparse), its memory
snapshot if it has one, and the session's records, each chunk checked by its hash, straight
from the host that owns the session into HOST's replicas area (not a session there), plus the
image build the disks were made on if HOST lacks it. The fleet records the copy under the
session's keys; 'berth checkpoints NAME' shows where copies are. If the session's host is
ever gone, 'berth recover NAME --from ID --on HOST --force' starts it there. Copying the
same checkpoint again replaces the copy.`,
		Example: "berth checkpoint replicate demo c3 --to h2",
		Setup: func(fs *flag.FlagSet) RunFunc {
			to := fs.String("to", "", "the `HOST` to keep the copy on (berth host ls lists them)")
			return func(ctx context.Context, c *Call, args []string) error {
				if *to == "" {
					return usageErrorf("--to HOST is needed")
				}
				rc, err := serviceAs[session.Recoverer](ctx, c, "replicate checkpoints")
				if err != nil {
					return err
				}
				rep, err := rc.ReplicateCheckpoint(ctx, args[0], args[1], *to)
				if err != nil {
					return err
				}
				printReplica(c, args[0], rep)
				return nil
			}
		},
	}
}

func recoverCmd() *Command {
	return &Command{
		Name: "recover", Action: session.ActionRecover, Group: "Sessions", Usage: "NAME --from ID --on HOST [--force]", Args: []string{"NAME"},
		Summary: "start a session of a gone host on another, from a checkpoint copied there",
		Help: `Starts session NAME on host HOST from the copy HOST keeps of its checkpoint ID ('berth
checkpoint replicate'), when the host that owns it is gone. It is refused while etcd still
holds that host's lease (the refusal says how long the lease has left): only etcd's expiry
of the lease says a host is gone, never a host's clock. Without --force it says what it
would do and does nothing. With it, HOST stages its copy, one etcd transaction makes HOST
the owner at a new epoch (guarded by the owner read, so of two recoveries at once exactly
one wins), and HOST starts the session on the checkpoint's disks (resuming its memory when
the checkpoint has it). What the session did after the checkpoint is lost. The old host,
when it comes back, stops its VM and sets its copy aside in quarantine (berth quarantine ls).`,
		Example: "berth recover demo --from c3 --on h2\nberth recover demo --from c3 --on h2 --force",
		Setup: func(fs *flag.FlagSet) RunFunc {
			from := fs.String("from", "", "the checkpoint `ID` whose copy starts it")
			host := fs.String("on", "", "the `HOST` that keeps the copy and takes the session")
			force := fs.Bool("force", false, "do it (without: say what it would do)")
			return func(ctx context.Context, c *Call, args []string) error {
				if *from == "" || *host == "" {
					return usageErrorf("--from ID and --on HOST are needed")
				}
				rc, err := serviceAs[session.Recoverer](ctx, c, "recover sessions")
				if err != nil {
					return err
				}
				res, err := rc.Recover(ctx, args[0], session.RecoverOptions{From: *from, On: *host, Force: *force})
				if err != nil {
					var se *session.Error
					if errors.As(err, &se) && !*force && strings.HasPrefix(se.Msg, "this would ") {
						return &session.Error{Class: se.Class, Msg: se.Msg + "; add --force to do it"}
					}
					return err
				}
				fmt.Fprintf(c.env.Stdout, "recovered %s on %s from checkpoint %s in %s, at epoch %d (host %s was gone); it is %s\n",
					args[0], *host, res.Checkpoint, res.Took.Round(time.Millisecond), res.Epoch, res.From, res.Session.State)
				return nil
			}
		},
	}
}

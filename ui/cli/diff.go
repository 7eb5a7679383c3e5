package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"regexp"
	"strings"

	"github.com/berthvm/berth/session"
)

// What runs changed, and taking it back.

// ckptIDRE is a checkpoint id's form.
var ckptIDRE = regexp.MustCompile(`^c[1-9][0-9]{0,8}$`)

func runChanges(r session.Run) string {
	if r.Changes == nil {
		return "-"
	}
	return fmt.Sprintf("%s +%d -%d", plural(r.Changes.Files, "file"), r.Changes.Added, r.Changes.Removed)
}

// noStart renders a run without a starting point with the flag that
// keeps one.
func noStart(err error) error {
	var e *session.Error
	if errors.As(err, &e) && e.Code == session.CodeNoStart {
		c := *e
		c.Hint = "start runs with 'berth run start NAME --keep' to compare or undo them"
		return &c
	}
	return err
}

// diffFlags binds the output flags diffs share.
type diffFlags struct{ stat, patch, json *bool }

func bindDiffFlags(fs *flag.FlagSet) diffFlags {
	return diffFlags{
		stat:  fs.Bool("stat", false, "one line per file with its lines added and removed, and the totals"),
		patch: fs.Bool("patch", false, "unified diffs of text files (binary files as \"binary, N → M bytes\")"),
		json:  fs.Bool("json", false, "print JSON"),
	}
}

const diffHelp = `Lists the paths added (A), modified (M), removed (D) and renamed (R, with the old
path), with sizes and modes; --stat counts lines added and removed, --patch prints each
text file's unified diff as 'git diff' does. PATHs (relative to /workspace or absolute
under it; none climbing with ..) limit it to those paths and what is under them.
The checkpoint is read on the host as it is, nothing mounted; the workspace now through
the session's guest, which a run keeping its start records changed paths for: only those
are read. Without that record (the VM restarted since, or the record overflowed) both
trees are compared whole, by metadata, and the output says so.`

func runDiffCmd() *Command {
	return &Command{
		Name: "run diff", Action: session.ActionDiff, Group: "Agent runs and schedules", Usage: "ID [--stat] [--patch] [--json] [PATH...]", Args: []string{"ID", "[PATH...]"},
		Summary: "show what an agent run changed in the workspace",
		Help:    "Compares the run's starting point (it must have been started with --keep) with the\nworkspace now.\n" + diffHelp,
		Example: "berth run diff r3f9a0c1d2e4b\nberth run diff r3f9a0c1d2e4b --stat\nberth run diff r3f9a0c1d2e4b --patch src/",
		Setup: func(fs *flag.FlagSet) RunFunc {
			f := bindDiffFlags(fs)
			return func(ctx context.Context, c *Call, args []string) error {
				if _, err := inRun(ctx, args[0]); err != nil {
					return err
				}
				svc, err := c.service(ctx)
				if err != nil {
					return err
				}
				d, err := svc.RunDiff(ctx, args[0], session.DiffOptions{Paths: args[1:], Patch: *f.patch})
				if err != nil {
					return noStart(err)
				}
				return writeDiff(c.env.Stdout, d, f)
			}
		},
	}
}

func diffCmd() *Command {
	return &Command{
		Name: "diff", Action: session.ActionDiff, Group: "Checkpoints", Usage: "NAME ID1 [ID2] [--stat] [--patch] [--json] [PATH...]", Args: []string{"NAME", "ID1", "[ID2]", "[PATH...]"},
		Summary: "compare a checkpoint with another, or with the workspace now",
		Help:    "Compares checkpoint ID1 with ID2, or with the workspace now. An argument after ID1 that\nis a checkpoint id (c and a number) is ID2; write a path of that name as ./c2.\n" + diffHelp,
		Example: "berth diff demo c1\nberth diff demo c1 c3 --stat\nberth diff demo c1 src/main.go",
		Setup: func(fs *flag.FlagSet) RunFunc {
			f := bindDiffFlags(fs)
			return func(ctx context.Context, c *Call, args []string) error {
				to, paths := "", args[2:]
				if len(paths) > 0 && ckptIDRE.MatchString(paths[0]) {
					to, paths = paths[0], paths[1:]
				}
				svc, err := c.service(ctx)
				if err != nil {
					return err
				}
				d, err := svc.Diff(ctx, args[0], args[1], to, session.DiffOptions{Paths: paths, Patch: *f.patch})
				if err != nil {
					return err
				}
				return writeDiff(c.env.Stdout, d, f)
			}
		},
	}
}

// writeDiff prints a diff: JSON, a stat, patches, or the list of paths.
func writeDiff(w io.Writer, d session.Diff, f diffFlags) error {
	if *f.json {
		return writeJSON(w, d)
	}
	to := d.To
	if to == "" {
		to = "now"
	}
	head := fmt.Sprintf("%s: checkpoint %s → %s", d.Session, d.From, to)
	if d.Run != "" {
		head = fmt.Sprintf("run %s (%s): its start, checkpoint %s → now", d.Run, d.Session, d.From)
	}
	fmt.Fprintln(w, "# "+head)
	if d.Note != "" {
		fmt.Fprintln(w, "# "+d.Note)
	}
	if len(d.Changes) == 0 {
		fmt.Fprintln(w, "no changes")
		return nil
	}
	switch {
	case *f.stat:
		width := 0
		for _, ch := range d.Changes {
			width = max(width, len(changeName(ch)))
		}
		for _, ch := range d.Changes {
			fmt.Fprintf(w, " %-*s | %s\n", width, changeName(ch), statCell(ch))
		}
		fmt.Fprintln(w, " "+d.Summary())
	case *f.patch:
		for _, ch := range d.Changes {
			fmt.Fprintln(w, changeLine(ch))
			if ch.Patch != "" {
				fmt.Fprint(w, ch.Patch)
			}
		}
	default:
		for _, ch := range d.Changes {
			fmt.Fprintln(w, changeLine(ch))
		}
		fmt.Fprintln(w, d.Summary())
	}
	return nil
}

func changeName(ch session.FileChange) string {
	if ch.From != "" {
		return ch.From + " → " + ch.Path
	}
	return ch.Path
}

func statCell(ch session.FileChange) string {
	switch {
	case ch.Binary:
		return fmt.Sprintf("binary, %d → %d bytes", ch.OldSize, ch.NewSize)
	case ch.Added+ch.Removed > 0:
		return fmt.Sprintf("%d %s%s", ch.Added+ch.Removed, strings.Repeat("+", min(ch.Added, 40)), strings.Repeat("-", min(ch.Removed, 40)))
	}
	return "0"
}

// changeLine is one change as the list shows it: "M 0644 → 0755 run.sh".
func changeLine(ch session.FileChange) string {
	letter := map[session.ChangeKind]string{session.ChangeAdded: "A", session.ChangeModified: "M", session.ChangeRemoved: "D", session.ChangeRenamed: "R"}[ch.Kind]
	var what []string
	switch ch.Kind {
	case session.ChangeAdded:
		what = append(what, describeEntry(ch.NewMode, ch.NewSize, ch.NewLink))
	case session.ChangeRemoved:
		what = append(what, describeEntry(ch.OldMode, ch.OldSize, ch.OldLink))
	default:
		if ch.OldMode.Type() != ch.NewMode.Type() {
			what = append(what, describeEntry(ch.OldMode, ch.OldSize, ch.OldLink)+" → "+describeEntry(ch.NewMode, ch.NewSize, ch.NewLink))
			break
		}
		if ch.OldMode.Perm() != ch.NewMode.Perm() || ch.OldMode&^fs.ModePerm != ch.NewMode&^fs.ModePerm {
			what = append(what, fmt.Sprintf("mode %04o → %04o", unixMode(ch.OldMode), unixMode(ch.NewMode)))
		}
		switch {
		case ch.NewMode.Type() == fs.ModeSymlink && ch.OldLink != ch.NewLink:
			what = append(what, "-> "+ch.OldLink+" → "+ch.NewLink)
		case ch.Content && ch.NewMode.IsRegular():
			what = append(what, fmt.Sprintf("%d → %d bytes", ch.OldSize, ch.NewSize))
		}
	}
	if !ch.Binary && ch.Added+ch.Removed > 0 {
		what = append(what, fmt.Sprintf("+%d -%d", ch.Added, ch.Removed))
	}
	return fmt.Sprintf("%s %s  (%s)", letter, changeName(ch), strings.Join(what, ", "))
}

func describeEntry(m fs.FileMode, size int64, link string) string {
	switch {
	case m.IsDir():
		return fmt.Sprintf("directory %04o", unixMode(m))
	case m.Type() == fs.ModeSymlink:
		return "symlink -> " + link
	case m.IsRegular():
		return fmt.Sprintf("%04o, %d bytes", unixMode(m), size)
	}
	return m.Type().String()
}

// unixMode is m's permission and special bits as chmod writes them.
func unixMode(m fs.FileMode) uint32 {
	u := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		u |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		u |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		u |= 0o1000
	}
	return u
}

func runUndoCmd() *Command {
	return &Command{
		Name: "run undo", Action: session.ActionUndo, Group: "Agent runs and schedules", Usage: "ID [PATH...] [--yes]", Args: []string{"ID", "[PATH...]"},
		Summary: "put the workspace back as it was when an agent run started",
		Help: `Without PATHs, restores the run's starting point whole, as 'berth restore' does: an
automatic checkpoint of the current state first (a restore of it takes the undo back),
then a new VM on the starting point's disks. With PATHs, puts each back as it was (what
is under it too), or removes it if the run created it, while the session runs on; each
file is written to a temporary name and renamed into place, so a write racing the undo
lands before or after it, never in a half-restored file; durable when it returns.
Refused while the run has running commands. Without --yes, says what happens and asks
you to type the session's name; without a terminal, --yes is required.`,
		Example: "berth run undo r3f9a0c1d2e4b src/main.go\nberth run undo r3f9a0c1d2e4b --yes",
		Setup: func(fs *flag.FlagSet) RunFunc {
			yes := fs.Bool("yes", false, "do not ask for confirmation")
			return func(ctx context.Context, c *Call, args []string) error {
				id, paths := args[0], args[1:]
				if _, err := inRun(ctx, id); err != nil {
					return err
				}
				for _, p := range paths {
					if _, err := session.CleanDiffPath(p); err != nil {
						return err
					}
				}
				if !*yes && !c.env.StdinTTY {
					return usageErrorf("refusing to undo run %s without confirmation: stdin is not a terminal; add --yes", id)
				}
				svc, err := c.service(ctx)
				if err != nil {
					return err
				}
				r, err := svc.GetRun(ctx, id)
				if err != nil {
					return err
				}
				if !*yes {
					what := "Its whole workspace goes back to checkpoint " + dash(r.Checkpoint) + ": the VM is stopped and started anew on it,\nafter an automatic checkpoint of the current state."
					if len(paths) > 0 {
						what = "These paths go back to checkpoint " + dash(r.Checkpoint) + " (removed if the run made them): " + strings.Join(paths, " ")
					}
					fmt.Fprintf(c.env.Stderr, "Undo run %s (%s) in session %s.\n%s\nType the session name to confirm: ", id, dash(r.Title), r.Session, what)
					answer, err := readLine(c.env.Stdin)
					if err != nil && answer == "" {
						return fmt.Errorf("undo run %s: no confirmation (%v); nothing was changed", id, err)
					}
					if answer != r.Session {
						return fmt.Errorf("undo run %s: confirmation %q does not match; nothing was changed", id, answer)
					}
				}
				res, err := svc.UndoRun(ctx, id, paths)
				if err != nil {
					return noStart(err)
				}
				if res.Whole {
					fmt.Fprintf(c.env.Stdout, "run %s undone: session %s is back on checkpoint %s; the state before is checkpoint %s\n", id, r.Session, res.Checkpoint, res.Restore.Auto.ID)
					return nil
				}
				for _, p := range res.Restored {
					fmt.Fprintf(c.env.Stdout, "put back %s\n", p)
				}
				for _, p := range res.Removed {
					fmt.Fprintf(c.env.Stdout, "removed %s\n", p)
				}
				if len(res.Restored)+len(res.Removed) == 0 {
					fmt.Fprintln(c.env.Stdout, "nothing to undo: those paths are as the run found them")
				}
				return nil
			}
		},
	}
}

package ui

import (
	"context"
	"fmt"
	"strings"
	"time"

	tea "charm.land/bubbletea/v2"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/ui/common"
	"github.com/berthvm/berth/ui/components/dialog"
)

// Checkpoint, restore and fork actions.

// checkpoint takes a checkpoint: from the command line at once
// (":checkpoint NAME [--memory] [LABEL]"), from the key through a form.
func (m *Model) checkpoint(c call) tea.Cmd {
	if c.line {
		opts := session.CheckpointOptions{Label: c.tail}
		if rest, ok := strings.CutPrefix(c.tail, "--memory"); ok {
			opts = session.CheckpointOptions{Memory: true, Label: strings.TrimSpace(rest)}
		}
		return m.takeCheckpoint(c.s.Name, opts)
	}
	name := c.s.Name
	fields := []dialog.Field{
		{Label: "label", Placeholder: "optional", Hint: "to know it by in the list"},
		{Label: "memory", Placeholder: "no", Hint: "yes: keep the VM's memory too, so a restore resumes its processes"},
	}
	d, cmd := dialog.NewForm(m.c, "Checkpoint "+name, "Commands keep running; they are held for the copy.", fields, func(v []string) (tea.Cmd, error) {
		opts := session.CheckpointOptions{Label: strings.TrimSpace(v[0])}
		switch strings.ToLower(strings.TrimSpace(v[1])) {
		case "", "n", "no":
		case "y", "yes":
			opts.Memory = true
		default:
			return nil, fmt.Errorf("memory: answer yes or no")
		}
		return m.takeCheckpoint(name, opts), nil
	})
	return m.openDialog(d, cmd)
}

func (m *Model) takeCheckpoint(name string, opts session.CheckpointOptions) tea.Cmd {
	svc := m.c.Svc
	return m.runOp("checkpointing "+name, func(ctx context.Context) (string, tea.Msg, error) {
		ck, err := svc.Checkpoint(ctx, name, opts)
		if err != nil {
			return "", nil, err
		}
		held := ""
		if ck.Frozen > 0 {
			held = "; commands held " + ck.Frozen.Round(time.Millisecond).String()
		}
		return fmt.Sprintf("checkpoint %s of %s: %s, %s (%s)%s", ck.ID, name, ck.Holds(), session.FormatBytesShort(ck.Bytes), ck.Copy, held), nil, nil
	})
}

// vetRestore finds the checkpoint a restore names: the command line's
// ID, else the newest. One that does not exist is said before the
// confirmation.
func vetRestore(ctx context.Context, svc session.Service, c call) (call, error) {
	id := ""
	if c.line {
		id, _, _ = strings.Cut(c.tail, " ")
	}
	list, err := svc.Checkpoints(ctx, c.s.Name)
	if err != nil {
		return c, err
	}
	if id == "" {
		if len(list) == 0 {
			return c, fmt.Errorf("%s has no checkpoints (c takes one)", c.s.Name)
		}
		c.ck = list[len(list)-1]
		return c, nil
	}
	for _, ck := range list {
		if ck.ID == id {
			c.ck = ck
			return c, nil
		}
	}
	return c, fmt.Errorf("%s has no checkpoint %q (the Info tab lists its checkpoints)", c.s.Name, id)
}

func restorePrompt(m *Model, c call) (string, []string) {
	ck := c.ck
	what := "checkpoint " + ck.ID + " (" + ck.Holds() + ", taken " + ck.CreatedAt.In(m.c.Now().Location()).Format("Jan _2 15:04:05")
	if ck.Label != "" {
		what += ", «" + common.SanitizeLine(ck.Label) + "»"
	}
	what += ")"
	body := []string{
		"Restore stops the VM of " + c.s.Name + " and puts it back on " + what + ".",
		"Its current disks are kept first as an automatic checkpoint, so this can be undone.",
	}
	if c.s.Running > 0 {
		body = append(body, fmt.Sprintf("%d running command(s) will be stopped.", c.s.Running))
	}
	return "Restore " + c.s.Name + "?", body
}

func (m *Model) restore(c call) tea.Cmd {
	svc, name, id := m.c.Svc, c.s.Name, c.ck.ID
	return m.runOp("restoring "+name, func(ctx context.Context) (string, tea.Msg, error) {
		r, err := svc.Restore(ctx, name, id)
		if err != nil {
			return "", nil, err
		}
		return fmt.Sprintf("restored %s to %s; the state before is %s", name, id, r.Auto.ID), nil, nil
	})
}

// fork asks the new session's name (or takes it from the command line)
// and forks.
func (m *Model) fork(c call) tea.Cmd {
	src := c.s.Name
	if c.line {
		if c.tail == "" {
			return m.usage(c)
		}
		return m.forkSession(src, c.tail)
	}
	fields := []dialog.Field{{Label: "new name", Placeholder: src + "-fork", Hint: "lowercase letters, digits and dashes"}}
	d, cmd := dialog.NewForm(m.c, "Fork "+src, "A new session with "+src+"'s processes, files and system as of now.", fields, func(v []string) (tea.Cmd, error) {
		name := strings.TrimSpace(v[0])
		if name == "" {
			name = src + "-fork"
		}
		if err := session.ValidateName(name); err != nil {
			return nil, err
		}
		return m.forkSession(src, name), nil
	})
	return m.openDialog(d, cmd)
}

func (m *Model) forkSession(src, name string) tea.Cmd {
	svc := m.c.Svc
	return m.runOp("forking "+src+" into "+name, func(ctx context.Context) (string, tea.Msg, error) {
		r, err := svc.Fork(ctx, src, name)
		if err != nil {
			return "", nil, err
		}
		return fmt.Sprintf("forked %s into %s in %s (%s held %s)", src, name, r.Took.Round(time.Millisecond), src, r.Frozen.Round(time.Millisecond)), createdMsg{r.Session}, nil
	})
}

// undoRequest is the Runs tab's request to undo a run (u, U in its diff
// view): the table's undo action, on the run's session.
func (m *Model) undoRequest(msg common.UndoRunMsg) tea.Cmd {
	a := m.verb("undo")
	if a.mutates() && m.c.ReadOnly {
		return m.refuse("undo")
	}
	s, ok := m.sessions.Get(msg.Session)
	if !ok {
		return m.setFlash(common.FlashError, "no session "+msg.Session)
	}
	return m.proceed(call{a: a, s: s, run: session.Run{ID: msg.Run}, paths: msg.Paths})
}

// vetUndo finds the run an undo names (the command line's RUN, then its
// paths) and checks, before the confirmation, that it is the session's
// and kept its starting point.
func vetUndo(ctx context.Context, svc session.Service, c call) (call, error) {
	if c.line {
		f := strings.Fields(c.tail)
		if len(f) == 0 {
			return c, session.Invalid(session.FieldRun, "missing: :undo NAME RUN [PATH…]", "the Runs tab lists the session's runs")
		}
		c.run.ID, c.paths = f[0], f[1:]
	}
	r, err := svc.GetRun(ctx, c.run.ID)
	if err != nil {
		return c, err
	}
	if r.Session != c.s.Name {
		return c, fmt.Errorf("run %s is not %s's (it is %s's)", r.ID, c.s.Name, r.Session)
	}
	if r.Checkpoint == "" {
		return c, session.NoStartingPoint(r.ID, "")
	}
	for _, p := range c.paths {
		if _, err := session.CleanDiffPath(p); err != nil {
			return c, err
		}
	}
	c.run = r
	return c, nil
}

func undoPrompt(m *Model, c call) (string, []string) {
	r := c.run
	what := "run " + r.ID
	if r.Title != "" {
		what += " («" + common.SanitizeLine(r.Title) + "»)"
	}
	if len(c.paths) == 0 {
		body := []string{
			"Undo stops the VM of " + c.s.Name + " and puts /workspace back as it was when " + what + " started (checkpoint " + r.Checkpoint + ").",
			"Its current disks are kept first as an automatic checkpoint, so this can be undone.",
		}
		return "Undo all of run " + r.ID + "?", body
	}
	names := make([]string, len(c.paths))
	for i, p := range c.paths {
		names[i] = common.SanitizeLine(p)
	}
	body := []string{
		"Puts " + strings.Join(names, " and ") + " back as " + what + " found it (checkpoint " + r.Checkpoint + "); what the run created there is removed.",
		"What is there now is not kept: the rest of /workspace is left as it is.",
	}
	return "Undo " + strings.Join(names, ", ") + "?", body
}

func (m *Model) undoRun(c call) tea.Cmd {
	svc, name, id, paths := m.c.Svc, c.s.Name, c.run.ID, c.paths
	return m.runOp("undoing run "+id, func(ctx context.Context) (string, tea.Msg, error) {
		r, err := svc.UndoRun(ctx, id, paths)
		if err != nil {
			return "", nil, err
		}
		done := common.RunUndoneMsg{Run: id}
		if r.Whole && r.Restore != nil {
			return fmt.Sprintf("undid run %s: %s is back at %s; the state before is %s", id, name, r.Checkpoint, r.Restore.Auto.ID), done, nil
		}
		return fmt.Sprintf("undid run %s for %s: %d put back, %d removed", id, strings.Join(paths, ", "), len(r.Restored), len(r.Removed)), done, nil
	})
}

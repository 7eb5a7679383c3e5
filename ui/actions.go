package ui

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/ui/common"
	"github.com/berthvm/berth/ui/components/dialog"
)

// Actions run as Cmds; while one is in flight the status line shows a
// spinner and its label, and its outcome becomes a flash message.

type opDoneMsg struct {
	id   int
	text string
	err  error
	// next is delivered after the flash (e.g. open the Output of a
	// started command).
	next tea.Msg
	// label names the action in an error message.
	label string
}

type opFunc func(ctx context.Context) (text string, next tea.Msg, err error)

func (m *Model) runOp(label string, fn opFunc) tea.Cmd {
	m.opSeq++
	id := m.opSeq
	m.pending[id] = label
	life := m.c.Ctx
	op := func() tea.Msg {
		ctx, cancel := context.WithTimeout(life, opTimeout)
		defer cancel()
		text, next, err := fn(ctx)
		return opDoneMsg{id: id, text: text, next: next, err: err, label: label}
	}
	var tick tea.Cmd
	if !m.spinning {
		m.spinning = true
		tick = m.spinner.Tick
	}
	return tea.Batch(op, tick)
}

func (m *Model) handleOpDone(msg opDoneMsg) tea.Cmd {
	delete(m.pending, msg.id)
	if msg.err != nil {
		m.c.Logger.Warn("action failed", "action", msg.label, "err", msg.err)
		return m.setFlash(common.FlashError, msg.label+" failed: "+common.ErrorText(msg.err))
	}
	cmd := m.setFlash(common.FlashOK, msg.text)
	if msg.next != nil {
		next := msg.next
		return tea.Batch(cmd, func() tea.Msg { return next })
	}
	return cmd
}

// refuse is the answer to a mutating request in read-only mode; keys are
// already hidden, this covers the command line.
func (m *Model) refuse(what string) tea.Cmd {
	return m.setFlash(common.FlashError, "read-only: "+what+" is not allowed")
}

func (m *Model) runAction(b key.Binding) tea.Cmd {
	a := &m.actions
	is := func(x key.Binding) bool { return x.Help().Key == b.Help().Key }
	if is(a.New) {
		return m.newSessionDialog("")
	}
	s, ok := m.target()
	if !ok {
		return m.setFlash(common.FlashError, "no session selected")
	}
	switch {
	case is(a.PauseResume):
		return m.pauseResume(s)
	case is(a.Sleep):
		return m.sleepWake(s)
	case is(a.Flush):
		return m.flush(s)
	case is(a.StopStart):
		return m.stopStart(s)
	case is(a.Delete):
		return m.confirmDelete(s)
	case is(a.Exec):
		return m.execDialog(s)
	case is(a.CancelExec):
		return m.confirmCancel()
	}
	return nil
}

func (m *Model) openDialog(d dialog.Dialog, cmd tea.Cmd) tea.Cmd {
	d.SetSize(m.width, m.height)
	m.dialog = d
	return cmd
}

func (m *Model) pauseResume(s session.Session) tea.Cmd {
	if m.c.ReadOnly {
		return m.refuse("pause/resume")
	}
	svc, name := m.c.Svc, s.Name
	switch s.State {
	case session.StateRunning:
		dirty := s.DirtyBytes
		return m.runOp("pausing "+name, func(ctx context.Context) (string, tea.Msg, error) {
			if _, err := svc.Pause(ctx, name); err != nil {
				return "", nil, err
			}
			return "paused " + name + ". Pause does not flush: " + session.FormatBytes(dirty) + " still only in guest memory (f flushes)", nil, nil
		})
	case session.StatePaused:
		return m.runOp("resuming "+name, func(ctx context.Context) (string, tea.Msg, error) {
			if _, err := svc.Resume(ctx, name); err != nil {
				return "", nil, err
			}
			return "resumed " + name, nil, nil
		})
	}
	return m.setFlash(common.FlashError, "can't pause or resume "+name+": it is "+string(s.State))
}

// sleepWake puts an idle running session to sleep, or wakes a sleeping one.
func (m *Model) sleepWake(s session.Session) tea.Cmd {
	if m.c.ReadOnly {
		return m.refuse("sleep/wake")
	}
	svc, name := m.c.Svc, s.Name
	switch s.State {
	case session.StateRunning:
		return m.runOp("putting "+name+" to sleep", func(ctx context.Context) (string, tea.Msg, error) {
			got, err := svc.Sleep(ctx, name)
			if err != nil {
				return "", nil, err
			}
			return fmt.Sprintf("%s is asleep: flushed, %s snapshot on disk, VM released", name, session.FormatBytes(got.SnapshotBytes)), nil, nil
		})
	case session.StateSleeping:
		return m.runOp("waking "+name, func(ctx context.Context) (string, tea.Msg, error) {
			got, err := svc.Resume(ctx, name)
			if err != nil {
				return "", nil, err
			}
			return fmt.Sprintf("woke %s in %s", name, got.LastWake.Round(time.Millisecond)), nil, nil
		})
	}
	return m.setFlash(common.FlashError, "can't sleep or wake "+name+": it is "+string(s.State))
}

func (m *Model) flush(s session.Session) tea.Cmd {
	if m.c.ReadOnly {
		return m.refuse("flush")
	}
	if s.State != session.StateRunning {
		hint := ""
		if s.State == session.StatePaused {
			hint = " (resume it first)"
		}
		return m.setFlash(common.FlashError, "can't flush "+s.Name+": it is "+string(s.State)+hint)
	}
	svc, name := m.c.Svc, s.Name
	return m.runOp("flushing "+name, func(ctx context.Context) (string, tea.Msg, error) {
		r, err := svc.Flush(ctx, name)
		if err != nil {
			return "", nil, err
		}
		if r.DirtyBefore == 0 {
			return "flushed " + name + ": nothing was pending", nil, nil
		}
		return fmt.Sprintf("flushed %s: %s made durable in %s", name, session.FormatBytes(r.DirtyBefore), session.FormatDuration(r.Took)), nil, nil
	})
}

func (m *Model) stopStart(s session.Session) tea.Cmd {
	if m.c.ReadOnly {
		return m.refuse("stop/start")
	}
	svc, name := m.c.Svc, s.Name
	switch s.State {
	case session.StateRunning, session.StatePaused:
		body := []string{
			"Stop shuts the VM down cleanly: commands are stopped, /workspace is flushed and unmounted, then the VM powers off.",
			"Kept: every file in /workspace. Lost: the VM's own state (home directory, processes, memory).",
		}
		if s.Running > 0 {
			body = append(body, fmt.Sprintf("%d running command(s) will be killed; there is no rollback of their partial changes.", s.Running))
		}
		d := dialog.NewConfirm(m.c, "Stop "+name+"?", body, func() tea.Cmd {
			return m.runOp("stopping "+name, func(ctx context.Context) (string, tea.Msg, error) {
				if _, err := svc.Stop(ctx, name); err != nil {
					return "", nil, err
				}
				return "stopped " + name + " (workspace flushed)", nil, nil
			})
		})
		return m.openDialog(d, nil)
	case session.StateStopped, session.StateCrashed, session.StateSleeping:
		return m.runOp("starting "+name, func(ctx context.Context) (string, tea.Msg, error) {
			if _, err := svc.Start(ctx, name); err != nil {
				return "", nil, err
			}
			return "started " + name, nil, nil
		})
	}
	return m.setFlash(common.FlashError, "can't stop or start "+name+": it is "+string(s.State))
}

func (m *Model) confirmDelete(s session.Session) tea.Cmd {
	if m.c.ReadOnly {
		return m.refuse("delete")
	}
	svc, name := m.c.Svc, s.Name
	body := []string{
		"This destroys the VM and ALL of its storage, including /workspace (" + session.FormatBytesShort(s.WorkspaceUsed) + " used of " + session.FormatBytesShort(s.DiskBytes) + "). It cannot be undone.",
	}
	if s.Running > 0 {
		body = append(body, fmt.Sprintf("%d command(s) are running in it.", s.Running))
	}
	d, cmd := dialog.NewTypedConfirm(m.c, "Delete "+name+" permanently?", body, name, func() tea.Cmd {
		return m.runOp("deleting "+name, func(ctx context.Context) (string, tea.Msg, error) {
			if err := svc.Delete(ctx, name); err != nil {
				return "", nil, err
			}
			return "deleted " + name, nil, nil
		})
	})
	return m.openDialog(d, cmd)
}

func (m *Model) newSessionDialog(name string) tea.Cmd {
	if m.c.ReadOnly {
		return m.refuse("create")
	}
	fields := []dialog.Field{
		{Label: "name", Placeholder: "my-session", Value: name, Hint: "lowercase letters, digits and dashes"},
		{Label: "vCPUs", Placeholder: "default", Hint: "e.g. 2"},
		{Label: "memory", Placeholder: "default", Hint: "e.g. 1G or 512M (a bare number is bytes)"},
		{Label: "disk", Placeholder: "default", Hint: "/workspace volume size, e.g. 10G (a bare number is bytes)"},
		{Label: "image", Placeholder: "default (" + session.DefaultImage + ")"},
	}
	d, cmd := dialog.NewForm(m.c, "New session", "", fields, func(v []string) (tea.Cmd, error) {
		opts, err := createOptions(v[0], v[1], v[2], v[3], v[4])
		if err != nil {
			return nil, err
		}
		return m.create(opts), nil
	})
	return m.openDialog(d, cmd)
}

// createOptions reads the new-session form (or :create's settings) with
// session's rules; empty fields take the daemon's defaults.
func createOptions(name, cpus, mem, disk, image string) (session.CreateOptions, error) {
	o := session.CreateOptions{Name: strings.TrimSpace(name), Image: strings.TrimSpace(image)}
	if err := session.ValidateName(o.Name); err != nil {
		return o, err
	}
	if s := strings.TrimSpace(cpus); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 256 {
			return o, fmt.Errorf("vCPUs %q: a number from 1 to 256", s)
		}
		o.CPUs = n
	}
	if s := strings.TrimSpace(mem); s != "" {
		mib, err := session.ParseMemory(s)
		if err != nil {
			return o, fmt.Errorf("memory %q: %v", s, err)
		}
		o.MemoryMiB = mib
	}
	if s := strings.TrimSpace(disk); s != "" {
		b, err := session.ParseSize(s)
		if err != nil {
			return o, fmt.Errorf("disk %q: %v", s, err)
		}
		o.DiskBytes = b
	}
	return o, nil
}

func (m *Model) create(opts session.CreateOptions) tea.Cmd {
	svc := m.c.Svc
	return m.runOp("creating "+opts.Name, func(ctx context.Context) (string, tea.Msg, error) {
		s, err := svc.Create(ctx, opts)
		if err != nil {
			return "", nil, err
		}
		return "created " + s.Name + " (" + string(s.State) + ")", createdMsg{s}, nil
	})
}

// createdMsg carries a session just created, to show and select.
type createdMsg struct{ s session.Session }

func (m *Model) execDialog(s session.Session) tea.Cmd {
	if m.c.ReadOnly {
		return m.refuse("exec")
	}
	name := s.Name
	note := ""
	if s.State != session.StateRunning {
		note = name + " is " + string(s.State) + "; the command will fail unless it is running."
	}
	d, cmd := dialog.NewForm(m.c, "Run in "+name, note, []dialog.Field{
		{Label: "$", Placeholder: "make test", Hint: "sh -c in /workspace; opens in Output"},
	}, func(v []string) (tea.Cmd, error) {
		command := strings.TrimSpace(v[0])
		if command == "" {
			return nil, fmt.Errorf("type a command")
		}
		return m.exec(name, command), nil
	})
	return m.openDialog(d, cmd)
}

// exec starts a command and opens its output. The process's stream is
// tied to the program's lifetime, not to this call: the Output view reads
// it, and drains it if the operator moves on, so the command is never cut
// short by the UI.
func (m *Model) exec(name, command string) tea.Cmd {
	svc, life, now := m.c.Svc, m.c.Ctx, m.c.Now
	argv := []string{"/bin/sh", "-c", command}
	return m.runOp("starting command in "+name, func(ctx context.Context) (string, tea.Msg, error) {
		ectx, cancel := context.WithCancel(life)
		// Bound the call itself: if Exec does not return in time, give up
		// on it; once it has returned the stream lives on.
		t := time.AfterFunc(opTimeout, cancel)
		p, err := svc.Exec(ectx, name, session.ExecRequest{Argv: argv})
		if err != nil || !t.Stop() {
			cancel()
			if err == nil {
				err = context.DeadlineExceeded
			}
			return "", nil, err
		}
		e := session.Execution{ID: p.ID(), Session: name, Argv: argv, State: session.ExecRunning, StartedAt: now(), By: "tui"}
		if rec, err := svc.Execution(ctx, p.ID()); err == nil {
			e = rec
		}
		return "started " + common.ShortID(e.ID) + " in " + name, common.OpenOutputMsg{Exec: e, Proc: p}, nil
	})
}

func (m *Model) confirmCancel() tea.Cmd {
	if m.c.ReadOnly {
		return m.refuse("cancel")
	}
	var e session.Execution
	var ok bool
	if m.tab == tabOutput {
		e, ok = m.output.Exec()
	} else {
		e, ok = m.execs.Selected()
	}
	if !ok {
		return m.setFlash(common.FlashError, "no execution selected")
	}
	if e.State.Done() {
		return m.setFlash(common.FlashError, "execution "+common.ShortID(e.ID)+" already "+string(e.State))
	}
	svc, id := m.c.Svc, e.ID
	d := dialog.NewConfirm(m.c, "Cancel "+common.ShortID(id)+"?", []string{
		"$ " + common.ExecLabel(e),
		"This kills the command's whole process group in the guest.",
		"There is no rollback: changes it already made to /workspace stay.",
	}, func() tea.Cmd {
		return m.runOp("cancelling "+common.ShortID(id), func(ctx context.Context) (string, tea.Msg, error) {
			if err := svc.Cancel(ctx, id); err != nil {
				return "", nil, err
			}
			return "cancelled " + common.ShortID(id) + " (partial changes, if any, remain)", nil, nil
		})
	})
	return m.openDialog(d, nil)
}

// runCommand runs a ":" command line.
func (m *Model) runCommand(line string) tea.Cmd {
	verb, rest, _ := strings.Cut(line, " ")
	rest = strings.TrimSpace(rest)
	arg, tail, _ := strings.Cut(rest, " ")
	tail = strings.TrimSpace(tail)
	named := func() (session.Session, bool) {
		if arg == "" {
			return m.target()
		}
		return m.sessions.Get(arg)
	}
	noSession := func() tea.Cmd {
		if arg == "" {
			return m.setFlash(common.FlashError, ":"+verb+" needs a session name")
		}
		return m.setFlash(common.FlashError, "no session "+arg)
	}
	mutating := map[string]bool{"create": true, "exec": true, "flush": true, "pause": true, "resume": true, "stop": true, "start": true, "delete": true}
	if m.c.ReadOnly && mutating[verb] {
		return m.refuse(":" + verb)
	}
	switch verb {
	case "q", "quit", "q!":
		return m.quit()
	case "help", "h":
		m.showHelp = true
		return nil
	case "create", "new":
		if arg == "" {
			return m.newSessionDialog("")
		}
		kv := map[string]string{}
		for _, f := range strings.Fields(tail) {
			k, v, ok := strings.Cut(f, "=")
			if !ok {
				return m.setFlash(common.FlashError, ":create NAME [cpus=N] [mem=SIZE] [disk=SIZE] [image=NAME]")
			}
			kv[k] = v
		}
		opts, err := createOptions(arg, kv["cpus"], kv["mem"], kv["disk"], kv["image"])
		if err != nil {
			return m.setFlash(common.FlashError, err.Error())
		}
		return m.create(opts)
	case "exec", "x":
		if arg == "" || tail == "" {
			return m.setFlash(common.FlashError, ":exec NAME COMMAND")
		}
		if _, ok := m.sessions.Get(arg); !ok {
			return noSession()
		}
		return m.exec(arg, tail)
	case "flush", "pause", "resume", "stop", "start", "delete", "open":
		s, ok := named()
		if !ok {
			return noSession()
		}
		switch verb {
		case "flush":
			return m.flush(s)
		case "pause":
			if s.State != session.StateRunning {
				return m.setFlash(common.FlashError, "can't pause "+s.Name+": it is "+string(s.State))
			}
			return m.pauseResume(s)
		case "resume":
			if s.State != session.StatePaused {
				return m.setFlash(common.FlashError, "can't resume "+s.Name+": it is "+string(s.State))
			}
			return m.pauseResume(s)
		case "stop":
			if s.State != session.StateRunning && s.State != session.StatePaused {
				return m.setFlash(common.FlashError, "can't stop "+s.Name+": it is "+string(s.State))
			}
			return m.stopStart(s)
		case "start":
			if s.State == session.StateRunning || s.State == session.StatePaused {
				return m.setFlash(common.FlashError, s.Name+" is already "+string(s.State))
			}
			return m.stopStart(s)
		case "delete":
			return m.confirmDelete(s)
		case "open":
			return m.openDetail(s.Name)
		}
	case "sort":
		if !m.sessions.SortByName(arg) {
			return m.setFlash(common.FlashError, "no column "+arg+" (name, state, vcpu, mem, workspace, dirty, run, uptime, activity)")
		}
		return nil
	case "filter":
		m.page = pageSessions
		m.sessions.SetFilter(rest)
		return nil
	}
	return m.setFlash(common.FlashError, "unknown command :"+verb+" (try :create, :exec, :flush, :open, :q)")
}

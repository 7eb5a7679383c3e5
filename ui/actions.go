package ui

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
		if errors.Is(msg.err, session.ErrInvalidState) {
			// The service's refusal names the action and says what to do.
			return m.setFlash(common.FlashError, common.ErrorText(msg.err))
		}
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

// The action table. Every thing an operator does to sessions and
// executions, by key or on the ":" command line, is one entry of
// actionTable; the key bindings, the help, read-only mode, key dispatch,
// the command line and its suggestions are all computed from it. The TUI
// does not predict the service's refusals: it asks, and shows the answer,
// which says what to do instead. An action that asks for confirmation
// asks the service first what can be known before (the role's permission,
// the session's state now, that the checkpoint exists), so a refusal never
// comes after the operator typed a name to confirm.

// confirmKind is what an action asks before it runs.
type confirmKind int

const (
	noConfirm   confirmKind = iota
	confirmYes              // a yes/no dialog
	confirmName             // the session's name must be typed
)

// targetKind is what an action applies to.
type targetKind int

const (
	noTarget targetKind = iota
	// onSession: the session named on the command line, else the one
	// shown or selected.
	onSession
	// onExecution: the execution shown in Output or selected in
	// Executions.
	onExecution
)

// An action is one entry of the table.
type action struct {
	// key is its key and help; no keys means command line only.
	key key.Binding
	// verbs are its ":" names, the first suggested; none means key only.
	verbs []string
	// args are the command line's arguments after the verb (after the
	// session name for onSession), for usage messages.
	args   string
	target targetKind
	// when, if set, says whether the key applies in the current view.
	when func(m *Model) bool
	// confirm is what is asked first; prompt gives the dialog's title and
	// body.
	confirm confirmKind
	prompt  func(m *Model, c call) (title string, body []string)
	// act is the contract's action it is, if any: the action table says
	// whether it changes anything (read-only mode hides and refuses it),
	// and before a confirmation the operator's permission
	// (Options.Permit) and the session's state are checked for it.
	act session.Action
	// vet, if set, checks more before the confirmation (off the UI
	// goroutine), filling in what it found.
	vet func(ctx context.Context, svc session.Service, c call) (call, error)
	run func(m *Model, c call) tea.Cmd
}

// mutates reports whether the action changes anything, as the contract's
// action table says.
func (a *action) mutates() bool { return a.act != "" && session.Mutates(a.act) }

// call is one invocation of an action.
type call struct {
	a    *action
	line bool   // from the command line; else from the key
	verb string // the verb typed
	arg  string // the first word after it
	tail string // what follows arg
	rest string // what follows the verb
	s    session.Session
	e    session.Execution
	ck   session.Checkpoint // restore's, found by vetRestore
	// undo's: the run, and the paths to put back (none: all of it).
	run   session.Run
	paths []string
}

func bind(k, help string) key.Binding {
	return key.NewBinding(key.WithKeys(k), key.WithHelp(k, help))
}

// actionTable returns every action. The order of the keyed ones is the
// order of the help and the footer.
func actionTable() []action {
	return []action{
		{key: bind("p", "pause/resume (does not flush)"), act: session.ActionPause, target: onSession,
			run: func(m *Model, c call) tea.Cmd {
				return m.do(pick(c.s.State, session.ActionPause, session.ActionResume), c)
			}},
		{verbs: []string{"pause"}, act: session.ActionPause, target: onSession, run: (*Model).pause},
		{verbs: []string{"resume"}, act: session.ActionResume, target: onSession, run: (*Model).resume},
		{key: bind("S", "sleep/wake (snapshot to disk)"), act: session.ActionSleep, target: onSession,
			run: func(m *Model, c call) tea.Cmd {
				if c.s.State == session.StateSleeping {
					return m.do(session.ActionResume, c)
				}
				return m.do(session.ActionSleep, c)
			}},
		{verbs: []string{"sleep"}, act: session.ActionSleep, target: onSession, run: (*Model).sleep},
		{key: bind("f", "flush workspace"), verbs: []string{"flush"}, act: session.ActionFlush, target: onSession, run: (*Model).flush},
		{key: bind("s", "stop/start"), act: session.ActionStop, target: onSession,
			run: func(m *Model, c call) tea.Cmd {
				return m.do(pick(c.s.State, session.ActionStart, session.ActionStop), c)
			}},
		{verbs: []string{"stop"}, target: onSession, confirm: confirmYes, prompt: stopPrompt, act: session.ActionStop, run: (*Model).stop},
		{verbs: []string{"start"}, act: session.ActionStart, target: onSession, run: (*Model).start},
		{key: bind("R", "replace VM (keeps /workspace)"), verbs: []string{"replace"}, target: onSession,
			confirm: confirmName, prompt: replacePrompt, act: session.ActionReplace, run: (*Model).replace},
		{key: bind("c", "checkpoint (disks, or memory too)"), verbs: []string{"checkpoint"}, args: "[--memory] [LABEL]", act: session.ActionCheckpoint, target: onSession, run: (*Model).checkpoint},
		{key: bind("u", "restore latest checkpoint"), verbs: []string{"restore"}, args: "[ID]", target: onSession,
			confirm: confirmName, prompt: restorePrompt, act: session.ActionRestore, vet: vetRestore, run: (*Model).restore},
		// undo has no key of its own here: the Runs tab's diff view
		// asks for it (u, U) with the run and file it shows.
		{verbs: []string{"undo"}, args: "RUN [PATH…]", target: onSession,
			confirm: confirmName, prompt: undoPrompt, act: session.ActionUndo, vet: vetUndo, run: (*Model).undoRun},
		{key: bind("F", "fork into a new session"), verbs: []string{"fork"}, args: "NEW", act: session.ActionFork, target: onSession, run: (*Model).fork},
		{key: bind("d", "delete session"), verbs: []string{"delete"}, target: onSession,
			confirm: confirmName, prompt: deletePrompt, act: session.ActionDelete, run: (*Model).delete},
		{key: bind("n", "new session"), verbs: []string{"create", "new"}, args: "NAME [cpus=N] [mem=SIZE] [disk=SIZE] [image=NAME] [from=SESSION@ID]",
			act: session.ActionCreate, run: (*Model).create},
		{key: bind("x", "run command"), verbs: []string{"exec", "x"}, args: "COMMAND", act: session.ActionExec, target: onSession, run: (*Model).execAction},
		{key: bind("N", "network policy"), verbs: []string{"net"}, args: "[POLICY]", act: session.ActionNet, target: onSession, run: (*Model).netAction},
		{key: bind("P", "forward a port"), verbs: []string{"forward", "port-forward"}, args: "[LOCAL:]REMOTE", act: session.ActionNet, target: onSession, run: (*Model).forwardAction},
		{key: bind("K", "cancel execution"), act: session.ActionCancel, target: onExecution, when: (*Model).onExecTab,
			confirm: confirmYes, prompt: cancelPrompt, run: (*Model).cancelExec},
		{verbs: []string{"open"}, target: onSession, run: func(m *Model, c call) tea.Cmd { return m.openDetail(c.s.Name) }},
		{verbs: []string{"sort"}, args: "COLUMN", run: func(m *Model, c call) tea.Cmd {
			if !m.sessions.SortByName(c.arg) {
				return m.setFlash(common.FlashError, "no column "+c.arg+" (name, state, vcpu, cpu, mem, workspace, dirty, run, uptime, activity)")
			}
			return nil
		}},
		{verbs: []string{"filter"}, args: "TEXT", run: func(m *Model, c call) tea.Cmd {
			m.page = pageSessions
			m.sessions.SetFilter(c.rest)
			return nil
		}},
		{verbs: []string{"hosts"}, act: session.ActionHosts, run: func(m *Model, c call) tea.Cmd { return m.openHosts() }},
		{verbs: []string{"help", "h"}, run: func(m *Model, c call) tea.Cmd { m.openHelp(); return nil }},
		{verbs: []string{"quit", "q", "q!"}, run: func(m *Model, c call) tea.Cmd { return m.quit() }},
	}
}

// newActions returns the table for one program: in read-only mode the
// keys of the actions that change anything are disabled, which hides them
// from the help and the footer.
func newActions(readOnly bool) []action {
	acts := actionTable()
	for i := range acts {
		if readOnly && acts[i].mutates() {
			acts[i].key.SetEnabled(false)
		}
	}
	return acts
}

// actionKeys returns the bindings of the keyed actions (the key coverage
// check).
func actionKeys() []key.Binding {
	var out []key.Binding
	for _, a := range actionTable() {
		if len(a.key.Keys()) > 0 {
			out = append(out, a.key)
		}
	}
	return out
}

// commandSuggestions are the command line's completions: each action's
// first verb, with a space when it takes arguments.
func commandSuggestions(acts []action) []string {
	var out []string
	for _, a := range acts {
		if len(a.verbs) == 0 {
			continue
		}
		v := a.verbs[0]
		if a.target == onSession || a.args != "" {
			v += " "
		}
		out = append(out, v)
	}
	return out
}

// pick returns the first of actions the transition table allows in st, or,
// when none is, the first, for the service to refuse with its hint.
func pick(st session.State, actions ...session.Action) session.Action {
	for _, a := range actions {
		if session.Allowed(a, st) {
			return a
		}
	}
	return actions[0]
}

// verb returns the action a command-line verb names, or nil.
func (m *Model) verb(v string) *action {
	for i := range m.actions {
		if slices.Contains(m.actions[i].verbs, v) {
			return &m.actions[i]
		}
	}
	return nil
}

// do runs the action named by a transition-table action (a key that
// toggles between two), on the target c already has.
func (m *Model) do(a session.Action, c call) tea.Cmd {
	c.a = m.verb(string(a))
	return m.proceed(c)
}

// invoke runs a: it refuses what read-only mode forbids, finds the target,
// then asks for confirmation if a wants it.
func (m *Model) invoke(a *action, c call) tea.Cmd {
	c.a = a
	if a.mutates() && m.c.ReadOnly {
		what := a.key.Help().Desc
		if c.line {
			what = ":" + c.verb
		}
		return m.refuse(what)
	}
	switch a.target {
	case onSession:
		s, ok := m.target()
		if c.line && c.arg != "" {
			s, ok = m.sessions.Get(c.arg)
		}
		switch {
		case ok:
			c.s = s
		case !c.line:
			return m.setFlash(common.FlashError, "no session selected")
		case c.arg == "":
			return m.setFlash(common.FlashError, ":"+c.verb+" needs a session name")
		default:
			return m.setFlash(common.FlashError, "no session "+c.arg)
		}
	case onExecution:
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
		c.e = e
	}
	return m.proceed(c)
}

// proceed asks c.a's confirmation, if any, then runs it. What can be
// checked is checked before the confirmation.
func (m *Model) proceed(c call) tea.Cmd {
	if c.a.confirm != noConfirm && (c.a.act != "" || c.a.vet != nil) {
		return m.vetCall(c)
	}
	return m.confirm(c)
}

// vettedMsg is the outcome of vetCall.
type vettedMsg struct {
	id  int // the pending entry
	c   call
	err error
}

// vetCall checks c off the UI goroutine; the confirmation opens when the
// checks pass (handleVetted).
func (m *Model) vetCall(c call) tea.Cmd {
	m.opSeq++
	id := m.opSeq
	m.pending[id] = "checking " + c.s.Name
	m.vetting, m.typeahead = id, nil
	svc, permit := m.c.Svc, m.opts.Permit
	ctx, cancel := m.c.Call()
	vet := func() tea.Msg {
		defer cancel()
		c, err := vet(ctx, svc, permit, c)
		return vettedMsg{id: id, c: c, err: err}
	}
	var tick tea.Cmd
	if !m.spinning {
		m.spinning = true
		tick = m.spinner.Tick
	}
	return tea.Batch(vet, tick)
}

// vet runs c's checks: the permission, then the session's state now, then
// the action's own.
func vet(ctx context.Context, svc session.Service, permit func(context.Context, session.Action) error, c call) (call, error) {
	a := c.a
	if a.act != "" {
		if permit != nil {
			if err := permit(ctx, a.act); err != nil {
				return c, err
			}
		}
		if a.target == onSession {
			s, err := svc.Get(ctx, c.s.Name)
			if err != nil {
				return c, err
			}
			if err := session.CheckTransition(s.Name, a.act, s.State); err != nil {
				return c, err
			}
			c.s = s
		}
	}
	if a.vet != nil {
		return a.vet(ctx, svc, c)
	}
	return c, nil
}

func (m *Model) handleVetted(msg vettedMsg) tea.Cmd {
	delete(m.pending, msg.id)
	if msg.id != m.vetting {
		return nil // given up with esc
	}
	typed := m.typeahead
	m.vetting, m.typeahead = 0, nil
	if msg.err != nil {
		return m.setFlash(common.FlashError, common.ErrorText(msg.err))
	}
	cmds := []tea.Cmd{m.confirm(msg.c)}
	for _, k := range typed {
		if m.dialog == nil {
			break
		}
		cmds = append(cmds, m.dialog.Update(k))
		if m.dialog.Done() {
			m.dialog = nil
		}
	}
	return tea.Batch(cmds...)
}

// holdKey keeps a key typed while a confirmation is being checked: it is
// meant for the dialog (a name typed ahead), not for the view beneath,
// where "alpha" would pause. esc gives the action up.
func (m *Model) holdKey(k tea.KeyPressMsg) tea.Cmd {
	if k.String() == "esc" {
		delete(m.pending, m.vetting)
		m.vetting, m.typeahead = 0, nil
		return nil
	}
	m.typeahead = append(m.typeahead, k)
	return nil
}

// confirm asks c.a's confirmation, if any, then runs it.
func (m *Model) confirm(c call) tea.Cmd {
	a := c.a
	run := func() tea.Cmd { return a.run(m, c) }
	switch a.confirm {
	case confirmYes:
		title, body := a.prompt(m, c)
		return m.openDialog(dialog.NewConfirm(m.c, title, body, run), nil)
	case confirmName:
		title, body := a.prompt(m, c)
		d, cmd := dialog.NewTypedConfirm(m.c, title, body, c.s.Name, run)
		return m.openDialog(d, cmd)
	}
	return run()
}

// runCommand runs a ":" command line.
func (m *Model) runCommand(line string) tea.Cmd {
	verb, rest, _ := strings.Cut(line, " ")
	rest = strings.TrimSpace(rest)
	arg, tail, _ := strings.Cut(rest, " ")
	a := m.verb(verb)
	if a == nil {
		return m.setFlash(common.FlashError, "unknown command :"+verb+" (try :create, :exec, :flush, :open, :q)")
	}
	return m.invoke(a, call{line: true, verb: verb, arg: arg, tail: strings.TrimSpace(tail), rest: rest})
}

// usage flashes how c's command line is written.
func (m *Model) usage(c call) tea.Cmd {
	u := ":" + c.a.verbs[0]
	if c.a.target == onSession {
		u += " NAME"
	}
	return m.setFlash(common.FlashError, u+" "+c.a.args)
}

func (m *Model) onExecTab() bool {
	return m.page == pageDetail && (m.tab == tabExecs || m.tab == tabOutput)
}

func (m *Model) openDialog(d dialog.Dialog, cmd tea.Cmd) tea.Cmd {
	d.SetSize(m.width, m.height)
	m.dialog = d
	return cmd
}

func (m *Model) pause(c call) tea.Cmd {
	svc, name, dirty := m.c.Svc, c.s.Name, c.s.DirtyBytes
	return m.runOp("pausing "+name, func(ctx context.Context) (string, tea.Msg, error) {
		if _, err := svc.Pause(ctx, name); err != nil {
			return "", nil, err
		}
		return "paused " + name + ". Pause does not flush: " + session.FormatBytes(dirty) + " still only in guest memory (f flushes)", nil, nil
	})
}

// resume continues a paused session, or wakes a sleeping one.
func (m *Model) resume(c call) tea.Cmd {
	svc, name := m.c.Svc, c.s.Name
	if c.s.State == session.StateSleeping {
		return m.runOp("waking "+name, func(ctx context.Context) (string, tea.Msg, error) {
			got, err := svc.Resume(ctx, name)
			if err != nil {
				return "", nil, err
			}
			return fmt.Sprintf("woke %s in %s", name, got.LastWake.Round(time.Millisecond)), nil, nil
		})
	}
	return m.runOp("resuming "+name, func(ctx context.Context) (string, tea.Msg, error) {
		if _, err := svc.Resume(ctx, name); err != nil {
			return "", nil, err
		}
		return "resumed " + name, nil, nil
	})
}

// sleep puts an idle running session to sleep.
func (m *Model) sleep(c call) tea.Cmd {
	svc, name := m.c.Svc, c.s.Name
	return m.runOp("putting "+name+" to sleep", func(ctx context.Context) (string, tea.Msg, error) {
		got, err := svc.Sleep(ctx, name)
		if err != nil {
			return "", nil, err
		}
		return fmt.Sprintf("%s is asleep: flushed, %s snapshot on disk, VM released", name, session.FormatBytes(got.SnapshotBytes)), nil, nil
	})
}

func (m *Model) flush(c call) tea.Cmd {
	svc, name := m.c.Svc, c.s.Name
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

func stopPrompt(m *Model, c call) (string, []string) {
	body := []string{
		"Stop shuts the VM down cleanly: commands are stopped, /workspace is flushed and unmounted, then the VM powers off.",
		"Kept: every file in /workspace. Lost: the VM's own state (home directory, processes, memory).",
	}
	if c.s.Running > 0 {
		body = append(body, fmt.Sprintf("%d running command(s) will be killed; there is no rollback of their partial changes.", c.s.Running))
	}
	return "Stop " + c.s.Name + "?", body
}

func (m *Model) stop(c call) tea.Cmd {
	svc, name := m.c.Svc, c.s.Name
	return m.runOp("stopping "+name, func(ctx context.Context) (string, tea.Msg, error) {
		if _, err := svc.Stop(ctx, name); err != nil {
			return "", nil, err
		}
		return "stopped " + name + " (workspace flushed)", nil, nil
	})
}

func (m *Model) start(c call) tea.Cmd {
	svc, name := m.c.Svc, c.s.Name
	return m.runOp("starting "+name, func(ctx context.Context) (string, tea.Msg, error) {
		if _, err := svc.Start(ctx, name); err != nil {
			return "", nil, err
		}
		return "started " + name, nil, nil
	})
}

func deletePrompt(m *Model, c call) (string, []string) {
	s := c.s
	ws := session.FormatBytesShort(s.DiskBytes) + ", its use not measured yet"
	if s.WorkspaceKnown() {
		ws = session.FormatBytesShort(s.WorkspaceUsed) + " used of " + session.FormatBytesShort(s.DiskBytes)
	}
	body := []string{
		"This destroys the VM and ALL of its storage, including /workspace (" + ws + "). It cannot be undone.",
	}
	if s.Running > 0 {
		body = append(body, fmt.Sprintf("%d command(s) are running in it.", s.Running))
	}
	if s.Checkpoints > 0 {
		body = append(body, fmt.Sprintf("Its %d checkpoint(s) (%s) are deleted with it.", s.Checkpoints, session.FormatBytesShort(s.CheckpointBytes)))
	}
	return "Delete " + s.Name + " permanently?", body
}

func (m *Model) delete(c call) tea.Cmd {
	svc, name := m.c.Svc, c.s.Name
	return m.runOp("deleting "+name, func(ctx context.Context) (string, tea.Msg, error) {
		if err := svc.Delete(ctx, name); err != nil {
			return "", nil, err
		}
		return "deleted " + name, nil, nil
	})
}

func replacePrompt(m *Model, c call) (string, []string) {
	s := c.s
	dropped := "its VM's memory and processes"
	if s.SystemBytes > 0 {
		dropped = "its system disk: " + session.FormatBytesShort(s.SystemUsed) + " of packages, /etc and /root changes"
	}
	body := []string{
		"Replace gives " + s.Name + " a fresh VM from image " + s.Image + " and drops " + dropped + ". It cannot be undone.",
		"Kept: every file in /workspace (" + common.WorkspaceUsed(s) + ").",
	}
	if !s.WorkspaceKnown() {
		body[1] = "Kept: every file in /workspace."
	}
	if s.Running > 0 {
		body = append(body, fmt.Sprintf("%d running command(s) will be stopped; there is no rollback of their partial changes.", s.Running))
	}
	return "Replace the VM of " + s.Name + "?", body
}

func (m *Model) replace(c call) tea.Cmd {
	svc, name := m.c.Svc, c.s.Name
	return m.runOp("replacing the VM of "+name, func(ctx context.Context) (string, tea.Msg, error) {
		r, err := svc.Replace(ctx, name, session.ReplaceOptions{})
		if err != nil {
			return "", nil, err
		}
		return "replaced " + name + ": a fresh VM from " + r.To + "; dropped " + session.FormatBytesShort(r.Dropped) + " of system changes; /workspace kept", nil, nil
	})
}

// create opens the new-session form, or, given a name on the command line,
// creates the session from key=value settings.
func (m *Model) create(c call) tea.Cmd {
	if !c.line || c.arg == "" {
		return m.newSessionDialog("")
	}
	kv := map[string]string{}
	for _, f := range strings.Fields(c.tail) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return m.usage(c)
		}
		kv[k] = v
	}
	opts, err := createOptions(c.arg, kv["cpus"], kv["mem"], kv["disk"], kv["image"], kv["from"])
	if err != nil {
		return m.setFlash(common.FlashError, common.ErrorText(err))
	}
	return m.createSession(opts)
}

func (m *Model) newSessionDialog(name string) tea.Cmd {
	fields := []dialog.Field{
		{Label: "name", Placeholder: "my-session", Value: name, Hint: "lowercase letters, digits and dashes"},
		{Label: "vCPUs", Placeholder: "default", Hint: "e.g. 2"},
		{Label: "memory", Placeholder: "default", Hint: "e.g. 1G or 512M (a bare number is bytes)"},
		{Label: "disk", Placeholder: "default", Hint: "/workspace volume size, e.g. 10G (a bare number is bytes)"},
		{Label: "image", Placeholder: "default (" + session.DefaultImage + ")"},
		{Label: "from", Placeholder: "none", Hint: "SESSION@ID: a copy of a checkpoint of another session (SESSION: its newest)"},
	}
	d, cmd := dialog.NewForm(m.c, "New session", "", fields, func(v []string) (tea.Cmd, error) {
		opts, err := createOptions(v[0], v[1], v[2], v[3], v[4], v[5])
		if err != nil {
			return nil, err
		}
		return m.createSession(opts), nil
	})
	return m.openDialog(d, cmd)
}

// createOptions reads the new-session form (or :create's settings) with
// session's rules; empty fields take the daemon's defaults (or, with
// from, the source's).
func createOptions(name, cpus, mem, disk, image, from string) (session.CreateOptions, error) {
	o := session.CreateOptions{Name: strings.TrimSpace(name), Image: strings.TrimSpace(image), From: strings.TrimSpace(from)}
	if err := session.ValidateName(o.Name); err != nil {
		return o, err
	}
	if o.From != "" {
		if _, err := session.ParseCheckpointRef(o.From); err != nil {
			return o, err
		}
	}
	if s := strings.TrimSpace(cpus); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || session.CheckCPUs(n) != nil {
			return o, fmt.Errorf("vCPUs %q: a number from 1 to %d", s, session.MaxCPUs)
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

func (m *Model) createSession(opts session.CreateOptions) tea.Cmd {
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

// execAction opens the run-a-command form, or runs the command given on
// the command line.
func (m *Model) execAction(c call) tea.Cmd {
	if !c.line {
		return m.execDialog(c.s)
	}
	if c.tail == "" {
		return m.usage(c)
	}
	return m.exec(c.s.Name, c.tail)
}

func (m *Model) execDialog(s session.Session) tea.Cmd {
	name := s.Name
	note := ""
	if err := session.CheckTransition(name, session.ActionExec, s.State); err != nil {
		note = common.ErrorText(err) + "."
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

func cancelPrompt(m *Model, c call) (string, []string) {
	return "Cancel " + common.ShortID(c.e.ID) + "?", []string{
		"$ " + common.ExecLabel(c.e),
		"This kills the command's whole process group in the guest.",
		"There is no rollback: changes it already made to /workspace stay.",
	}
}

func (m *Model) cancelExec(c call) tea.Cmd {
	svc, id := m.c.Svc, c.e.ID
	return m.runOp("cancelling "+common.ShortID(id), func(ctx context.Context) (string, tea.Msg, error) {
		if err := svc.Cancel(ctx, id); err != nil {
			return "", nil, err
		}
		return "cancelled " + common.ShortID(id) + " (partial changes, if any, remain)", nil, nil
	})
}

// Package runs is the Runs tab: a session's agent runs, newest first, each
// with its executions under it and, for a run that kept its starting
// point, what it changed; enter on an execution opens its output, d on a
// run its diff: the files changed on the left (A/M/D/R), the selected
// one's diff beside it (added lines green, removed red), u to undo that
// file and U the whole run (the root asks the typed confirmation). The
// tab is shown once the session has a run.
package runs

import (
	"context"
	"io/fs"
	"slices"
	"strconv"
	"strings"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/ui/common"
)

// maxRuns bounds the runs loaded (the newest); maxExecs the executions
// shown per run.
const (
	maxRuns  = 50
	maxExecs = 50
)

// KeyMap are the Runs tab's keys.
type KeyMap struct {
	common.NavKeys
	Open    key.Binding
	Refresh key.Binding
	Diff    key.Binding
	Close   key.Binding
	// In the diff view: up/down (NavKeys) move in the file list, these
	// scroll the selected file's diff, and undo.
	ScrollUp   key.Binding
	ScrollDown key.Binding
	Undo       key.Binding
	UndoAll    key.Binding
}

// DefaultKeyMap returns the bindings.
func DefaultKeyMap() KeyMap {
	return KeyMap{
		NavKeys:    common.NewNavKeys(),
		Open:       key.NewBinding(key.WithKeys("enter"), key.WithHelp("enter", "show output")),
		Refresh:    key.NewBinding(key.WithKeys("r"), key.WithHelp("r", "reload")),
		Diff:       key.NewBinding(key.WithKeys("d"), key.WithHelp("d", "what the run changed")),
		Close:      key.NewBinding(key.WithKeys("esc", "d", "q"), key.WithHelp("esc", "back to the runs")),
		ScrollUp:   key.NewBinding(key.WithKeys("ctrl+u", "pgup", "K"), key.WithHelp("ctrl+u/K", "scroll the diff up")),
		ScrollDown: key.NewBinding(key.WithKeys("ctrl+d", "pgdown", "J", "space"), key.WithHelp("ctrl+d/J", "scroll the diff down")),
		// u is the file under the cursor: in a list of files, the one
		// pointed at is what an operator means; the whole run is the
		// bigger step, so it takes the shifted key.
		Undo:    key.NewBinding(key.WithKeys("u"), key.WithHelp("u", "undo this file")),
		UndoAll: key.NewBinding(key.WithKeys("U"), key.WithHelp("U", "undo the whole run")),
	}
}

// fileKeys are the diff view's file list moves.
func (k KeyMap) fileKeys() []key.Binding {
	return []key.Binding{k.Up, k.Down, k.Top, k.Bottom}
}

// entry is one run with its executions.
type entry struct {
	run   session.Run
	execs []session.Execution
}

type loadedMsg struct {
	gen     int
	entries []entry
	err     error
}

// row is a line of the list: a run, or one of its executions.
type row struct {
	run  int // index in entries
	exec int // index in its execs, or -1 for the run's own line
}

// Model is the Runs tab.
type Model struct {
	c    *common.Common
	svc  session.Service
	keys KeyMap
	w, h int

	name    string
	gen     int
	entries []entry // newest first
	rows    []row
	cursor  int
	offset  int
	loading bool
	err     string

	// The diff shown over the list (d), while diffOn: the files changed
	// on the left, the selected one's diff on the right.
	diffOn   bool
	diffGen  int
	diffRun  session.Run
	diff     *session.Diff // nil until loaded
	diffText string        // while loading, or why there is no diff
	fileCur  int
	fileOff  int
	patch    []string // the selected file's diff, rendered
	patchOff int
}

type diffMsg struct {
	gen  int
	diff session.Diff
	err  error
}

var _ common.Component = (*Model)(nil)

// New returns an empty tab; it shows nothing unless svc keeps runs.
func New(c *common.Common, svc session.Service) *Model {
	m := &Model{c: c, svc: svc, keys: DefaultKeyMap()}
	if c.ReadOnly {
		// Undo changes the workspace: a viewer is not offered it.
		m.keys.Undo.SetEnabled(false)
		m.keys.UndoAll.SetEnabled(false)
	}
	return m
}

// SetSize implements common.Component.
func (m *Model) SetSize(w, h int) {
	m.w, m.h = w, h
	m.clampScroll()
	if m.diff != nil {
		m.selectFile(m.fileCur)
	}
}

// ShortHelp implements help.KeyMap.
func (m *Model) ShortHelp() []key.Binding {
	if m.diffOn {
		return common.Enabled(m.keys.Down, m.keys.ScrollDown, m.keys.Undo, m.keys.UndoAll, m.keys.Close)
	}
	return []key.Binding{m.keys.Open, m.keys.Diff}
}

// FullHelp implements help.KeyMap.
func (m *Model) FullHelp() [][]key.Binding {
	if m.diffOn {
		return [][]key.Binding{m.keys.fileKeys(), {m.keys.ScrollUp, m.keys.ScrollDown}, common.Enabled(m.keys.Undo, m.keys.UndoAll, m.keys.Close)}
	}
	return [][]key.Binding{m.keys.NavKeys.List(), {m.keys.Open, m.keys.Diff, m.keys.Refresh}}
}

// Capturing implements common.Capturer: the diff view takes every key
// until it is closed.
func (m *Model) Capturing() bool { return m.diffOn }

// Has reports whether the session shown has runs: the tab is shown then.
func (m *Model) Has() bool { return len(m.entries) > 0 }

// Len returns the number of runs shown.
func (m *Model) Len() int { return len(m.entries) }

// SetSession shows a session's runs, (re)loading them.
func (m *Model) SetSession(name string) tea.Cmd {
	if name != m.name {
		m.entries, m.rows, m.cursor, m.offset = nil, nil, 0, 0
		m.diffOn = false
	}
	m.name = name
	return m.Reload()
}

// Reload loads the runs again (after an event of the session).
func (m *Model) Reload() tea.Cmd {
	h := m.svc
	if m.name == "" {
		return nil
	}
	m.gen++
	m.loading = true
	gen, name, svc := m.gen, m.name, m.svc
	ctx, cancel := m.c.Call()
	return func() tea.Msg {
		defer cancel()
		es, err := load(ctx, svc, h, name)
		return loadedMsg{gen: gen, entries: es, err: err}
	}
}

func load(ctx context.Context, svc session.Service, h session.Harness, name string) ([]entry, error) {
	list, err := h.Runs(ctx, name)
	if err != nil {
		return nil, err
	}
	slices.Reverse(list) // newest first
	list = list[:min(len(list), maxRuns)]
	out := make([]entry, 0, len(list))
	for _, r := range list {
		e := entry{run: r}
		if full, err := h.GetRun(ctx, r.ID); err == nil {
			ids := full.ExecIDs
			if len(ids) > maxExecs {
				ids = ids[len(ids)-maxExecs:]
			}
			for _, id := range ids {
				if x, err := svc.Execution(ctx, id); err == nil {
					e.execs = append(e.execs, x)
				}
			}
		}
		out = append(out, e)
	}
	return out, nil
}

func (m *Model) rebuild() {
	m.rows = m.rows[:0]
	for i, e := range m.entries {
		m.rows = append(m.rows, row{run: i, exec: -1})
		for j := range e.execs {
			m.rows = append(m.rows, row{run: i, exec: j})
		}
	}
	m.cursor = common.Clamp(m.cursor, 0, len(m.rows)-1)
	m.clampScroll()
}

func (m *Model) clampScroll() {
	m.offset = common.ScrollTo(m.cursor, m.offset, m.page(), len(m.rows))
}

func (m *Model) page() int { return max(1, m.h-1) }

// Selected returns the execution under the cursor (on a run's line, its
// newest execution).
func (m *Model) Selected() (session.Execution, bool) {
	if m.cursor >= len(m.rows) {
		return session.Execution{}, false
	}
	r := m.rows[m.cursor]
	e := m.entries[r.run]
	switch {
	case r.exec >= 0:
		return e.execs[r.exec], true
	case len(e.execs) > 0:
		return e.execs[len(e.execs)-1], true
	}
	return session.Execution{}, false
}

// Update implements common.Component.
func (m *Model) Update(msg tea.Msg) tea.Cmd {
	switch msg := msg.(type) {
	case loadedMsg:
		if msg.gen != m.gen {
			return nil
		}
		m.loading = false
		if msg.err != nil {
			m.err = common.ErrorText(msg.err)
			return nil
		}
		m.err = ""
		m.entries = msg.entries
		m.rebuild()
	case diffMsg:
		if msg.gen != m.diffGen || !m.diffOn {
			return nil
		}
		if msg.err != nil {
			m.diff, m.diffText = nil, m.c.Styles.FlashErr.Render(common.ErrorText(msg.err))
			return nil
		}
		d := msg.diff
		m.diff, m.diffText = &d, ""
		m.fileCur = common.Clamp(m.fileCur, 0, len(d.Changes)-1)
		m.selectFile(m.fileCur)
	case common.RunUndoneMsg:
		// What it changed is different now: the list's counts and, if
		// it is shown, the diff.
		cmds := []tea.Cmd{m.Reload()}
		if m.diffOn && m.diffRun.ID == msg.Run {
			cmds = append(cmds, m.loadDiff())
		}
		return tea.Batch(cmds...)
	case tea.KeyPressMsg:
		if m.diffOn {
			return m.diffKey(msg)
		}
		if c, ok := m.keys.Move(msg, m.cursor, m.page(), len(m.rows)); ok {
			m.cursor = c
			m.clampScroll()
			return nil
		}
		switch {
		case key.Matches(msg, m.keys.Open):
			if e, ok := m.Selected(); ok {
				return func() tea.Msg { return common.OpenOutputMsg{Exec: e} }
			}
		case key.Matches(msg, m.keys.Refresh):
			return m.Reload()
		case key.Matches(msg, m.keys.Diff):
			return m.openDiff()
		}
	}
	return nil
}

// openDiff opens the diff of the run under the cursor.
func (m *Model) openDiff() tea.Cmd {
	if m.cursor >= len(m.rows) {
		return nil
	}
	m.diffRun = m.entries[m.rows[m.cursor].run].run
	m.diffOn, m.diff, m.fileCur, m.fileOff, m.patch, m.patchOff = true, nil, 0, 0, nil, 0
	return m.loadDiff()
}

// loadDiff (re)loads the diff shown, keeping the file selected.
func (m *Model) loadDiff() tea.Cmd {
	run := m.diffRun
	m.diffGen++
	if run.Checkpoint == "" {
		m.diffText = m.c.Styles.Muted.Render("Run " + run.ID + " kept no starting point, so there is nothing to compare it with (start runs with 'berth run start --keep').")
		return nil
	}
	if m.diff == nil {
		m.diffText = m.c.Styles.Muted.Render("comparing run " + run.ID + " with its starting point…")
	}
	gen, svc, id := m.diffGen, m.svc, run.ID
	ctx, cancel := m.c.Call()
	return func() tea.Msg {
		defer cancel()
		d, err := svc.RunDiff(ctx, id, session.DiffOptions{Patch: true})
		return diffMsg{gen: gen, diff: d, err: err}
	}
}

// diffKey handles a key in the diff view.
func (m *Model) diffKey(k tea.KeyPressMsg) tea.Cmd {
	var n int
	if m.diff != nil {
		n = len(m.diff.Changes)
	}
	switch {
	case key.Matches(k, m.keys.Close):
		m.diffOn = false
	case key.Matches(k, m.keys.ScrollUp):
		m.patchOff = max(0, m.patchOff-m.patchPage()/2)
	case key.Matches(k, m.keys.ScrollDown):
		m.patchOff = common.Clamp(m.patchOff+m.patchPage()/2, 0, max(0, len(m.patch)-m.patchPage()))
	case key.Matches(k, m.keys.Undo):
		if n == 0 {
			return nil
		}
		c := m.diff.Changes[m.fileCur]
		paths := []string{c.Path}
		if c.From != "" {
			paths = []string{c.From, c.Path} // a rename: the old name back, the new one gone
		}
		return m.undo(paths)
	case key.Matches(k, m.keys.UndoAll):
		if m.diffRun.Checkpoint == "" {
			return nil
		}
		return m.undo(nil)
	default:
		if key.Matches(k, m.keys.fileKeys()...) && n > 0 {
			if c, ok := m.keys.Move(k, m.fileCur, m.listPage(), n); ok {
				m.selectFile(c)
			}
		}
	}
	return nil
}

func (m *Model) undo(paths []string) tea.Cmd {
	msg := common.UndoRunMsg{Session: m.diffRun.Session, Run: m.diffRun.ID, Paths: paths}
	if msg.Session == "" {
		msg.Session = m.name
	}
	return func() tea.Msg { return msg }
}

// SelectedFile returns the path of the file selected in the diff view.
func (m *Model) SelectedFile() (string, bool) {
	if !m.diffOn || m.diff == nil || m.fileCur >= len(m.diff.Changes) {
		return "", false
	}
	return m.diff.Changes[m.fileCur].Path, true
}

// DiffShown reports whether the diff view is open.
func (m *Model) DiffShown() bool { return m.diffOn }

// selectFile moves the file list's cursor to i and renders its diff.
func (m *Model) selectFile(i int) {
	if i != m.fileCur {
		m.patchOff = 0
	}
	m.fileCur = i
	m.fileOff = common.ScrollTo(i, m.fileOff, m.listPage(), len(m.diff.Changes))
	m.patch = nil
	if i < len(m.diff.Changes) {
		m.patch = m.renderChange(m.diff.Changes[i])
	}
	m.patchOff = common.Clamp(m.patchOff, 0, max(0, len(m.patch)-m.patchPage()))
}

var letters = map[session.ChangeKind]string{session.ChangeAdded: "A", session.ChangeModified: "M", session.ChangeRemoved: "D", session.ChangeRenamed: "R"}

// renderChange lays one change out: what happened to it (kind, sizes,
// modes), then its patch with added lines green and removed ones red.
func (m *Model) renderChange(c session.FileChange) []string {
	st := m.c.Styles
	name := common.SanitizeLine(c.Path)
	if c.From != "" {
		name = common.SanitizeLine(c.From) + " → " + name
	}
	out := []string{st.Bold.Render(letters[c.Kind] + " " + name)}
	var facts []string
	switch c.Kind {
	case session.ChangeAdded:
		facts = append(facts, "new "+kindOf(c.NewMode)+", "+c.NewMode.Perm().String())
	case session.ChangeRemoved:
		facts = append(facts, "removed "+kindOf(c.OldMode))
	default:
		if c.OldMode.Type() != c.NewMode.Type() {
			facts = append(facts, kindOf(c.OldMode)+" → "+kindOf(c.NewMode))
		}
		const bits = fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky
		if c.OldMode.Type() == c.NewMode.Type() && c.OldMode&bits != c.NewMode&bits {
			facts = append(facts, "mode "+c.OldMode.String()+" → "+c.NewMode.String())
		}
	}
	if c.OldMode.IsRegular() || c.NewMode.IsRegular() {
		facts = append(facts, session.FormatBytes(c.OldSize)+" → "+session.FormatBytes(c.NewSize))
	}
	if c.OldLink != c.NewLink {
		facts = append(facts, "link "+common.SanitizeLine(c.OldLink)+" → "+common.SanitizeLine(c.NewLink))
	}
	if c.Added+c.Removed > 0 {
		facts = append(facts, st.FlashOK.Render("+"+strconv.Itoa(c.Added))+" "+st.FlashErr.Render("-"+strconv.Itoa(c.Removed)))
	}
	out = append(out, st.Muted.Render(strings.Join(facts, " · ")), "")
	if c.Patch == "" {
		if !c.Content {
			out = append(out, st.Muted.Render("(its content is unchanged)"))
		}
		return out
	}
	for _, l := range strings.Split(strings.TrimSuffix(c.Patch, "\n"), "\n") {
		t := common.SanitizeLine(l)
		switch {
		case strings.HasPrefix(l, "+++"), strings.HasPrefix(l, "---"):
			t = st.Bold.Render(t)
		case strings.HasPrefix(l, "@@"):
			t = st.Accent.Render(t)
		case strings.HasPrefix(l, "+"):
			t = st.FlashOK.Render(t)
		case strings.HasPrefix(l, "-"):
			t = st.FlashErr.Render(t)
		}
		out = append(out, t)
	}
	return out
}

func kindOf(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "directory"
	case m.Type() == fs.ModeSymlink:
		return "symlink"
	case m.IsRegular():
		return "file"
	}
	return "special file"
}

// The diff view's layout: two heading lines, then the file list (listW
// wide) and the diff beside it.
const diffHead = 2

func (m *Model) listW() int     { return common.Clamp(m.w/3, 16, 48) }
func (m *Model) listPage() int  { return max(1, m.h-diffHead) }
func (m *Model) patchPage() int { return max(1, m.h-diffHead) }

// diffView renders the diff view.
func (m *Model) diffView() string {
	st := m.c.Styles
	run := m.diffRun
	if m.diff == nil {
		head := st.Bold.Render("Run " + run.ID)
		return common.Block(head+"\n\n"+m.diffText, m.w, m.h)
	}
	d := m.diff
	head := st.Bold.Render("Run "+d.Run+": checkpoint "+d.From+" → now") + " — " + d.Summary()
	sub := ""
	if d.Note != "" {
		sub = st.Muted.Render(common.SanitizeLine(d.Note))
	}
	lines := []string{common.Fit(head, m.w), common.Fit(sub, m.w)}
	if len(d.Changes) == 0 {
		lines = append(lines, "", "  "+st.Muted.Render("Nothing changed since the run started."))
		return common.Block(strings.Join(lines, "\n"), m.w, m.h)
	}
	lw := m.listW()
	pw := max(0, m.w-lw-3)
	for i := range m.listPage() {
		left := ""
		if fi := m.fileOff + i; fi < len(d.Changes) {
			c := d.Changes[fi]
			left = " " + letters[c.Kind] + " " + common.SanitizeLine(c.Path)
			left = common.Fit(left, lw)
			if fi == m.fileCur {
				left = st.Selected.Render(left)
			}
		}
		right := ""
		if pi := m.patchOff + i; pi < len(m.patch) {
			right = m.patch[pi]
		}
		lines = append(lines, common.Fit(left, lw)+" "+st.Muted.Render("│")+" "+common.Fit(right, pw))
	}
	return common.Block(strings.Join(lines, "\n"), m.w, m.h)
}

// Column widths; the title or command takes the rest.
const (
	wID, wStatus, wStart, wExecs, wWritten, wChanges, wBy = 13, 10, 8, 5, 9, 14, 12
)

// changes is a run's CHANGES cell: its last diff's counts, or that it
// kept a starting point not compared yet.
func changes(r session.Run) string {
	switch {
	case r.Changes != nil:
		return strconv.Itoa(r.Changes.Files) + " +" + strconv.Itoa(r.Changes.Added) + " -" + strconv.Itoa(r.Changes.Removed)
	case r.Checkpoint != "":
		return "d: diff"
	}
	return "-"
}

// View implements common.Component.
func (m *Model) View() string {
	st := m.c.Styles
	if m.diffOn {
		return m.diffView()
	}
	// The CHANGES column is there once a run shown kept its start.
	kept := slices.ContainsFunc(m.entries, func(e entry) bool { return e.run.Checkpoint != "" })
	changesHead := ""
	if kept {
		changesHead = common.Fit("CHANGES", wChanges) + "  "
	}
	head := common.Fit("  "+common.Fit("RUN", wID)+"  "+common.Fit("STATUS", wStatus)+"  "+common.Fit("STARTED", wStart)+"  "+
		common.FitLeft("EXECS", wExecs)+"  "+common.FitLeft("WRITTEN", wWritten)+"  "+changesHead+common.Fit("BY", wBy)+"  TITLE", m.w)
	lines := []string{st.TableHead.Render(head)}
	switch {
	case m.err != "":
		lines = append(lines, "", "  "+st.FlashErr.Render(m.err))
	case m.loading && len(m.entries) == 0:
		lines = append(lines, "", "  "+st.Muted.Render("loading runs…"))
	case len(m.entries) == 0:
		lines = append(lines, "", "  "+st.Muted.Render("No agent runs yet ('berth run start "+m.name+"' or an MCP client opens one)."))
	}
	loc := m.c.Now().Location()
	for i := m.offset; i < len(m.rows) && i < m.offset+m.page(); i++ {
		r := m.rows[i]
		e := &m.entries[r.run]
		mark := "  "
		if i == m.cursor {
			mark = "▸ "
		}
		var line string
		if r.exec < 0 {
			run := e.run
			changesCell := ""
			if kept {
				changesCell = common.Fit(changes(run), wChanges) + "  "
			}
			line = mark + common.Fit(run.ID, wID) + "  " + common.Fit(string(run.Status), wStatus) + "  " +
				common.Fit(run.StartedAt.In(loc).Format("15:04:05"), wStart) + "  " + common.FitLeft(strconv.Itoa(run.Executions), wExecs) + "  " +
				common.FitLeft(session.FormatBytesShort(run.BytesWritten), wWritten) + "  " + changesCell + common.Fit(common.SanitizeLine(run.By), wBy) + "  " +
				common.SanitizeLine(run.Title)
		} else {
			x := e.execs[r.exec]
			exit := string(x.State)
			if x.ExitCode != nil {
				exit += " " + strconv.Itoa(*x.ExitCode)
			}
			line = mark + "  └ " + common.Fit(common.ShortID(x.ID), wID-4) + "  " + common.Fit(exit, wStatus) + "  " +
				common.Fit(x.StartedAt.In(loc).Format("15:04:05"), wStart) + "  " + common.ExecLabel(x)
		}
		line = common.Fit(line, m.w)
		if i == m.cursor {
			line = st.Selected.Render(line)
		}
		lines = append(lines, line)
	}
	return common.Block(strings.Join(lines, "\n"), m.w, m.h)
}

// Package execs is the Executions tab: a session's executions, newest
// first, with state, exit status, duration and output size, kept current
// from the event stream; enter opens one in the Output tab.
package execs

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
	"time"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
	"charm.land/lipgloss/v2"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/ui/common"
)

// KeyMap are the Executions tab's keys.
type KeyMap struct {
	common.NavKeys
	Open    key.Binding
	Refresh key.Binding
}

// DefaultKeyMap returns the bindings.
func DefaultKeyMap() KeyMap {
	return KeyMap{
		NavKeys: common.NewNavKeys(),
		Open:    key.NewBinding(key.WithKeys("enter"), key.WithHelp("enter", "show output")),
		Refresh: key.NewBinding(key.WithKeys("r"), key.WithHelp("r", "reload")),
	}
}

type loadedMsg struct {
	gen   int
	execs []session.Execution
	err   error
}

// Model is the Executions tab.
type Model struct {
	c    *common.Common
	svc  session.Execer // lists executions
	keys KeyMap
	w, h int

	name    string
	gen     int
	list    []session.Execution // newest first
	cursor  int
	offset  int
	selID   string
	loading bool
	err     string
}

var _ common.Component = (*Model)(nil)

// New returns an empty tab that lists executions through svc.
func New(c *common.Common, svc session.Execer) *Model {
	return &Model{c: c, svc: svc, keys: DefaultKeyMap()}
}

// Keys returns the key map.
func (m *Model) Keys() KeyMap { return m.keys }

// SetSize implements common.Component.
func (m *Model) SetSize(w, h int) { m.w, m.h = w, h; m.clampScroll() }

// ShortHelp implements help.KeyMap.
func (m *Model) ShortHelp() []key.Binding { return []key.Binding{m.keys.Open} }

// FullHelp implements help.KeyMap.
func (m *Model) FullHelp() [][]key.Binding {
	return [][]key.Binding{m.keys.NavKeys.List(), {m.keys.Open, m.keys.Refresh}}
}

// SetSession shows a session's executions, (re)loading them.
func (m *Model) SetSession(name string) tea.Cmd {
	m.name = name
	m.list, m.cursor, m.offset, m.selID = nil, 0, 0, ""
	return m.load()
}

func (m *Model) load() tea.Cmd {
	m.gen++
	m.loading = true
	gen, name, svc := m.gen, m.name, m.svc
	ctx, cancel := m.c.Call()
	return func() tea.Msg {
		defer cancel()
		es, err := svc.Executions(ctx, name, true)
		return loadedMsg{gen: gen, execs: es, err: err}
	}
}

// Selected returns the execution under the cursor.
func (m *Model) Selected() (session.Execution, bool) {
	if m.cursor < len(m.list) {
		return m.list[m.cursor], true
	}
	return session.Execution{}, false
}

// Len returns the number of executions shown.
func (m *Model) Len() int { return len(m.list) }

// ApplyExec folds an execution event in.
func (m *Model) ApplyExec(e session.Execution) {
	if e.Session != m.name {
		return
	}
	if i := slices.IndexFunc(m.list, func(x session.Execution) bool { return x.ID == e.ID }); i >= 0 {
		m.list[i] = e
		return
	}
	m.list = append(m.list, e)
	m.sort()
}

func (m *Model) sort() {
	slices.SortStableFunc(m.list, func(a, b session.Execution) int {
		if c := b.StartedAt.Compare(a.StartedAt); c != 0 {
			return c
		}
		return cmp.Compare(b.ID, a.ID)
	})
	// Keep the cursor on the same execution.
	if i := slices.IndexFunc(m.list, func(x session.Execution) bool { return x.ID == m.selID }); i >= 0 {
		m.cursor = i
	}
	m.clampScroll()
}

func (m *Model) setCursor(i int) {
	m.cursor = common.Clamp(i, 0, len(m.list)-1)
	if m.cursor < len(m.list) {
		m.selID = m.list[m.cursor].ID
	}
	m.clampScroll()
}

func (m *Model) clampScroll() {
	m.offset = common.ScrollTo(m.cursor, m.offset, m.page(), len(m.list))
}

func (m *Model) page() int { return max(1, m.h-1) }

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
		m.list = msg.execs
		m.sort()
		if m.selID == "" {
			m.setCursor(0)
		}
	case tea.KeyPressMsg:
		if c, ok := m.keys.Move(msg, m.cursor, m.page(), len(m.list)); ok {
			m.setCursor(c)
			return nil
		}
		switch {
		case key.Matches(msg, m.keys.Open):
			if e, ok := m.Selected(); ok {
				return func() tea.Msg { return common.OpenOutputMsg{Exec: e} }
			}
		case key.Matches(msg, m.keys.Refresh):
			return m.load()
		}
	case tea.MouseClickMsg:
		if msg.Button == tea.MouseLeft && msg.Y > 0 {
			m.setCursor(m.offset + msg.Y - 1)
		}
	case tea.MouseWheelMsg:
		switch msg.Button {
		case tea.MouseWheelUp:
			m.setCursor(m.cursor - 3)
		case tea.MouseWheelDown:
			m.setCursor(m.cursor + 3)
		}
	}
	return nil
}

// col is one column of the table but the command, which takes the rest.
type col int

const (
	colID col = iota
	colState
	colExit
	colStarted
	colTook
	colOut
	colBy
	numCols
)

type colSpec struct {
	title string
	width int
	right bool
	// drop orders the columns that give way to the command on a narrow
	// terminal: highest first; 0 never.
	drop int
}

var specs = [numCols]colSpec{
	colID:      {title: "ID", width: 8},
	colState:   {title: "STATE", width: 9},
	colExit:    {title: "EXIT", width: 4, right: true},
	colStarted: {title: "STARTED", width: 8, drop: 1},
	colTook:    {title: "TOOK", width: 6, right: true},
	colOut:     {title: "OUT/ERR", width: 11, right: true, drop: 3},
	colBy:      {title: "BY", width: 8, drop: 2},
}

const (
	gap    = 2
	marker = 2 // "▸ " before each row
	// minCommand is what the command keeps before a column gives way: a
	// command line cut to a few characters says nothing.
	minCommand = 30
)

// columns returns the columns that leave the command at least minCommand
// cells of width w (dropping the least useful first), and the command's
// width.
func columns(w int) ([]col, int) {
	cols := make([]col, 0, numCols)
	for c := range numCols {
		cols = append(cols, c)
	}
	for {
		rest := w - marker
		for _, c := range cols {
			rest -= specs[c].width + gap
		}
		if rest >= minCommand {
			return cols, rest
		}
		worst := -1
		for i, c := range cols {
			if specs[c].drop > 0 && (worst < 0 || specs[c].drop > specs[cols[worst]].drop) {
				worst = i
			}
		}
		if worst < 0 {
			return cols, max(rest, 1)
		}
		cols = slices.Delete(cols, worst, worst+1)
	}
}

func cell(c col, s string) string {
	if specs[c].right {
		return common.FitLeft(s, specs[c].width)
	}
	return common.Fit(s, specs[c].width)
}

// View implements common.Component.
func (m *Model) View() string {
	st := m.c.Styles
	cols, _ := columns(m.w)
	var hb strings.Builder
	hb.WriteString(strings.Repeat(" ", marker))
	for _, c := range cols {
		hb.WriteString(cell(c, specs[c].title) + strings.Repeat(" ", gap))
	}
	hb.WriteString("COMMAND")
	lines := []string{st.TableHead.Render(common.Fit(hb.String(), m.w))}
	switch {
	case m.err != "":
		lines = append(lines, "", "  "+st.FlashErr.Render(m.err))
	case m.loading && len(m.list) == 0:
		lines = append(lines, "", "  "+st.Muted.Render("loading executions…"))
	case len(m.list) == 0:
		msg := "No executions yet."
		if !m.c.ReadOnly {
			msg += " Press x to run a command."
		}
		lines = append(lines, "", "  "+st.Muted.Render(msg))
	}
	now := m.c.Now()
	for i := m.offset; i < len(m.list) && i < m.offset+m.page(); i++ {
		lines = append(lines, m.row(&m.list[i], cols, i == m.cursor, now))
	}
	return common.Block(strings.Join(lines, "\n"), m.w, m.h)
}

func (m *Model) row(e *session.Execution, cols []col, sel bool, now time.Time) string {
	st := m.c.Styles
	var b strings.Builder
	if sel {
		b.WriteString("▸ ")
	} else {
		b.WriteString("  ")
	}
	for _, c := range cols {
		var v string
		switch c {
		case colID:
			v = cell(c, common.ShortID(e.ID))
		case colState:
			state := string(e.State)
			if e.Outside {
				state = "outside"
			}
			if e.Held != "" {
				state = "held" // output waits in the guest for host disk space
			}
			v = cell(c, state)
			if !sel {
				v = lipgloss.NewStyle().Foreground(st.ExecColor(e.State)).Render(v)
			}
		case colExit:
			exit := "—"
			switch {
			case e.ExitCode != nil:
				exit = strconv.Itoa(*e.ExitCode)
			case e.Signal != "":
				exit = strings.TrimPrefix(e.Signal, "SIG")
			case e.State == session.ExecLost:
				exit = "?"
			}
			v = cell(c, exit)
			if !sel && e.ExitCode != nil && *e.ExitCode != 0 {
				v = st.FlashErr.Render(v)
			}
		case colStarted:
			started := "—"
			if !e.StartedAt.IsZero() {
				started = e.StartedAt.In(now.Location()).Format("15:04:05")
			}
			v = cell(c, started)
		case colTook:
			end := e.EndedAt
			if end.IsZero() {
				end = now
			}
			took := "—"
			if !e.StartedAt.IsZero() {
				took = session.FormatDuration(end.Sub(e.StartedAt))
			}
			v = cell(c, took)
		case colOut:
			v = cell(c, session.FormatBytesShort(e.StdoutBytes)+"/"+session.FormatBytesShort(e.StderrBytes))
		case colBy:
			v = cell(c, common.SanitizeLine(e.By))
		}
		b.WriteString(v + strings.Repeat(" ", gap))
	}
	b.WriteString(common.ExecLabel(*e))
	if e.Held != "" {
		b.WriteString("  (" + common.SanitizeLine(e.Held) + ")")
	}
	row := common.Fit(b.String(), m.w)
	if sel {
		row = st.Selected.Render(row)
	}
	return row
}

// Package execs is the Executions tab: a session's executions, newest
// first, with state, exit status, duration and output size, kept current
// from the event stream; enter opens one in the Output tab.
package execs

import (
	"cmp"
	"slices"
	"strconv"
	"strings"

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

// Column widths; the command takes the rest.
const (
	wID, wState, wExit, wStart, wDur, wOut, wBy = 8, 10, 6, 8, 7, 11, 8
)

// View implements common.Component.
func (m *Model) View() string {
	st := m.c.Styles
	head := common.Fit("  "+common.Fit("ID", wID)+"  "+common.Fit("STATE", wState)+"  "+common.FitLeft("EXIT", wExit)+"  "+
		common.Fit("STARTED", wStart)+"  "+common.FitLeft("TOOK", wDur)+"  "+common.FitLeft("OUT/ERR", wOut)+"  "+
		common.Fit("BY", wBy)+"  COMMAND", m.w)
	lines := []string{st.TableHead.Render(head)}
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
	loc := now.Location()
	for i := m.offset; i < len(m.list) && i < m.offset+m.page(); i++ {
		e := &m.list[i]
		sel := i == m.cursor
		exit := "—"
		switch {
		case e.ExitCode != nil:
			exit = strconv.Itoa(*e.ExitCode)
		case e.Signal != "":
			exit = strings.TrimPrefix(e.Signal, "SIG")
		case e.State == session.ExecLost:
			exit = "?"
		}
		end := e.EndedAt
		if end.IsZero() {
			end = now
		}
		took := "—"
		if !e.StartedAt.IsZero() {
			took = session.FormatDuration(end.Sub(e.StartedAt))
		}
		started := "—"
		if !e.StartedAt.IsZero() {
			started = e.StartedAt.In(loc).Format("15:04:05")
		}
		state := string(e.State)
		if e.Outside {
			state = "outside"
		}
		if e.Held != "" {
			state = "held" // output waits in the guest for host disk space
		}
		stateCell := common.Fit(state, wState)
		exitCell := common.FitLeft(exit, wExit)
		if !sel {
			stateCell = lipgloss.NewStyle().Foreground(st.ExecColor(e.State)).Render(stateCell)
			if e.ExitCode != nil && *e.ExitCode != 0 {
				exitCell = st.FlashErr.Render(exitCell)
			}
		}
		mark := "  "
		if sel {
			mark = "▸ "
		}
		by := common.SanitizeLine(e.By)
		row := mark + common.Fit(common.ShortID(e.ID), wID) + "  " + stateCell + "  " + exitCell + "  " +
			common.Fit(started, wStart) + "  " + common.FitLeft(took, wDur) + "  " +
			common.FitLeft(session.FormatBytesShort(e.StdoutBytes)+"/"+session.FormatBytesShort(e.StderrBytes), wOut) + "  " +
			common.Fit(by, wBy) + "  " + common.ExecLabel(*e)
		if e.Held != "" {
			row += "  (" + common.SanitizeLine(e.Held) + ")"
		}
		row = common.Fit(row, m.w)
		if sel {
			row = st.Selected.Render(row)
		}
		lines = append(lines, row)
	}
	return common.Block(strings.Join(lines, "\n"), m.w, m.h)
}

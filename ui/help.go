package ui

import (
	"strconv"
	"strings"

	"charm.land/bubbles/v2/key"
	"charm.land/bubbles/v2/viewport"
	tea "charm.land/bubbletea/v2"
	"charm.land/lipgloss/v2"

	"github.com/berthvm/berth/ui/common"
)

// The help lists every key of the current view. A detail tab has more
// keys than 24 rows hold, so the list scrolls in a viewport under a fixed
// title; only the help's Close keys close it.

func newHelpViewport(k HelpKeys) viewport.Model {
	vp := viewport.New()
	vp.KeyMap = viewport.KeyMap{
		Up: k.Up, Down: k.Down, PageUp: k.PageUp, PageDown: k.PageDown,
		HalfPageUp: k.HalfUp, HalfPageDown: k.HalfDown,
		// Left and Right stay unbound: the lines are cut to the width.
	}
	return vp
}

func (m *Model) openHelp() {
	m.showHelp = true
	m.layoutHelp(m.bodyHeight())
	m.helpVP.GotoTop()
}

// updateHelp handles a key while the help is open.
func (m *Model) updateHelp(k tea.KeyPressMsg) tea.Cmd {
	switch {
	case key.Matches(k, m.helpKeys.Close):
		m.showHelp = false
	case key.Matches(k, m.helpKeys.Top):
		m.helpVP.GotoTop()
	case key.Matches(k, m.helpKeys.Bottom):
		m.helpVP.GotoBottom()
	default:
		m.helpVP, _ = m.helpVP.Update(k)
	}
	return nil
}

// helpGroups returns every key of the current view, in columns: the
// component's, then the actions available here, then the global keys.
func (m *Model) helpGroups() [][]key.Binding {
	groups := append([][]key.Binding{}, m.active().FullHelp()...)
	if acts := m.actionBindings(); len(acts) > 0 {
		groups = append(groups, acts)
	}
	return append(groups, m.globalBindings())
}

// helpLines lays the help's columns out in rows of the screen's width.
// Each column goes into the first row with room for it, so a short column
// (the global keys) sits beside others instead of starting a row of its
// own; every key shows (the bubbles full help drops columns that do not
// fit).
func (m *Model) helpLines() []string {
	st := m.c.Styles
	const pad = 4
	avail := m.width - 2
	type row struct {
		cols []string
		w    int
	}
	var rows []*row
	for _, g := range m.helpGroups() {
		g = common.Enabled(g...)
		if len(g) == 0 {
			continue
		}
		kw := 0
		for _, b := range g {
			kw = max(kw, lipgloss.Width(b.Help().Key))
		}
		var lines []string
		for _, b := range g {
			lines = append(lines, st.Help.FullKey.Render(common.Fit(b.Help().Key, kw))+"  "+st.Help.FullDesc.Render(b.Help().Desc))
		}
		col := strings.Join(lines, "\n")
		w := lipgloss.Width(col)
		var into *row
		for _, r := range rows {
			if r.w+w <= avail {
				into = r
				break
			}
		}
		if into == nil {
			into = &row{}
			rows = append(rows, into)
		}
		into.cols = append(into.cols, col)
		into.w += w + pad
	}
	var out []string
	for i, r := range rows {
		if i > 0 {
			out = append(out, "")
		}
		// Pad all but the last column: padding past the width would be
		// cut with an ellipsis.
		for j := range len(r.cols) - 1 {
			r.cols[j] = lipgloss.NewStyle().PaddingRight(pad).Render(r.cols[j])
		}
		for _, l := range strings.Split(lipgloss.JoinHorizontal(lipgloss.Top, r.cols...), "\n") {
			out = append(out, common.Fit(" "+l, m.width))
		}
	}
	return out
}

// layoutHelp sizes the help's viewport for a body of h rows (the title
// takes one) and fills it for the current view.
func (m *Model) layoutHelp(h int) {
	vh := max(1, h-1)
	lines := m.helpLines()
	if len(lines) < vh {
		lines = append([]string{""}, lines...) // air under the title, when there is room
	}
	m.helpVP.SetWidth(m.width)
	m.helpVP.SetHeight(vh)
	m.helpVP.SetContentLines(lines)
}

// helpView renders the help as a body of h rows: the title, with where
// the list is scrolled to, over the viewport.
func (m *Model) helpView(h int) string {
	st := m.c.Styles
	m.layoutHelp(h)
	view := "sessions"
	switch m.page {
	case pageDetail:
		view = strings.ToLower(m.tab.String()) + " tab"
	case pageHosts:
		view = "hosts"
	}
	title := " " + st.DialogHead.Render("Keys: "+view)
	pos := ""
	vp := &m.helpVP
	if total := vp.TotalLineCount(); total > vp.Height() {
		first := vp.YOffset() + 1
		last := min(total, vp.YOffset()+vp.Height())
		pos = "lines " + strconv.Itoa(first) + "-" + strconv.Itoa(last) + " of " + strconv.Itoa(total)
		switch {
		case vp.AtTop():
			pos += " ↓"
		case vp.AtBottom():
			pos += " ↑"
		default:
			pos += " ↑↓"
		}
		pos = st.Accent.Render(pos) + " "
	}
	return common.Block(spread(title, pos, m.width)+"\n"+vp.View(), m.width, h)
}

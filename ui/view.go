package ui

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
	"charm.land/lipgloss/v2"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/ui/common"
)

// View implements tea.Model. Only the root sets program-level view
// options; components return strings.
func (m *Model) View() tea.View {
	v := tea.NewView(m.Render())
	v.AltScreen = true
	v.MouseMode = tea.MouseModeCellMotion
	v.WindowTitle = "berth"
	return v
}

// Render returns the screen's content: exactly height lines of width
// cells.
func (m *Model) Render() string {
	if m.width <= 0 || m.height <= 0 {
		return ""
	}
	if m.width < minW || m.height < minH {
		return common.Block("berth needs at least "+strconv.Itoa(minW)+"x"+strconv.Itoa(minH)+
			" (80x24 recommended); this window is "+strconv.Itoa(m.width)+"x"+strconv.Itoa(m.height), m.width, m.height)
	}
	lines := make([]string, 0, m.height)
	lines = append(lines, m.headerView())
	if m.page == pageDetail {
		lines = append(lines, m.sparks.View(), m.tabsView())
	}
	bh := m.bodyHeight()
	var body string
	if m.showHelp {
		body = m.helpView(bh)
	} else {
		// Components render exactly their size; re-fit only if one did
		// not (measuring every cell twice per frame is not free).
		body = m.active().View()
		if strings.Count(body, "\n") != bh-1 {
			body = common.Block(body, m.width, bh)
		}
	}
	if m.dialog != nil {
		dv := m.dialog.View()
		w, h := common.Size(dv)
		x, y := common.Center(m.width, bh, w, h)
		body = common.Overlay(body, dv, x, y)
	}
	lines = append(lines, body, m.statusView(), m.footerView())
	return strings.Join(lines, "\n")
}

func (m *Model) headerView() string {
	st := m.c.Styles
	left := st.Title.Render("berth")
	sep := st.Muted.Render(" › ")
	if m.page == pageDetail {
		s, _ := m.detailSession()
		left += sep + st.Bold.Render(common.SanitizeLine(s.Name)) + "  " + st.StateBadge(s.State)
		facts := []string{strconv.Itoa(s.CPUs) + " vCPU", session.FormatBytesShort(int64(s.MemoryMiB)<<20) + " mem",
			"ws " + common.WorkspaceUsed(s) + "/" + session.FormatBytesShort(s.DiskBytes)}
		dirty := "dirty " + session.FormatBytesShort(s.DirtyBytes)
		if s.DirtyBytes > 0 {
			dirty = lipgloss.NewStyle().Foreground(st.Palette.Warn).Render(dirty)
		}
		facts = append(facts, dirty)
		if !s.StartedAt.IsZero() && (s.State == session.StateRunning || s.State == session.StatePaused) {
			facts = append(facts, "up "+session.FormatDuration(m.c.Now().Sub(s.StartedAt)))
		}
		left += "  " + strings.Join(facts, st.Muted.Render(" · "))
	} else if m.page == pageHosts {
		left += sep + st.Bold.Render("hosts") + "  " + m.hostCountsView()
	} else {
		left += sep + st.Bold.Render("sessions") + "  " + m.countsView()
	}
	var right []string
	if h := m.host; h.Below || len(h.DiskFullPaused) > 0 {
		banner := "host disk low: " + session.FormatBytesShort(h.Free) + " free, floor " + session.FormatBytesShort(h.Floor)
		if n := len(h.DiskFullPaused); n > 0 {
			banner = fmt.Sprintf("host disk full: %d session(s) paused, %s free", n, session.FormatBytesShort(h.Free))
		}
		right = append(right, st.FlashErr.Render("⚠ "+banner))
	} else if n := len(h.OutputHeld); n > 0 {
		right = append(right, st.FlashErr.Render(fmt.Sprintf("⚠ output held: %d session(s), %s free", n, session.FormatBytesShort(h.Free))))
	}
	if m.c.ReadOnly {
		right = append(right, st.DialogWarn.Render("read-only"))
	}
	switch {
	case m.connected:
		right = append(right, st.FlashOK.Render("● live"))
	case m.watchErr != "":
		right = append(right, st.FlashErr.Render("○ reconnecting: "+m.watchErr))
	default:
		right = append(right, st.Muted.Render("○ connecting…"))
	}
	return spread(left, strings.Join(right, "  "), m.width)
}

func (m *Model) countsView() string {
	st := m.c.Styles
	counts := m.sessions.Counts()
	parts := []string{strconv.Itoa(m.sessions.Len()) + " total"}
	if v := m.sessions.Visible(); v != m.sessions.Len() {
		parts[0] = strconv.Itoa(v) + " of " + strconv.Itoa(m.sessions.Len()) + " shown"
	}
	for _, s := range []session.State{session.StateRunning, session.StatePaused, session.StateSleeping,
		session.StateStopped, session.StateCrashed, session.StateCreating, session.StateStopping, session.StateDeleting} {
		if n := counts[s]; n > 0 {
			parts = append(parts, lipgloss.NewStyle().Foreground(st.StateColor(s)).Render(strconv.Itoa(n)+" "+string(s)))
		}
	}
	return strings.Join(parts, st.Muted.Render(" · "))
}

// hostCountsView is the hosts page's header: how many hosts, and how
// many in each state, coloured as the table colours them.
func (m *Model) hostCountsView() string {
	st := m.c.Styles
	list, ok := m.hosts.List()
	if !ok || !list.Fleet {
		return ""
	}
	parts := []string{strconv.Itoa(len(list.Hosts)) + " total"}
	counts := map[session.HostState]int{}
	var order []session.HostState
	for _, h := range list.Hosts {
		if counts[h.State] == 0 {
			order = append(order, h.State)
		}
		counts[h.State]++
	}
	slices.SortFunc(order, func(a, b session.HostState) int { return cmp.Compare(hostOrder(a), hostOrder(b)) })
	for _, s := range order {
		parts = append(parts, lipgloss.NewStyle().Foreground(st.HostColor(s)).Render(strconv.Itoa(counts[s])+" "+common.SanitizeLine(string(s))))
	}
	return strings.Join(parts, st.Muted.Render(" · "))
}

// hostOrder orders the header's counts: the known states as host ls
// explains them, then any other.
func hostOrder(s session.HostState) int {
	switch s {
	case session.HostReady:
		return 0
	case session.HostDraining:
		return 1
	case session.HostGone:
		return 3
	}
	return 2
}

// tabRanges returns each tab's [start, end) columns in the tabs row; the
// mouse handler uses the same numbers as the renderer.
func (m *Model) tabRanges() [][2]int {
	var out [][2]int
	x := 1
	for t := range m.tabCount() {
		w := lipgloss.Width(tabLabel(t)) + 2 // padding
		out = append(out, [2]int{x, x + w})
		x += w + 1
	}
	return out
}

func tabLabel(t tab) string { return strconv.Itoa(int(t)+1) + " " + t.String() }

func (m *Model) tabsView() string {
	st := m.c.Styles
	var b strings.Builder
	b.WriteString(" ")
	for t := range m.tabCount() {
		if t == m.tab {
			b.WriteString(st.TabActive.Render(tabLabel(t)))
		} else {
			b.WriteString(st.Tab.Render(tabLabel(t)))
		}
		b.WriteString(st.Subtle.Render("│"))
	}
	return common.Fit(b.String(), m.width)
}

func (m *Model) statusView() string {
	st := m.c.Styles
	if m.cmdActive {
		return common.Fit(m.cmdline.View(), m.width)
	}
	var parts []string
	if n := len(m.pending); n > 0 {
		label := ""
		for id, l := range m.pending { // newest label
			if label == "" || id == m.opSeq {
				label = l
			}
		}
		p := m.spinner.View() + " " + label + "…"
		if n > 1 {
			p += " (+" + strconv.Itoa(n-1) + " more)"
		}
		parts = append(parts, st.Accent.Render(p))
	}
	if m.flash.text != "" {
		style := st.FlashInfo
		switch m.flash.kind {
		case common.FlashOK:
			style = st.FlashOK
		case common.FlashError:
			style = st.FlashErr
		}
		parts = append(parts, style.Render(common.SanitizeLine(m.flash.text)))
	}
	return common.Fit(" "+strings.Join(parts, "  "), m.width)
}

// footerBindings are the keys the footer advertises: the focused
// component's most useful ones, the view's first actions, help and quit.
func (m *Model) footerBindings() []key.Binding {
	var bs []key.Binding
	switch {
	case m.dialog != nil:
		return m.dialog.ShortHelp()
	case m.cmdActive:
		return []key.Binding{m.cmdKeys.Run, m.cmdKeys.Cancel}
	case m.showHelp:
		return m.helpKeys.footer()
	}
	comp := m.active()
	bs = append(bs, comp.ShortHelp()...)
	if c, ok := comp.(common.Capturer); ok && c.Capturing() {
		return bs
	}
	switch m.page {
	case pageDetail, pageHosts:
		bs = append(bs, m.keys.Back)
	}
	bs = append(bs, m.keys.Help, m.keys.Quit)
	if m.page == pageSessions && m.keys.Hosts.Enabled() {
		bs = append(bs, m.keys.Hosts)
	}
	// Actions go last: when the line is too narrow they drop first, so
	// "? help" always shows.
	return append(bs, m.actionBindings()...)
}

func (m *Model) footerView() string {
	st := m.c.Styles
	var right []string
	if m.opts.Who != "" {
		right = append(right, common.SanitizeLine(m.opts.Who))
	}
	if m.daemon != "" {
		right = append(right, "daemon: "+m.daemon)
	}
	r := st.Muted.Render(strings.Join(right, " · "))
	rw := lipgloss.Width(r)
	bs := m.footerBindings()
	// The footer changes only with the view and the width; cache it.
	var kb strings.Builder
	kb.WriteString(strconv.Itoa(m.width) + "|" + r)
	for _, b := range bs {
		kb.WriteString("|" + b.Help().Key + b.Help().Desc)
	}
	if k := kb.String(); k == m.footerKey {
		return m.footer
	} else {
		m.footerKey = k
	}
	h := m.help
	h.SetWidth(0)
	avail := m.width - rw - 3
	l := h.ShortHelpView(bs)
	for len(bs) > 1 && lipgloss.Width(l) > avail {
		bs = bs[:len(bs)-1]
		l = h.ShortHelpView(bs)
	}
	m.footer = spread(" "+l, r+" ", m.width)
	return m.footer
}

// spread puts left and right on one line of width cells, cutting left if
// both do not fit.
func spread(left, right string, width int) string {
	lw, rw := lipgloss.Width(left), lipgloss.Width(right)
	if lw+rw+1 > width {
		return common.Fit(common.Fit(left, max(0, width-rw-1))+" "+right, width)
	}
	return left + strings.Repeat(" ", width-lw-rw) + right
}

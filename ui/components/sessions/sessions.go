// Package sessions is the sessions table: every session with its state and
// live figures, kept current from the event stream, with fuzzy filtering,
// qualifiers and column sorting. It scales to tens of thousands of rows by
// re-sorting only when an order-relevant field changes and rendering only
// the rows on screen.
package sessions

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
	"time"

	"charm.land/bubbles/v2/key"
	"charm.land/bubbles/v2/textinput"
	tea "charm.land/bubbletea/v2"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/ui/common"
)

// Column identifies a table column.
type Column int

// Columns; display gives their order on screen.
const (
	ColName Column = iota
	ColState
	ColCPUs
	ColMemory
	ColWorkspace
	ColDirty
	ColRunning
	ColUptime
	ColActivity
	ColCPU // live: the VMM's CPU as a share of the vCPUs (shown after VCPU)
	// ColHost is the fleet host that owns the session: shown only once a
	// session has one (the daemon is in a fleet).
	ColHost
	numColumns
)

// display is the columns' order on screen.
var display = [numColumns]Column{ColName, ColHost, ColState, ColCPUs, ColCPU, ColMemory, ColWorkspace, ColDirty, ColRunning, ColUptime, ColActivity}

type colSpec struct {
	title string
	width int  // 0: flexible (name)
	right bool // right-aligned numbers
	drop  int  // drop order when narrow: higher drops first; 0 never
	desc  bool // natural direction is descending (biggest/newest first)
}

func spec(c Column) colSpec {
	switch c {
	case ColName:
		return colSpec{title: "NAME"}
	case ColState:
		return colSpec{title: "STATE", width: 10}
	case ColHost:
		return colSpec{title: "HOST", width: 10, drop: 2}
	case ColCPU:
		return colSpec{title: "CPU", width: 5, right: true, drop: 1, desc: true}
	case ColCPUs:
		return colSpec{title: "VCPU", width: 5, right: true, drop: 6, desc: true}
	case ColMemory:
		// Guest memory in use against the VM's size; sorts by use.
		return colSpec{title: "MEM", width: 9, right: true, drop: 4, desc: true}
	case ColWorkspace:
		return colSpec{title: "WORKSPACE", width: 11, right: true, desc: true}
	case ColDirty:
		return colSpec{title: "DIRTY", width: 6, right: true, desc: true}
	case ColRunning:
		return colSpec{title: "RUN", width: 4, right: true, drop: 5, desc: true}
	case ColUptime:
		return colSpec{title: "UPTIME", width: 7, right: true, drop: 3, desc: true}
	case ColActivity:
		return colSpec{title: "ACTIVITY", width: 9, right: true, drop: 7, desc: true}
	}
	return colSpec{}
}

const (
	gap       = 2 // spaces between columns
	marker    = 2 // "▸ " before each row
	minName   = 12
	maxName   = 40
	wheelStep = 3
)

// KeyMap are the sessions table's keys.
type KeyMap struct {
	common.NavKeys
	Open        key.Binding
	Filter      key.Binding
	ClearFilter key.Binding
	Sort        key.Binding
	Reverse     key.Binding
	// Accept and Cancel apply while the filter prompt has focus.
	Accept key.Binding
	Cancel key.Binding
}

// DefaultKeyMap returns the table's bindings.
func DefaultKeyMap() KeyMap {
	return KeyMap{
		NavKeys:     common.NewNavKeys(),
		Open:        key.NewBinding(key.WithKeys("enter"), key.WithHelp("enter", "open")),
		Filter:      key.NewBinding(key.WithKeys("/"), key.WithHelp("/", "filter")),
		ClearFilter: key.NewBinding(key.WithKeys("esc"), key.WithHelp("esc", "clear filter"), key.WithDisabled()),
		Sort:        key.NewBinding(key.WithKeys("o"), key.WithHelp("o", "sort by next column")),
		Reverse:     key.NewBinding(key.WithKeys("O"), key.WithHelp("O", "reverse sort")),
		Accept:      key.NewBinding(key.WithKeys("enter"), key.WithHelp("enter", "apply filter"), key.WithDisabled()),
		Cancel:      key.NewBinding(key.WithKeys("esc"), key.WithHelp("esc", "clear filter"), key.WithDisabled()),
	}
}

type row struct {
	s     session.Session
	lower string // lower-cased name, for the fuzzy filter
	// pinned is since when the session's CPU has stayed at or above
	// PinnedCPU; zero while it is below.
	pinned time.Time
}

// A CPU at or above PinnedCPU percent is shown in the warning colour, and
// in the error colour once it has stayed there for PinnedFor.
const (
	PinnedCPU = 90
	PinnedFor = 2 * time.Minute
)

// track notes when the row's CPU became pinned.
func (r *row) track(now time.Time) {
	if lv := r.s.Live; lv != nil && lv.CPUPercent >= PinnedCPU {
		if r.pinned.IsZero() {
			r.pinned = now
		}
		return
	}
	r.pinned = time.Time{}
}

// cpuLevel is 0 (normal), 1 (busy now) or 2 (pinned for PinnedFor).
func (r *row) cpuLevel(now time.Time) int {
	switch {
	case r.pinned.IsZero():
		return 0
	case now.Sub(r.pinned) >= PinnedFor:
		return 2
	}
	return 1
}

// Model is the sessions table.
type Model struct {
	c    *common.Common
	keys KeyMap

	rows    map[string]*row
	sorted  []*row // all rows in sort order
	visible []*row // sorted rows that pass the filter
	counts  map[session.State]int
	fleet   bool // a session has a host: the HOST column is shown

	cursor, offset int
	selName        string // keeps the selection on the same session across re-sorts

	sortCol Column
	desc    bool

	input     textinput.Model
	filtering bool // the filter prompt has focus
	query     query

	width, height int
	cols          []Column
	widths        []int

	rebuilds     int // full re-sorts, for tests of the incremental path
	lastSort     time.Time
	resortQueued bool
}

var _ common.Component = (*Model)(nil)

// New returns an empty table.
func New(c *common.Common) *Model {
	in := textinput.New()
	in.Prompt = "/ "
	in.Placeholder = "name, state:paused, image:mini, -state:stopped"
	m := &Model{c: c, keys: DefaultKeyMap(), rows: map[string]*row{}, counts: map[session.State]int{}, input: in}
	return m
}

// Keys returns the key map (tests iterate it for coverage).
func (m *Model) Keys() KeyMap { return m.keys }

// SetSize implements common.Component.
func (m *Model) SetSize(w, h int) {
	m.width, m.height = w, h
	m.layout()
	m.input.SetWidth(max(10, w-20))
	m.offset = common.ScrollTo(m.cursor, m.offset, m.pageRows(), len(m.visible))
}

// Capturing implements common.Capturer.
func (m *Model) Capturing() bool { return m.filtering }

// ShortHelp implements help.KeyMap.
func (m *Model) ShortHelp() []key.Binding {
	if m.filtering {
		return common.Enabled(m.keys.Accept, m.keys.Cancel)
	}
	return common.Enabled(m.keys.Open, m.keys.Filter, m.keys.ClearFilter)
}

// FullHelp implements help.KeyMap.
func (m *Model) FullHelp() [][]key.Binding {
	if m.filtering {
		return [][]key.Binding{common.Enabled(m.keys.Accept, m.keys.Cancel)}
	}
	return [][]key.Binding{
		m.keys.NavKeys.List(),
		common.Enabled(m.keys.Open, m.keys.Filter, m.keys.ClearFilter, m.keys.Sort, m.keys.Reverse),
	}
}

// Len returns the number of sessions (unfiltered).
func (m *Model) Len() int { return len(m.rows) }

// Visible returns the number of sessions passing the filter.
func (m *Model) Visible() int { return len(m.visible) }

// Counts returns how many sessions are in each state.
func (m *Model) Counts() map[session.State]int { return m.counts }

// Get returns a session by name.
func (m *Model) Get(name string) (session.Session, bool) {
	r, ok := m.rows[name]
	if !ok {
		return session.Session{}, false
	}
	return r.s, true
}

// Selected returns the session under the cursor.
func (m *Model) Selected() (session.Session, bool) {
	if m.cursor < 0 || m.cursor >= len(m.visible) {
		return session.Session{}, false
	}
	return m.visible[m.cursor].s, true
}

// Select moves the cursor to a session by name. A session not (yet) in
// the table is selected when it arrives.
func (m *Model) Select(name string) {
	m.selName = name
	for i, r := range m.visible {
		if r.s.Name == name {
			m.setCursor(i)
			return
		}
	}
}

// Created folds in the session a create call returned and selects it. The
// call's answer and the event stream race: the answer may come first, and
// it is then the newest news of a row still shown as creating. A row that
// has moved on already is left alone.
func (m *Model) Created(s session.Session) tea.Cmd {
	var cmd tea.Cmd
	if r, ok := m.rows[s.Name]; !ok || r.s.State == session.StateCreating {
		cmd = m.Apply([]session.Event{{Kind: session.EventState, Name: s.Name, Session: &s}})
	}
	m.Select(s.Name)
	return cmd
}

// Sort returns the sort column and direction.
func (m *Model) Sort() (Column, bool) { return m.sortCol, m.desc }

// SetSort sorts by a column.
func (m *Model) SetSort(c Column, desc bool) {
	m.sortCol, m.desc = c, desc
	m.rebuild()
}

// nextSort is the column after the sort column as the header shows them,
// left to right, wrapping to the first: o walks the header the operator
// reads, not the order the columns were added in. Columns a narrow
// terminal dropped are skipped (a sort by a column not shown would
// look like no order at all); :sort still reaches them.
func (m *Model) nextSort() Column {
	shown := m.cols
	if len(shown) == 0 {
		shown = display[:]
	}
	i := slices.Index(display[:], m.sortCol)
	for n := 1; n <= len(display); n++ {
		if c := display[(i+n)%len(display)]; slices.Contains(shown, c) {
			return c
		}
	}
	return ColName
}

// SortByName sorts by a column named like its header ("dirty", "name").
func (m *Model) SortByName(name string) bool {
	for c := range numColumns {
		if strings.EqualFold(spec(c).title, name) || (c == ColCPUs && strings.EqualFold(name, "cpus")) {
			m.SetSort(c, spec(c).desc)
			return true
		}
	}
	return false
}

// Filter returns the current filter text.
func (m *Model) Filter() string { return m.input.Value() }

// SetFilter sets the filter text and applies it.
func (m *Model) SetFilter(s string) {
	m.input.SetValue(s)
	m.query = parseQuery(s)
	m.keys.ClearFilter.SetEnabled(!m.query.empty())
	m.refilter()
}

// Apply folds a batch of events into the table. It re-sorts only when a
// row was added or removed or a sort key changed, and re-filters only when
// a filtered field changed, so a burst of stats events for thousands of
// sessions costs one pass over the batch.
func (m *Model) Apply(evs []session.Event) tea.Cmd {
	// resort: rows came or went (sort now); reorder: only sort keys
	// changed (sort at most every resortEvery, so a column of live
	// figures does not cost a full sort per frame or make rows jump).
	resort, reorder, refilter := false, false, false
	now := m.c.Now()
	for i := range evs {
		ev := &evs[i]
		switch ev.Kind {
		case session.EventDeleted:
			if r, ok := m.rows[ev.Name]; ok {
				m.counts[r.s.State]--
				delete(m.rows, ev.Name)
				resort = true
			}
		case session.EventState, session.EventStats:
			if ev.Session == nil {
				continue
			}
			s := *ev.Session
			if s.Name == "" {
				s.Name = ev.Name
			}
			if s.Host != "" && !m.fleet {
				m.fleet = true // a HOST column from now on
				m.layout()
			}
			r, ok := m.rows[s.Name]
			if !ok {
				r = &row{s: s, lower: strings.ToLower(s.Name)}
				r.track(now)
				m.rows[s.Name] = r
				m.counts[s.State]++
				resort = true
				continue
			}
			old := r.s
			r.s = s
			r.track(now)
			if old.State != s.State {
				m.counts[old.State]--
				m.counts[s.State]++
			}
			if !reorder && m.compare(&old, &r.s) != 0 {
				reorder = true
			}
			if old.State != s.State || old.Image != s.Image || old.VMM != s.VMM {
				refilter = true
			}
		}
	}
	for st, n := range m.counts {
		if n == 0 {
			delete(m.counts, st)
		}
	}
	var cmd tea.Cmd
	switch {
	case resort:
		m.rebuild()
	case reorder && now.Sub(m.lastSort) >= resortEvery:
		m.rebuild()
	case reorder:
		if !m.resortQueued {
			m.resortQueued = true
			cmd = tea.Tick(resortEvery, func(time.Time) tea.Msg { return resortMsg{} })
		}
		if refilter && !m.query.empty() {
			m.refilter()
		}
	case refilter && !m.query.empty():
		m.refilter()
	}
	return cmd
}

// resortEvery bounds how often live figures re-sort the table.
const resortEvery = 250 * time.Millisecond

// resortMsg applies a re-sort deferred by Apply.
type resortMsg struct{}

// Retain drops every session not in names (after the event stream
// reconnects, sessions deleted meanwhile sent no event).
func (m *Model) Retain(names map[string]bool) {
	changed := false
	for n := range m.rows {
		if !names[n] {
			delete(m.rows, n)
			changed = true
		}
	}
	if changed {
		clear(m.counts)
		for _, r := range m.rows {
			m.counts[r.s.State]++
		}
		m.rebuild()
	}
}

// compare orders two sessions by the sort column, ignoring direction and
// the name tie-break; it is also the "did the sort key change" test.
func (m *Model) compare(a, b *session.Session) int {
	switch m.sortCol {
	case ColState:
		return cmp.Compare(stateOrder(a.State), stateOrder(b.State))
	case ColCPU:
		return cmp.Compare(cpuKey(a), cpuKey(b))
	case ColCPUs:
		return cmp.Compare(a.CPUs, b.CPUs)
	case ColMemory:
		return cmp.Compare(a.MemUsedBytes, b.MemUsedBytes)
	case ColWorkspace:
		return cmp.Compare(a.WorkspaceUsed, b.WorkspaceUsed)
	case ColDirty:
		return cmp.Compare(a.DirtyBytes, b.DirtyBytes)
	case ColRunning:
		return cmp.Compare(a.Running, b.Running)
	case ColUptime:
		// Longer uptime = earlier start; not running sorts as no uptime.
		return cmp.Compare(uptimeKey(b), uptimeKey(a))
	case ColActivity:
		return a.LastActivity.Compare(b.LastActivity)
	case ColHost:
		return strings.Compare(a.Host, b.Host)
	}
	return 0
}

// natural compares names with digit runs as numbers, so "ci-9" sorts
// before "ci-10".
func natural(a, b string) int {
	for a != "" && b != "" {
		if isDigit(a[0]) && isDigit(b[0]) {
			i, j := digits(a), digits(b)
			na, nb := strings.TrimLeft(a[:i], "0"), strings.TrimLeft(b[:j], "0")
			if c := cmp.Compare(len(na), len(nb)); c != 0 {
				return c
			}
			if c := strings.Compare(na, nb); c != 0 {
				return c
			}
			a, b = a[i:], b[j:]
			continue
		}
		if a[0] != b[0] {
			return cmp.Compare(a[0], b[0])
		}
		a, b = a[1:], b[1:]
	}
	return cmp.Compare(len(a), len(b))
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func digits(s string) int {
	i := 0
	for i < len(s) && isDigit(s[i]) {
		i++
	}
	return i
}

// cpuKey sorts sessions that are not sampled below idle ones.
func cpuKey(s *session.Session) float64 {
	if s.Live == nil {
		return -1
	}
	return s.Live.CPUPercent
}

func uptimeKey(s *session.Session) int64 {
	if s.StartedAt.IsZero() || (s.State != session.StateRunning && s.State != session.StatePaused) {
		return 1 << 62
	}
	return s.StartedAt.UnixNano()
}

func (m *Model) rebuild() {
	m.rebuilds++
	m.lastSort = m.c.Now()
	m.resortQueued = false
	m.sorted = m.sorted[:0]
	for _, r := range m.rows {
		m.sorted = append(m.sorted, r)
	}
	slices.SortFunc(m.sorted, func(a, b *row) int {
		c := m.compare(&a.s, &b.s)
		if m.desc {
			c = -c
		}
		if c == 0 {
			c = natural(a.s.Name, b.s.Name)
		}
		return c
	})
	m.refilter()
}

func (m *Model) refilter() {
	if m.query.empty() {
		m.visible = append(m.visible[:0], m.sorted...)
	} else {
		m.visible = m.visible[:0]
		for _, r := range m.sorted {
			if m.query.match(r) {
				m.visible = append(m.visible, r)
			}
		}
	}
	// Keep the cursor on the same session if it is still visible,
	// otherwise on the same position.
	idx := -1
	if m.selName != "" && m.cursor < len(m.visible) && m.visible[m.cursor].s.Name == m.selName {
		idx = m.cursor
	} else if m.selName != "" {
		for i, r := range m.visible {
			if r.s.Name == m.selName {
				idx = i
				break
			}
		}
	}
	if idx < 0 {
		idx = common.Clamp(m.cursor, 0, len(m.visible)-1)
	}
	m.setCursor(idx)
}

func (m *Model) setCursor(i int) {
	m.cursor = common.Clamp(i, 0, len(m.visible)-1)
	if m.cursor < len(m.visible) {
		m.selName = m.visible[m.cursor].s.Name
	}
	m.offset = common.ScrollTo(m.cursor, m.offset, m.pageRows(), len(m.visible))
}

func (m *Model) showFilterBar() bool { return m.filtering || m.input.Value() != "" }

// pageRows is the number of table rows on screen.
func (m *Model) pageRows() int {
	h := m.height - 1 // header
	if m.showFilterBar() {
		h--
	}
	return max(1, h)
}

// Update implements common.Component.
func (m *Model) Update(msg tea.Msg) tea.Cmd {
	switch msg := msg.(type) {
	case resortMsg:
		if m.resortQueued {
			m.rebuild()
		}
	case tea.KeyPressMsg:
		if m.filtering {
			return m.updateFilter(msg)
		}
		if c, ok := m.keys.Move(msg, m.cursor, m.pageRows(), len(m.visible)); ok {
			m.setCursor(c)
			return nil
		}
		switch {
		case key.Matches(msg, m.keys.Open):
			if s, ok := m.Selected(); ok {
				return func() tea.Msg { return common.OpenSessionMsg{Name: s.Name} }
			}
		case key.Matches(msg, m.keys.Filter):
			m.filtering = true
			m.keys.Accept.SetEnabled(true)
			m.keys.Cancel.SetEnabled(true)
			m.input.CursorEnd()
			return m.input.Focus()
		case key.Matches(msg, m.keys.ClearFilter):
			m.SetFilter("")
		case key.Matches(msg, m.keys.Sort):
			next := m.nextSort()
			m.SetSort(next, spec(next).desc)
		case key.Matches(msg, m.keys.Reverse):
			m.SetSort(m.sortCol, !m.desc)
		}
	case tea.MouseClickMsg:
		m.click(msg.Mouse())
	case tea.MouseWheelMsg:
		switch msg.Button {
		case tea.MouseWheelUp:
			m.setCursor(m.cursor - wheelStep)
		case tea.MouseWheelDown:
			m.setCursor(m.cursor + wheelStep)
		}
	}
	return nil
}

func (m *Model) updateFilter(msg tea.KeyPressMsg) tea.Cmd {
	switch {
	case key.Matches(msg, m.keys.Accept):
		m.endFilter()
		return nil
	case key.Matches(msg, m.keys.Cancel):
		m.endFilter()
		m.SetFilter("")
		return nil
	}
	var cmd tea.Cmd
	m.input, cmd = m.input.Update(msg)
	if q := m.input.Value(); q != m.lastQuery() {
		m.SetFilter(q)
	}
	return cmd
}

func (m *Model) lastQuery() string {
	var parts []string
	parts = append(parts, m.query.words...)
	for _, q := range m.query.quals {
		p := q.field + ":" + strings.Join(q.values, ",")
		if q.not {
			p = "-" + p
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, " ")
}

func (m *Model) endFilter() {
	m.filtering = false
	m.keys.Accept.SetEnabled(false)
	m.keys.Cancel.SetEnabled(false)
	m.input.Blur()
	m.offset = common.ScrollTo(m.cursor, m.offset, m.pageRows(), len(m.visible))
}

// click selects the clicked row, or sorts by the clicked header.
func (m *Model) click(ms tea.Mouse) {
	if ms.Button != tea.MouseLeft {
		return
	}
	y := ms.Y
	if m.showFilterBar() {
		y--
	}
	if y == 0 {
		if c, ok := m.columnAt(ms.X); ok {
			if c == m.sortCol {
				m.SetSort(c, !m.desc)
			} else {
				m.SetSort(c, spec(c).desc)
			}
		}
		return
	}
	if i := m.offset + y - 1; y > 0 && i < len(m.visible) {
		m.setCursor(i)
	}
}

func (m *Model) columnAt(x int) (Column, bool) {
	pos := marker
	for i, c := range m.cols {
		if x >= pos && x < pos+m.widths[i]+gap {
			return c, true
		}
		pos += m.widths[i] + gap
	}
	return 0, false
}

// colWidth is column c's width. In a fleet STATE is wider: a session
// whose host is out of reach is "? unreachable".
func (m *Model) colWidth(c Column) int {
	if c == ColState && m.fleet {
		return len("? ") + len(session.StateUnreachable)
	}
	return spec(c).width
}

// layout picks the columns that fit and their widths: fixed columns keep
// their width, the name takes the rest, and low-priority columns drop
// out (activity first) until the name gets at least minName cells.
func (m *Model) layout() {
	all := append(make([]Column, 0, numColumns), display[:]...)
	if !m.fleet {
		all = slices.DeleteFunc(all, func(c Column) bool { return c == ColHost })
	}
	for {
		fixed := marker
		for _, c := range all {
			fixed += m.colWidth(c) + gap
		}
		nameW := m.width - fixed
		if nameW >= minName || len(all) <= 3 {
			m.cols = all
			m.widths = make([]int, len(all))
			for i, c := range all {
				m.widths[i] = m.colWidth(c)
			}
			m.widths[0] = common.Clamp(nameW, 4, maxName)
			return
		}
		// Drop the column with the highest drop rank.
		best, bi := 0, -1
		for i, c := range all {
			if d := spec(c).drop; d > best {
				best, bi = d, i
			}
		}
		if bi < 0 {
			m.cols = all
			m.widths = make([]int, len(all))
			for i, c := range all {
				m.widths[i] = m.colWidth(c)
			}
			m.widths[0] = max(4, nameW)
			return
		}
		all = slices.Delete(all, bi, bi+1)
	}
}

// View implements common.Component.
func (m *Model) View() string {
	st := m.c.Styles
	lines := make([]string, 0, m.height)
	if m.showFilterBar() {
		bar := m.input.View()
		count := st.Muted.Render("  " + strconv.Itoa(len(m.visible)) + " of " + strconv.Itoa(len(m.rows)))
		lines = append(lines, bar+count)
	}
	lines = append(lines, m.header())
	page := m.pageRows()
	now := m.c.Now()
	for i := m.offset; i < len(m.visible) && i < m.offset+page; i++ {
		lines = append(lines, m.renderRow(m.visible[i], i == m.cursor, now))
	}
	if len(m.visible) == 0 {
		msg := "No sessions yet."
		if !m.c.ReadOnly {
			msg += " Press n to create one."
		}
		if len(m.rows) > 0 {
			msg = "No session matches the filter. esc clears it."
		}
		lines = append(lines, "", "  "+st.Muted.Render(msg))
	}
	return common.Block(strings.Join(lines, "\n"), m.width, m.height)
}

func (m *Model) header() string {
	st := m.c.Styles
	var b strings.Builder
	b.WriteString(strings.Repeat(" ", marker))
	for i, c := range m.cols {
		t := spec(c).title
		if c == m.sortCol {
			if m.desc {
				t += "↓"
			} else {
				t += "↑"
			}
		}
		if spec(c).right {
			b.WriteString(common.FitLeft(t, m.widths[i]))
		} else {
			b.WriteString(common.Fit(t, m.widths[i]))
		}
		if i < len(m.cols)-1 {
			b.WriteString(strings.Repeat(" ", gap))
		}
	}
	return st.TableHead.Render(common.Fit(b.String(), m.width))
}

func (m *Model) renderRow(r *row, selected bool, now time.Time) string {
	st := m.c.Styles
	s := &r.s
	var b strings.Builder
	if selected {
		b.WriteString("▸ ")
	} else {
		b.WriteString("  ")
	}
	styled := !selected // the cursor row is one reverse/tinted bar
	for i, c := range m.cols {
		w := m.widths[i]
		var cell string
		switch c {
		case ColName:
			cell = common.Fit(common.SanitizeLine(s.Name), w)
		case ColHost:
			cell = common.Fit(common.SanitizeLine(s.Host), w)
		case ColState:
			if styled {
				cell = common.Fit(st.StateBadge(s.State), w)
			} else {
				cell = common.Fit(common.StateMark(s.State)+" "+string(s.State), w)
			}
		case ColCPU:
			txt := "—"
			if s.Live != nil {
				txt = strconv.Itoa(int(s.Live.CPUPercent+0.5)) + "%"
			}
			cell = common.FitLeft(txt, w)
			if styled {
				switch r.cpuLevel(now) {
				case 2:
					cell = st.ErrP.Render(cell)
				case 1:
					cell = st.WarnP.Render(cell)
				}
			}
		case ColCPUs:
			cell = common.FitLeft(strconv.Itoa(s.CPUs), w)
		case ColMemory:
			used := "—"
			if s.MemUsedBytes > 0 {
				used = session.FormatBytesShort(s.MemUsedBytes)
			}
			cell = common.FitLeft(used+"/"+session.FormatBytesShort(int64(s.MemoryMiB)<<20), w)
		case ColWorkspace:
			txt := common.WorkspaceUsed(*s) + "/" + session.FormatBytesShort(s.DiskBytes)
			cell = common.FitLeft(txt, w)
			if styled && s.DiskBytes > 0 && s.WorkspaceUsed*10 >= s.DiskBytes*9 {
				cell = st.ErrP.Render(cell)
			}
		case ColDirty:
			cell = common.FitLeft(session.FormatBytesShort(s.DirtyBytes), w)
			if styled {
				if s.DirtyBytes > 0 {
					cell = st.WarnP.Render(cell)
				} else {
					cell = st.MutedP.Render(cell)
				}
			}
		case ColRunning:
			cell = common.FitLeft(strconv.Itoa(s.Running), w)
			if styled && s.Running == 0 {
				cell = st.MutedP.Render(cell)
			}
		case ColUptime:
			txt := "—"
			if !s.StartedAt.IsZero() && (s.State == session.StateRunning || s.State == session.StatePaused) {
				txt = session.FormatDuration(now.Sub(s.StartedAt))
			}
			cell = common.FitLeft(txt, w)
		case ColActivity:
			cell = common.FitLeft(common.Ago(now, s.LastActivity), w)
			if styled {
				cell = st.MutedP.Render(cell)
			}
		}
		b.WriteString(cell)
		if i < len(m.cols)-1 {
			b.WriteString("  ")
		}
	}
	line := common.Fit(b.String(), m.width)
	if selected {
		return st.SelectedP.Render(line)
	}
	return line
}

// Restyle re-applies the shared styles (after a background or colour
// profile change) to the filter prompt, which keeps its own copy.
func (m *Model) Restyle() { m.input.SetStyles(m.c.Styles.Input) }

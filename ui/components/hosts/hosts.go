// Package hosts is the hosts page: the hosts of the daemon's fleet as
// `berth host ls` shows them (state, address, what each has and what
// placement promised of it), polled while the page is shown.
package hosts

import (
	"strconv"
	"strings"
	"time"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
	"charm.land/lipgloss/v2"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/ui/common"
)

// DefaultEvery is how often the page asks for the hosts while shown: a
// host's lease and use change in seconds, and each answer is one etcd
// read by the daemon.
const DefaultEvery = 3 * time.Second

// NotInFleet is what the page says for a daemon that is no fleet's host.
const NotInFleet = "this berth is one host on its own: berth serve --fleet … joins a fleet"

// Column identifies a table column.
type column int

const (
	colHost column = iota
	colState
	colAddr
	colCPUs
	colMemory
	colDisk
	colSessions
	colImages
	colSince
	numColumns
)

type colSpec struct {
	title string
	min   int  // at least this wide (flexible columns)
	max   int  // at most this wide; 0: as wide as the title or a fixed width
	right bool // right-aligned numbers
	drop  int  // drop order when narrow: higher drops first; 0 never
}

func spec(c column) colSpec {
	switch c {
	case colHost:
		return colSpec{title: "HOST", min: 4, max: 32}
	case colState:
		return colSpec{title: "STATE", min: 10, max: 10}
	case colAddr:
		return colSpec{title: "ADDRESS", min: 7, max: 24, drop: 5}
	case colCPUs:
		return colSpec{title: "CPUS", min: 5, max: 9, right: true}
	case colMemory:
		return colSpec{title: "MEMORY", min: 6, max: 13, right: true, drop: 4}
	case colDisk:
		return colSpec{title: "DISK FREE", min: 9, max: 15, right: true, drop: 3}
	case colSessions:
		return colSpec{title: "SESSIONS", min: 8, max: 8, right: true, drop: 6}
	case colImages:
		return colSpec{title: "IMAGES", min: 6, max: 30, drop: 8}
	case colSince:
		return colSpec{title: "SINCE", min: 7, max: 8, right: true, drop: 7}
	}
	return colSpec{}
}

const (
	gap       = 2 // spaces between columns
	marker    = 2 // "▸ " before each row
	wheelStep = 3
)

// KeyMap are the hosts page's keys.
type KeyMap struct {
	common.NavKeys
	Refresh key.Binding
}

// DefaultKeyMap returns the page's bindings.
func DefaultKeyMap() KeyMap {
	return KeyMap{
		NavKeys: common.NewNavKeys(),
		Refresh: key.NewBinding(key.WithKeys("r"), key.WithHelp("r", "refresh now")),
	}
}

// listedMsg is the answer of one Hosts call; gen ties it to the poll
// that asked, so an answer for a page left since is dropped.
type listedMsg struct {
	gen  int
	list session.HostList
	err  error
}

// tickMsg asks for the next poll of generation gen.
type tickMsg struct{ gen int }

// Model is the hosts page.
type Model struct {
	c      *common.Common
	lister session.HostLister
	keys   KeyMap
	every  time.Duration

	list  session.HostList
	known bool      // an answer came: list is what etcd said
	at    time.Time // when list was answered
	err   error     // the last call's error; nil once one succeeds

	cursor, offset int
	selID          string // keeps the cursor on the same host across polls

	width, height int
	cols          []column
	widths        []int

	// gen is the poll's generation: Show and Hide bump it, so a tick or
	// an answer of an earlier poll ends that poll's chain. shown says a
	// poll runs.
	gen   int
	shown bool
}

var _ common.Component = (*Model)(nil)

// New returns the page, asking lister.
func New(c *common.Common, lister session.HostLister) *Model {
	return &Model{c: c, lister: lister, keys: DefaultKeyMap(), every: DefaultEvery}
}

// SetEvery sets how often the page polls (tests poll faster).
func (m *Model) SetEvery(d time.Duration) { m.every = d }

// Keys returns the key map (tests iterate it for coverage).
func (m *Model) Keys() KeyMap { return m.keys }

// Show starts polling: one call now, then one every interval after each
// answer, until Hide. The chain is one Cmd at a time, so a slow etcd
// never has calls pile up.
func (m *Model) Show() tea.Cmd {
	m.gen++
	m.shown = true
	return m.fetch()
}

// Hide stops polling: a tick or answer still on its way is dropped.
func (m *Model) Hide() {
	if m.shown {
		m.shown = false
		m.gen++
	}
}

// Polling reports whether the page polls (it is shown).
func (m *Model) Polling() bool { return m.shown }

// List returns the last answer, and whether one came.
func (m *Model) List() (session.HostList, bool) { return m.list, m.known }

// Err returns the last call's error (nil once one succeeded since).
func (m *Model) Err() error { return m.err }

// Selected returns the host under the cursor.
func (m *Model) Selected() (session.HostInfo, bool) {
	if m.cursor < 0 || m.cursor >= len(m.list.Hosts) {
		return session.HostInfo{}, false
	}
	return m.list.Hosts[m.cursor], true
}

func (m *Model) fetch() tea.Cmd {
	gen, lister := m.gen, m.lister
	ctx, cancel := m.c.Call()
	return func() tea.Msg {
		defer cancel()
		list, err := lister.Hosts(ctx)
		return listedMsg{gen: gen, list: list, err: err}
	}
}

// SetSize implements common.Component.
func (m *Model) SetSize(w, h int) {
	m.width, m.height = w, h
	m.layout()
	m.offset = common.ScrollTo(m.cursor, m.offset, m.pageRows(), len(m.list.Hosts))
}

// ShortHelp implements help.KeyMap.
func (m *Model) ShortHelp() []key.Binding { return []key.Binding{m.keys.Refresh} }

// FullHelp implements help.KeyMap.
func (m *Model) FullHelp() [][]key.Binding {
	return [][]key.Binding{m.keys.NavKeys.List(), {m.keys.Refresh}}
}

// Update implements common.Component.
func (m *Model) Update(msg tea.Msg) tea.Cmd {
	switch msg := msg.(type) {
	case listedMsg:
		if msg.gen != m.gen || !m.shown {
			return nil
		}
		m.apply(msg.list, msg.err)
		gen := m.gen
		return tea.Tick(m.every, func(time.Time) tea.Msg { return tickMsg{gen: gen} })
	case tickMsg:
		if msg.gen != m.gen || !m.shown {
			return nil
		}
		return m.fetch()
	case tea.KeyPressMsg:
		if c, ok := m.keys.Move(msg, m.cursor, m.pageRows(), len(m.list.Hosts)); ok {
			m.setCursor(c)
			return nil
		}
		if key.Matches(msg, m.keys.Refresh) && m.shown {
			// A new generation: the chain waiting on its tick ends, so
			// there is still one call at a time.
			return m.Show()
		}
	case tea.MouseClickMsg:
		ms := msg.Mouse()
		if i := m.offset + ms.Y - m.tableTop() - 1; ms.Button == tea.MouseLeft && ms.Y > m.tableTop() && i < len(m.list.Hosts) {
			m.setCursor(i)
		}
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

// apply takes an answer. An error keeps the hosts last known: the page
// says they are stale rather than going blank while etcd is away.
func (m *Model) apply(list session.HostList, err error) {
	if err != nil {
		m.err = err
		m.layout()
		return
	}
	m.err, m.list, m.known, m.at = nil, list, true, m.c.Now()
	m.layout()
	idx := m.cursor
	for i, h := range m.list.Hosts {
		if h.ID == m.selID {
			idx = i
			break
		}
	}
	m.setCursor(idx)
}

func (m *Model) setCursor(i int) {
	m.cursor = common.Clamp(i, 0, len(m.list.Hosts)-1)
	if m.cursor < len(m.list.Hosts) {
		m.selID = m.list.Hosts[m.cursor].ID
	}
	m.offset = common.ScrollTo(m.cursor, m.offset, m.pageRows(), len(m.list.Hosts))
}

// tableTop is the row of the table's header: below the error line, if
// there is one.
func (m *Model) tableTop() int {
	if m.err != nil {
		return 1
	}
	return 0
}

// pageRows is the number of host rows on screen.
func (m *Model) pageRows() int { return max(1, m.height-m.tableTop()-1) }

// cell returns a host's text for a column, unstyled.
func (m *Model) cell(h *session.HostInfo, c column, now time.Time) string {
	switch c {
	case colHost:
		id := common.SanitizeLine(h.ID)
		if h.ID == m.list.Self {
			id += " (this)"
		}
		return id
	case colState:
		return common.HostMark(h.State) + " " + common.SanitizeLine(string(h.State))
	case colAddr:
		if h.Addr == "" {
			return "—"
		}
		return common.SanitizeLine(h.Addr)
	case colCPUs:
		return strconv.Itoa(h.Used.CPUs) + "/" + strconv.Itoa(h.CPUs)
	case colMemory:
		return session.FormatBytesShort(h.Used.MemoryMiB<<20) + "/" + session.FormatBytesShort(h.MemoryMiB<<20)
	case colDisk:
		txt := session.FormatBytesShort(h.DiskFree)
		if h.Floor > 0 {
			txt += " (" + session.FormatBytesShort(h.Floor) + ")"
		}
		return txt
	case colSessions:
		return strconv.Itoa(h.Used.Sessions)
	case colImages:
		if len(h.Images) == 0 {
			return "—"
		}
		return common.SanitizeLine(strings.Join(h.Images, ","))
	case colSince:
		return common.Ago(now, h.Since)
	}
	return ""
}

// layout picks the columns that fit and their widths: each as wide as
// its widest cell within its bounds, dropping the least useful ones
// (images first) until the rest fit; HOST, STATE and CPUS always stay,
// and a line still too wide is cut at the edge.
func (m *Model) layout() {
	now := m.c.Now()
	all := make([]column, 0, numColumns)
	want := make(map[column]int, numColumns)
	for c := range numColumns {
		all = append(all, c)
		w := max(spec(c).min, lipgloss.Width(spec(c).title))
		for i := range m.list.Hosts {
			w = max(w, lipgloss.Width(m.cell(&m.list.Hosts[i], c, now)))
		}
		if mx := spec(c).max; mx > 0 {
			w = min(w, max(mx, lipgloss.Width(spec(c).title)))
		}
		want[c] = w
	}
	for {
		total := marker - gap
		for _, c := range all {
			total += want[c] + gap
		}
		if total <= m.width {
			break
		}
		best, bi := 0, -1
		for i, c := range all {
			if d := spec(c).drop; d > best {
				best, bi = d, i
			}
		}
		if bi < 0 {
			break
		}
		all = append(all[:bi], all[bi+1:]...)
	}
	m.cols = all
	m.widths = m.widths[:0]
	for _, c := range all {
		m.widths = append(m.widths, want[c])
	}
}

// View implements common.Component.
func (m *Model) View() string {
	st := m.c.Styles
	now := m.c.Now()
	lines := make([]string, 0, m.height)
	if m.err != nil {
		msg := "⚠ cannot list the hosts: " + common.ErrorText(m.err)
		if m.known {
			msg += " (as of " + common.Ago(now, m.at) + ")"
		}
		lines = append(lines, st.FlashErr.Render(common.Fit(" "+msg, m.width)))
	}
	switch {
	case !m.known && m.err == nil:
		lines = append(lines, "", "  "+st.Muted.Render("asking for the fleet's hosts…"))
	case !m.known:
	case !m.list.Fleet:
		lines = append(lines, "", "  "+st.Muted.Render(NotInFleet))
	case len(m.list.Hosts) == 0:
		lines = append(lines, m.header(), "", "  "+st.Muted.Render("no host has registered in the fleet"))
	default:
		lines = append(lines, m.header())
		for i := m.offset; i < len(m.list.Hosts) && i < m.offset+m.pageRows(); i++ {
			lines = append(lines, m.row(&m.list.Hosts[i], i == m.cursor, now))
		}
	}
	return common.Block(strings.Join(lines, "\n"), m.width, m.height)
}

func (m *Model) header() string {
	var b strings.Builder
	b.WriteString(strings.Repeat(" ", marker))
	for i, c := range m.cols {
		if i > 0 {
			b.WriteString(strings.Repeat(" ", gap))
		}
		if spec(c).right {
			b.WriteString(common.FitLeft(spec(c).title, m.widths[i]))
		} else {
			b.WriteString(common.Fit(spec(c).title, m.widths[i]))
		}
	}
	return m.c.Styles.TableHead.Render(common.Fit(b.String(), m.width))
}

func (m *Model) row(h *session.HostInfo, selected bool, now time.Time) string {
	st := m.c.Styles
	var b strings.Builder
	if selected {
		b.WriteString("▸ ")
	} else {
		b.WriteString("  ")
	}
	styled := !selected // the cursor row is one reverse/tinted bar
	for i, c := range m.cols {
		if i > 0 {
			b.WriteString(strings.Repeat(" ", gap))
		}
		w := m.widths[i]
		txt := m.cell(h, c, now)
		var cell string
		if spec(c).right {
			cell = common.FitLeft(txt, w)
		} else {
			cell = common.Fit(txt, w)
		}
		if styled {
			switch {
			case c == colState:
				cell = lipgloss.NewStyle().Foreground(st.HostColor(h.State)).Render(cell)
			case c == colDisk && h.Floor > 0 && h.DiskFree < h.Floor:
				cell = st.ErrP.Render(cell)
			case c == colCPUs && h.CPUs > 0 && h.Used.CPUs >= h.CPUs,
				c == colMemory && h.MemoryMiB > 0 && h.Used.MemoryMiB >= h.MemoryMiB:
				cell = st.WarnP.Render(cell) // full: placement puts nothing more there
			case c == colSince || (c == colImages && len(h.Images) == 0) || (c == colAddr && h.Addr == ""):
				cell = st.MutedP.Render(cell)
			}
		}
		b.WriteString(cell)
	}
	line := common.Fit(b.String(), m.width)
	if selected {
		return st.SelectedP.Render(line)
	}
	return line
}

// Package output is the Output tab: the live stdout/stderr of one
// execution. It follows new output by default, pauses when the operator
// scrolls up (counting new lines), wraps, shows timestamps, filters by
// stream and searches. It never holds a whole output: a bounded window of
// lines is filled from the store page by page as the operator scrolls, so
// a million-line output scrolls like a short one.
package output

import (
	"bytes"
	"context"
	"strings"

	"charm.land/bubbles/v2/key"
	"charm.land/bubbles/v2/textinput"
	tea "charm.land/bubbletea/v2"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/ui/common"
)

// Window bounds. The view keeps at most this much output in memory;
// pages aim at targetPageLines lines each.
const (
	maxLines        = 20000
	maxBytes        = 8 << 20
	targetPageLines = 2000
	wheelStep       = 3
	gutterWidth     = 2
	stampWidth      = 13 // "15:04:05.000 "
)

// Streams selects which streams are shown.
type Streams int

const (
	Both Streams = iota
	StdoutOnly
	StderrOnly
)

func (s Streams) String() string {
	switch s {
	case StdoutOnly:
		return "stdout"
	case StderrOnly:
		return "stderr"
	}
	return "stdout+stderr"
}

// KeyMap are the Output tab's keys.
type KeyMap struct {
	common.NavKeys
	Wrap        key.Binding
	Timestamps  key.Binding
	Streams     key.Binding
	Search      key.Binding
	NextMatch   key.Binding
	PrevMatch   key.Binding
	ClearSearch key.Binding
	// Accept and Cancel apply while typing a search.
	Accept key.Binding
	Cancel key.Binding
}

// DefaultKeyMap returns the Output bindings.
func DefaultKeyMap() KeyMap {
	nav := common.NewNavKeys()
	nav.Bottom.SetHelp("G/end", "bottom, follow")
	return KeyMap{
		NavKeys:     nav,
		Wrap:        key.NewBinding(key.WithKeys("w"), key.WithHelp("w", "wrap lines")),
		Timestamps:  key.NewBinding(key.WithKeys("t"), key.WithHelp("t", "timestamps")),
		Streams:     key.NewBinding(key.WithKeys("s"), key.WithHelp("s", "stdout/stderr/both")),
		Search:      key.NewBinding(key.WithKeys("/"), key.WithHelp("/", "search")),
		NextMatch:   key.NewBinding(key.WithKeys("n"), key.WithHelp("n", "next match")),
		PrevMatch:   key.NewBinding(key.WithKeys("N"), key.WithHelp("N", "previous match")),
		ClearSearch: key.NewBinding(key.WithKeys("esc"), key.WithHelp("esc", "clear search"), key.WithDisabled()),
		Accept:      key.NewBinding(key.WithKeys("enter"), key.WithHelp("enter", "find"), key.WithDisabled()),
		Cancel:      key.NewBinding(key.WithKeys("esc"), key.WithHelp("esc", "cancel search"), key.WithDisabled()),
	}
}

type pos struct{ line, off int }

// Model is the Output tab.
type Model struct {
	c    *common.Common
	svc  session.Execer // reads, follows and probes output
	keys KeyMap
	w, h int

	exec   session.Execution
	has    bool
	gen    int                // bumps on every Open, so stale messages are dropped
	cancel context.CancelFunc // ends the live follower
	owned  session.Process    // a process the UI started; drained when abandoned
	live   bool               // a pump is armed
	// follower is the attached stream of a running execution the UI did
	// not start; the pump re-arms on it after each batch.
	follower <-chan session.Chunk

	win           window
	top, sub      int    // first shown line and its first shown row (wrap)
	follow        bool   // stick to the end as output arrives
	atEnd         bool   // the window holds the newest output
	lastSeq       uint64 // newest seq known
	newLines      int    // arrived while not following
	loading       bool   // the first page is on its way
	loadingBefore bool
	loadingAfter  bool
	linesPerChunk float64

	wrap    bool
	stamps  bool
	streams Streams

	searching bool
	input     textinput.Model
	query     string
	fold      bool // case-insensitive (query is all lower case)
	cur       pos
	hasCur    bool
	scanning  bool

	status string // a one-off note in the status bar ("no more matches")
	err    string
}

var _ common.Component = (*Model)(nil)

// New returns an empty Output view that reads and follows output through svc.
func New(c *common.Common, svc session.Execer) *Model {
	in := textinput.New()
	in.Prompt = "/"
	in.Placeholder = "search (lower case: ignore case)"
	in.SetStyles(c.Styles.Input)
	return &Model{c: c, svc: svc, keys: DefaultKeyMap(), input: in, follow: true}
}

// Keys returns the key map.
func (m *Model) Keys() KeyMap { return m.keys }

// SetSize implements common.Component.
func (m *Model) SetSize(w, h int) {
	m.w, m.h = w, h
	m.input.SetWidth(max(10, w-30))
	if m.follow {
		m.gotoBottom()
	}
}

// Capturing implements common.Capturer.
func (m *Model) Capturing() bool { return m.searching }

// ShortHelp implements help.KeyMap.
func (m *Model) ShortHelp() []key.Binding {
	if m.searching {
		return common.Enabled(m.keys.Accept, m.keys.Cancel)
	}
	return common.Enabled(m.keys.Bottom, m.keys.Search, m.keys.Wrap, m.keys.Streams, m.keys.ClearSearch)
}

// FullHelp implements help.KeyMap.
func (m *Model) FullHelp() [][]key.Binding {
	if m.searching {
		return [][]key.Binding{common.Enabled(m.keys.Accept, m.keys.Cancel)}
	}
	return [][]key.Binding{
		m.keys.NavKeys.List(),
		common.Enabled(m.keys.Wrap, m.keys.Timestamps, m.keys.Streams, m.keys.Search, m.keys.NextMatch, m.keys.PrevMatch, m.keys.ClearSearch),
	}
}

// Exec returns the shown execution.
func (m *Model) Exec() (session.Execution, bool) { return m.exec, m.has }

// Following reports whether the view sticks to the end of the output.
func (m *Model) Following() bool { return m.follow }

// NewLines returns how many lines arrived since following paused.
func (m *Model) NewLines() int { return m.newLines }

// WindowLines returns how many lines the view holds in memory.
func (m *Model) WindowLines() int { return len(m.win.lines) }

// Wrap, Timestamps and Streams report the display toggles.
func (m *Model) Wrap() bool         { return m.wrap }
func (m *Model) Timestamps() bool   { return m.stamps }
func (m *Model) Streams() Streams   { return m.streams }
func (m *Model) Query() string      { return m.query }
func (m *Model) Match() (int, bool) { return m.cur.line, m.hasCur }

// ApplyExec updates the shown execution's record (from the event stream).
func (m *Model) ApplyExec(e session.Execution) {
	if m.has && e.ID == m.exec.ID {
		m.exec = e
	}
}

// Open shows an execution. proc is the stream of an execution the UI just
// started (nil to read the store and attach).
func (m *Model) Open(e session.Execution, proc session.Process) tea.Cmd {
	cmd := m.Close()
	m.gen++
	m.exec, m.has = e, true
	m.top, m.sub, m.newLines, m.lastSeq = 0, 0, 0, 0
	m.follow, m.atEnd = true, false
	m.loadingBefore, m.loadingAfter, m.scanning = false, false, false
	m.hasCur, m.status, m.err = false, "", ""
	m.win.reset(1)
	if proc != nil {
		m.owned = proc
		m.atEnd = true
		m.live = true
		return tea.Batch(cmd, pump(m.gen, proc.Output()))
	}
	m.loading = true
	return tea.Batch(cmd, m.loadTail())
}

// Close stops following the shown execution. The returned Cmd drains a
// stream the UI owns, so the service never blocks on it.
func (m *Model) Close() tea.Cmd {
	if m.cancel != nil {
		m.cancel()
		m.cancel = nil
	}
	m.live = false
	m.follower = nil
	m.gen++
	if m.owned != nil {
		ch := m.owned.Output()
		m.owned = nil
		return drain(ch)
	}
	return nil
}

// Clear closes and forgets the execution (its session went away).
func (m *Model) Clear() tea.Cmd {
	cmd := m.Close()
	m.has = false
	m.exec = session.Execution{}
	m.win.reset(1)
	return cmd
}

func (m *Model) textRows() int { return max(1, m.h-2) }

func (m *Model) textWidth() int {
	w := m.w - gutterWidth
	if m.stamps {
		w -= stampWidth
	}
	return max(4, w)
}

func (m *Model) pageLimit() int {
	if m.linesPerChunk <= 0 {
		return 64
	}
	return common.Clamp(int(targetPageLines/m.linesPerChunk), 8, 1024)
}

func (m *Model) learn(chunks, lines int) {
	if chunks == 0 {
		return
	}
	v := float64(max(lines, 1)) / float64(chunks)
	if m.linesPerChunk == 0 {
		m.linesPerChunk = v
	} else {
		m.linesPerChunk = 0.7*m.linesPerChunk + 0.3*v
	}
}

// Load commands. Each captures what it needs, so it never touches the
// model from its goroutine.

func (m *Model) loadTail() tea.Cmd {
	gen, id, svc, limit := m.gen, m.exec.ID, m.svc, m.pageLimit()
	ctx, cancel := m.c.Call()
	return func() tea.Msg {
		defer cancel()
		last, err := lastSeq(ctx, svc, id)
		if err != nil {
			return pageMsg{gen: gen, kind: kindTail, err: err}
		}
		from := uint64(1)
		if last > uint64(limit) {
			from = last - uint64(limit) + 1
		}
		p, err := svc.Output(ctx, id, from, limit)
		return pageMsg{gen: gen, kind: kindTail, from: from, limit: limit, page: p, last: last, err: err}
	}
}

func (m *Model) loadAt(target uint64, search int) tea.Cmd {
	gen, id, svc, limit := m.gen, m.exec.ID, m.svc, m.pageLimit()
	from := uint64(1)
	if target > uint64(limit/4) {
		from = target - uint64(limit/4)
	}
	ctx, cancel := m.c.Call()
	return func() tea.Msg {
		defer cancel()
		p, err := svc.Output(ctx, id, from, limit)
		return pageMsg{gen: gen, kind: kindAt, from: from, limit: limit, page: p, target: target, search: search, err: err}
	}
}

func (m *Model) loadBefore() tea.Cmd {
	if m.loadingBefore || m.win.atStart || m.win.lo <= 1 {
		return nil
	}
	m.loadingBefore = true
	gen, id, svc, limit := m.gen, m.exec.ID, m.svc, m.pageLimit()
	hi := m.win.lo // exclusive
	from := uint64(1)
	if hi > uint64(limit) {
		from = hi - uint64(limit)
	}
	ctx, cancel := m.c.Call()
	return func() tea.Msg {
		defer cancel()
		p, err := svc.Output(ctx, id, from, int(hi-from))
		return pageMsg{gen: gen, kind: kindBefore, from: from, limit: int(hi - from), page: p, err: err}
	}
}

func (m *Model) loadAfter() tea.Cmd {
	if m.loadingAfter || m.atEnd || m.loading {
		return nil
	}
	m.loadingAfter = true
	gen, id, svc, limit, from := m.gen, m.exec.ID, m.svc, m.pageLimit(), m.win.next
	ctx, cancel := m.c.Call()
	return func() tea.Msg {
		defer cancel()
		p, err := svc.Output(ctx, id, from, limit)
		return pageMsg{gen: gen, kind: kindAfter, from: from, limit: limit, page: p, err: err}
	}
}

func (m *Model) attach() tea.Cmd {
	if m.live || m.exec.State.Done() {
		return nil
	}
	m.live = true
	ctx, cancel := context.WithCancel(m.c.Ctx)
	m.cancel = cancel
	gen, id, svc, from := m.gen, m.exec.ID, m.svc, m.win.next
	return func() tea.Msg {
		p, err := svc.Attach(ctx, id, from)
		return attachedMsg{gen: gen, proc: p, err: err}
	}
}

func (m *Model) refreshExec() tea.Cmd {
	gen, id, svc := m.gen, m.exec.ID, m.svc
	ctx, cancel := m.c.Call()
	return func() tea.Msg {
		defer cancel()
		e, err := svc.Execution(ctx, id)
		if err != nil {
			return nil
		}
		return execMsg{gen: gen, exec: e}
	}
}

// prefetch reads the neighbouring page when the viewport nears an edge of
// the window, so scrolling rarely reaches a gap.
func (m *Model) prefetch() tea.Cmd {
	margin := 3 * m.textRows()
	var cmds []tea.Cmd
	if !m.win.atStart && m.top < margin {
		cmds = append(cmds, m.loadBefore())
	}
	if !m.atEnd && len(m.win.lines)-m.top < margin+m.textRows() {
		cmds = append(cmds, m.loadAfter())
	}
	return tea.Batch(cmds...)
}

// Update implements common.Component.
func (m *Model) Update(msg tea.Msg) tea.Cmd {
	switch msg := msg.(type) {
	case pageMsg:
		return m.handlePage(msg)
	case chunksMsg:
		return m.handleChunks(msg)
	case attachedMsg:
		if msg.gen != m.gen {
			return nil
		}
		if msg.err != nil {
			m.live = false
			m.status = "live follow failed: " + common.ErrorText(msg.err)
			return nil
		}
		m.follower = msg.proc.Output()
		return pump(m.gen, m.follower)
	case scanMsg:
		return m.handleScan(msg)
	case execMsg:
		if msg.gen == m.gen {
			m.exec = msg.exec
		}
	case tea.KeyPressMsg:
		if !m.has {
			return nil
		}
		if m.searching {
			return m.updateSearch(msg)
		}
		return m.handleKey(msg)
	case tea.MouseWheelMsg:
		switch msg.Button {
		case tea.MouseWheelUp:
			m.follow = false
			m.scrollUp(wheelStep)
		case tea.MouseWheelDown:
			m.scrollDown(wheelStep)
			m.maybeResumeFollow()
		}
		return m.prefetch()
	}
	return nil
}

func (m *Model) handleKey(k tea.KeyPressMsg) tea.Cmd {
	half := max(1, m.textRows()/2)
	m.status = ""
	switch {
	case key.Matches(k, m.keys.Up):
		m.follow = false
		m.scrollUp(1)
	case key.Matches(k, m.keys.Down):
		m.scrollDown(1)
		m.maybeResumeFollow()
	case key.Matches(k, m.keys.HalfUp):
		m.follow = false
		m.scrollUp(half)
	case key.Matches(k, m.keys.HalfDown):
		m.scrollDown(half)
		m.maybeResumeFollow()
	case key.Matches(k, m.keys.Top):
		m.follow = false
		if m.win.atStart {
			m.top, m.sub = m.firstVisible(0, 1), 0
		} else {
			return m.loadAt(1, 0)
		}
	case key.Matches(k, m.keys.Bottom):
		m.follow = true
		m.newLines = 0
		if m.atEnd {
			m.gotoBottom()
			return nil
		}
		return m.loadTail()
	case key.Matches(k, m.keys.Wrap):
		m.wrap = !m.wrap
		m.sub = 0
		if m.follow {
			m.gotoBottom()
		}
	case key.Matches(k, m.keys.Timestamps):
		m.stamps = !m.stamps
		m.sub = 0
		if m.follow {
			m.gotoBottom()
		}
	case key.Matches(k, m.keys.Streams):
		m.streams = (m.streams + 1) % 3
		m.sub = 0
		m.hasCur = false
		if m.follow {
			m.gotoBottom()
		} else if f := m.firstVisible(m.top, 1); f < len(m.win.lines) {
			m.top = f
		} else {
			m.top = m.firstVisible(m.top, -1)
		}
	case key.Matches(k, m.keys.Search):
		m.searching = true
		m.keys.Accept.SetEnabled(true)
		m.keys.Cancel.SetEnabled(true)
		m.input.SetValue("")
		return m.input.Focus()
	case key.Matches(k, m.keys.NextMatch):
		return m.findMatch(1, true)
	case key.Matches(k, m.keys.PrevMatch):
		return m.findMatch(-1, true)
	case key.Matches(k, m.keys.ClearSearch):
		m.setQuery("")
	}
	return m.prefetch()
}

func (m *Model) updateSearch(k tea.KeyPressMsg) tea.Cmd {
	switch {
	case key.Matches(k, m.keys.Accept):
		m.endSearch()
		m.setQuery(m.input.Value())
		if m.query == "" {
			return nil
		}
		m.hasCur = false
		return m.findMatch(1, true)
	case key.Matches(k, m.keys.Cancel):
		m.endSearch()
		return nil
	}
	var cmd tea.Cmd
	m.input, cmd = m.input.Update(k)
	return cmd
}

func (m *Model) endSearch() {
	m.searching = false
	m.keys.Accept.SetEnabled(false)
	m.keys.Cancel.SetEnabled(false)
	m.input.Blur()
}

func (m *Model) setQuery(q string) {
	m.query = q
	m.fold = q == strings.ToLower(q)
	m.hasCur = false
	m.keys.ClearSearch.SetEnabled(q != "")
}

// SetQuery sets the search text (tests, the command line).
func (m *Model) SetQuery(q string) { m.setQuery(q) }

func (m *Model) needle() string {
	if m.fold {
		return strings.ToLower(m.query)
	}
	return m.query
}

// hay is the text of line i that search matches: what is shown, without
// colours, folded to lower case for a case-insensitive search.
func (m *Model) hay(i int) string {
	v := visible(m.win.lines[i].text)
	if m.fold {
		return strings.ToLower(v)
	}
	return v
}

// findMatch moves to the next match in direction dir: first in the
// window, then (when the window is not at that end) by scanning the store.
// Like vi's wrapscan, a search that runs off one end continues from the
// other once (wrap); so "/" right after opening, at the end of the
// output, finds matches above.
func (m *Model) findMatch(dir int, wrap bool) tea.Cmd {
	if m.query == "" {
		m.status = "no search; press / to search"
		return nil
	}
	start, off := m.top, -1
	if m.hasCur {
		start, off = m.cur.line, m.cur.off
	} else if dir < 0 {
		off = 1 << 30
	}
	limit := len(m.win.lines)
	if dir < 0 {
		limit = 0
	}
	if p, ok := m.searchWindow(start, off, dir, limit); ok {
		m.jumpTo(p)
		return m.prefetch()
	}
	if dir > 0 && !m.atEnd {
		return m.scanStore(m.win.next, 1, wrap)
	}
	if dir < 0 && !m.win.atStart && m.win.lo > 1 {
		return m.scanStore(m.win.lo-1, -1, wrap)
	}
	if wrap {
		return m.wrapSearch(dir, start, off)
	}
	m.status = "no match"
	return nil
}

// wrapSearch continues a search from the other end of the output.
func (m *Model) wrapSearch(dir, start, off int) tea.Cmd {
	if dir > 0 {
		m.status = "search hit the end, continued at the top"
		if !m.win.atStart {
			return m.scanStore(1, 1, false)
		}
		if p, ok := m.searchWindow(0, -1, 1, start+1); ok {
			m.jumpTo(p)
			return m.prefetch()
		}
	} else {
		m.status = "search hit the top, continued at the end"
		if !m.atEnd {
			return m.scanStore(m.lastSeq, -1, false)
		}
		if p, ok := m.searchWindow(len(m.win.lines)-1, 1<<30, -1, start); ok {
			m.jumpTo(p)
			return m.prefetch()
		}
	}
	m.status = "no match"
	return nil
}

// searchWindow looks for the query in the window from line start (after
// or before byte off) in direction dir, not past line limit (exclusive
// for dir > 0, inclusive bound for dir < 0).
func (m *Model) searchWindow(start, off, dir, limit int) (pos, bool) {
	q := m.needle()
	if dir > 0 {
		for i := max(start, 0); i < min(limit, len(m.win.lines)); i++ {
			if !m.shown(i) {
				continue
			}
			h := m.hay(i)
			from := 0
			if i == start && off >= 0 {
				from = min(off+1, len(h))
			}
			if j := strings.Index(h[from:], q); j >= 0 {
				return pos{i, from + j}, true
			}
		}
		return pos{}, false
	}
	for i := min(start, len(m.win.lines)-1); i >= max(limit, 0); i-- {
		if !m.shown(i) {
			continue
		}
		h := m.hay(i)
		to := len(h)
		if i == start && off >= 0 {
			to = min(off, len(h))
		}
		if j := strings.LastIndex(h[:to], q); j >= 0 {
			return pos{i, j}, true
		}
	}
	return pos{}, false
}

const searchingNote = "searching stored output…"

func (m *Model) scanStore(from uint64, dir int, wrap bool) tea.Cmd {
	if m.scanning {
		return nil
	}
	m.scanning = true
	if !strings.HasPrefix(m.status, "search hit") {
		m.status = searchingNote
	}
	gen, id, svc, needle, fold := m.gen, m.exec.ID, m.svc, []byte(m.needle()), m.fold
	ctx, cancel := context.WithTimeout(m.c.Ctx, scanTimeout)
	return func() tea.Msg {
		defer cancel()
		seq, ok, err := scan(ctx, svc, id, from, dir, needle, fold)
		return scanMsg{gen: gen, seq: seq, found: ok, dir: dir, wrap: wrap, err: err}
	}
}

func (m *Model) handleScan(msg scanMsg) tea.Cmd {
	if msg.gen != m.gen {
		return nil
	}
	m.scanning = false
	switch {
	case msg.err != nil:
		m.status = "search: " + common.ErrorText(msg.err)
	case !msg.found && msg.wrap:
		return m.wrapSearch(msg.dir, m.top, -1)
	case !msg.found:
		m.status = "no match"
	default:
		if m.status == searchingNote {
			m.status = ""
		}
		return m.loadAt(msg.seq, msg.dir)
	}
	return nil
}

func (m *Model) jumpTo(p pos) {
	m.cur, m.hasCur = p, true
	m.follow = false
	// Show the match a third of the way down, with context above it,
	// unless it is already comfortably on screen.
	if p.line <= m.top || p.line >= m.top+m.textRows()-1 || m.wrap {
		m.top, m.sub = p.line, 0
		m.scrollUp(m.textRows() / 3)
	}
}

func (m *Model) shown(i int) bool {
	l := &m.win.lines[i]
	switch m.streams {
	case StdoutOnly:
		return l.marker || l.stream != session.Stderr
	case StderrOnly:
		return l.marker || l.stream == session.Stderr
	}
	return true
}

// firstVisible returns the first shown line from i in direction dir, or
// len(lines) (dir > 0) / the first shown line (dir < 0) if none.
func (m *Model) firstVisible(i, dir int) int {
	n := len(m.win.lines)
	for i >= 0 && i < n {
		if m.shown(i) {
			return i
		}
		i += dir
	}
	if dir > 0 {
		return n
	}
	return m.firstVisible(0, 1)
}

// rows returns how many screen rows line i takes.
func (m *Model) rows(i int) int {
	l := &m.win.lines[i]
	tw := m.textWidth()
	if !m.wrap || int(l.width) <= tw {
		return 1
	}
	return len(wrapOffsets(l.text, tw))
}

func (m *Model) scrollDown(n int) {
	lines := len(m.win.lines)
	for ; n > 0; n-- {
		if m.top >= lines {
			break
		}
		if m.sub+1 < m.rows(m.top) {
			m.sub++
			continue
		}
		nx := m.firstVisible(m.top+1, 1)
		if nx >= lines {
			break
		}
		m.top, m.sub = nx, 0
	}
	// Never leave blank rows below the end.
	if m.rowsFromTop(m.textRows()) < m.textRows() {
		m.gotoBottom()
	}
}

func (m *Model) scrollUp(n int) {
	for ; n > 0; n-- {
		if m.sub > 0 {
			m.sub--
			continue
		}
		p := m.top - 1
		for p >= 0 && !m.shown(p) {
			p--
		}
		if p < 0 {
			break
		}
		m.top, m.sub = p, m.rows(p)-1
	}
}

// rowsFromTop counts the rows from the viewport's top to the end of the
// window, stopping at limit.
func (m *Model) rowsFromTop(limit int) int {
	n := 0
	for i := m.top; i < len(m.win.lines) && n < limit; i++ {
		if !m.shown(i) {
			continue
		}
		r := m.rows(i)
		if i == m.top {
			r -= m.sub
		}
		n += r
	}
	return n
}

func (m *Model) gotoBottom() {
	need := m.textRows()
	i := len(m.win.lines) - 1
	for ; i >= 0; i-- {
		if !m.shown(i) {
			continue
		}
		r := m.rows(i)
		if r >= need {
			m.top, m.sub = i, r-need
			return
		}
		need -= r
	}
	m.top, m.sub = m.firstVisible(0, 1), 0
}

func (m *Model) atBottom() bool {
	return m.rowsFromTop(m.textRows()+1) <= m.textRows()
}

func (m *Model) maybeResumeFollow() {
	if m.atEnd && m.atBottom() {
		m.follow = true
		m.newLines = 0
	}
}

// overflow returns how many lines the window holds beyond its bounds.
func (m *Model) overflow() int {
	n := len(m.win.lines) - maxLines
	if m.win.bytes > maxBytes {
		n = max(n, len(m.win.lines)/4)
	}
	return n
}

// trim keeps the window bounded, dropping output on the side away from
// the viewport (never the rows on screen and a few screens around them).
func (m *Model) trim() {
	ex := m.overflow()
	if ex <= 0 {
		return
	}
	keep := 3 * m.textRows()
	if n := min(ex, m.top-keep); n > 0 {
		d := m.win.trimFront(n)
		m.top -= d
		if m.hasCur {
			m.cur.line -= d
			if m.cur.line < 0 {
				m.hasCur = false
			}
		}
		ex -= d
	}
	if ex <= 0 {
		return
	}
	if n := min(ex, len(m.win.lines)-(m.top+m.textRows()+keep)); n > 0 {
		if m.win.trimBack(n) > 0 {
			m.atEnd = false
		}
	}
}

func (m *Model) handlePage(msg pageMsg) tea.Cmd {
	if msg.gen != m.gen {
		return nil
	}
	switch msg.kind {
	case kindBefore:
		m.loadingBefore = false
	case kindAfter:
		m.loadingAfter = false
	default:
		m.loading = false
	}
	if msg.err != nil {
		m.err = common.ErrorText(msg.err)
		return nil
	}
	m.err = ""
	p := msg.page
	var cmds []tea.Cmd
	switch msg.kind {
	case kindTail, kindAt:
		m.win.reset(msg.from)
		if p.Gap > 0 && len(p.Chunks) > 0 {
			m.win.addMarker("… "+session.FormatBytes(p.Gap)+" of earlier output trimmed by retention", p.Chunks[0].Seq)
		}
		for i := range p.Chunks {
			m.win.appendChunk(&p.Chunks[i])
		}
		m.learn(len(p.Chunks), len(m.win.lines))
		m.win.atStart = msg.from <= 1
		if len(p.Chunks) == 0 && msg.from <= 1 {
			m.win.reset(1)
		}
		m.lastSeq = max(m.lastSeq, msg.last, m.win.next-1)
		m.atEnd = len(p.Chunks) < msg.limit || m.win.next > m.lastSeq
		m.hasCur = false
		if msg.kind == kindTail {
			m.follow = true
			m.newLines = 0
			m.gotoBottom()
			cmds = append(cmds, m.attach())
		} else {
			m.follow = false
			i := 0
			for i < len(m.win.lines) && m.win.lines[i].endSeq < msg.target {
				i++
			}
			m.top, m.sub = m.firstVisible(min(i, max(0, len(m.win.lines)-1)), 1), 0
			switch {
			case msg.search > 0:
				m.cur, m.hasCur = pos{m.top, -1}, true
				cmds = append(cmds, m.findMatch(1, false))
			case msg.search < 0:
				end := m.top
				for end+1 < len(m.win.lines) && m.win.lines[end+1].seq <= msg.target {
					end++
				}
				m.cur, m.hasCur = pos{end, 1 << 30}, true
				cmds = append(cmds, m.findMatch(-1, false))
			}
		}
	case kindBefore:
		var chunks []session.Chunk
		for _, c := range p.Chunks {
			if c.Seq < m.win.lo {
				chunks = append(chunks, c)
			}
		}
		n := m.win.prepend(chunks, msg.from <= 1, p.Gap)
		m.learn(len(chunks), n)
		m.top += n
		if m.hasCur {
			m.cur.line += n
		}
		m.trim()
	case kindAfter:
		added := 0
		for i := range p.Chunks {
			if c := &p.Chunks[i]; c.Seq >= m.win.next {
				added += m.win.appendChunk(c)
			}
		}
		m.learn(len(p.Chunks), added)
		if len(p.Chunks) < msg.limit {
			m.atEnd = true
		}
		m.lastSeq = max(m.lastSeq, m.win.next-1)
		if m.follow {
			m.trim()
			m.gotoBottom()
		} else {
			m.trim()
		}
	}
	cmds = append(cmds, m.prefetch())
	return tea.Batch(cmds...)
}

func (m *Model) handleChunks(msg chunksMsg) tea.Cmd {
	if msg.gen != m.gen {
		return nil
	}
	added, appended, gap := 0, 0, false
	for i := range msg.chunks {
		c := &msg.chunks[i]
		if c.Stream == session.Notice {
			// berth's word, not output: the executions' HELD column and
			// the header say it; it has no place among the lines.
			continue
		}
		if c.Seq > m.lastSeq && !m.exec.State.Done() {
			// The record's byte counts lag (it is refreshed on state
			// changes); count live output as it arrives.
			if c.Stream == session.Stderr {
				m.exec.StderrBytes += int64(len(c.Data))
			} else {
				m.exec.StdoutBytes += int64(len(c.Data))
			}
		}
		m.lastSeq = max(m.lastSeq, c.Seq)
		switch {
		case m.atEnd && (m.win.empty() || c.Seq == m.win.next):
			n := m.win.appendChunk(c)
			added += n
			appended++
			if !m.follow {
				m.newLines += n
			}
		case c.Seq >= m.win.next:
			// Not contiguous with the window (it was trimmed, or a page
			// is on its way): the store has it, count it for the badge.
			m.atEnd = false
			gap = true
			if !m.follow {
				m.newLines += bytes.Count(c.Data, []byte{'\n'})
			}
		}
	}
	m.learn(appended, added)
	m.trim()
	if m.follow {
		m.gotoBottom()
	}
	var cmds []tea.Cmd
	if gap && m.follow {
		cmds = append(cmds, m.loadAfter())
	}
	if msg.closed {
		m.live = false
		cmds = append(cmds, m.refreshExec())
	} else {
		ch := m.stream()
		if ch != nil {
			cmds = append(cmds, pump(m.gen, ch))
		}
	}
	return tea.Batch(cmds...)
}

// stream returns the live stream to re-arm the pump on.
func (m *Model) stream() <-chan session.Chunk {
	if m.owned != nil {
		return m.owned.Output()
	}
	return m.follower
}

// Restyle re-applies the shared styles to the search prompt.
func (m *Model) Restyle() { m.input.SetStyles(m.c.Styles.Input) }

// Loading reports whether the first page is still on its way.
func (m *Model) Loading() bool { return m.loading }

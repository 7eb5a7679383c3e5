// Package files is the Workspace tab: a browser of a session's /workspace
// (directories first, sizes, modification times) with a preview pane for
// text files. It goes through the session's agent, so it checks the
// session's state first and bounds every call with a timeout: a paused or
// stopped session gets an explanation, never a hang.
package files

import (
	"bytes"
	"io"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/ui/common"
)

const (
	previewBytes    = 64 << 10
	previewDebounce = 120 * time.Millisecond
	minSplitWidth   = 80
)

// KeyMap are the Workspace tab's keys.
type KeyMap struct {
	common.NavKeys
	Open    key.Binding
	Parent  key.Binding
	Refresh key.Binding
}

// DefaultKeyMap returns the bindings.
func DefaultKeyMap() KeyMap {
	return KeyMap{
		NavKeys: common.NewNavKeys(),
		Open:    key.NewBinding(key.WithKeys("enter", "l", "right"), key.WithHelp("enter", "open dir")),
		Parent:  key.NewBinding(key.WithKeys("backspace", "h", "left"), key.WithHelp("backspace", "up a dir")),
		Refresh: key.NewBinding(key.WithKeys("r"), key.WithHelp("r", "reload")),
	}
}

type listedMsg struct {
	gen     int
	dir     string
	sel     string // entry to put the cursor on
	entries []session.FileInfo
	err     error
}

type previewTickMsg struct{ id int }

type previewMsg struct {
	id     int
	path   string
	data   []byte
	binary bool
	err    error
}

type preview struct {
	path    string
	lines   []string
	binary  bool
	size    int64
	err     string
	loading bool
}

// Model is the Workspace tab.
type Model struct {
	c    *common.Common
	svc  session.Files // lists and reads /workspace
	keys KeyMap
	w, h int

	sess    session.Session
	dir     string // relative to /workspace; "" is the root
	entries []session.FileInfo
	cursor  int
	offset  int
	gen     int
	loaded  bool // entries are for (sess.Name, dir)
	loading bool
	err     string

	pv        preview
	previewID int
}

var _ common.Component = (*Model)(nil)

// New returns an empty browser of the workspaces svc serves.
func New(c *common.Common, svc session.Files) *Model {
	return &Model{c: c, svc: svc, keys: DefaultKeyMap()}
}

// Keys returns the key map.
func (m *Model) Keys() KeyMap { return m.keys }

// SetSize implements common.Component.
func (m *Model) SetSize(w, h int) {
	m.w, m.h = w, h
	m.offset = common.ScrollTo(m.cursor, m.offset, m.page(), len(m.entries))
}

// ShortHelp implements help.KeyMap.
func (m *Model) ShortHelp() []key.Binding { return []key.Binding{m.keys.Open, m.keys.Parent} }

// FullHelp implements help.KeyMap.
func (m *Model) FullHelp() [][]key.Binding {
	return [][]key.Binding{m.keys.NavKeys.List(), {m.keys.Open, m.keys.Parent, m.keys.Refresh}}
}

// Dir returns the shown directory, relative to /workspace.
func (m *Model) Dir() string { return m.dir }

// Entries returns the listed entries.
func (m *Model) Entries() []session.FileInfo { return m.entries }

// SetSession follows a session's record. A new session starts at the
// root; a session that becomes browsable is listed if the tab is shown.
func (m *Model) SetSession(s session.Session, shown bool) tea.Cmd {
	if s.Name != m.sess.Name {
		m.dir = ""
		m.entries, m.cursor, m.offset, m.loaded, m.err = nil, 0, 0, false, ""
		m.pv = preview{}
	}
	was := m.sess.State
	m.sess = s
	if s.State != session.StateRunning {
		m.loaded = false
		return nil
	}
	// List when the session becomes browsable while the tab is shown;
	// not on every event (a failed listing is retried with r, not by the
	// next stats refresh).
	if shown && was != session.StateRunning && !m.loading {
		return m.list()
	}
	return nil
}

// Show is called when the tab is shown: it lists the directory if that
// has not been done for the current state.
func (m *Model) Show() tea.Cmd {
	if m.sess.State == session.StateRunning && !m.loaded && !m.loading {
		return m.list()
	}
	return nil
}

func browsable(st session.State) bool { return st == session.StateRunning }

// list reads the current directory.
func (m *Model) list() tea.Cmd { return m.listSelect("") }

// listSelect reads the current directory and puts the cursor on sel
// (going up lands on the directory just left).
func (m *Model) listSelect(sel string) tea.Cmd {
	m.gen++
	m.loading = true
	m.err = ""
	gen, name, dir, svc := m.gen, m.sess.Name, m.dir, m.svc
	ctx, cancel := m.c.Call()
	return func() tea.Msg {
		defer cancel()
		es, err := svc.ListDir(ctx, name, dir)
		return listedMsg{gen: gen, dir: dir, sel: sel, entries: es, err: err}
	}
}

func (m *Model) page() int { return max(1, m.h-1) }

// Update implements common.Component.
func (m *Model) Update(msg tea.Msg) tea.Cmd {
	switch msg := msg.(type) {
	case listedMsg:
		if msg.gen != m.gen {
			return nil
		}
		m.loading = false
		if msg.err != nil {
			m.err = callError("listing /workspace/"+msg.dir, msg.err, m.c.CallTimeout)
			return nil
		}
		m.loaded = true
		slices.SortFunc(msg.entries, func(a, b session.FileInfo) int {
			if a.IsDir() != b.IsDir() {
				if a.IsDir() {
					return -1
				}
				return 1
			}
			return strings.Compare(a.Name, b.Name)
		})
		m.entries = msg.entries
		if i := slices.IndexFunc(m.entries, func(e session.FileInfo) bool { return e.Name == msg.sel }); i >= 0 {
			m.cursor = i
		}
		m.cursor = common.Clamp(m.cursor, 0, len(m.entries)-1)
		m.offset = common.ScrollTo(m.cursor, 0, m.page(), len(m.entries))
		return m.schedulePreview()
	case previewTickMsg:
		if msg.id == m.previewID {
			return m.loadPreview()
		}
	case previewMsg:
		if msg.id != m.previewID {
			return nil
		}
		m.pv.loading = false
		if msg.err != nil {
			m.pv.err = callError("reading "+msg.path, msg.err, m.c.CallTimeout)
			return nil
		}
		m.pv.binary = msg.binary
		if !msg.binary {
			m.pv.lines = previewLines(msg.data, max(1, m.h-2))
		}
	case tea.KeyPressMsg:
		if !browsable(m.sess.State) {
			if key.Matches(msg, m.keys.Refresh) && m.sess.State == session.StateSleeping {
				// Browsing wakes a sleeping session; r asks for it explicitly.
				return m.list()
			}
			return nil
		}
		if c, ok := m.keys.Move(msg, m.cursor, m.page(), len(m.entries)); ok {
			if c != m.cursor {
				m.cursor = c
				m.offset = common.ScrollTo(m.cursor, m.offset, m.page(), len(m.entries))
				return m.schedulePreview()
			}
			return nil
		}
		switch {
		case key.Matches(msg, m.keys.Open):
			if m.cursor < len(m.entries) && m.entries[m.cursor].IsDir() {
				m.dir = path.Join(m.dir, m.entries[m.cursor].Name)
				m.cursor, m.offset = 0, 0
				m.entries = nil
				m.pv = preview{}
				return m.list()
			}
		case key.Matches(msg, m.keys.Parent):
			if m.dir != "" {
				child := path.Base(m.dir)
				m.dir = path.Dir(m.dir)
				if m.dir == "." {
					m.dir = ""
				}
				m.entries = nil
				m.pv = preview{}
				m.cursor = 0
				return m.listSelect(child)
			}
		case key.Matches(msg, m.keys.Refresh):
			return m.list()
		}
	case tea.MouseClickMsg:
		if msg.Button == tea.MouseLeft && msg.Y > 0 && msg.X < m.listWidth() {
			if i := m.offset + msg.Y - 1; i < len(m.entries) {
				m.cursor = i
				return m.schedulePreview()
			}
		}
	case tea.MouseWheelMsg:
		d := 3
		if msg.Button == tea.MouseWheelUp {
			d = -3
		}
		m.cursor = common.Clamp(m.cursor+d, 0, len(m.entries)-1)
		m.offset = common.ScrollTo(m.cursor, m.offset, m.page(), len(m.entries))
		return m.schedulePreview()
	}
	return nil
}

// schedulePreview debounces previews, so holding j does not read every
// file passed over.
func (m *Model) schedulePreview() tea.Cmd {
	m.previewID++
	m.pv = preview{}
	if m.w < minSplitWidth || m.cursor >= len(m.entries) || m.entries[m.cursor].IsDir() {
		return nil
	}
	e := m.entries[m.cursor]
	m.pv = preview{path: path.Join(m.dir, e.Name), size: e.Size, loading: true}
	id := m.previewID
	return tea.Tick(previewDebounce, func(time.Time) tea.Msg { return previewTickMsg{id: id} })
}

func (m *Model) loadPreview() tea.Cmd {
	id, name, p, svc := m.previewID, m.sess.Name, m.pv.path, m.svc
	ctx, cancel := m.c.Call()
	return func() tea.Msg {
		defer cancel()
		rc, err := svc.ReadFile(ctx, name, p)
		if err != nil {
			return previewMsg{id: id, path: p, err: err}
		}
		defer rc.Close()
		data, err := io.ReadAll(io.LimitReader(rc, previewBytes))
		if err != nil {
			return previewMsg{id: id, path: p, err: err}
		}
		return previewMsg{id: id, path: p, data: data, binary: isBinary(data)}
	}
}

// isBinary reports whether data looks like a binary file: a NUL byte, or
// invalid UTF-8, in its first 8 KiB (a cut multi-byte rune at the end of
// the sample is allowed).
func isBinary(data []byte) bool {
	s := data[:min(len(data), 8<<10)]
	if bytes.IndexByte(s, 0) >= 0 {
		return true
	}
	for i := 0; i < 4 && len(s) > 0 && !utf8.Valid(s); i++ {
		s = s[:len(s)-1]
	}
	return !utf8.Valid(s)
}

func previewLines(data []byte, n int) []string {
	var out []string
	for len(out) < n && len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		var l []byte
		if i < 0 {
			l, data = data, nil
		} else {
			l, data = data[:i], data[i+1:]
		}
		out = append(out, common.SanitizeLine(string(l)))
	}
	return out
}

// callError explains a failed agent call; a timeout says what it means.
func callError(what string, err error, d time.Duration) string {
	if d <= 0 {
		d = common.DefaultCallTimeout
	}
	if strings.Contains(err.Error(), "deadline exceeded") {
		return what + ": no answer within " + d.String() + " (VM busy or unreachable); r retries"
	}
	return what + ": " + common.ErrorText(err)
}

func (m *Model) listWidth() int {
	if m.w >= minSplitWidth {
		return m.w / 2
	}
	return m.w
}

// unavailable explains why a session in state st cannot be browsed.
func (m *Model) unavailable() string {
	s := m.sess
	ro := m.c.ReadOnly
	hint := func(h string) string {
		if ro {
			return ""
		}
		return " " + h
	}
	switch s.State {
	case session.StatePaused:
		return "Session " + s.Name + " is paused: its vCPUs are stopped, so its agent cannot read /workspace." + hint("Resume it (p) to browse.")
	case session.StateStopped:
		return "Session " + s.Name + " is stopped: no VM is running to read /workspace. Its files are kept." + hint("Start it (s) to browse.")
	case session.StateCrashed:
		cause := ""
		if s.Cause != "" {
			cause = " (" + common.SanitizeLine(s.Cause) + ")"
		}
		return "Session " + s.Name + " crashed" + cause + ". Its files are kept." + hint("Start it (s) to browse.")
	case session.StateSleeping:
		return "Session " + s.Name + " is sleeping; browsing wakes it." + hint("Press r to wake it and browse.")
	}
	return "Session " + s.Name + " is " + string(s.State) + "; browsing is possible once it is running."
}

// View implements common.Component.
func (m *Model) View() string {
	st := m.c.Styles
	title := st.Bold.Render("/workspace/" + common.SanitizeLine(m.dir))
	if !browsable(m.sess.State) && !(m.sess.State == session.StateSleeping && (m.loaded || m.loading)) {
		body := st.DialogWarn.Width(max(20, m.w-4)).Render(m.unavailable())
		return common.Block(title+"\n\n"+indent(body, "  "), m.w, m.h)
	}
	lw := m.listWidth()
	var list []string
	count := ""
	if m.loaded {
		count = st.Muted.Render("  " + plural(len(m.entries), "entry", "entries"))
	}
	list = append(list, title+count)
	switch {
	case m.err != "":
		list = append(list, "", st.FlashErr.Width(max(10, lw-4)).Render(m.err))
	case m.loading && len(m.entries) == 0:
		list = append(list, st.Muted.Render("  loading…"))
	case m.loaded && len(m.entries) == 0:
		list = append(list, st.Muted.Render("  (empty directory)"))
	}
	loc := m.c.Now().Location()
	const wSize, wTime = 6, 12
	nameW := max(8, lw-wSize-wTime-7)
	for i := m.offset; i < len(m.entries) && i < m.offset+m.page(); i++ {
		e := m.entries[i]
		sel := i == m.cursor
		name := common.SanitizeLine(e.Name)
		size := session.FormatBytesShort(e.Size)
		switch {
		case e.IsDir():
			name += "/"
			size = ""
		case e.Link != "":
			name += " → " + common.SanitizeLine(e.Link)
		}
		mt := ""
		if !e.ModTime.IsZero() {
			mt = e.ModTime.In(loc).Format("Jan _2 15:04")
		}
		nameCell := common.Fit(name, nameW)
		if e.IsDir() && !sel {
			nameCell = st.Accent.Render(nameCell)
		}
		mark := "  "
		if sel {
			mark = "▸ "
		}
		row := common.Fit(mark+nameCell+"  "+common.FitLeft(size, wSize)+"  "+st.Muted.Render(common.Fit(mt, wTime)), lw)
		if sel {
			row = st.Selected.Render(common.Fit(mark+common.Fit(name, nameW)+"  "+common.FitLeft(size, wSize)+"  "+common.Fit(mt, wTime), lw))
		}
		list = append(list, row)
	}
	left := common.Block(strings.Join(list, "\n"), lw, m.h)
	if lw == m.w {
		return left
	}
	right := common.Block(m.previewView(m.w-lw-2), m.w-lw-2, m.h)
	return joinColumns(left, st.Subtle.Render("│ "), right, m.h)
}

func (m *Model) previewView(w int) string {
	st := m.c.Styles
	pv := &m.pv
	if pv.path == "" {
		return st.Muted.Render("no file selected")
	}
	head := st.Bold.Render(common.SanitizeLine(path.Base(pv.path))) + st.Muted.Render("  "+session.FormatBytes(pv.size))
	switch {
	case pv.err != "":
		return head + "\n\n" + st.FlashErr.Width(w).Render(pv.err)
	case pv.loading:
		return head + "\n\n" + st.Muted.Render("loading preview…")
	case pv.binary:
		return head + "\n\n" + st.Muted.Render("binary file: no preview")
	}
	lines := []string{head}
	for _, l := range pv.lines {
		lines = append(lines, common.Fit(l, w))
	}
	return strings.Join(lines, "\n")
}

func joinColumns(left, sep, right string, h int) string {
	ls := strings.Split(left, "\n")
	rs := strings.Split(right, "\n")
	out := make([]string, h)
	for i := range h {
		var l, r string
		if i < len(ls) {
			l = ls[i]
		}
		if i < len(rs) {
			r = rs[i]
		}
		out[i] = l + sep + r
	}
	return strings.Join(out, "\n")
}

func indent(s, p string) string {
	return p + strings.ReplaceAll(s, "\n", "\n"+p)
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}

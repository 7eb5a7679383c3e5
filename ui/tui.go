// Package ui is berth's terminal UI: a Bubble Tea program in which
// operators watch and steer every session. The root model here does the
// layout, routes keys and events, and runs session actions; the views are
// components in ui/components. The same root model serves the local TUI
// (Run) and, one program per connection, SSH clients (New).
package ui

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"time"

	"charm.land/bubbles/v2/help"
	"charm.land/bubbles/v2/key"
	"charm.land/bubbles/v2/spinner"
	"charm.land/bubbles/v2/textinput"
	"charm.land/bubbles/v2/viewport"
	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/colorprofile"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/ui/common"
	"github.com/berthvm/berth/ui/components/dialog"
	"github.com/berthvm/berth/ui/components/execs"
	"github.com/berthvm/berth/ui/components/files"
	"github.com/berthvm/berth/ui/components/hosts"
	"github.com/berthvm/berth/ui/components/info"
	"github.com/berthvm/berth/ui/components/output"
	"github.com/berthvm/berth/ui/components/runs"
	"github.com/berthvm/berth/ui/components/sessions"
	"github.com/berthvm/berth/ui/components/sparks"
)

// Options configure a UI program.
type Options struct {
	// ReadOnly hides and refuses every action that changes a session
	// (the SSH viewer role).
	ReadOnly bool
	// Who is shown in the footer: the operator ("alice@host", "ssh:key").
	Who string
	// DaemonStatus, when set, is polled (off the UI goroutine) every few
	// seconds and shown in the footer.
	DaemonStatus func() string
	// Logger receives action failures and stream reconnects; nil discards.
	Logger *slog.Logger
	// Permit, when set, says whether the operator may do a kind of action
	// now (over SSH: the key's current role). An action that asks for
	// confirmation asks Permit first, so a refusal comes before the
	// question, not after the answer; the service still enforces its own.
	Permit func(ctx context.Context, a session.Action) error
	// Context bounds the program's background work: the event stream,
	// output followers and pending calls end when it is done. Nil means
	// they end when the operator quits; a server that ends programs from
	// outside (an SSH disconnect) must set it. Run sets it.
	Context context.Context
}

type page int

const (
	pageSessions page = iota
	pageDetail
	// pageHosts lists the hosts of the daemon's fleet; it is reached
	// from the sessions page, and only where the service lists hosts.
	pageHosts
)

type tab int

const (
	tabExecs tab = iota
	tabOutput
	tabFiles
	tabInfo
	numTabs
	// tabRuns follows the others once the session has agent runs.
	tabRuns = numTabs
)

func (t tab) String() string {
	switch t {
	case tabOutput:
		return "Output"
	case tabFiles:
		return "Workspace"
	case tabInfo:
		return "Info"
	case tabRuns:
		return "Runs"
	}
	return "Executions"
}

// tabCount is the number of tabs the session view shows now.
func (m *Model) tabCount() tab {
	if m.runs.Has() {
		return numTabs + 1
	}
	return numTabs
}

const (
	// opTimeout bounds lifecycle calls; a cold boot under TCG takes ~6 s,
	// a clean stop flushes first, so this is generous.
	opTimeout      = 2 * time.Minute
	flashFor       = 6 * time.Second
	flashErrFor    = 12 * time.Second
	daemonEvery    = 5 * time.Second
	clockEvery     = time.Second
	maxRetry       = 10 * time.Second
	firstRetry     = 500 * time.Millisecond
	minW, minH     = 40, 10
	eventLinger    = 16 * time.Millisecond
	maxEventsBatch = 16384
)

type flash struct {
	kind common.FlashKind
	text string
	id   int
}

// Model is the root model.
type Model struct {
	c      *common.Common
	cancel context.CancelFunc
	opts   Options

	keys    KeyMap
	actions []action // actionTable, with read-only mode applied
	cmdKeys CmdKeys

	width, height int
	isDark        bool
	profile       colorprofile.Profile

	page   page
	tab    tab
	detail string

	sessions *sessions.Model
	execs    *execs.Model
	runs     *runs.Model
	output   *output.Model
	files    *files.Model
	info     *info.Model
	sparks   *sparks.Model // the session view's strip of graphs
	hosts    *hosts.Model  // nil: the service lists no hosts

	dialog    dialog.Dialog
	cmdActive bool
	cmdline   textinput.Model
	showHelp  bool
	help      help.Model
	helpKeys  HelpKeys
	helpVP    viewport.Model // the help's scrolling list

	flash    flash
	flashSeq int
	pending  map[int]string
	opSeq    int
	// vetting is the pending entry of the checks before a confirmation
	// (0: none); typeahead holds the keys typed meanwhile.
	vetting   int
	typeahead []tea.KeyPressMsg
	spinner   spinner.Model
	spinning  bool

	watchGen      int
	watchCancel   context.CancelFunc
	watchCh       <-chan session.Event
	connected     bool
	everConnected bool
	watchErr      string
	retry         time.Duration

	daemon string
	host   session.HostStatus // the data directory's space, when known

	footer, footerKey string // the rendered footer and what it was rendered for
	forwards          *tuiForwards
}

var _ tea.Model = (*Model)(nil)

// New returns the root model for one program. It holds no process-wide
// state: every SSH connection gets its own.
func New(svc session.Service, opts Options) tea.Model { return newModel(svc, opts) }

func newModel(svc session.Service, opts Options) *Model {
	parent := opts.Context
	if parent == nil {
		parent = context.Background()
	}
	ctx, cancel := context.WithCancel(parent)
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	c := &common.Common{
		Ctx:      ctx,
		Svc:      svc,
		Styles:   common.NewStyles(true, colorprofile.TrueColor),
		Logger:   logger.With("component", "ui"),
		Now:      time.Now,
		ReadOnly: opts.ReadOnly,
	}
	m := &Model{
		c: c, cancel: cancel, opts: opts,
		keys: DefaultKeyMap(), actions: newActions(opts.ReadOnly), cmdKeys: DefaultCmdKeys(),
		isDark: true, profile: colorprofile.TrueColor,
		sessions: sessions.New(c),
		execs:    execs.New(c, svc),
		runs:     runs.New(c, svc),
		output:   output.New(c, svc),
		files:    files.New(c, svc),
		info:     info.New(c, svc),
		sparks:   sparks.New(c, svc),
		help:     help.New(),
		helpKeys: DefaultHelpKeys(),
		pending:  map[int]string{},
		forwards: &tuiForwards{},
		spinner:  spinner.New(spinner.WithSpinner(spinner.MiniDot)),
	}
	if l, ok := svc.(session.HostLister); ok {
		m.hosts = hosts.New(c, l)
	}
	m.keys.Hosts.SetEnabled(m.hosts != nil)
	m.helpVP = newHelpViewport(m.helpKeys)
	m.info.SetForwards(m.forwards.list)
	m.cmdline = textinput.New()
	m.cmdline.Prompt = ":"
	m.cmdline.Placeholder = "create NAME · exec NAME CMD · flush NAME · open NAME · sort COLUMN · q"
	m.cmdline.ShowSuggestions = true
	m.cmdline.SetSuggestions(commandSuggestions(m.actions))
	m.restyle()
	return m
}

// Run runs the TUI on the local terminal (alternate screen, mouse) until
// the operator quits or ctx ends.
func Run(ctx context.Context, svc session.Service, opts Options, progOpts ...tea.ProgramOption) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	opts.Context = ctx
	m := newModel(svc, opts)
	p := tea.NewProgram(m, append([]tea.ProgramOption{tea.WithContext(ctx)}, progOpts...)...)
	_, err := p.Run()
	if errors.Is(err, tea.ErrProgramKilled) && ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// Init implements tea.Model.
func (m *Model) Init() tea.Cmd {
	return tea.Batch(tea.RequestBackgroundColor, m.connect(), m.pollDaemon(), m.clock())
}

func (m *Model) restyle() {
	*m.c.Styles = *common.NewStyles(m.isDark, m.profile)
	st := m.c.Styles
	m.help.Styles = st.Help
	m.footerKey = ""
	m.cmdline.SetStyles(st.Input)
	m.sessions.Restyle()
	m.output.Restyle()
}

func (m *Model) active() common.Component {
	switch m.page {
	case pageSessions:
		return m.sessions
	case pageHosts:
		return m.hosts
	}
	switch m.tab {
	case tabOutput:
		return m.output
	case tabFiles:
		return m.files
	case tabInfo:
		return m.info
	case tabRuns:
		return m.runs
	}
	return m.execs
}

// Layout: header (1) [graphs (1) tabs (1)] body status (1) footer (1).
func (m *Model) bodyTop() int {
	if m.page == pageDetail {
		return 3
	}
	return 1
}

func (m *Model) bodyHeight() int { return max(1, m.height-m.bodyTop()-2) }

func (m *Model) setSize(w, h int) {
	m.width, m.height = w, h
	m.help.SetWidth(w)
	m.cmdline.SetWidth(max(10, w-4))
	// Sessions has one row less than detail tabs need; each gets its own.
	m.sessions.SetSize(w, max(1, h-3))
	if m.hosts != nil {
		m.hosts.SetSize(w, max(1, h-3))
	}
	dh := max(1, h-5)
	m.sparks.SetWidth(w)
	m.execs.SetSize(w, dh)
	m.runs.SetSize(w, dh)
	m.output.SetSize(w, dh)
	m.files.SetSize(w, dh)
	m.info.SetSize(w, dh)
	if m.dialog != nil {
		m.dialog.SetSize(w, h)
	}
	if m.showHelp {
		m.layoutHelp(m.bodyHeight())
	}
}

func (m *Model) quit() tea.Cmd {
	m.cancel()
	return tea.Quit
}

// Update implements tea.Model.
func (m *Model) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	defer m.hideHosts()
	switch msg := msg.(type) {
	case tea.WindowSizeMsg:
		m.setSize(msg.Width, msg.Height)
		return m, nil
	case tea.BackgroundColorMsg:
		m.isDark = msg.IsDark()
		m.restyle()
		return m, nil
	case tea.ColorProfileMsg:
		m.profile = msg.Profile
		m.restyle()
		return m, nil
	case tea.KeyPressMsg:
		return m, m.handleKey(msg)
	case tea.PasteMsg:
		switch {
		case m.dialog != nil:
			return m, m.dialog.Update(msg)
		case m.cmdActive:
			var cmd tea.Cmd
			m.cmdline, cmd = m.cmdline.Update(msg)
			return m, cmd
		}
		return m, m.active().Update(msg)
	case tea.MouseClickMsg, tea.MouseWheelMsg:
		return m, m.handleMouse(msg.(tea.MouseMsg))
	case watchStartedMsg:
		return m, m.handleWatchStarted(msg)
	case eventsMsg:
		return m, m.handleEvents(msg)
	case reconnectMsg:
		if msg.gen == m.watchGen {
			return m, m.connect()
		}
		return m, nil
	case common.OpenSessionMsg:
		return m, m.openDetail(msg.Name)
	case common.OpenOutputMsg:
		return m, m.openOutput(msg)
	case common.UndoRunMsg:
		return m, m.undoRequest(msg)
	case common.FlashMsg:
		return m, m.setFlash(msg.Kind, msg.Text)
	case opDoneMsg:
		return m, m.handleOpDone(msg)
	case vettedMsg:
		return m, m.handleVetted(msg)
	case flashExpireMsg:
		if msg.id == m.flash.id {
			m.flash = flash{}
		}
		return m, nil
	case spinner.TickMsg:
		if len(m.pending) == 0 {
			m.spinning = false
			return m, nil
		}
		var cmd tea.Cmd
		m.spinner, cmd = m.spinner.Update(msg)
		return m, cmd
	case daemonMsg:
		m.daemon = msg.text
		return m, tea.Tick(daemonEvery, func(time.Time) tea.Msg { return daemonTickMsg{} })
	case daemonTickMsg:
		return m, m.pollDaemon()
	case clockMsg:
		return m, m.clock()
	case createdMsg:
		return m, m.sessions.Created(msg.s)
	}
	// Component-internal messages (pages, listings, timelines) carry
	// their own generation and are ignored by the others.
	var cmds []tea.Cmd
	for _, c := range []common.Component{m.sessions, m.execs, m.output, m.files, m.info, m.runs} {
		cmds = append(cmds, c.Update(msg))
	}
	if m.hosts != nil {
		cmds = append(cmds, m.hosts.Update(msg))
	}
	cmds = append(cmds, m.sparks.Update(msg))
	if m.dialog != nil {
		cmds = append(cmds, m.dialog.Update(msg))
	}
	return m, tea.Batch(cmds...)
}

// hideHosts stops the hosts page's poll once the page is not shown.
// Update runs it after every message, rather than each way out of the
// page (esc, :open, :filter, an execution opened) stopping it, so a new
// way out cannot leave a poll running.
func (m *Model) hideHosts() {
	if m.page != pageHosts && m.hosts != nil {
		m.hosts.Hide()
	}
}

type clockMsg struct{}

// clock re-renders once a second so uptimes, ages and running durations
// move; the renderer sends only the cells that changed.
func (m *Model) clock() tea.Cmd {
	return tea.Tick(clockEvery, func(time.Time) tea.Msg { return clockMsg{} })
}

type daemonMsg struct{ text string }
type daemonTickMsg struct{}

func (m *Model) pollDaemon() tea.Cmd {
	f := m.opts.DaemonStatus
	if f == nil {
		return nil
	}
	return func() tea.Msg { return daemonMsg{text: common.SanitizeLine(f())} }
}

type flashExpireMsg struct{ id int }

func (m *Model) setFlash(kind common.FlashKind, text string) tea.Cmd {
	m.flashSeq++
	m.flash = flash{kind: kind, text: text, id: m.flashSeq}
	d := flashFor
	if kind == common.FlashError {
		d = flashErrFor
	}
	id := m.flashSeq
	return tea.Tick(d, func(time.Time) tea.Msg { return flashExpireMsg{id: id} })
}

// Flash returns the status line's message (tests).
func (m *Model) Flash() (common.FlashKind, string) { return m.flash.kind, m.flash.text }

// Pending returns the labels of actions in flight (tests).
func (m *Model) Pending() []string {
	var out []string
	for _, l := range m.pending {
		out = append(out, l)
	}
	return out
}

func (m *Model) handleKey(k tea.KeyPressMsg) tea.Cmd {
	if k.String() == "ctrl+c" {
		return m.quit()
	}
	if m.dialog != nil {
		cmd := m.dialog.Update(k)
		if m.dialog.Done() {
			m.dialog = nil
		}
		return cmd
	}
	if m.vetting != 0 {
		return m.holdKey(k)
	}
	if m.cmdActive {
		return m.updateCmdline(k)
	}
	if m.showHelp {
		return m.updateHelp(k)
	}
	comp := m.active()
	if c, ok := comp.(common.Capturer); ok && c.Capturing() {
		return comp.Update(k)
	}
	// The focused component's keys win over actions, and actions over
	// global keys (e.g. "s" toggles streams in Output, stops elsewhere).
	if matchesAny(k, comp.FullHelp()) {
		return comp.Update(k)
	}
	for _, a := range m.keyActions() {
		if key.Matches(k, a.key) {
			return m.invoke(a, call{})
		}
	}
	return m.handleGlobal(k)
}

func matchesAny(k tea.KeyPressMsg, groups [][]key.Binding) bool {
	for _, g := range groups {
		if key.Matches(k, g...) {
			return true
		}
	}
	return false
}

// keyActions returns the actions whose keys work in the current view:
// the enabled ones that apply here and whose keys the component does not
// claim. Help and key handling both use it, so they cannot disagree.
func (m *Model) keyActions() []*action {
	if m.page == pageHosts {
		// The hosts page has no session under its cursor: a session's
		// key there would act on the one selected out of sight.
		return nil
	}
	claimed := map[string]bool{}
	for _, g := range m.active().FullHelp() {
		for _, b := range g {
			if b.Enabled() {
				for _, k := range b.Keys() {
					claimed[k] = true
				}
			}
		}
	}
	var out []*action
	for i := range m.actions {
		a := &m.actions[i]
		if !a.key.Enabled() || (a.when != nil && !a.when(m)) {
			continue
		}
		shadowed := false
		for _, k := range a.key.Keys() {
			shadowed = shadowed || claimed[k]
		}
		if !shadowed {
			out = append(out, a)
		}
	}
	return out
}

// actionBindings returns the keys of keyActions, for the help and footer.
func (m *Model) actionBindings() []key.Binding {
	var out []key.Binding
	for _, a := range m.keyActions() {
		out = append(out, a.key)
	}
	return out
}

// globalBindings returns the root keys that apply in the current view.
func (m *Model) globalBindings() []key.Binding {
	out := []key.Binding{m.keys.Help, m.keys.Command, m.keys.Quit}
	switch m.page {
	case pageSessions:
		if m.keys.Hosts.Enabled() {
			out = append(out, m.keys.Hosts)
		}
	case pageDetail:
		out = append(out, m.keys.Back, m.keys.NextTab, m.keys.PrevTab, m.keys.Tabs)
	case pageHosts:
		out = append(out, m.keys.Back)
	}
	return out
}

func (m *Model) handleGlobal(k tea.KeyPressMsg) tea.Cmd {
	switch {
	case key.Matches(k, m.keys.Quit):
		return m.quit()
	case key.Matches(k, m.keys.Help):
		m.openHelp()
	case key.Matches(k, m.keys.Command):
		m.cmdActive = true
		m.cmdline.SetValue("")
		return m.cmdline.Focus()
	}
	switch m.page {
	case pageSessions:
		if key.Matches(k, m.keys.Hosts) {
			return m.openHosts()
		}
		return nil
	case pageHosts:
		if key.Matches(k, m.keys.Back) {
			m.page = pageSessions
		}
		return nil
	}
	switch {
	case key.Matches(k, m.keys.Back):
		m.page = pageSessions
		m.sessions.Select(m.detail)
		return m.output.Clear()
	case key.Matches(k, m.keys.NextTab):
		return m.setTab((m.tab + 1) % m.tabCount())
	case key.Matches(k, m.keys.PrevTab):
		return m.setTab((m.tab + m.tabCount() - 1) % m.tabCount())
	case key.Matches(k, m.keys.Tab1):
		return m.setTab(tabExecs)
	case key.Matches(k, m.keys.Tab2):
		return m.setTab(tabOutput)
	case key.Matches(k, m.keys.Tab3):
		return m.setTab(tabFiles)
	case key.Matches(k, m.keys.Tab4):
		return m.setTab(tabInfo)
	case key.Matches(k, m.keys.Tab5) && m.runs.Has():
		return m.setTab(tabRuns)
	}
	return nil
}

// openHosts shows the hosts page, which polls while it is shown.
func (m *Model) openHosts() tea.Cmd {
	if m.hosts == nil {
		return m.setFlash(common.FlashError, "this berth's service lists no hosts")
	}
	m.page = pageHosts
	return m.hosts.Show()
}

func (m *Model) setTab(t tab) tea.Cmd {
	m.tab = t
	switch t {
	case tabFiles:
		return m.files.Show()
	case tabOutput:
		// Opening Output with nothing shown opens the selected execution.
		if _, ok := m.output.Exec(); !ok {
			if e, ok := m.execs.Selected(); ok {
				return m.output.Open(e, nil)
			}
		}
	}
	return nil
}

func (m *Model) openDetail(name string) tea.Cmd {
	s, ok := m.sessions.Get(name)
	if !ok {
		return m.setFlash(common.FlashError, "no session "+name)
	}
	var cmds []tea.Cmd
	if name != m.detail {
		cmds = append(cmds, m.output.Clear())
	}
	m.page, m.detail, m.tab = pageDetail, name, tabExecs
	cmds = append(cmds, m.execs.SetSession(name), m.files.SetSession(s, false), m.info.Open(s), m.runs.SetSession(name), m.sparks.Open(s))
	return tea.Batch(cmds...)
}

func (m *Model) openOutput(msg common.OpenOutputMsg) tea.Cmd {
	var cmds []tea.Cmd
	if m.page != pageDetail || m.detail != msg.Exec.Session {
		cmds = append(cmds, m.openDetail(msg.Exec.Session))
	}
	m.tab = tabOutput
	m.execs.ApplyExec(msg.Exec)
	cmds = append(cmds, m.output.Open(msg.Exec, msg.Proc))
	return tea.Batch(cmds...)
}

func (m *Model) handleMouse(msg tea.MouseMsg) tea.Cmd {
	if m.dialog != nil || m.cmdActive {
		return nil
	}
	ms := msg.Mouse()
	if m.showHelp {
		switch msg := msg.(type) {
		case tea.MouseClickMsg:
			m.showHelp = false
		case tea.MouseWheelMsg:
			m.helpVP, _ = m.helpVP.Update(msg)
		}
		return nil
	}
	if _, ok := msg.(tea.MouseClickMsg); ok && m.page == pageDetail && ms.Y == m.bodyTop()-1 {
		for t, r := range m.tabRanges() {
			if ms.X >= r[0] && ms.X < r[1] {
				return m.setTab(tab(t))
			}
		}
		return nil
	}
	top := m.bodyTop()
	if ms.Y < top || ms.Y >= top+m.bodyHeight() {
		return nil
	}
	local := ms
	local.Y -= top
	switch msg.(type) {
	case tea.MouseClickMsg:
		return m.active().Update(tea.MouseClickMsg(local))
	case tea.MouseWheelMsg:
		return m.active().Update(tea.MouseWheelMsg(local))
	}
	return nil
}

// detailSession returns the session the detail view shows.
func (m *Model) detailSession() (session.Session, bool) { return m.sessions.Get(m.detail) }

// target returns the session actions apply to.
func (m *Model) target() (session.Session, bool) {
	if m.page == pageDetail {
		return m.detailSession()
	}
	return m.sessions.Selected()
}

func (m *Model) updateCmdline(k tea.KeyPressMsg) tea.Cmd {
	switch {
	case key.Matches(k, m.cmdKeys.Run):
		line := strings.TrimSpace(m.cmdline.Value())
		m.cmdActive = false
		m.cmdline.Blur()
		if line == "" {
			return nil
		}
		return m.runCommand(line)
	case key.Matches(k, m.cmdKeys.Cancel):
		m.cmdActive = false
		m.cmdline.Blur()
		return nil
	}
	var cmd tea.Cmd
	m.cmdline, cmd = m.cmdline.Update(k)
	return cmd
}

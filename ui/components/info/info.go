// Package info is the Info tab: a session's configuration and live
// figures (VM pid, accelerator, image, sizes) and its event timeline:
// state changes, crashes with their cause, flushes with bytes written.
package info

import (
	"context"
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

// timelineLimit bounds the events read and kept.
const timelineLimit = 500

// KeyMap are the Info tab's keys.
type KeyMap struct {
	common.NavKeys
	Refresh key.Binding
}

// DefaultKeyMap returns the bindings.
func DefaultKeyMap() KeyMap {
	nav := common.NewNavKeys()
	nav.Up.SetHelp("↑/k", "scroll timeline up")
	nav.Down.SetHelp("↓/j", "scroll timeline down")
	return KeyMap{NavKeys: nav, Refresh: key.NewBinding(key.WithKeys("r"), key.WithHelp("r", "reload timeline"))}
}

type timelineMsg struct {
	gen    int
	events []session.Event
	err    error
	// ckpts are the session's checkpoints, when the service keeps them.
	ckpts []session.Checkpoint
	net   *session.NetStatus // nil: not known
}

// Source is what the tab reads: timelines and network status.
type Source interface {
	Timeline(ctx context.Context, name string, limit int) ([]session.Event, error)
	NetStatus(ctx context.Context, name string) (session.NetStatus, error)
	Checkpoints(ctx context.Context, name string) ([]session.Checkpoint, error)
}

// Model is the Info tab.
type Model struct {
	c    *common.Common
	svc  Source // reads the timeline, the network and the checkpoints
	keys KeyMap
	w, h int

	sess    session.Session
	gen     int
	events  []session.Event // newest first
	maxSeq  uint64
	offset  int
	loading bool
	err     string
	ckpts   []session.Checkpoint // oldest first

	net      *session.NetStatus         // as of the last load
	forwards func(name string) []string // the program's own forwards, if any
}

var _ common.Component = (*Model)(nil)

// New returns an empty tab that reads timelines through svc.
func New(c *common.Common, svc Source) *Model {
	return &Model{c: c, svc: svc, keys: DefaultKeyMap()}
}

// Keys returns the key map.
func (m *Model) Keys() KeyMap { return m.keys }

// SetSize implements common.Component.
func (m *Model) SetSize(w, h int) { m.w, m.h = w, h }

// ShortHelp implements help.KeyMap.
func (m *Model) ShortHelp() []key.Binding { return []key.Binding{m.keys.Refresh} }

// FullHelp implements help.KeyMap.
func (m *Model) FullHelp() [][]key.Binding {
	return [][]key.Binding{m.keys.NavKeys.List(), {m.keys.Refresh}}
}

// Events returns the timeline, newest first.
func (m *Model) Events() []session.Event { return m.events }

// SetSession follows a session's record; a different session reloads the
// timeline.
func (m *Model) SetSession(s session.Session) tea.Cmd {
	changed := s.Name != m.sess.Name
	ckptsChanged := s.Checkpoints != m.sess.Checkpoints || s.CheckpointBytes != m.sess.CheckpointBytes
	m.sess = s
	if !changed {
		if ckptsChanged {
			return m.load() // a checkpoint was taken or removed
		}
		return nil
	}
	m.ckpts = nil
	m.events, m.maxSeq, m.offset = nil, 0, 0
	return m.load()
}

// Open shows a session and (re)loads its timeline.
func (m *Model) Open(s session.Session) tea.Cmd {
	m.sess = s
	m.events, m.maxSeq, m.offset, m.ckpts = nil, 0, 0, nil
	return m.load()
}

// Session returns the session shown.
func (m *Model) Session() session.Session { return m.sess }

// Checkpoints returns the shown session's checkpoints as last read,
// oldest first.
func (m *Model) Checkpoints() []session.Checkpoint {
	return m.ckpts
}

func (m *Model) load() tea.Cmd {
	m.gen++
	m.loading = true
	gen, name, svc := m.gen, m.sess.Name, m.svc
	ctx, cancel := m.c.Call()
	return func() tea.Msg {
		defer cancel()
		evs, err := svc.Timeline(ctx, name, timelineLimit)
		msg := timelineMsg{gen: gen, events: evs, err: err}
		if err == nil {
			msg.ckpts, _ = svc.Checkpoints(ctx, name)
		}
		if st, err := svc.NetStatus(ctx, name); err == nil {
			msg.net = &st
		}
		return msg
	}
}

// AddEvent appends a live event. Events already in the timeline (by seq)
// and unsequenced ones (a watch stream's initial snapshot) are skipped, as
// are stats refreshes, which are not history.
func (m *Model) AddEvent(ev session.Event) {
	if ev.Name != m.sess.Name || ev.Kind == session.EventStats || ev.Seq == 0 || ev.Seq <= m.maxSeq {
		return
	}
	m.maxSeq = ev.Seq
	m.events = slices.Insert(m.events, 0, ev)
	if len(m.events) > timelineLimit {
		m.events = m.events[:timelineLimit]
	}
	if m.offset > 0 {
		m.offset++ // keep the operator's place
	}
}

// Update implements common.Component.
func (m *Model) Update(msg tea.Msg) tea.Cmd {
	switch msg := msg.(type) {
	case timelineMsg:
		if msg.gen != m.gen {
			return nil
		}
		m.loading = false
		m.net = msg.net
		if msg.err != nil {
			m.err = common.ErrorText(msg.err)
			return nil
		}
		m.err = ""
		m.ckpts = msg.ckpts
		evs := slices.Clone(msg.events)
		slices.Reverse(evs)
		// Keep live events that arrived after the read.
		for _, ev := range m.events {
			if len(evs) == 0 || ev.Seq > evs[0].Seq {
				evs = slices.Insert(evs, 0, ev)
			}
		}
		m.events = evs
		for _, ev := range evs {
			m.maxSeq = max(m.maxSeq, ev.Seq)
		}
	case tea.KeyPressMsg:
		if o, ok := m.keys.Move(msg, m.offset, m.page(), max(1, len(m.events)-m.page()+1)); ok {
			m.offset = o
			return nil
		}
		if key.Matches(msg, m.keys.Refresh) {
			return m.load()
		}
	case tea.MouseWheelMsg:
		d := 3
		if msg.Button == tea.MouseWheelUp {
			d = -3
		}
		m.offset = common.Clamp(m.offset+d, 0, max(0, len(m.events)-m.page()))
	}
	return nil
}

// configLines is the number of rows the configuration block takes.
const configLines = 8

func (m *Model) page() int { return max(1, m.h-configLines-2-m.ckptLines()) }

// ckptShown bounds the checkpoints listed; the newest are shown.
const ckptShown = 4

// ckptLines is the rows the checkpoints block takes.
func (m *Model) ckptLines() int {
	if len(m.ckpts) == 0 {
		return 0
	}
	return 2 + min(len(m.ckpts), ckptShown)
}

// View implements common.Component.
func (m *Model) View() string {
	st := m.c.Styles
	s := &m.sess
	now := m.c.Now()
	loc := now.Location()
	kv := func(k, v string) string {
		return st.Muted.Render(common.Fit(k, 10)) + " " + v
	}
	uptime := "—"
	if !s.StartedAt.IsZero() && (s.State == session.StateRunning || s.State == session.StatePaused) {
		uptime = session.FormatDuration(now.Sub(s.StartedAt)) + " (since " + s.StartedAt.In(loc).Format("Jan _2 15:04:05") + ")"
	}
	pid := "—"
	if s.Pid > 0 {
		pid = strconv.Itoa(s.Pid)
	}
	accel := s.Accel
	if accel == "" {
		accel = "—"
	}
	mem := session.FormatBytesShort(int64(s.MemoryMiB) << 20)
	if s.MemUsedBytes > 0 {
		mem = session.FormatBytesShort(s.MemUsedBytes) + " used of " + mem
	}
	cause := ""
	if s.Cause != "" {
		cause = st.Muted.Render(" — " + common.SanitizeLine(s.Cause))
	}
	dirty := session.FormatBytes(s.DirtyBytes)
	if s.DirtyBytes > 0 {
		dirty = st.DialogWarn.Render(dirty + " not yet durable (a crash would lose it; f flushes)")
	}
	colW := max(30, m.w/2)
	two := func(a, b string) string { return common.Fit(a, colW-1) + " " + b }
	img := common.SanitizeLine(s.Image)
	if s.ImageDigest != "" {
		img += st.Muted.Render(" @" + common.SanitizeLine(s.ImageDigest))
	}
	lines := []string{
		two(kv("state", st.StateBadge(s.State)+cause), kv("created", s.CreatedAt.In(loc).Format("2006-01-02 15:04"))),
		two(kv("image", img), kv("uptime", uptime)),
		two(kv("vmm", common.SanitizeLine(s.VMM)+" · accel "+common.SanitizeLine(accel)), kv("activity", common.Ago(now, s.LastActivity))),
		two(kv("vm pid", pid), kv("running", strconv.Itoa(s.Running)+" command(s)")),
		two(kv("vcpus", strconv.Itoa(s.CPUs)), kv("memory", mem)),
		kv("workspace", workspaceText(*s, now)),
	}
	if s.SystemBytes > 0 {
		lines = append(lines, kv("system", session.FormatBytesShort(s.SystemUsed)+" used of "+session.FormatBytesShort(s.SystemBytes)+
			" (system disk: packages, /etc, "+common.SanitizeLine(s.HomeDirectory)+"; kept until R replaces it)"))
	}
	lines = append(lines, kv("dirty", dirty), kv("network", m.netText()))
	if n := len(m.ckpts); n > 0 {
		lines = append(lines, "", st.TableHead.Render("CHECKPOINTS")+st.Muted.Render("  "+strconv.Itoa(n)+", "+
			session.FormatBytesShort(s.CheckpointBytes)+" on disk · c checkpoint · u restore · F fork"))
		for i := max(0, n-ckptShown); i < n; i++ {
			c := m.ckpts[i]
			label := common.SanitizeLine(c.Label)
			lines = append(lines, "  "+common.Fit(c.ID, 5)+" "+c.CreatedAt.In(loc).Format("Jan _2 15:04:05")+"  "+
				common.Fit(session.FormatBytesShort(c.Bytes), 7)+" "+common.Fit(c.Holds(), 28)+" "+label)
		}
	}
	lines = append(lines,
		"",
		st.TableHead.Render("TIMELINE")+st.Muted.Render("  newest first"),
	)
	switch {
	case m.err != "":
		lines = append(lines, st.FlashErr.Render("  "+m.err))
	case m.loading && len(m.events) == 0:
		lines = append(lines, st.Muted.Render("  loading…"))
	case len(m.events) == 0:
		lines = append(lines, st.Muted.Render("  no events"))
	}
	for i := m.offset; i < len(m.events) && i < m.offset+m.page(); i++ {
		lines = append(lines, m.eventLine(m.events[i]))
	}
	return common.Block(strings.Join(lines, "\n"), m.w, m.h)
}

func (m *Model) eventLine(ev session.Event) string {
	st := m.c.Styles
	loc := m.c.Now().Location()
	kind := string(ev.Kind)
	style := st.Muted
	msg := common.SanitizeLine(ev.Message)
	switch ev.Kind {
	case session.EventState:
		if ev.Session != nil {
			kind = string(ev.Session.State)
			style = lipgloss.NewStyle().Foreground(st.StateColor(ev.Session.State))
			if ev.Session.State == session.StateCrashed {
				style = st.FlashErr
			}
			if msg == "" {
				msg = common.SanitizeLine(ev.Session.Cause)
			}
		}
	case session.EventFlush:
		style = st.FlashOK
	case session.EventExec:
		if ev.Exec != nil {
			kind = "exec " + string(ev.Exec.State)
			style = lipgloss.NewStyle().Foreground(st.ExecColor(ev.Exec.State))
			if msg == "" {
				msg = common.ShortID(ev.Exec.ID) + " " + common.ExecLabel(*ev.Exec)
			}
		}
	case session.EventDeleted:
		style = st.FlashErr
	}
	by := ""
	if ev.By != "" {
		by = st.Muted.Render("  by " + common.SanitizeLine(ev.By))
	}
	return "  " + st.Muted.Render(ev.Time.In(loc).Format("Jan _2 15:04:05")) + "  " + style.Render(common.Fit(kind, 14)) + " " + msg + by
}

// workspaceText is the workspace's use as last measured and when, or that
// it was never measured (rather than 0 B).
func workspaceText(s session.Session, now time.Time) string {
	size := session.FormatBytesShort(s.DiskBytes) + " (/workspace volume)"
	switch {
	case !s.WorkspaceKnown():
		return size + ", its use not measured yet"
	case s.WorkspaceMeasuredAt.IsZero():
		return session.FormatBytesShort(s.WorkspaceUsed) + " used of " + size
	}
	return session.FormatBytesShort(s.WorkspaceUsed) + " used of " + size + ", measured " + common.Ago(now, s.WorkspaceMeasuredAt)
}

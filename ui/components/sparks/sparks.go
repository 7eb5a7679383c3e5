// Package sparks is the session view's header strip: sparklines of the
// last ten minutes of one session's CPU, memory, disk I/O and dirty bytes,
// from the daemon's history (session.Sampler) and then the live stats
// events. It keeps the samples of the one session on screen only.
package sparks

import (
	"context"
	"strconv"
	"strings"
	"time"

	tea "charm.land/bubbletea/v2"
	"charm.land/lipgloss/v2"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/ui/common"
)

// maxSamples bounds the samples kept: ten minutes at the daemon's 2 s
// interval, with room for a faster one.
const maxSamples = 600

// Model is the strip.
type Model struct {
	c     *common.Common
	svc   session.Sampler
	name  string
	gen   int // of the current session: a history that arrives late for another is dropped
	s     session.Session
	hist  []session.Sample
	width int
	err   string
}

// New returns an empty strip that loads history from svc.
func New(c *common.Common, svc session.Sampler) *Model { return &Model{c: c, svc: svc} }

// historyMsg carries a loaded history.
type historyMsg struct {
	gen     int
	samples []session.Sample
	err     error
}

// Open shows session s, loading its history.
func (m *Model) Open(s session.Session) tea.Cmd {
	m.gen++
	m.name, m.s, m.hist, m.err = s.Name, s, nil, ""
	gen, svc, name := m.gen, m.svc, s.Name
	ctx, timeout := m.c.Ctx, m.c.CallTimeout
	return func() tea.Msg {
		if timeout > 0 {
			var cancel func()
			ctx, cancel = context.WithTimeout(ctx, timeout)
			defer cancel()
		}
		h, err := svc.History(ctx, name)
		return historyMsg{gen: gen, samples: h, err: err}
	}
}

// Update folds in a loaded history.
func (m *Model) Update(msg tea.Msg) tea.Cmd {
	if h, ok := msg.(historyMsg); ok && h.gen == m.gen {
		if h.err != nil {
			m.err = common.ErrorText(h.err)
			return nil
		}
		// Live samples that came while it loaded are newer than all of it.
		var newer []session.Sample
		if n := len(h.samples); n > 0 {
			last := h.samples[n-1].Time
			for _, s := range m.hist {
				if s.Time.After(last) {
					newer = append(newer, s)
				}
			}
		} else {
			newer = m.hist
		}
		m.hist = append(append([]session.Sample{}, h.samples...), newer...)
		m.trim()
	}
	return nil
}

// Observe folds in the session's newest record; a new live sample extends
// the graphs.
func (m *Model) Observe(s session.Session) {
	if s.Name != m.name {
		return
	}
	m.s = s
	lv := s.Live
	if lv == nil {
		return
	}
	if n := len(m.hist); n > 0 && !lv.Time.After(m.hist[n-1].Time) {
		return
	}
	m.hist = append(m.hist, session.Sample{
		Time: lv.Time, CPUPercent: float32(lv.CPUPercent), MemUsedBytes: s.MemUsedBytes, RSSBytes: lv.RSSBytes,
		DiskBps:    float32(lv.WorkspaceReadBps + lv.WorkspaceWriteBps + lv.SystemReadBps + lv.SystemWriteBps),
		DirtyBytes: s.DirtyBytes,
	})
	m.trim()
}

func (m *Model) trim() {
	if n := len(m.hist); n > maxSamples {
		m.hist = append(m.hist[:0], m.hist[n-maxSamples:]...)
	}
}

// Samples returns the samples shown (tests).
func (m *Model) Samples() []session.Sample { return m.hist }

// SetWidth sets the strip's width; it is one line high.
func (m *Model) SetWidth(w int) { m.width = w }

// bars are the sparkline's levels, lowest first.
var bars = []rune("▁▂▃▄▅▆▇█")

// graph draws vals (oldest first) in w cells against top, each cell the
// mean of its share of the window, or with peak its highest value (bursts
// of I/O must not average away); a missing value is a space.
func graph(vals []float64, have []bool, w int, top float64, peak bool) string {
	if w <= 0 {
		return ""
	}
	out := make([]rune, w)
	for i := range out {
		out[i] = ' '
	}
	n := len(vals)
	if n == 0 {
		return string(out)
	}
	// The newest samples sit at the right edge; with fewer samples than
	// cells the graph grows from the right.
	per := max(1, (n+w-1)/w)
	cells := (n + per - 1) / per
	for c := 0; c < cells; c++ {
		lo, hi := n-(cells-c)*per, n-(cells-c-1)*per
		best, sum, k := 0.0, 0.0, 0
		for i := max(0, lo); i < hi; i++ {
			if have[i] {
				best, sum, k = max(best, vals[i]), sum+vals[i], k+1
			}
		}
		if k == 0 {
			continue
		}
		if !peak {
			best = sum / float64(k)
		}
		lvl := 0
		if top > 0 {
			lvl = int(best / top * float64(len(bars)-1))
		}
		out[w-cells+c] = bars[min(max(lvl, 0), len(bars)-1)]
	}
	return string(out)
}

// View draws one line: for each figure, its name, a sparkline and the
// newest value. A CPU pinned at the top for minutes and a workspace past
// 90% are drawn in the error colour.
func (m *Model) View() string {
	st := m.c.Styles
	if m.width <= 0 {
		return ""
	}
	if m.err != "" && len(m.hist) == 0 {
		return common.Fit(" "+st.Muted.Render("figures: "+m.err), m.width)
	}
	n := len(m.hist)
	now := m.c.Now()
	// Samples older than the window are not drawn.
	from := 0
	for from < n && now.Sub(m.hist[from].Time) > session.HistoryWindow {
		from++
	}
	h := m.hist[from:]
	vals := func(f func(s session.Sample) float64) ([]float64, []bool, float64) {
		v, ok := make([]float64, len(h)), make([]bool, len(h))
		top := 0.0
		for i, s := range h {
			v[i], ok[i] = f(s), true
			top = max(top, v[i])
		}
		return v, ok, top
	}
	last := func(f func(s session.Sample) float64) (float64, bool) {
		if len(h) == 0 {
			return 0, false
		}
		return f(h[len(h)-1]), true
	}
	type fig struct {
		label string
		f     func(s session.Sample) float64
		top   float64 // fixed scale; 0: the window's highest value
		peak  bool    // a cell shows its highest value, not the mean
		text  func(v float64) string
		paint common.Paint
	}
	cpuP := common.Paint{}
	if pinned(h, now) {
		cpuP = st.ErrP
	} else if v, ok := last(func(s session.Sample) float64 { return float64(s.CPUPercent) }); ok && v >= 90 {
		cpuP = st.WarnP
	}
	dirtyP := common.Paint{}
	if m.s.DirtyBytes > 0 {
		dirtyP = st.WarnP
	}
	figs := []fig{
		{"cpu", func(s session.Sample) float64 { return float64(s.CPUPercent) }, 100, false, func(v float64) string { return strconv.Itoa(int(v+0.5)) + "%" }, cpuP},
		{"mem", func(s session.Sample) float64 { return float64(s.MemUsedBytes) }, float64(int64(m.s.MemoryMiB) << 20), false, func(v float64) string { return session.FormatBytesShort(int64(v)) }, common.Paint{}},
		{"disk", func(s session.Sample) float64 { return float64(s.DiskBps) }, 0, true, func(v float64) string { return session.FormatBytesShort(int64(v)) + "/s" }, common.Paint{}},
		{"dirty", func(s session.Sample) float64 { return float64(s.DirtyBytes) }, 0, true, func(v float64) string { return session.FormatBytesShort(int64(v)) }, dirtyP},
	}
	// Four figures share the line: " label graph value " each.
	const valueW = 7
	cell := max(4, (m.width-1)/len(figs)-len("dirty ")-valueW-2)
	var b strings.Builder
	b.WriteString(" ")
	for i, f := range figs {
		v, ok, top := vals(f.f)
		if f.top > 0 {
			top = f.top
		}
		val := "—"
		if x, has := last(f.f); has && m.s.State == session.StateRunning {
			val = f.text(x)
		}
		b.WriteString(st.Muted.Render(common.FitLeft(f.label, len("dirty"))) + " ")
		gp := f.paint
		if gp == (common.Paint{}) {
			gp = accentP(st)
		}
		b.WriteString(gp.Render(graph(v, ok, cell, top, f.peak)))
		b.WriteString(" " + f.paint.Render(common.Fit(val, valueW)))
		if i < len(figs)-1 {
			b.WriteString(" ")
		}
	}
	if m.s.DiskBytes > 0 && m.s.WorkspaceUsed*10 >= m.s.DiskBytes*9 {
		b.WriteString(" " + st.ErrP.Render("ws "+strconv.Itoa(int(m.s.WorkspaceUsed*100/m.s.DiskBytes))+"%"))
	}
	return common.Fit(b.String(), m.width)
}

// accentP is the graphs' paint.
func accentP(st *common.Styles) common.Paint {
	return common.PaintOf(lipgloss.NewStyle().Foreground(st.Palette.Accent))
}

// pinned reports whether the CPU stayed at or above 90% over the last
// two minutes of samples (and there are two minutes of them).
func pinned(h []session.Sample, now time.Time) bool {
	if len(h) == 0 || now.Sub(h[0].Time) < 2*time.Minute {
		return false
	}
	for i := len(h) - 1; i >= 0; i-- {
		s := h[i]
		if now.Sub(s.Time) > 2*time.Minute {
			return true
		}
		if s.CPUPercent < 90 {
			return false
		}
	}
	return true
}

package output

import (
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"charm.land/lipgloss/v2"
	"github.com/charmbracelet/x/ansi"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/ui/common"
)

// Lines in the window are sanitised output: printable text and SGR
// sequences (common.SanitizeOutputLine). The helpers below measure, wrap
// and cut them with x/ansi, so an escape sequence takes no cells and a row
// boundary never falls inside one.

// wrapOffsets returns the byte offset where each row of text starts when
// wrapped at width cells. A row starts with the SGR sequences just before
// its first character. ASCII text without escapes (the common case) is
// sliced without decoding.
func wrapOffsets(text string, width int) []int {
	offs := []int{0}
	if ascii(text) {
		for o := width; o < len(text); o += width {
			offs = append(offs, o)
		}
		return offs
	}
	col, pos, esc := 0, 0, -1 // esc: where the sequences before pos start
	var state byte
	for pos < len(text) {
		seq, w, n, st := ansi.DecodeSequence(text[pos:], state, nil)
		state = st
		if n <= 0 {
			break
		}
		if w == 0 && seq[0] == ansi.ESC {
			if esc < 0 {
				esc = pos
			}
			pos += n
			continue
		}
		if col+w > width && col > 0 {
			at := pos
			if esc >= 0 {
				at = esc
			}
			offs = append(offs, at)
			col = 0
		}
		esc = -1
		col += w
		pos += n
	}
	return offs
}

// cutWidth returns the byte length of text's prefix that fits in width
// cells, never inside an escape sequence.
func cutWidth(text string, width int) int {
	if ascii(text) {
		return min(len(text), width)
	}
	col, pos := 0, 0
	var state byte
	for pos < len(text) {
		_, w, n, st := ansi.DecodeSequence(text[pos:], state, nil)
		state = st
		if n <= 0 || col+w > width {
			break
		}
		col += w
		pos += n
	}
	return pos
}

// ascii reports whether s is ASCII without escape sequences.
func ascii(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf || s[i] == ansi.ESC {
			return false
		}
	}
	return true
}

func hasEscape(s string) bool { return strings.IndexByte(s, ansi.ESC) >= 0 }

// visible returns a line's text as shown, without its colours: what
// search matches.
func visible(s string) string {
	if !hasEscape(s) {
		return s
	}
	return ansi.Strip(s)
}

// sgrState returns the SGR sequences in effect at the end of s, a prefix
// of a sanitised line cut at a row boundary: those after its last full
// reset. A wrapped row starts with them, so it keeps its colours.
func sgrState(s string) string {
	var b strings.Builder
	for {
		i := strings.IndexByte(s, ansi.ESC)
		if i < 0 {
			return b.String()
		}
		s = s[i:]
		j := strings.IndexByte(s, 'm')
		if j < 0 {
			return b.String()
		}
		if seq := s[:j+1]; isReset(seq) {
			b.Reset()
		} else {
			b.WriteString(seq)
		}
		s = s[j+1:]
	}
}

// isReset reports whether an SGR sequence resets every attribute.
func isReset(seq string) bool { return strings.Trim(seq[2:len(seq)-1], "0") == "" }

// styleOpen returns the sequence that starts style (empty for none).
func styleOpen(style lipgloss.Style) string {
	r := style.Render("x")
	if i := strings.IndexByte(r, 'x'); i > 0 {
		return r[:i]
	}
	return ""
}

// View implements common.Component.
func (m *Model) View() string {
	st := m.c.Styles
	if !m.has {
		msg := "No execution selected: pick one in Executions (1) and press enter"
		if !m.c.ReadOnly {
			msg += ", or run a command with x"
		}
		return common.Block("\n  "+st.Muted.Render(msg+"."), m.w, m.h)
	}
	lines := make([]string, 0, m.h)
	lines = append(lines, m.header())
	rows := m.textRows()
	body := make([]string, 0, rows)
	switch {
	case m.loading:
		body = append(body, st.Muted.Render("  loading output…"))
	case m.err != "" && len(m.win.lines) == 0:
		body = append(body, st.FlashErr.Render("  "+m.err))
	case len(m.win.lines) == 0:
		if m.exec.State.Done() {
			body = append(body, st.Muted.Render("  (no output)"))
		} else {
			body = append(body, st.Muted.Render("  (no output yet)"))
		}
	default:
		body = m.renderRows(body, rows)
	}
	for len(body) < rows {
		body = append(body, "")
	}
	lines = append(lines, body...)
	lines = append(lines, m.statusBar())
	return common.Block(strings.Join(lines, "\n"), m.w, m.h)
}

func (m *Model) header() string {
	st := m.c.Styles
	e := &m.exec
	state := lipgloss.NewStyle().Foreground(st.ExecColor(e.State)).Render(string(e.State))
	parts := []string{st.Bold.Render(common.ShortID(e.ID)), state}
	if e.ExitCode != nil {
		parts = append(parts, "exit "+strconv.Itoa(*e.ExitCode))
	}
	if e.Signal != "" {
		parts = append(parts, e.Signal)
	}
	end := e.EndedAt
	if end.IsZero() {
		end = m.c.Now()
	}
	if !e.StartedAt.IsZero() {
		parts = append(parts, session.FormatDuration(end.Sub(e.StartedAt)))
	}
	parts = append(parts, "out "+session.FormatBytesShort(e.StdoutBytes)+" err "+session.FormatBytesShort(e.StderrBytes))
	if note := stateNote(e.State); note != "" {
		parts = append(parts, st.DialogWarn.Render(note))
	}
	parts = append(parts, st.Muted.Render("$ "+common.ExecLabel(*e)))
	return strings.Join(parts, st.Subtle.Render(" · "))
}

// stateNote says what an outcome means for the workspace.
func stateNote(s session.ExecState) string {
	switch s {
	case session.ExecLost:
		return "outcome unknown (VM or agent lost it): not a success"
	case session.ExecCancelled, session.ExecFailed, session.ExecTimedOut:
		return "no rollback: partial changes may remain"
	}
	return ""
}

func (m *Model) statusBar() string {
	st := m.c.Styles
	if m.searching {
		return m.input.View()
	}
	var left []string
	if m.follow {
		left = append(left, st.FlashOK.Render("FOLLOW"))
	} else {
		left = append(left, st.Muted.Render("PAUSED"))
		if m.newLines > 0 {
			left = append(left, st.Badge.Render(" "+strconv.Itoa(m.newLines)+" new lines · G "))
		}
	}
	if m.query != "" {
		q := "/" + common.SanitizeLine(m.query)
		if m.hasCur {
			q += " (n/N)"
		}
		left = append(left, st.Accent.Render(q))
	}
	if m.status != "" {
		left = append(left, st.DialogWarn.Render(m.status))
	}
	if m.err != "" && len(m.win.lines) > 0 {
		left = append(left, st.FlashErr.Render(m.err))
	}
	var right []string
	if m.wrap {
		right = append(right, "wrap")
	}
	if m.stamps {
		right = append(right, "time")
	}
	right = append(right, m.streams.String(), m.position())
	l := strings.Join(left, "  ")
	r := st.Muted.Render(strings.Join(right, " · "))
	gap := m.w - lipgloss.Width(l) - lipgloss.Width(r)
	if gap < 1 {
		return common.Fit(l, m.w)
	}
	return l + strings.Repeat(" ", gap) + r
}

// position shows where the viewport is in the whole output, by chunk seq
// (line numbers of a partially loaded output are unknown).
func (m *Model) position() string {
	if len(m.win.lines) == 0 || m.lastSeq == 0 {
		return "—"
	}
	if m.follow && m.atEnd {
		return "end"
	}
	top := m.win.lines[common.Clamp(m.top, 0, len(m.win.lines)-1)].seq
	if m.lastSeq <= 1 {
		return "100%"
	}
	pct := int((top - 1) * 100 / (m.lastSeq - 1))
	if m.atEnd && m.atBottom() {
		pct = 100
	}
	return strconv.Itoa(pct) + "% (chunk " + strconv.FormatUint(top, 10) + "/" + strconv.FormatUint(m.lastSeq, 10) + ")"
}

func (m *Model) renderRows(out []string, rows int) []string {
	st := m.c.Styles
	tw := m.textWidth()
	q := ""
	if m.query != "" {
		q = m.needle()
	}
	loc := m.c.Now().Location()
	blankStamp := strings.Repeat(" ", stampWidth)
	sub := m.sub
	stderrOpen := styleOpen(st.Stderr)
	for i := m.top; i < len(m.win.lines) && len(out) < rows; i++ {
		if !m.shown(i) {
			continue
		}
		l := &m.win.lines[i]
		text := l.text
		var matches [][2]int
		if q != "" {
			// Search matches the visible text. Case folding can change
			// byte lengths (rare scripts); then offsets would not map
			// back, so such lines are not highlighted.
			v := visible(l.text)
			h := v
			if m.fold {
				h = strings.ToLower(v)
			}
			if len(h) == len(v) {
				matches = findAll(h, q)
			}
			if len(matches) > 0 {
				// A line with a highlighted match is shown without its
				// own colours.
				text = v
			}
		}
		var offs []int
		if m.wrap && int(l.width) > tw {
			offs = wrapOffsets(text, tw)
		} else {
			offs = []int{0}
		}
		for r := sub; r < len(offs) && len(out) < rows; r++ {
			var b strings.Builder
			// Gutter: stderr is marked in the gutter as well as coloured,
			// so it stays distinct without colour.
			switch {
			case l.marker:
				b.WriteString(st.Muted.Render("··"))
			case l.stream == session.Stderr && r == 0:
				b.WriteString(st.StderrMark.Render("▌") + " ")
			case l.stream == session.Stderr:
				b.WriteString(st.StderrMark.Render("▏") + " ")
			default:
				b.WriteString("  ")
			}
			if m.stamps {
				if r == 0 && !l.marker {
					b.WriteString(st.Muted.Render(time.Unix(0, l.unix).In(loc).Format("15:04:05.000")) + " ")
				} else {
					b.WriteString(blankStamp)
				}
			}
			start := offs[r]
			end := len(text)
			ellipsis := false
			if r+1 < len(offs) {
				end = offs[r+1]
			} else if !m.wrap && int(l.width) > tw {
				end = cutWidth(text, tw-1)
				ellipsis = true
			}
			if len(matches) == 0 && hasEscape(text) {
				b.WriteString(colourSegment(l, text, start, end, stderrOpen))
			} else {
				b.WriteString(m.styleSegment(l, i, text, start, end, matches))
			}
			if ellipsis {
				b.WriteString(st.Muted.Render("…"))
			}
			out = append(out, b.String())
		}
		sub = 0
	}
	return out
}

// colourSegment renders text[start:end] of line l, a row of a line with
// its own colours: the row starts with the colours in effect where it
// starts and ends with a reset, so a colour never reaches the next row or
// the view around it. The stream's style applies under the line's colours
// and again after each of its resets.
func colourSegment(l *line, text string, start, end int, stderrOpen string) string {
	base := ""
	if l.stream == session.Stderr {
		base = stderrOpen
	}
	seg := text[start:end]
	carry := sgrState(text[:start])
	var b strings.Builder
	b.Grow(len(base) + len(carry) + len(seg) + 16)
	b.WriteString(base)
	b.WriteString(carry)
	open := base != "" || carry != "" // a style is set
	for len(seg) > 0 {
		i := strings.IndexByte(seg, ansi.ESC)
		if i < 0 {
			b.WriteString(seg)
			break
		}
		j := i + strings.IndexByte(seg[i:], 'm')
		b.WriteString(seg[:j+1])
		open = !isReset(seg[i : j+1])
		seg = seg[j+1:]
		if !open && base != "" && seg != "" {
			b.WriteString(base)
			open = true
		}
	}
	if open {
		b.WriteString(common.SGRReset)
	}
	return b.String()
}

// styleSegment renders text[start:end] of line i (text without escape
// sequences) with stream colour and search highlights.
func (m *Model) styleSegment(l *line, i int, text string, start, end int, matches [][2]int) string {
	st := m.c.Styles
	base := lipgloss.NewStyle()
	switch {
	case l.marker:
		base = st.Muted
	case l.stream == session.Stderr:
		base = st.Stderr
	}
	render := func(s string, style lipgloss.Style) string {
		if s == "" {
			return ""
		}
		return style.Render(s)
	}
	var b strings.Builder
	p := start
	for _, mt := range matches {
		ms, me := max(mt[0], start), min(mt[1], end)
		if ms >= me {
			continue
		}
		b.WriteString(render(text[p:ms], base))
		hs := st.Match
		if m.hasCur && m.cur.line == i && m.cur.off == mt[0] {
			hs = st.MatchCur
		}
		b.WriteString(render(text[ms:me], hs))
		p = me
	}
	b.WriteString(render(text[p:end], base))
	return b.String()
}

func findAll(h, q string) [][2]int {
	var out [][2]int
	for from := 0; from <= len(h); {
		j := strings.Index(h[from:], q)
		if j < 0 {
			break
		}
		out = append(out, [2]int{from + j, from + j + len(q)})
		from += j + max(1, len(q))
	}
	return out
}

package common

import (
	"image/color"

	"charm.land/bubbles/v2/help"
	"charm.land/bubbles/v2/textinput"
	"charm.land/lipgloss/v2"
	"github.com/charmbracelet/colorprofile"

	"github.com/berthvm/berth/session"
)

// Palette is the set of colours every style is built from. Each colour is
// picked per colour profile (so 16-colour terminals get a real ANSI colour
// instead of a poor approximation of a hex value) and per background (so
// text stays readable on light terminals).
type Palette struct {
	Accent, OK, Warn, Err, Info, Busy, Muted, Subtle, Text, SelBg, SelFg, MatchBg, MatchFg color.Color
}

// NewPalette picks colours for a background (isDark) and a colour profile.
// For Ascii and NoTTY profiles (NO_COLOR, dumb terminals) every colour is
// "no colour", and the styles rely on bold/reverse and text marks instead.
func NewPalette(isDark bool, p colorprofile.Profile) Palette {
	ld := lipgloss.LightDark(isDark)
	pick := func(ansi int, light256, dark256 int, light, dark string) color.Color {
		switch p {
		case colorprofile.ANSI:
			return lipgloss.ANSIColor(ansi)
		case colorprofile.ANSI256:
			return ld(lipgloss.ANSIColor(light256), lipgloss.ANSIColor(dark256))
		case colorprofile.TrueColor:
			return ld(lipgloss.Color(light), lipgloss.Color(dark))
		}
		return lipgloss.NoColor{}
	}
	return Palette{
		Accent:  pick(6, 30, 80, "#00808a", "#5fd7d7"),
		OK:      pick(2, 28, 78, "#217a3c", "#5fd787"),
		Warn:    pick(3, 136, 179, "#9a6b00", "#e5c07b"),
		Err:     pick(1, 160, 203, "#c0392b", "#ff6b6b"),
		Info:    pick(4, 25, 75, "#1f5fa8", "#61afef"),
		Busy:    pick(5, 91, 176, "#8e44ad", "#d19ae6"),
		Muted:   pick(8, 244, 245, "#6c6c6c", "#8a8a8a"),
		Subtle:  pick(8, 250, 238, "#d0d0d0", "#3a3a3a"),
		Text:    pick(7, 235, 252, "#1c1c1c", "#d0d0d0"),
		SelBg:   pick(6, 152, 24, "#c6e6ea", "#1f4f5a"),
		SelFg:   pick(0, 235, 255, "#000000", "#ffffff"),
		MatchBg: pick(3, 220, 178, "#ffd75f", "#d7af00"),
		MatchFg: pick(0, 16, 16, "#000000", "#000000"),
	}
}

// Styles are the rendering styles of the whole UI.
type Styles struct {
	IsDark  bool
	Profile colorprofile.Profile
	Palette Palette

	Title      lipgloss.Style
	Muted      lipgloss.Style
	Subtle     lipgloss.Style
	Bold       lipgloss.Style
	Accent     lipgloss.Style
	TableHead  lipgloss.Style
	Selected   lipgloss.Style // the cursor row; reverse so it shows without colour
	Tab        lipgloss.Style
	TabActive  lipgloss.Style
	Stderr     lipgloss.Style
	StderrMark lipgloss.Style
	Match      lipgloss.Style
	MatchCur   lipgloss.Style
	Badge      lipgloss.Style // "N new lines" and similar
	FlashInfo  lipgloss.Style
	FlashOK    lipgloss.Style
	FlashErr   lipgloss.Style
	Dialog     lipgloss.Style
	DialogHead lipgloss.Style
	DialogWarn lipgloss.Style
	Key        lipgloss.Style
	Help       help.Styles
	Input      textinput.Styles

	// Precomputed paints for table cells (see Paint).
	MutedP, WarnP, ErrP, SelectedP Paint
	stateP                         map[session.State]Paint
}

// NewStyles builds the styles for a background and a colour profile.
func NewStyles(isDark bool, p colorprofile.Profile) *Styles {
	pal := NewPalette(isDark, p)
	s := &Styles{IsDark: isDark, Profile: p, Palette: pal}
	ns := lipgloss.NewStyle
	s.Title = ns().Bold(true).Foreground(pal.Accent)
	s.Muted = ns().Foreground(pal.Muted)
	s.Subtle = ns().Foreground(pal.Subtle)
	s.Bold = ns().Bold(true)
	s.Accent = ns().Foreground(pal.Accent)
	s.TableHead = ns().Bold(true).Foreground(pal.Muted)
	s.Selected = ns().Bold(true).Reverse(true)
	if p == colorprofile.ANSI256 || p == colorprofile.TrueColor {
		// With enough colours, a tinted bar reads better than reverse video.
		s.Selected = ns().Bold(true).Background(pal.SelBg).Foreground(pal.SelFg)
	}
	s.Tab = ns().Foreground(pal.Muted).Padding(0, 1)
	s.TabActive = ns().Bold(true).Underline(true).Foreground(pal.Accent).Padding(0, 1)
	s.Stderr = ns().Foreground(pal.Err)
	s.StderrMark = ns().Foreground(pal.Err).Bold(true)
	s.Match = ns().Background(pal.MatchBg).Foreground(pal.MatchFg)
	s.MatchCur = ns().Reverse(true).Bold(true)
	s.Badge = ns().Bold(true).Reverse(true)
	s.FlashInfo = ns().Foreground(pal.Info)
	s.FlashOK = ns().Foreground(pal.OK)
	s.FlashErr = ns().Foreground(pal.Err).Bold(true)
	s.Dialog = ns().Border(lipgloss.RoundedBorder()).BorderForeground(pal.Accent).Padding(0, 1)
	s.DialogHead = ns().Bold(true).Foreground(pal.Accent)
	s.DialogWarn = ns().Foreground(pal.Warn)
	s.Key = ns().Bold(true).Foreground(pal.Accent)

	s.Help = help.Styles{
		ShortKey:       ns().Foreground(pal.Accent),
		ShortDesc:      ns().Foreground(pal.Muted),
		ShortSeparator: ns().Foreground(pal.Subtle),
		Ellipsis:       ns().Foreground(pal.Muted),
		FullKey:        ns().Bold(true).Foreground(pal.Accent),
		FullDesc:       ns().Foreground(pal.Text),
		FullSeparator:  ns().Foreground(pal.Subtle),
	}
	in := textinput.DefaultStyles(isDark)
	in.Focused.Prompt = ns().Foreground(pal.Accent).Bold(true)
	in.Blurred.Prompt = ns().Foreground(pal.Muted)
	in.Focused.Placeholder = ns().Foreground(pal.Muted)
	in.Blurred.Placeholder = ns().Foreground(pal.Muted)
	in.Cursor.Color = pal.Accent
	// A steady cursor: blinking would redraw twice a second, which is
	// noise over a slow SSH link and makes screen tests time-dependent.
	in.Cursor.Blink = false
	s.Input = in

	s.MutedP, s.WarnP, s.ErrP, s.SelectedP = PaintOf(s.Muted), PaintOf(ns().Foreground(pal.Warn)), PaintOf(ns().Foreground(pal.Err)), PaintOf(s.Selected)
	s.stateP = map[session.State]Paint{}
	for _, st := range []session.State{session.StateCreating, session.StateRunning, session.StatePaused, session.StateStopping,
		session.StateStopped, session.StateCrashed, session.StateDeleting, session.StateSleeping} {
		s.stateP[st] = PaintOf(ns().Foreground(s.StateColor(st)))
	}
	return s
}

// StatePaint is the paint of a state's badge.
func (s *Styles) StatePaint(st session.State) Paint {
	if p, ok := s.stateP[st]; ok {
		return p
	}
	return PaintOf(lipgloss.NewStyle().Foreground(s.StateColor(st)))
}

// StateColor is the colour of a session state's badge.
func (s *Styles) StateColor(st session.State) color.Color {
	switch st {
	case session.StateRunning:
		return s.Palette.OK
	case session.StatePaused:
		return s.Palette.Warn
	case session.StateCrashed, session.StateUnreachable:
		return s.Palette.Err
	case session.StateSleeping:
		return s.Palette.Info
	case session.StateStopped:
		return s.Palette.Muted
	}
	return s.Palette.Busy // transitional states
}

// StateBadge renders a state as a coloured mark and its name. The mark's
// shape also differs per state, so the badge reads without colour.
func (s *Styles) StateBadge(st session.State) string {
	return s.StatePaint(st).Render(StateMark(st) + " " + string(st))
}

// StateMark is a one-cell symbol per state.
func StateMark(st session.State) string {
	switch st {
	case session.StateRunning:
		return "●"
	case session.StatePaused:
		return "‖"
	case session.StateCrashed:
		return "✗"
	case session.StateStopped:
		return "○"
	case session.StateSleeping:
		return "z"
	case session.StateUnreachable:
		return "?"
	}
	return "◌"
}

// HostColor is the colour of a fleet host's state, as a session state's
// of the same sense: ready as running, draining as paused, and gone, or
// any state this build does not know (isolated), as crashed.
func (s *Styles) HostColor(st session.HostState) color.Color {
	switch st {
	case session.HostReady:
		return s.Palette.OK
	case session.HostDraining:
		return s.Palette.Warn
	}
	return s.Palette.Err
}

// HostMark is a one-cell symbol per host state, so a host's state reads
// without colour.
func HostMark(st session.HostState) string {
	switch st {
	case session.HostReady:
		return "●"
	case session.HostDraining:
		return "◌"
	case session.HostGone:
		return "✗"
	}
	return "?"
}

// ExecColor is the colour of an execution state.
func (s *Styles) ExecColor(st session.ExecState) color.Color {
	switch st {
	case session.ExecRunning, session.ExecStarting:
		return s.Palette.Busy
	case session.ExecExited:
		return s.Palette.OK
	case session.ExecLost, session.ExecFailed, session.ExecTimedOut:
		return s.Palette.Err
	case session.ExecCancelled:
		return s.Palette.Warn
	}
	return s.Palette.Muted
}

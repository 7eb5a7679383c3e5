package common

import (
	"strings"
	"unicode/utf8"

	"charm.land/lipgloss/v2"
	"github.com/charmbracelet/x/ansi"
)

// widthOf is ansi.StringWidth with a fast path for what the UI's own
// lines are made of: printable ASCII, SGR sequences and single-width
// symbols (box drawing, arrows, marks). Anything else (wide or combining
// characters from untrusted text) takes the grapheme-aware path.
func widthOf(s string) int {
	w := 0
	for i := 0; i < len(s); {
		b := s[i]
		switch {
		case b >= 0x20 && b < 0x7f:
			w++
			i++
		case b == 0x1b && i+1 < len(s) && s[i+1] == '[':
			j := i + 2
			for j < len(s) && (s[j] < 0x40 || s[j] > 0x7e) {
				j++
			}
			i = j + 1
		case b >= 0x80:
			r, size := utf8.DecodeRuneInString(s[i:])
			if !narrowSymbol(r) {
				return ansi.StringWidth(s)
			}
			w++
			i += size
		default:
			return ansi.StringWidth(s)
		}
	}
	return w
}

// narrowSymbol reports runes known to be one cell and not to combine:
// Latin-1 letters, general punctuation, arrows, box drawing, block and
// geometric shapes, control pictures.
func narrowSymbol(r rune) bool {
	switch {
	case r >= 0xa0 && r < 0x300:
		return true
	case r >= 0x2010 && r <= 0x2027, r >= 0x2030 && r <= 0x205e:
		return true
	case r >= 0x2190 && r <= 0x21ff, r >= 0x2400 && r <= 0x2426, r >= 0x2500 && r <= 0x25ff:
		return true
	case r == 0x2713 || r == 0x2717: // ✓ ✗
		return true
	}
	return false
}

// Fit pads or cuts s (styled text) to exactly width cells.
func Fit(s string, width int) string {
	if width <= 0 {
		return ""
	}
	w := widthOf(s)
	if w > width {
		return ansi.Truncate(s, width, "…")
	}
	if w < width {
		return s + strings.Repeat(" ", width-w)
	}
	return s
}

// FitLeft is Fit for right-aligned cells.
func FitLeft(s string, width int) string {
	if width <= 0 {
		return ""
	}
	w := widthOf(s)
	if w > width {
		return ansi.Truncate(s, width, "…")
	}
	return strings.Repeat(" ", width-w) + s
}

// Block makes s exactly width x height cells: lines are cut or padded and
// the line count is cut or padded with blank lines. Every component's View
// goes through it, so a component can never push the layout around.
func Block(s string, width, height int) string {
	if height <= 0 || width <= 0 {
		return ""
	}
	lines := strings.Split(s, "\n")
	if len(lines) > height {
		lines = lines[:height]
	}
	var b strings.Builder
	b.Grow((width + 1) * height)
	blank := strings.Repeat(" ", width)
	for i := range height {
		if i > 0 {
			b.WriteByte('\n')
		}
		if i < len(lines) {
			b.WriteString(Fit(lines[i], width))
		} else {
			b.WriteString(blank)
		}
	}
	return b.String()
}

// Overlay draws fg (a block of lines) over bg at column x, row y, keeping
// the background's cells (and styles) around it. Dialogs and the help
// overlay use it so the view behind them stays visible.
func Overlay(bg, fg string, x, y int) string {
	bgLines := strings.Split(bg, "\n")
	fgLines := strings.Split(fg, "\n")
	for i, fl := range fgLines {
		row := y + i
		if row < 0 || row >= len(bgLines) {
			continue
		}
		bl := bgLines[row]
		bw := ansi.StringWidth(bl)
		fw := ansi.StringWidth(fl)
		left := ansi.Cut(bl, 0, x)
		if lw := ansi.StringWidth(left); lw < x {
			left += strings.Repeat(" ", x-lw)
		}
		right := ""
		if x+fw < bw {
			right = ansi.Cut(bl, x+fw, bw)
		}
		bgLines[row] = left + fl + right
	}
	return strings.Join(bgLines, "\n")
}

// Center returns the top-left corner that centres a w x h box in an
// area of aw x ah.
func Center(aw, ah, w, h int) (x, y int) {
	return max(0, (aw-w)/2), max(0, (ah-h)/2)
}

// Size returns a rendered block's width and height.
func Size(s string) (w, h int) {
	return lipgloss.Width(s), lipgloss.Height(s)
}

// Paint is a style reduced to the escape sequences it puts around a
// single-line cell. Tables paint thousands of cells per second; a full
// lipgloss Render per cell (which handles borders, padding and wrapping a
// cell never has) costs more than the rest of the frame.
type Paint struct{ pre, post string }

// PaintOf precomputes a style's Paint. The style must not pad, align,
// size, border or transform its text.
func PaintOf(st lipgloss.Style) Paint {
	r := st.Render("x")
	i := strings.IndexByte(r, 'x')
	if i < 0 {
		return Paint{}
	}
	return Paint{pre: r[:i], post: r[i+1:]}
}

// Render paints s.
func (p Paint) Render(s string) string {
	if p.pre == "" && p.post == "" {
		return s
	}
	return p.pre + s + p.post
}

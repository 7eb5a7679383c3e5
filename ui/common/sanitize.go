package common

import (
	"strconv"
	"unicode/utf8"

	"github.com/mattn/go-runewidth"
)

// MaxLineBytes bounds one displayed line of untrusted output. A command that
// prints megabytes without a newline must not make every frame scan them.
const MaxLineBytes = 16 << 10

const tabWidth = 8

// SanitizeLine makes one line of untrusted text (command output, file
// contents, error text from a guest) safe to draw: the result never moves
// the cursor, changes modes, sets colours or titles, or spans rows, so a
// command cannot break the layout. It
//
//   - drops escape sequences (CSI, OSC, DCS/SOS/PM/APC strings, and their
//     8-bit C1 forms) rather than showing them, since they are usually colour;
//   - keeps what a terminal would show after a carriage return (progress
//     bars print "10%\r20%\r"), and applies backspaces;
//   - shows other control characters as their Unicode control pictures
//     (␇ for BEL), so they are visible but harmless;
//   - expands tabs to 8-column stops, replaces invalid UTF-8 with U+FFFD,
//     drops bidi overrides that would reorder neighbouring text;
//   - bounds the line to MaxLineBytes, marking the cut with "…".
func SanitizeLine(s string) string {
	for len(s) > 0 && (s[len(s)-1] == '\n' || s[len(s)-1] == '\r') {
		s = s[:len(s)-1]
	}
	truncated := 0
	if len(s) > MaxLineBytes {
		cut := MaxLineBytes
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		truncated = len(s) - cut
		s = s[:cut]
	}
	if clean(s) {
		if truncated > 0 {
			return s + "…[+" + strconv.Itoa(truncated) + " bytes]"
		}
		return s
	}
	// A carriage return restarts the line; what follows the last one wins.
	// (Partial overwrites, where the new text is shorter, are rare enough
	// that showing only the newest text is the more useful choice.)
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '\r' {
			s = s[i+1:]
			break
		}
	}
	out := make([]byte, 0, min(len(s)+8, MaxLineBytes+tabWidth))
	col := 0
	for i := 0; i < len(s); {
		if len(out) >= MaxLineBytes {
			// Tabs, pictures and replacements grow the line: the bound
			// is on what is shown, not only on what came in.
			truncated += len(s) - i
			break
		}
		b := s[i]
		switch {
		case b == 0x1b:
			i = skipEscape(s, i+1)
			continue
		case b == '\t':
			n := tabWidth - col%tabWidth
			for range n {
				out = append(out, ' ')
			}
			col += n
			i++
			continue
		case b == '\b':
			if len(out) > 0 {
				r, size := utf8.DecodeLastRune(out)
				out = out[:len(out)-size]
				col -= runewidth.RuneWidth(r)
			}
			i++
			continue
		case b < 0x20:
			out = utf8.AppendRune(out, rune(0x2400+int(b)))
			col++
			i++
			continue
		case b == 0x7f:
			out = utf8.AppendRune(out, '\u2421')
			col++
			i++
			continue
		case b < 0x80:
			out = append(out, b)
			col++
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		i += size
		switch {
		case r == utf8.RuneError && size == 1:
			out = utf8.AppendRune(out, utf8.RuneError)
			col++
		case r >= 0x80 && r <= 0x9f:
			// C1 controls: 8-bit forms of CSI, OSC and the string
			// introducers are sequences; the rest are dropped.
			switch r {
			case 0x9b:
				i = skipCSI(s, i)
			case 0x9d, 0x90, 0x98, 0x9e, 0x9f:
				i = skipString(s, i)
			}
		case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
			// Bidi embeddings and isolates.
		default:
			out = utf8.AppendRune(out, r)
			col += runewidth.RuneWidth(r)
		}
	}
	if truncated > 0 {
		out = append(out, "…[+"+strconv.Itoa(truncated)+" bytes]"...)
	}
	return string(out)
}

// clean reports whether s is printable ASCII only, the common case that
// needs no copy.
func clean(s string) bool {
	for i := 0; i < len(s); i++ {
		if b := s[i]; b < 0x20 || b >= 0x7f {
			return false
		}
	}
	return true
}

// skipEscape skips an escape sequence whose ESC was just before s[i].
func skipEscape(s string, i int) int {
	if i >= len(s) {
		return i
	}
	switch c := s[i]; {
	case c == '[':
		return skipCSI(s, i+1)
	case c == ']' || c == 'P' || c == 'X' || c == '^' || c == '_':
		return skipString(s, i+1)
	case c >= 0x20 && c <= 0x2f:
		// nF: intermediates then one final byte (e.g. ESC ( B).
		for i < len(s) && s[i] >= 0x20 && s[i] <= 0x2f {
			i++
		}
		if i < len(s) {
			i++
		}
		return i
	}
	return i + 1
}

// skipCSI skips a control sequence's parameters, intermediates and final byte.
func skipCSI(s string, i int) int {
	for i < len(s) {
		c := s[i]
		i++
		if c >= 0x40 && c <= 0x7e {
			return i
		}
		if c < 0x20 || c > 0x7e {
			// A malformed sequence: end it before the offending byte,
			// which is then handled on its own.
			return i - 1
		}
	}
	return i
}

// skipString skips an OSC/DCS-style string up to its terminator: BEL, ST
// (ESC \ or the 8-bit 0x9c), or the end of the line.
func skipString(s string, i int) int {
	for i < len(s) {
		switch s[i] {
		case 0x07:
			return i + 1
		case 0x1b:
			if i+1 < len(s) && s[i+1] == '\\' {
				return i + 2
			}
			return i + 1
		case 0xc2:
			if i+1 < len(s) && s[i+1] == 0x9c {
				return i + 2
			}
		}
		i++
	}
	return i
}

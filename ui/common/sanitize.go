package common

import (
	"strconv"
	"unicode/utf8"

	"github.com/charmbracelet/x/ansi"
)

// MaxLineBytes bounds one displayed line of untrusted output. A command that
// prints megabytes without a newline must not make every frame scan them.
// The bound counts the input's escape sequences too.
const MaxLineBytes = 16 << 10

// MaxSGRBytes bounds one kept SGR sequence, ESC [ and the final m
// included; a longer one is dropped like any other escape sequence.
const MaxSGRBytes = 64

// SGRReset is what ends a line of output that sets colours, so they never
// leak past it.
const SGRReset = "\x1b[m"

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
func SanitizeLine(s string) string { return sanitize(s, false) }

// SanitizeOutputLine is SanitizeLine for a line of command output shown in
// the output view: it keeps colours. Well-formed SGR sequences (ESC [, then
// only digits, ';' and ':', then m; at most MaxSGRBytes; the 8-bit CSI
// form is rewritten as ESC [) are kept; every other escape sequence is
// dropped as by SanitizeLine (cursor movement, erase, modes, OSC titles and
// hyperlinks, DCS/SOS/PM/APC strings). A line whose colours are still set
// at its end gets SGRReset appended (before a truncation mark), so a
// line's style never reaches the next row or the surrounding view. Colours
// set before a carriage return still apply to the text after it, as on a
// terminal.
func SanitizeOutputLine(s string) string { return sanitize(s, true) }

// span is the byte range of a kept SGR sequence in the output.
type span struct{ start, end int }

func sanitize(s string, keepSGR bool) string {
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
	out := make([]byte, 0, len(s)+8)
	var sgrs []span // kept SGR sequences in out, in order
	// A carriage return restarts the line; what follows the last one wins.
	// (Partial overwrites, where the new text is shorter, are rare enough
	// that showing only the newest text is the more useful choice.) The
	// colours set before it still apply.
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '\r' {
			if keepSGR {
				out, sgrs = appendSGRs(out, sgrs, s[:i])
			}
			s = s[i+1:]
			break
		}
	}
	// col is the column at mark: the width of out[mark:] is not yet
	// counted. It is needed only for tab stops, so it is brought up to
	// date at each tab rather than per rune.
	col, mark := 0, len(out)
	// prevOut and prevI are where out and s stood before the element
	// being added: one that takes out past the bound is taken back whole
	// and counted as cut, so no output is longer than MaxLineBytes
	// without saying so (and sanitising the output again changes nothing).
	prevOut, prevI := len(out), 0
	over := func() bool {
		if len(out) <= MaxLineBytes {
			return false
		}
		out = out[:prevOut]
		for len(sgrs) > 0 && sgrs[len(sgrs)-1].start >= prevOut {
			sgrs = sgrs[:len(sgrs)-1]
		}
		truncated += len(s) - prevI
		return true
	}
	for i := 0; i < len(s); {
		if over() {
			break
		}
		if len(out) >= MaxLineBytes {
			// Tabs, pictures and replacements grow the line: the bound
			// is on what is shown, not only on what came in.
			truncated += len(s) - i
			break
		}
		prevOut, prevI = len(out), i
		b := s[i]
		switch {
		case b == 0x1b:
			if keepSGR && i+1 < len(s) && s[i+1] == '[' {
				if n := sgrLen(s, i+2); n > 0 {
					sgrs = append(sgrs, span{len(out), len(out) + 2 + n})
					out = append(out, s[i:i+2+n]...)
					i += 2 + n
					continue
				}
			}
			i = skipEscape(s, i+1)
			continue
		case b == '\t':
			col += ansi.StringWidth(string(out[mark:]))
			n := tabWidth - col%tabWidth
			for range n {
				out = append(out, ' ')
			}
			col += n
			mark = len(out)
			i++
			continue
		case b == '\b':
			out, sgrs, col, mark = backspace(out, sgrs, col, mark)
			i++
			continue
		case b < 0x20:
			out = utf8.AppendRune(out, rune(0x2400+int(b)))
			i++
			continue
		case b == 0x7f:
			out = utf8.AppendRune(out, '\u2421')
			i++
			continue
		case b < 0x80:
			out = append(out, b)
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		i += size
		switch {
		case r == utf8.RuneError && size == 1:
			out = utf8.AppendRune(out, utf8.RuneError)
		case r >= 0x80 && r <= 0x9f:
			// C1 controls: 8-bit forms of CSI, OSC and the string
			// introducers are sequences; the rest are dropped.
			switch r {
			case 0x9b:
				if keepSGR {
					if n := sgrLen(s, i); n > 0 {
						sgrs = append(sgrs, span{len(out), len(out) + 2 + n})
						out = append(out, "\x1b["...)
						out = append(out, s[i:i+n]...)
						i += n
						continue
					}
				}
				i = skipCSI(s, i)
			case 0x9d, 0x90, 0x98, 0x9e, 0x9f:
				i = skipString(s, i)
			}
		case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
			// Bidi embeddings and isolates.
		default:
			out = utf8.AppendRune(out, r)
		}
	}
	over() // the last element
	if n := len(sgrs); n > 0 && !isReset(out[sgrs[n-1].start:sgrs[n-1].end]) {
		out = append(out, SGRReset...)
	}
	if truncated > 0 {
		out = append(out, "…[+"+strconv.Itoa(truncated)+" bytes]"...)
	}
	return string(out)
}

// sgrLen returns the length of a well-formed SGR sequence's parameters and
// final m, starting at s[i] just after its CSI, or 0 if there is none
// there: only digits, ';' and ':', then 'm', within MaxSGRBytes.
func sgrLen(s string, i int) int {
	for j := i; j < len(s) && j-i+2 < MaxSGRBytes; j++ {
		switch c := s[j]; {
		case c == 'm':
			return j - i + 1
		case c >= '0' && c <= '9', c == ';', c == ':':
		default:
			return 0
		}
	}
	return 0
}

// isReset reports whether an SGR sequence (ESC [ … m) resets every
// attribute: no parameters, or a single 0.
func isReset(seq []byte) bool {
	p := seq[2 : len(seq)-1]
	for _, c := range p {
		if c != '0' {
			return false
		}
	}
	return true
}

// appendSGRs appends the well-formed SGR sequences of s (text before a
// carriage return) that are still in effect at its end: those after the
// last full reset.
func appendSGRs(out []byte, sgrs []span, s string) ([]byte, []span) {
	for i := 0; i < len(s); {
		switch {
		case s[i] == 0x1b:
			if i+1 < len(s) && s[i+1] == '[' {
				if n := sgrLen(s, i+2); n > 0 {
					out, sgrs = addSGR(out, sgrs, s[i+2:i+2+n])
					i += 2 + n
					continue
				}
			}
			i = skipEscape(s, i+1)
		case s[i] == 0xc2 && i+1 < len(s) && s[i+1] == 0x9b:
			if n := sgrLen(s, i+2); n > 0 {
				out, sgrs = addSGR(out, sgrs, s[i+2:i+2+n])
				i += 2 + n
				continue
			}
			i = skipCSI(s, i+2)
		case s[i] == 0xc2 && i+1 < len(s) && (s[i+1] == 0x9d || s[i+1] == 0x90 || s[i+1] == 0x98 || s[i+1] == 0x9e || s[i+1] == 0x9f):
			i = skipString(s, i+2)
		default:
			i++
		}
	}
	return out, sgrs
}

// addSGR appends one SGR sequence (its parameters and final m) that
// precedes a carriage return; a full reset drops those before it.
func addSGR(out []byte, sgrs []span, params string) ([]byte, []span) {
	start := len(out)
	out = append(out, "\x1b["...)
	out = append(out, params...)
	if isReset(out[start:]) {
		return out[:0], sgrs[:0]
	}
	return out, append(sgrs, span{start, len(out)})
}

// backspace removes the last shown character from out, stepping over the
// kept SGR sequences after it (they still apply to what follows).
func backspace(out []byte, sgrs []span, col, mark int) ([]byte, []span, int, int) {
	end, k := len(out), len(sgrs)
	for k > 0 && sgrs[k-1].end == end {
		k--
		end = sgrs[k].start
	}
	if end == 0 {
		return out, sgrs, col, mark
	}
	r, size := utf8.DecodeLastRune(out[:end])
	if end <= mark {
		// Already counted in col (a tab's space or what precedes it).
		col -= ansi.StringWidth(string(r))
		mark -= size
	}
	out = append(out[:end-size], out[end:]...)
	for j := k; j < len(sgrs); j++ {
		sgrs[j].start -= size
		sgrs[j].end -= size
	}
	return out, sgrs, col, mark
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

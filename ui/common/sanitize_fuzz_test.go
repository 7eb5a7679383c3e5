package common

import (
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// checkSanitized fails unless s keeps SanitizeLine's promises: valid
// UTF-8 with no C0 control (tabs are expanded, newlines and carriage
// returns consumed, others shown as pictures), no DEL, no C1 control
// (so no escape sequence, 7- or 8-bit, survives: each starts with ESC or
// a C1), no bidi embedding, override or isolate, and at most
// MaxLineBytes and the widest thing one input byte becomes, plus the
// mark of the cut.
func checkSanitized(t *testing.T, in, s string) {
	t.Helper()
	if !utf8.ValidString(s) {
		t.Fatalf("SanitizeLine(%q) = %q: invalid UTF-8", in, s)
	}
	for i, r := range s {
		switch {
		case r < 0x20, r == 0x7f:
			t.Fatalf("SanitizeLine(%q) = %q: control %#x at %d", in, s, r, i)
		case r >= 0x80 && r <= 0x9f:
			t.Fatalf("SanitizeLine(%q) = %q: C1 control %#x at %d", in, s, r, i)
		case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
			t.Fatalf("SanitizeLine(%q) = %q: bidi control %#x at %d", in, s, r, i)
		}
	}
	if max := MaxLineBytes + tabWidth + len("…[+ bytes]") + len(strconv.Itoa(len(in))); len(s) > max {
		t.Fatalf("SanitizeLine of %d bytes = %d bytes, over %d", len(in), len(s), max)
	}
}

// FuzzSanitizeLine sanitises arbitrary command output. Property: the
// result keeps the sanitiser's policy (checkSanitized), sanitising it
// again changes nothing (unless it was cut), and printable ASCII comes
// out as it went in.
func FuzzSanitizeLine(f *testing.F) {
	for _, s := range []string{
		"plain", "crlf\r\n", "\x1b[31mred\x1b[0m", "\x1b]0;title\x07after", "\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\",
		"\x1bP+q544e\x1b\\dcs", "\x1b(Bcharset", "\u009b31mc1csi", "\u009d0;t\u009cc1osc", "10%\r20%\r30%", "a\tb",
		"日本\tx", "bell\x07", "ab\bc", "\xff\xfe", "\u202eevil\u202c", "\x1b[31", "\x1b[3\x07x", "\x1b", "\xc2", "\xc2\x9b",
		"\b\b\tx", "\x1b]\xc2\x9c", "\u2066x\u2069", strings.Repeat("\t", MaxLineBytes), strings.Repeat("\x00", MaxLineBytes+5),
		strings.Repeat("é", MaxLineBytes), "\x1b\x1b[", "e\u0301\b\tx", "\x1bX\x1b", "\x9b",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		out := SanitizeLine(in)
		checkSanitized(t, in, out)
		if !strings.Contains(out, "…[+") {
			if again := SanitizeLine(out); again != out {
				t.Fatalf("SanitizeLine(%q) = %q, which sanitises to %q", in, out, again)
			}
		}
		trimmed := strings.TrimRight(in, "\r\n")
		if clean(trimmed) && len(trimmed) <= MaxLineBytes && out != trimmed {
			t.Fatalf("SanitizeLine(%q) = %q; printable ASCII changed", in, out)
		}
	})
}

package common

import (
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/charmbracelet/x/ansi"
)

func TestSanitizeOutputLine(t *testing.T) {
	sgr64 := "\x1b[" + strings.Repeat("1", 61) + "m" // MaxSGRBytes exactly
	sgr65 := "\x1b[" + strings.Repeat("1", 62) + "m"
	for _, c := range []struct{ name, in, want string }{
		// Colours are kept.
		{"red", "\x1b[31mred\x1b[0m", "\x1b[31mred\x1b[0m"},
		{"green, bare reset", "\x1b[32mok\x1b[m done", "\x1b[32mok\x1b[m done"},
		{"bold", "\x1b[1mbold\x1b[0m", "\x1b[1mbold\x1b[0m"},
		{"256 colours", "\x1b[38;5;208morange\x1b[0m", "\x1b[38;5;208morange\x1b[0m"},
		{"truecolour ;", "\x1b[38;2;255;128;0mtc\x1b[0m", "\x1b[38;2;255;128;0mtc\x1b[0m"},
		{"truecolour :", "\x1b[38:2::255:128:0mtc\x1b[0m", "\x1b[38:2::255:128:0mtc\x1b[0m"},
		{"combined", "\x1b[1;4;31;48;5;17mx\x1b[00m", "\x1b[1;4;31;48;5;17mx\x1b[00m"},
		{"8-bit CSI", "\u009b31mc1\u009b0m", "\x1b[31mc1\x1b[0m"},
		{"longest kept", sgr64 + "x\x1b[0m", sgr64 + "x\x1b[0m"},
		// A reset is appended when colours are still set at the end.
		{"no reset", "\x1b[32mPASS", "\x1b[32mPASS" + SGRReset},
		{"partial reset", "\x1b[1;31mFAIL\x1b[22m", "\x1b[1;31mFAIL\x1b[22m" + SGRReset},
		{"reset then colour", "\x1b[0;31mx", "\x1b[0;31mx" + SGRReset},
		{"colour after text", "x\x1b[31m", "x\x1b[31m" + SGRReset},
		{"reset only", "\x1b[mx", "\x1b[mx"},
		// Everything else is dropped, as by SanitizeLine.
		{"erase, home", "\x1b[2J\x1b[Hclear", "clear"},
		{"cursor up", "\x1b[5Aup\x1b[10;3Hto", "upto"},
		{"erase line", "\x1b[Kx\x1b[2K", "x"},
		{"hide cursor", "\x1b[?25lx\x1b[?25h", "x"},
		{"alt screen", "\x1b[?1049hx", "x"},
		{"private m", "\x1b[?1mx", "x"},
		{"modifyOtherKeys", "\x1b[>4;2mx", "x"},
		{"private param", "\x1b[31;<mx", "x"},
		{"intermediate", "\x1b[1 mx", "x"},
		{"OSC title BEL", "\x1b]0;title\x07after", "after"},
		{"OSC title ST", "\x1b]2;title\x1b\\after", "after"},
		{"hyperlink", "\x1b]8;;http://x\x1b\\\x1b[34mlink\x1b[0m\x1b]8;;\x1b\\", "\x1b[34mlink\x1b[0m"},
		{"DCS", "\x1bP+q544e\x1b\\dcs", "dcs"},
		{"APC", "\x1b_Gi=1;AAAA\x1b\\apc", "apc"},
		{"PM", "\x1b^pm\x1b\\x", "x"},
		{"SOS", "\x1bXsos\x1b\\x", "x"},
		{"8-bit OSC", "\u009d0;t\u009cc1osc", "c1osc"},
		{"8-bit CSI not SGR", "\u009b2Jx", "x"},
		{"charset", "\x1b(Bcharset", "charset"},
		{"save cursor", "\x1b7save\x1b8", "save"},
		{"raw 0x9b byte", "\x9b31mx", "\ufffd31mx"},
		// Malformed, unterminated or oversized SGR is dropped.
		{"unterminated", "\x1b[31", ""},
		{"unterminated after text", "ok\x1b[38;5;2", "ok"},
		{"control inside", "\x1b[3\x07x", "␇x"},
		{"ESC inside", "\x1b[3\x1b[32mx", "\x1b[32mx" + SGRReset},
		{"oversized", sgr65 + "x", "x"},
		{"oversized C1", "\u009b" + strings.Repeat("1", 62) + "mx", "x"},
		// Carriage returns, backspaces, tabs, controls and bidi as before;
		// colours set before a carriage return still apply.
		{"progress", "10%\r20%\r30%", "30%"},
		{"progress in colour", "\x1b[32m10%\r20%", "\x1b[32m20%" + SGRReset},
		{"reset before CR", "\x1b[31mred\x1b[0m\rplain", "plain"},
		{"colours before CR", "\x1b[1m\x1b[31ma\x1b[m\x1b[32mb\x1b]0;t\x07\rc", "\x1b[32mc" + SGRReset},
		{"backspace", "ab\bc", "ac"},
		{"backspace over colour", "ab\x1b[31m\bc", "a\x1b[31mc" + SGRReset},
		{"backspace at start", "\x1b[31m\bx", "\x1b[31mx" + SGRReset},
		{"tab after colour", "\x1b[31mab\x1b[0m\tx", "\x1b[31mab\x1b[0m      x"},
		{"tab after wide", "\x1b[1m日本\x1b[0m\tx", "\x1b[1m日本\x1b[0m    x"},
		{"backspace over tab", "a\tb\b\b\x1b[31mc", "a      \x1b[31mc" + SGRReset},
		{"bell", "\x1b[31mbell\x07", "\x1b[31mbell␇" + SGRReset},
		{"nul, del", "nul\x00del\x7f", "nul␀del␡"},
		{"invalid UTF-8", "\x1b[31m\xff\xfe", "\x1b[31m\ufffd\ufffd" + SGRReset},
		{"bidi", "\x1b[31m\u202eevil\u202c\x1b[0m", "\x1b[31mevil\x1b[0m"},
		{"crlf", "\x1b[31mx\x1b[0m\r\n", "\x1b[31mx\x1b[0m"},
	} {
		if got := SanitizeOutputLine(c.in); got != c.want {
			t.Errorf("%s: SanitizeOutputLine(%q) = %q, want %q", c.name, c.in, got, c.want)
		}
		// Names, causes and the like stay strict: no escapes at all, and
		// the same text.
		strict := SanitizeLine(c.in)
		if strings.ContainsRune(strict, 0x1b) {
			t.Errorf("%s: SanitizeLine(%q) = %q keeps an escape", c.name, c.in, strict)
		}
		if p := ansi.Strip(c.want); p != strict {
			t.Errorf("%s: SanitizeLine(%q) = %q, want the text %q", c.name, c.in, strict, p)
		}
	}
}

func TestSanitizeOutputLineBounds(t *testing.T) {
	// The byte bound counts kept escapes; a sequence cut by it is dropped,
	// and the reset comes before the truncation mark.
	long := strings.Repeat("\x1b[31mab", MaxLineBytes/7+1)
	got := SanitizeOutputLine(long)
	if !strings.HasSuffix(got, SGRReset+"…[+"+itoa(len(long)-MaxLineBytes)+" bytes]") {
		t.Fatalf("suffix %q", got[len(got)-40:])
	}
	if len(got) > MaxLineBytes+64 {
		t.Fatalf("len %d", len(got))
	}
	checkOutputLine(t, long, got)
	// A cut inside a sequence drops the piece.
	cut := strings.Repeat("x", MaxLineBytes-3) + "\x1b[31mred"
	if got := SanitizeOutputLine(cut); !strings.HasPrefix(got, strings.Repeat("x", MaxLineBytes-3)+"…") {
		t.Fatalf("cut sequence kept: %q", got[MaxLineBytes-8:])
	}
}

func itoa(n int) string {
	var b []byte
	for {
		b = append([]byte{byte('0' + n%10)}, b...)
		n /= 10
		if n == 0 {
			return string(b)
		}
	}
}

// Pieces of hostile output for the property test.
var pieces = []string{
	"a", "xyz", " ", "日本", "👍🏽", "e\u0301", "\t", "\b", "\r", "\n", "\x00", "\x07", "\x7f", "\x1b",
	"\x1b[", "\x1b[31m", "\x1b[0m", "\x1b[m", "\x1b[1;32m", "\x1b[38;5;208m", "\x1b[38:2::1:2:3m", "\x1b[48;2;1;2;3m",
	"\x1b[2J", "\x1b[H", "\x1b[?25l", "\x1b[>4;2m", "\x1b[31;<m", "\x1b[3", "\x1b]0;title\x07", "\x1b]8;;http://x\x1b\\",
	"\x1b]", "\x1bP", "\x1b_", "\x1b^", "\x1bX", "\x1b\\", "\x1b(B", "\x1b7", "\u009b", "\u009b31m", "\u009d", "\u009c",
	"\u0085", "\x9b", "\xc2", "\xff", "\u202e", "\u2066", "m", ";", ":", "5", "[",
	"\x1b[" + strings.Repeat("1", 61) + "m", "\x1b[" + strings.Repeat("1", 62) + "m",
}

// checkOutputLine asserts SanitizeOutputLine's guarantees for one input.
func checkOutputLine(t *testing.T, in, out string) {
	t.Helper()
	if !utf8.ValidString(out) {
		t.Fatalf("invalid UTF-8 from %q: %q", in, out)
	}
	last := ""
	for i := 0; i < len(out); {
		if out[i] == 0x1b {
			n := 0
			if i+1 < len(out) && out[i+1] == '[' {
				n = sgrLen(out, i+2)
			}
			if n == 0 {
				t.Fatalf("escape that is no SGR at %d from %q: %q", i, in, out)
			}
			last = out[i : i+2+n]
			i += 2 + n
			continue
		}
		r, size := utf8.DecodeRuneInString(out[i:])
		switch {
		case r < 0x20, r == 0x7f, r >= 0x80 && r <= 0x9f:
			t.Fatalf("control %U at %d from %q: %q", r, i, in, out)
		case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
			t.Fatalf("bidi control %U from %q: %q", r, in, out)
		}
		i += size
	}
	if last != "" && !isReset([]byte(last)) {
		t.Fatalf("colours not reset at the end (last %q) from %q: %q", last, in, out)
	}
	if len(out) > 8*MaxLineBytes+64 {
		t.Fatalf("%d bytes from %d", len(out), len(in))
	}
	// Without its colours the line is what SanitizeLine shows.
	if p, strict := ansi.Strip(out), SanitizeLine(in); p != strict {
		t.Fatalf("text of %q: %q, SanitizeLine %q", in, p, strict)
	}
}

func TestSanitizeOutputLineProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(24, 8))
	for range 20000 {
		var b strings.Builder
		for range rng.IntN(24) {
			b.WriteString(pieces[rng.IntN(len(pieces))])
		}
		in := b.String()
		checkOutputLine(t, in, SanitizeOutputLine(in))
	}
}

func FuzzSanitizeOutputLine(f *testing.F) {
	for _, p := range pieces {
		f.Add(p + "x" + p)
	}
	f.Add("\x1b[32m10%\r\x1b[1m20%\b\t\x1b]0;t\x07done")
	f.Fuzz(func(t *testing.T, in string) {
		checkOutputLine(t, in, SanitizeOutputLine(in))
	})
}

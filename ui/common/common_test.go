package common

import (
	"strings"
	"testing"
	"time"

	"github.com/charmbracelet/colorprofile"
	"github.com/charmbracelet/x/ansi"

	"github.com/berthvm/berth/session"
)

func TestSanitizeLine(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"plain text", "plain text"},
		{"crlf\r\n", "crlf"},
		{"\x1b[31mred\x1b[0m", "red"},
		{"\x1b[2J\x1b[Hclear", "clear"},
		{"\x1b]0;title\x07after", "after"},
		{"\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\", "link"},
		{"\x1bP+q544e\x1b\\dcs", "dcs"},
		{"\x1b(Bcharset", "charset"},
		{"\x1b7save\x1b8", "save"},
		{"\u009b31mc1csi", "c1csi"},
		{"\u009d0;t\u009cc1osc", "c1osc"},
		{"10%\r20%\r30%", "30%"},
		{"a\tb", "a       b"},
		{"abc\tx", "abc     x"},
		{"日本\tx", "日本    x"},
		{"bell\x07", "bell␇"},
		{"nul\x00", "nul␀"},
		{"del\x7f", "del␡"},
		{"ab\bc", "ac"},
		{"\xff\xfe", "\ufffd\ufffd"},
		{"\u202eevil\u202c", "evil"},
		{"\x1b[31", ""},
		{"\x1b[3\x07x", "␇x"},
		{"emoji 👍🏽 ok", "emoji 👍🏽 ok"},
	} {
		if got := SanitizeLine(c.in); got != c.want {
			t.Errorf("SanitizeLine(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	long := strings.Repeat("é", MaxLineBytes)
	got := SanitizeLine(long)
	if !strings.HasSuffix(got, "…[+16384 bytes]") || len(got) > MaxLineBytes+32 {
		t.Fatalf("long line: len %d suffix %q", len(got), got[len(got)-20:])
	}
}

func TestAgo(t *testing.T) {
	now := time.Now()
	for d, want := range map[time.Duration]string{0: "now", 30 * time.Second: "30s ago", 5 * time.Minute: "5m ago", 30 * time.Hour: "30h ago", 72 * time.Hour: "3d ago"} {
		if got := Ago(now, now.Add(-d)); got != want {
			t.Errorf("Ago(%v) = %q, want %q", d, got, want)
		}
	}
	if Ago(now, time.Time{}) != "—" {
		t.Error("zero time")
	}
}

func TestLayout(t *testing.T) {
	b := Block("a\n\x1b[1mbold text that is long\x1b[0m\nc\nd", 10, 3)
	lines := strings.Split(b, "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines", len(lines))
	}
	for _, l := range lines {
		if ansi.StringWidth(l) != 10 {
			t.Fatalf("width %d: %q", ansi.StringWidth(l), l)
		}
	}
	o := Overlay("..........\n..........\n..........", "XX\nYY", 4, 1)
	if o != "..........\n....XX....\n....YY...." {
		t.Fatalf("overlay:\n%s", o)
	}
	if x, y := Center(100, 30, 20, 10); x != 40 || y != 10 {
		t.Fatalf("center %d %d", x, y)
	}
}

func TestPaletteDegrades(t *testing.T) {
	for _, p := range []colorprofile.Profile{colorprofile.TrueColor, colorprofile.ANSI256, colorprofile.ANSI, colorprofile.Ascii, colorprofile.NoTTY} {
		for _, dark := range []bool{true, false} {
			s := NewStyles(dark, p)
			r := s.StateBadge("running")
			switch p {
			case colorprofile.Ascii, colorprofile.NoTTY:
				if strings.Contains(r, "\x1b[3") {
					t.Errorf("%v: colour in %q", p, r)
				}
				if !s.Selected.GetReverse() {
					t.Errorf("%v: selection without reverse video", p)
				}
			default:
				if !strings.Contains(r, "\x1b[") {
					t.Errorf("%v: no colour in %q", p, r)
				}
			}
		}
	}
	if NewPalette(true, colorprofile.TrueColor).OK == NewPalette(false, colorprofile.TrueColor).OK {
		t.Error("light and dark palettes agree")
	}
}

func TestWorkspaceUsed(t *testing.T) {
	for _, c := range []struct {
		s    session.Session
		want string
	}{
		{session.Session{}, "?"},
		{session.Session{WorkspaceMeasuredAt: time.Unix(1, 0)}, "0"},
		{session.Session{WorkspaceUsed: 12 << 20}, "12M"},
	} {
		if got := WorkspaceUsed(c.s); got != c.want {
			t.Errorf("WorkspaceUsed(%+v) = %q, want %q", c.s, got, c.want)
		}
	}
}

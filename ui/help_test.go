package ui

import (
	"strings"
	"testing"

	tea "charm.land/bubbletea/v2"
)

// TestHelpScrollsAndClosesOnlyOnItsKeys: at 80x24 the executions tab's
// help is longer than the screen. Scroll keys and the wheel move it,
// ?, esc and q close it (q does not quit), and every other key is
// ignored while it is open.
func TestHelpScrollsAndClosesOnlyOnItsKeys(t *testing.T) {
	t.Parallel()
	f := fixture()
	h := newHarness(t, f, Options{})
	h.resize(80, 24)
	h.press("enter")
	h.waitFor("executions", func() bool { return h.m.execs.Len() == 4 })
	h.press("?")
	vp := &h.m.helpVP
	if vp.TotalLineCount() <= vp.Height() {
		t.Fatalf("the help fits (%d lines in %d): this test needs one that scrolls", vp.TotalLineCount(), vp.Height())
	}
	if strings.Contains(h.screen(), "cancel execution") || !strings.Contains(h.screen(), "lines 1-") {
		t.Fatalf("the first screen of help shows its end, or not where it is:\n%s", h.screen())
	}
	bottom := vp.TotalLineCount() - vp.Height()
	for _, c := range []struct {
		key  string
		want int
	}{
		{"j", 1}, {"down", 2}, {"k", 1}, {"up", 0},
		{"pgdown", bottom}, {"pgup", 0}, {"space", bottom}, {"home", 0},
		{"ctrl+d", min(bottom, vp.Height()/2)}, {"ctrl+u", 0}, {"G", bottom}, {"g", 0}, {"end", bottom},
	} {
		h.press(c.key)
		if got := vp.YOffset(); got != c.want || !h.m.showHelp {
			t.Fatalf("%s: offset %d, open %v; want %d, open", c.key, got, h.m.showHelp, c.want)
		}
	}
	if !strings.Contains(h.screen(), "K  cancel execution") {
		t.Fatalf("the help's bottom lacks K:\n%s", h.screen())
	}
	h.d.Send(tea.MouseWheelMsg{X: 10, Y: 10, Button: tea.MouseWheelUp})
	if got := vp.YOffset(); got != max(0, bottom-3) {
		t.Fatalf("wheel up: offset %d", got)
	}

	// Keys of the view and its actions do nothing while the help is open.
	for _, k := range []string{"x", "d", "enter", "1", "3", "tab", "p", ":"} {
		h.press(k)
		if !h.m.showHelp || h.m.dialog != nil || h.m.cmdActive || h.m.tab != tabExecs || len(h.m.Pending()) > 0 {
			t.Fatalf("%s with the help open: open %v, dialog %v, command line %v, tab %v, pending %v",
				k, h.m.showHelp, h.m.dialog != nil, h.m.cmdActive, h.m.tab, h.m.Pending())
		}
	}
	if f.Calls("Pause") != 0 {
		t.Fatal("p paused with the help open")
	}

	for i, k := range []string{"?", "esc", "q"} {
		if i > 0 {
			h.press("?")
			if !h.m.showHelp || h.m.helpVP.YOffset() != 0 {
				t.Fatalf("? did not open the help at its top")
			}
		}
		h.press(k)
		if h.m.showHelp || h.d.Quit || h.m.page != pageDetail {
			t.Fatalf("%s: help open %v, quit %v, page %v; want it closed and nothing else", k, h.m.showHelp, h.d.Quit, h.m.page)
		}
	}
}

package ui

import (
	"strings"
	"testing"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/colorprofile"

	"github.com/berthvm/berth/ui/internal/uitest"
)

// Golden screens: every view at 100x30 without colour, a few at 80x24,
// and one with ANSI 256 colours. Run with -update to rewrite them; review
// the diff like code.

func golden(t *testing.T, h *harness) {
	t.Helper()
	uitest.Golden(t, strings.TrimPrefix(t.Name(), "TestGolden/"), h.screen(), *update)
}

func openExec(h *harness, downs int) {
	h.press("enter")
	h.waitFor("executions", func() bool { return h.m.execs.Len() == 4 })
	for range downs {
		h.press("j")
	}
	h.press("enter")
	h.waitFor("output", func() bool { return h.m.output.WindowLines() > 0 })
}

func TestGolden(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		w, h int
		do   func(h *harness)
	}{
		{"sessions", 100, 30, func(h *harness) {}},
		{"sessions_80x24", 80, 24, func(h *harness) {}},
		{"sessions_filter", 100, 30, func(h *harness) { h.press("/"); h.typeText("state:r,p"); h.press("enter") }},
		{"sessions_sort_dirty", 100, 30, func(h *harness) {
			for range 6 { // STATE, VCPU, CPU, MEM, WORKSPACE, DIRTY: left to right
				h.press("o")
			}
		}},
		{"sessions_help", 100, 30, func(h *harness) { h.press("?") }},
		{"sessions_help_80x24", 80, 24, func(h *harness) { h.press("?") }},
		{"sessions_cmdline", 100, 30, func(h *harness) { h.press(":"); h.typeText("create web cpus=2") }},
		{"sessions_flash", 100, 30, func(h *harness) {
			h.press("f")
			h.waitFor("flash", func() bool { return h.flash() != "" })
		}},
		{"executions", 100, 30, func(h *harness) {
			h.press("enter")
			h.waitFor("executions", func() bool { return h.m.execs.Len() == 4 })
		}},
		{"executions_80x24", 80, 24, func(h *harness) {
			h.press("enter")
			h.waitFor("executions", func() bool { return h.m.execs.Len() == 4 })
		}},
		{"output", 100, 30, func(h *harness) { openExec(h, 1) }},
		{"output_80x24", 80, 24, func(h *harness) { openExec(h, 1) }},
		{"output_search_timestamps", 100, 30, func(h *harness) {
			openExec(h, 1)
			h.press("t", "/")
			h.typeText("test")
			h.press("enter", "n")
		}},
		{"output_stderr_only", 100, 30, func(h *harness) { openExec(h, 1); h.press("s", "s") }},
		{"output_lost", 100, 30, func(h *harness) {
			h.press("enter")
			h.waitFor("executions", func() bool { return h.m.execs.Len() == 4 })
			h.press("j", "j", "2")
			h.waitFor("loaded", func() bool { return !h.m.output.Loading() })
		}},
		{"output_help", 100, 30, func(h *harness) { openExec(h, 1); h.press("?") }},
		{"executions_help_80x24", 80, 24, func(h *harness) {
			h.press("enter")
			h.waitFor("executions", func() bool { return h.m.execs.Len() == 4 })
			h.press("?")
		}},
		{"executions_help_80x24_bottom", 80, 24, func(h *harness) {
			h.press("enter")
			h.waitFor("executions", func() bool { return h.m.execs.Len() == 4 })
			h.press("?", "pgdown")
		}},
		{"workspace", 100, 30, func(h *harness) {
			h.press("enter", "3")
			h.waitFor("listing", func() bool { return len(h.m.files.Entries()) > 0 })
			h.press("G", "k")
			h.waitFor("preview", func() bool { return strings.Contains(h.screen(), "A scratch project") })
		}},
		{"workspace_paused", 100, 30, func(h *harness) {
			// The session view opens on a message of its own: a tab key
			// sent before it has opened lands on the list instead.
			h.press("j", "enter")
			h.waitFor("the session view", func() bool { return strings.Contains(h.screen(), "No executions yet") })
			h.press("3")
			h.waitFor("the workspace tab", func() bool { return strings.Contains(h.screen(), "is paused") })
		}},
		{"info", 100, 30, func(h *harness) {
			h.press("enter", "4")
			h.waitFor("timeline", func() bool { return len(h.m.info.Events()) > 0 })
		}},
		{"info_crashed", 100, 30, func(h *harness) {
			h.press("j", "j", "enter", "4")
			h.waitFor("timeline", func() bool { return len(h.m.info.Events()) > 0 })
		}},
		{"dialog_delete", 100, 30, func(h *harness) { h.press("d") }},
		{"dialog_stop", 100, 30, func(h *harness) { h.press("s") }},
		{"dialog_new", 100, 30, func(h *harness) { h.press("n"); h.typeText("web") }},
		{"dialog_exec", 80, 24, func(h *harness) { h.press("x"); h.typeText("make test") }},
		{"restore_unknown_checkpoint_80x24", 80, 24, func(h *harness) {
			h.press(":")
			h.typeText("restore alpha c9")
			h.press("enter")
			h.waitFor("the refusal", func() bool { return h.flash() != "" })
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, fixture(), Options{Who: "alice@host"})
			h.resize(c.w, c.h)
			c.do(h)
			golden(t, h)
		})
	}
}

// TestGoldenANSI256 pins the colours of the sessions view on a dark
// terminal with 256 colours.
func TestGoldenANSI256(t *testing.T) {
	t.Parallel()
	h := newHarness(t, fixture(), Options{Who: "alice@host"})
	h.d.Send(tea.ColorProfileMsg{Profile: colorprofile.ANSI256})
	var b strings.Builder
	w := colorprofile.Writer{Forward: &b, Profile: colorprofile.ANSI256}
	w.WriteString(h.m.Render())
	uitest.Golden(t, "sessions_ansi256", b.String(), *update)
}

// TestGoldenOutputColour pins the output view with a command's own
// colours (kept SGR, each row reset) at 80x24 with 256 colours.
func TestGoldenOutputColour(t *testing.T) {
	t.Parallel()
	h := newHarness(t, fixture(), Options{Who: "alice@host"})
	h.resize(80, 24)
	h.d.Send(tea.ColorProfileMsg{Profile: colorprofile.ANSI256})
	openExec(h, 1)
	var b strings.Builder
	w := colorprofile.Writer{Forward: &b, Profile: colorprofile.ANSI256}
	w.WriteString(h.m.Render())
	uitest.Golden(t, "output_colour_80x24", b.String(), *update)
}

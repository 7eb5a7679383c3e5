package ui_test

import (
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestTUIRunsEndToEnd: a run made with the CLI on a real session shows in
// the real TUI's Runs tab (tmux), with its execution, which opens into its
// output.
func TestTUIRunsEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM and drives the TUI in tmux (not in -short)")
	}
	tmux, err := exec.LookPath("tmux")
	if err != nil {
		t.Skip("tmux is not installed: this test drives the TUI through a tmux pane")
	}
	e := newTUIEnv(t, tmux)
	const name = "runs-e2e"
	e.OK("create", name, "--memory", "256M", "--disk", "128M")
	defer e.run("delete", name, "--yes")
	id := strings.TrimSpace(e.OK("run", "start", name, "--title", "tmux task"))
	e.OK("exec", "--run", id, name, "--", "sh", "-c", "echo from-the-run")

	e.startTUI()
	e.waitFor(t, "● live", uiWait)
	e.waitFor(t, name, uiWait)
	e.keys("Enter")
	e.waitFor(t, "5 Runs", uiWait)
	e.typeText("5")
	s := e.waitUntil(t, "the run with its execution", uiWait, func(s string) bool {
		return strings.Contains(s, id) && strings.Contains(s, "tmux task") && strings.Contains(s, "└ ") && strings.Contains(s, "exited 0")
	})
	if !strings.Contains(s, "open") {
		t.Errorf("the open run is not shown open:\n%s", s)
	}
	e.typeText("j")
	e.keys("Enter")
	e.waitFor(t, "from-the-run", uiWait)

	// Ending it shows, live.
	e.OK("run", "end", id, "--status", "failed")
	e.typeText("5")
	e.waitUntil(t, "the run shown ended", 10*time.Second, func(s string) bool { return strings.Contains(s, "failed") })

	// A run that keeps its start: d lists its files beside the selected
	// one's diff; u puts the selected file back once the name is typed.
	e.OK("exec", name, "--", "sh", "-c", "echo before > kept.txt")
	kid := strings.TrimSpace(e.OK("run", "start", name, "--title", "keep task", "--keep"))
	e.OK("exec", "--run", kid, name, "--", "sh", "-c", "echo after > kept.txt && echo new > made.txt")
	e.waitFor(t, "keep task", 10*time.Second)
	e.typeText("g") // the newest run is on top
	e.typeText("d")
	e.waitUntil(t, "the file list and the first file's diff", 30*time.Second, func(s string) bool {
		return strings.Contains(s, "2 files changed") && strings.Contains(s, " M kept.txt") && strings.Contains(s, " A made.txt") &&
			strings.Contains(s, "-before") && strings.Contains(s, "+after") && !strings.Contains(s, "+new")
	})
	e.typeText("j")
	e.waitUntil(t, "made.txt's diff", uiWait, func(s string) bool { return strings.Contains(s, "+new") && !strings.Contains(s, "+after") })
	e.typeText("u")
	e.waitFor(t, "Undo made.txt?", 10*time.Second)
	e.typeText(name)
	e.keys("Enter")
	e.waitUntil(t, "the undo done and the diff reloaded", 30*time.Second, func(s string) bool {
		return strings.Contains(s, "1 removed") && strings.Contains(s, "1 file changed") && !strings.Contains(s, " A made.txt")
	})
	if got := e.OK("exec", name, "--", "sh", "-c", "test ! -e made.txt && cat kept.txt"); got != "after\n" {
		t.Errorf("after undoing made.txt: %q, want it gone and kept.txt as the run left it", got)
	}
}

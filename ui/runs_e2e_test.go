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
}

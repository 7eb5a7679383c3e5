package ui_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/berthvm/berth/ui/components/hosts"
)

// TestTUIHostsEndToEnd opens the hosts page of the real TUI in tmux
// against a real daemon started without --fleet: the page asks the
// daemon over its socket and says the berth is one host on its own, and
// esc goes back to the sessions. It boots no VM.
func TestTUIHostsEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("drives the TUI in tmux against a daemon (not in -short)")
	}
	tmux, err := exec.LookPath("tmux")
	if err != nil {
		t.Skip("tmux is not installed: this test drives the TUI through a tmux pane")
	}
	e := newTUIEnv(t, tmux)
	e.startTUI()
	e.waitFor(t, "● live", uiWait)
	e.typeText("H")
	s := e.waitFor(t, hosts.NotInFleet, uiWait)
	if !strings.Contains(line(s, 0), "berth › hosts") || !strings.Contains(s, "esc back") {
		t.Fatalf("the hosts page's header or footer is wrong:\n%s", s)
	}
	e.keys("Escape")
	e.waitUntil(t, "the sessions page", uiWait, func(s string) bool { return strings.Contains(line(s, 0), "berth › sessions") })
}

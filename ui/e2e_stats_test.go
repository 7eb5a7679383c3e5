package ui_test

import (
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestTUIGraphsEndToEnd runs the TUI in tmux against a real daemon whose
// session burns CPU: the table's CPU and MEM columns show the sampled
// figures, and the session view's strip draws the graphs.
func TestTUIGraphsEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM and drives the TUI in tmux (not in -short)")
	}
	tmux, err := exec.LookPath("tmux")
	if err != nil {
		t.Skip("tmux is not installed: this test drives the TUI through a tmux pane")
	}
	e := newTUIEnv(t, tmux)
	const name = "graphs"
	e.OK("create", name, "--cpus", "1", "--memory", "256M", "--disk", "256M")
	e.OK("exec", name, "--detach", "--", "sh", "-c", "end=$(($(date +%s)+40)); while [ $(date +%s) -lt $end ]; do :; done")
	e.startTUI()

	// A busy loop under TCG: the VMM's CPU is well above idle.
	busy := regexp.MustCompile(`([0-9]{2,3})%\s+[0-9.]+[KMG]/256M`)
	s := e.waitUntil(t, "the CPU column shows the busy session", 30*time.Second, func(s string) bool {
		m := busy.FindStringSubmatch(row(s, name))
		if m == nil {
			return false
		}
		pct, _ := strconv.Atoi(m[1])
		return pct >= 30
	})
	if r := row(s, name); !strings.Contains(r, "/256M") {
		t.Errorf("MEM shows no use against the size: %q", r)
	}
	e.keys("Enter")
	graph := regexp.MustCompile(`cpu [▁▂▃▄▅▆▇█ ]*[▂▃▄▅▆▇█][▁▂▃▄▅▆▇█ ]* +[0-9]+%`)
	s = e.waitUntil(t, "the session view's graphs", 30*time.Second, func(s string) bool {
		return graph.MatchString(line(s, 1)) && strings.Contains(line(s, 1), "mem ") && strings.Contains(line(s, 1), "dirty ")
	})
	if !strings.Contains(line(s, 2), "1 Executions") {
		t.Errorf("the tabs are not below the graphs:\n%s", strings.Join(lines(s)[:3], "\n"))
	}
	e.typeText("q")
	e.waitFor(t, "[berth exited with status 0]", uiWait)
}

package ui_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/ui/common"
)

// TestTUIEndToEnd runs the real `berth` TUI in tmux against a real daemon
// with a real VM and drives a session's whole life through keystrokes
// (tmux send-keys) and screen reads (tmux capture-pane): create it from
// the form, run a command and watch its output stream in, pause (the
// state shows paused), resume, flush, delete with the typed
// confirmation, and quit. The CLI (`berth ls --json`, `ps`, `logs`,
// `events`) confirms what the screen claims.
func TestTUIEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM and drives the TUI in tmux (not in -short)")
	}
	tmux, err := exec.LookPath("tmux")
	if err != nil {
		t.Skip("tmux is not installed: this test drives the TUI through a tmux pane")
	}
	began := time.Now()
	step := func(what string) { t.Logf("%6.1fs  %s", time.Since(began).Seconds(), what) }

	e := newTUIEnv(t, tmux)
	step("daemon up")
	e.startTUI()

	// The TUI finds the daemon the test started: no second one, live stream.
	e.waitFor(t, "No sessions yet. Press n to create one.", 15*time.Second)
	s := e.waitFor(t, "● live", uiWait)
	if !strings.Contains(line(s, 0), "berth › sessions  0 total") {
		t.Fatalf("header %q, want an empty sessions list", line(s, 0))
	}
	if _, err := os.Stat(filepath.Join(e.Data, "daemon.log")); err == nil {
		t.Fatal("the TUI started a daemon of its own although one was answering")
	}
	step("TUI up")

	const name = "tuie2e"

	// Create from the form: name, vCPUs, memory, disk (image stays default).
	e.typeText("n")
	e.waitFor(t, "New session", uiWait)
	e.typeText(name)
	e.keys("Tab")
	e.typeText("1")
	e.keys("Tab")
	e.typeText("256M")
	e.keys("Tab")
	e.typeText("256M")
	e.waitUntil(t, "the form filled in", uiWait, func(s string) bool {
		return strings.Contains(s, "name    "+name) && strings.Contains(s, "vCPUs   1") &&
			strings.Contains(s, "memory  256M") && strings.Contains(s, "disk    256M")
	})
	e.keys("Enter")
	e.waitFor(t, "creating "+name, uiWait) // the status line's spinner
	step("create submitted")
	s = e.waitFor(t, "created "+name+" (running)", bootWait)
	step("created")
	if r := row(s, name); !strings.Contains(r, "● running") || !strings.HasPrefix(r, "▸") {
		t.Fatalf("row %q, want %s selected and running", r, name)
	}
	cs := e.wantState(name, session.StateRunning)
	if cs.CPUs != 1 || cs.MemoryMiB != 256 || cs.DiskBytes != 256<<20 || cs.Image != "mini" {
		t.Errorf("the form's values did not reach the daemon: %d vCPU, %d MiB, %d disk bytes, image %q",
			cs.CPUs, cs.MemoryMiB, cs.DiskBytes, cs.Image)
	}
	vmPid := cs.Pid
	if vmPid <= 0 || !alive(vmPid) {
		t.Fatalf("ls --json: VMM pid %d is not a live process", vmPid)
	}

	// Run a command; its output must show line by line while it runs.
	const command = "for i in 1 2 3 4 5; do echo tick-$i; sleep 0.6; done; echo all-done"
	e.typeText("x")
	e.waitFor(t, "Run in "+name, uiWait)
	e.typeText(command)
	e.keys("Enter")
	partial := map[int]bool{} // tick lines seen on screens without all-done
	s = e.waitUntil(t, "the command's output, then its exit", 30*time.Second, func(s string) bool {
		ticks := 0
		for i := 1; i <= 5; i++ {
			if hasLine(s, "tick-"+strconv.Itoa(i)) {
				ticks++
			}
		}
		done := hasLine(s, "all-done")
		if ticks > 0 && !done {
			if !strings.Contains(line(s, 3), "· running ·") {
				t.Fatalf("output shown, command not done, but the header says %q", line(s, 3))
			}
			partial[ticks] = true
		}
		return done && strings.Contains(line(s, 3), "· exited · exit 0 ·")
	})
	step(fmt.Sprintf("command ran (%d partial screens before it ended)", len(partial)))
	if len(partial) < 2 {
		t.Errorf("output did not stream in: saw %d distinct partial screens (tick counts %v) before all-done", len(partial), partial)
	}
	if !strings.Contains(line(s, 2), "2 Output") || !strings.Contains(line(s, 0), "berth › "+name) {
		t.Errorf("exec did not open the session's Output tab:\n%s\n%s", line(s, 0), line(s, 2))
	}
	xs := e.Execs(name)
	if len(xs) != 1 {
		t.Fatalf("ps --json: %d executions, want 1", len(xs))
	}
	x := xs[0]
	if x.State != session.ExecExited || x.ExitCode == nil || *x.ExitCode != 0 || x.By != "tui" ||
		strings.Join(x.Argv, " ") != "/bin/sh -c "+command {
		t.Errorf("ps --json: %+v", x)
	}
	if !strings.HasPrefix(line(s, 3), common.ShortID(x.ID)+" · ") {
		t.Errorf("Output header %q does not name execution %s", line(s, 3), x.ID)
	}
	if got, want := e.OK("logs", name, x.ID), "tick-1\ntick-2\ntick-3\ntick-4\ntick-5\nall-done\n"; got != want {
		t.Errorf("berth logs: %q, want %q", got, want)
	}

	// Back to the list; pause. Pause does not flush, and says so.
	e.keys("Escape")
	e.waitFor(t, "berth › sessions", uiWait)
	e.typeText("p")
	s = e.waitUntil(t, name+" paused", uiWait, func(s string) bool {
		return strings.Contains(row(s, name), "‖ paused") && strings.Contains(s, "paused "+name+". Pause does not flush")
	})
	if !strings.Contains(line(s, 0), "1 paused") {
		t.Errorf("header %q does not count the paused session", line(s, 0))
	}
	e.wantState(name, session.StatePaused)
	step("paused")
	// A paused VM cannot flush; the TUI shows the daemon's refusal and hint.
	e.typeText("f")
	e.waitFor(t, "cannot flush session \""+name+"\": it is paused (resume it first)", uiWait)
	e.wantState(name, session.StatePaused)

	// Resume.
	e.typeText("p")
	e.waitUntil(t, name+" resumed", uiWait, func(s string) bool {
		return strings.Contains(row(s, name), "● running") && strings.Contains(s, "resumed "+name)
	})
	e.wantState(name, session.StateRunning)
	step("resumed")

	// Leave writes in the guest's page cache, then flush them.
	e.typeText("x")
	e.waitFor(t, "Run in "+name, uiWait)
	e.typeText("head -c 2000000 /dev/urandom > dirty.bin && echo wrote-dirty")
	e.keys("Enter")
	e.waitUntil(t, "the write to finish", 30*time.Second, func(s string) bool {
		return hasLine(s, "wrote-dirty") && strings.Contains(line(s, 3), "· exited · exit 0 ·")
	})
	e.keys("Escape")
	e.waitFor(t, "berth › sessions", uiWait)
	e.typeText("f")
	s = e.waitFor(t, "flushed "+name+":", 30*time.Second)
	step("flushed")
	if m := regexp.MustCompile(`flushed ` + name + `: (\S+ \S+) made durable in \S+`).FindStringSubmatch(s); m == nil {
		t.Errorf("flush of a 2 MB write did not report bytes made durable:\n%s", line(s, tuiRows-2))
	} else {
		t.Logf("TUI: flushed %s", m[1])
	}
	var flushed bool
	for _, l := range strings.Split(e.OK("events", name), "\n") {
		f := strings.Fields(l)
		flushed = flushed || (len(f) > 4 && f[2] == "flush" && f[3] == "tui")
	}
	if !flushed {
		t.Errorf("berth events has no flush by the TUI:\n%s", e.OK("events", name))
	}
	if s := e.wantState(name, session.StateRunning); s.DirtyBytes >= 2000000 {
		t.Errorf("ls --json: %d dirty bytes after the flush", s.DirtyBytes)
	}

	// Delete: the dialog wants the name typed; a wrong name is refused.
	e.typeText("d")
	e.waitUntil(t, "the delete dialog", uiWait, func(s string) bool {
		return strings.Contains(s, "Delete "+name+" permanently?") && strings.Contains(s, "Type "+name+" to confirm:")
	})
	e.typeText(name[:len(name)-1])
	e.keys("Enter")
	e.waitFor(t, "type "+name+" exactly to confirm", uiWait)
	if _, ok := e.session(name); !ok {
		t.Fatal("a wrong confirmation deleted the session")
	}
	e.typeText(name[len(name)-1:])
	e.keys("Enter")
	e.waitFor(t, "deleted "+name, 60*time.Second)
	s = e.waitFor(t, "No sessions yet.", uiWait)
	step("deleted")
	if row(s, name) != "" || !strings.Contains(line(s, 0), "0 total") {
		t.Errorf("the list still shows %s:\n%s\n%s", name, line(s, 0), row(s, name))
	}
	if _, ok := e.session(name); ok {
		t.Error("berth ls --json still lists the session")
	}
	if _, errs, code := e.run("info", name); code == 0 || !strings.Contains(errs, "not found") {
		t.Errorf("berth info after delete: exit %d, %q", code, errs)
	}
	if _, err := os.Stat(filepath.Join(e.Data, "sessions", name)); !os.IsNotExist(err) {
		t.Errorf("delete left the session's storage (%v)", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for alive(vmPid) {
		if time.Now().After(deadline) {
			t.Fatalf("VMM pid %d still alive after delete", vmPid)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// Quit.
	e.typeText("q")
	e.waitFor(t, "[berth exited with status 0]", uiWait)
	step("quit")
}

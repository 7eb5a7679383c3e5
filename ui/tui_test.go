package ui

import (
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/colorprofile"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/sessiontest"
	"github.com/berthvm/berth/ui/common"
	"github.com/berthvm/berth/ui/internal/uitest"
)

func selected(h *harness) string {
	s, _ := h.m.sessions.Selected()
	return s.Name
}

func TestSessionsNavigation(t *testing.T) {
	t.Parallel()
	h := newHarness(t, fixture(), Options{})
	if got := selected(h); got != "alpha" {
		t.Fatalf("initial selection %q, want alpha", got)
	}
	steps := []struct {
		key, want string
	}{
		{"j", "build-cache"}, {"down", "ci-runner-7"}, {"k", "build-cache"}, {"up", "alpha"},
		{"G", "experiment"}, {"g", "alpha"}, {"end", "experiment"}, {"home", "alpha"},
		{"ctrl+d", "ci-runner-7"}, {"ctrl+u", "alpha"}, {"pgdown", "ci-runner-7"}, {"pgup", "alpha"},
	}
	h.resize(100, 8) // 4 table rows, so a half page is 2 rows
	for _, s := range steps {
		h.press(s.key)
		if got := selected(h); got != s.want {
			t.Fatalf("after %s: selected %q, want %q", s.key, got, s.want)
		}
	}
}

func TestOpenDetailTabsAndBack(t *testing.T) {
	t.Parallel()
	h := newHarness(t, fixture(), Options{})
	h.press("enter")
	if h.m.page != pageDetail || h.m.detail != "alpha" || h.m.tab != tabExecs {
		t.Fatalf("enter: page %v detail %q tab %v", h.m.page, h.m.detail, h.m.tab)
	}
	h.waitFor("executions", func() bool { return h.m.execs.Len() == 4 })
	for _, s := range []struct {
		key  string
		want tab
	}{{"tab", tabOutput}, {"tab", tabFiles}, {"tab", tabInfo}, {"tab", tabExecs}, {"shift+tab", tabInfo},
		{"1", tabExecs}, {"2", tabOutput}, {"3", tabFiles}, {"4", tabInfo}} {
		h.press(s.key)
		if h.m.tab != s.want {
			t.Fatalf("after %s: tab %v, want %v", s.key, h.m.tab, s.want)
		}
	}
	h.press("esc")
	if h.m.page != pageSessions || selected(h) != "alpha" {
		t.Fatalf("esc: page %v selected %q", h.m.page, selected(h))
	}
}

func TestOutputTabOpensSelectedExecution(t *testing.T) {
	t.Parallel()
	h := newHarness(t, fixture(), Options{})
	h.press("enter")
	h.waitFor("executions", func() bool { return h.m.execs.Len() == 4 })
	h.press("j", "2") // x0000002 (go test), newest first after x0000003
	h.waitFor("output", func() bool { return h.m.output.WindowLines() > 0 })
	e, _ := h.m.output.Exec()
	if e.ID != "x0000002bcdefa" {
		t.Fatalf("output shows %s", e.ID)
	}
	if !strings.Contains(h.screen(), "▌ flush_test.go:42") {
		t.Fatalf("stderr not marked:\n%s", h.screen())
	}
}

func TestPauseShowsSpinnerAndNoFlushNote(t *testing.T) {
	t.Parallel()
	f := fixtureWith(sessiontest.Options{Delay: 300 * time.Millisecond})
	h := newHarness(t, f, Options{})
	h.d.Send(keys.Key("p"))
	if p := h.m.Pending(); len(p) != 1 || p[0] != "pausing alpha" {
		t.Fatalf("pending %v", p)
	}
	if !strings.Contains(h.screen(), "pausing alpha…") {
		t.Fatalf("no pending status:\n%s", h.screen())
	}
	h.waitFor("pause", func() bool { return len(h.m.Pending()) == 0 })
	if k, txt := h.m.Flash(); k != common.FlashOK || !strings.Contains(txt, "does not flush") || !strings.Contains(txt, "12 MiB") {
		t.Fatalf("flash %v %q", k, txt)
	}
	h.waitFor("paused state", func() bool { s, _ := h.m.sessions.Get("alpha"); return s.State == session.StatePaused })
	h.press("p")
	h.waitFor("resume", func() bool { s, _ := h.m.sessions.Get("alpha"); return s.State == session.StateRunning })
	if !strings.Contains(h.flash(), "resumed alpha") {
		t.Fatalf("flash %q", h.flash())
	}
}

func TestSleepAndWake(t *testing.T) {
	t.Parallel()
	f := fixture()
	// Only an idle session sleeps: end alpha's running command first.
	if err := f.Cancel(t.Context(), "x0000003cdefab"); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, f, Options{})
	h.press("S")
	h.waitFor("asleep", func() bool { s, _ := h.m.sessions.Get("alpha"); return s.State == session.StateSleeping })
	if !strings.Contains(h.flash(), "alpha is asleep") {
		t.Fatalf("flash %q", h.flash())
	}
	h.press("S")
	h.waitFor("awake", func() bool { s, _ := h.m.sessions.Get("alpha"); return s.State == session.StateRunning })
	if !strings.Contains(h.flash(), "woke alpha") {
		t.Fatalf("flash %q", h.flash())
	}
}

func TestActionErrorsAreFlashed(t *testing.T) {
	t.Parallel()
	f := fixture()
	h := newHarness(t, f, Options{})
	f.FailNext("Pause", errors.New("qmp: stop: device busy"))
	h.press("p")
	h.waitFor("failure", func() bool { return len(h.m.Pending()) == 0 })
	if k, txt := h.m.Flash(); k != common.FlashError || !strings.Contains(txt, "pausing alpha failed: qmp: stop: device busy") {
		t.Fatalf("flash %v %q", k, txt)
	}
	// p follows the transition table: a sleeping session resumes (wakes);
	// where neither pause nor resume is allowed, the service's refusal
	// and its hint are shown.
	h.press("G") // experiment (sleeping)
	h.press("p")
	h.waitFor("woken", func() bool { s, _ := h.m.sessions.Get("experiment"); return s.State == session.StateRunning })
	if !strings.Contains(h.flash(), "woke experiment") {
		t.Fatalf("flash %q", h.flash())
	}
	h.press("k") // docs (stopped)
	h.press("p")
	h.waitFor("refusal", func() bool { return len(h.m.Pending()) == 0 && strings.Contains(h.flash(), "docs") })
	if k, txt := h.m.Flash(); k != common.FlashError || txt != `cannot pause session "docs": it is stopped (start it first)` {
		t.Fatalf("flash %v %q", k, txt)
	}
}

func TestFlushShowsBytes(t *testing.T) {
	t.Parallel()
	f := fixture()
	h := newHarness(t, f, Options{})
	h.press("f")
	h.waitFor("flush", func() bool { return f.Calls("Flush") == 1 && len(h.m.Pending()) == 0 })
	if !strings.Contains(h.flash(), "flushed alpha: 12 MiB made durable in 120ms") {
		t.Fatalf("flash %q", h.flash())
	}
	h.waitFor("dirty zero", func() bool { s, _ := h.m.sessions.Get("alpha"); return s.DirtyBytes == 0 })
	h.press("j", "f") // build-cache is paused: the service refuses, with its hint
	h.waitFor("refusal", func() bool { return f.Calls("Flush") == 2 && len(h.m.Pending()) == 0 })
	if !strings.Contains(h.flash(), `cannot flush session "build-cache": it is paused (resume it first)`) {
		t.Fatalf("flash %q", h.flash())
	}
	if s, _ := h.m.sessions.Get("build-cache"); s.State != session.StatePaused {
		t.Fatalf("build-cache is %s", s.State)
	}
	// The table allows flushing a sleeping session (the TUI used to refuse).
	h.press("G", "f") // experiment is sleeping
	h.waitFor("flush", func() bool { return f.Calls("Flush") == 3 && len(h.m.Pending()) == 0 })
	if !strings.Contains(h.flash(), "flushed experiment: nothing was pending") {
		t.Fatalf("flash %q", h.flash())
	}
}

func TestStopConfirmsAndStartDoesNot(t *testing.T) {
	t.Parallel()
	f := fixture()
	h := newHarness(t, f, Options{})
	h.press("s")
	if h.m.dialog == nil || !strings.Contains(h.screen(), "Stop alpha?") || !strings.Contains(h.screen(), "1 running command(s) will be killed") {
		t.Fatalf("no stop dialog:\n%s", h.screen())
	}
	h.press("n")
	if h.m.dialog != nil || f.Calls("Stop") != 0 {
		t.Fatal("n did not cancel")
	}
	h.press("s")
	h.d.Send(uitest.Key("esc"))
	if h.m.dialog != nil || f.Calls("Stop") != 0 {
		t.Fatal("esc did not cancel")
	}
	h.press("s", "y")
	h.waitFor("stopped", func() bool { s, _ := h.m.sessions.Get("alpha"); return s.State == session.StateStopped })
	h.press("s") // start: no confirmation
	if h.m.dialog != nil {
		t.Fatal("start asked for confirmation")
	}
	h.waitFor("started", func() bool { s, _ := h.m.sessions.Get("alpha"); return s.State == session.StateRunning })
}

func TestDeleteRequiresTypingTheName(t *testing.T) {
	t.Parallel()
	f := fixture()
	h := newHarness(t, f, Options{})
	h.press("d")
	if !strings.Contains(h.screen(), "Delete alpha permanently?") {
		t.Fatalf("no delete dialog:\n%s", h.screen())
	}
	h.press("enter")
	if h.m.dialog == nil || f.Calls("Delete") != 0 || !strings.Contains(h.screen(), "type alpha exactly to confirm") {
		t.Fatalf("enter without the name deleted or closed:\n%s", h.screen())
	}
	h.typeText("alpx")
	h.press("enter")
	if f.Calls("Delete") != 0 {
		t.Fatal("deleted with a wrong name")
	}
	h.press("backspace")
	h.typeText("ha")
	h.press("enter")
	h.waitFor("deleted", func() bool { _, ok := h.m.sessions.Get("alpha"); return !ok })
	if h.flash() != "deleted alpha" {
		t.Fatalf("flash %q", h.flash())
	}
}

// Replace drops the VM's system disk: it asks for the name, says what is
// kept and what is dropped, and reports the result.
func TestReplaceRequiresTypingTheName(t *testing.T) {
	t.Parallel()
	f := fixture()
	h := newHarness(t, f, Options{})
	h.press("R")
	scr := h.screen()
	if !strings.Contains(scr, "Replace the VM of alpha?") || !strings.Contains(scr, "Kept: every file in /workspace") {
		t.Fatalf("no replace dialog:\n%s", scr)
	}
	h.press("enter")
	if f.Calls("Replace") != 0 {
		t.Fatal("replaced without the name typed")
	}
	h.typeText("alpha")
	h.press("enter")
	h.waitFor("replaced", func() bool { return strings.HasPrefix(h.flash(), "replaced alpha") })
	if f.Calls("Replace") != 1 || !strings.Contains(h.flash(), "/workspace kept") {
		t.Fatalf("calls %d, flash %q", f.Calls("Replace"), h.flash())
	}
}

func TestNewSessionForm(t *testing.T) {
	t.Parallel()
	f := fixture()
	h := newHarness(t, f, Options{})
	h.press("n")
	h.typeText("Bad Name")
	h.press("enter")
	if h.m.dialog == nil || !strings.Contains(h.screen(), "invalid session name") {
		t.Fatalf("invalid name accepted:\n%s", h.screen())
	}
	for range len("Bad Name") {
		h.d.Send(uitest.Key("backspace"))
	}
	h.typeText("web")
	h.press("tab")
	h.typeText("4")
	h.d.Send(uitest.Key("tab"))
	h.typeText("2G")
	h.d.Send(uitest.Key("shift+tab"), uitest.Key("shift+tab"), uitest.Key("shift+tab"))
	h.press("enter")
	h.waitFor("created", func() bool { _, ok := h.m.sessions.Get("web"); return ok })
	s, _ := h.m.sessions.Get("web")
	if s.CPUs != 4 || s.MemoryMiB != 2048 {
		t.Fatalf("created %+v", s)
	}
	h.waitFor("selected", func() bool { return selected(h) == "web" })
}

func TestExecOpensOutput(t *testing.T) {
	t.Parallel()
	f := fixture()
	h := newHarness(t, f, Options{})
	h.press("x")
	h.typeText("echo hi")
	h.press("enter")
	h.waitFor("output", func() bool { return h.m.tab == tabOutput && strings.Contains(h.screen(), "ran: /bin/sh -c echo hi") })
	if h.m.page != pageDetail || h.m.detail != "alpha" {
		t.Fatalf("page %v detail %q", h.m.page, h.m.detail)
	}
	h.waitFor("exit", func() bool { e, _ := h.m.output.Exec(); return e.State == session.ExecExited })
}

func TestCancelExecutionConfirms(t *testing.T) {
	t.Parallel()
	f := fixture()
	h := newHarness(t, f, Options{})
	h.press("enter")
	h.waitFor("executions", func() bool { return h.m.execs.Len() == 4 })
	if e, _ := h.m.execs.Selected(); e.State != session.ExecRunning {
		t.Fatalf("selected %v", e.State)
	}
	h.press("K")
	if !strings.Contains(h.screen(), "There is no rollback") {
		t.Fatalf("no cancel dialog:\n%s", h.screen())
	}
	h.press("y")
	h.waitFor("cancelled", func() bool { e, _ := h.m.execs.Selected(); return e.State == session.ExecCancelled })
	h.press("K")
	if !strings.Contains(h.flash(), "already cancelled") {
		t.Fatalf("flash %q", h.flash())
	}
	// K is not an action on the sessions page.
	h.press("esc", "K")
	if h.m.dialog != nil {
		t.Fatal("K opened a dialog on the sessions page")
	}
}

// TestHelpShowsEveryKeyOfTheView: at 100x30 and at 80x24 the help of
// every view lists each of its keys with its description, scrolling where
// they do not fit on one screen.
func TestHelpShowsEveryKeyOfTheView(t *testing.T) {
	t.Parallel()
	h := newHarness(t, fixture(), Options{})
	for _, size := range [][2]int{{100, 30}, {80, 24}} {
		h.resize(size[0], size[1])
		h.press("esc")
		for _, view := range []func(){
			func() {},
			func() { h.press("enter") },
			func() { h.press("2") },
			func() { h.press("3") },
			func() { h.press("4") },
		} {
			view()
			h.press("?")
			seen := h.screen()
			for i := 0; !h.m.helpVP.AtBottom(); i++ {
				if i > 100 {
					t.Fatal("the help does not reach its bottom")
				}
				h.press("j")
				seen += h.screen()
			}
			for _, g := range h.m.helpGroups() {
				for _, b := range g {
					re := regexp.MustCompile(regexp.QuoteMeta(b.Help().Key) + " +" + regexp.QuoteMeta(b.Help().Desc))
					if b.Enabled() && !re.MatchString(seen) {
						t.Errorf("%dx%d: help lacks %s %q:\n%s", size[0], size[1], b.Help().Key, b.Help().Desc, seen)
					}
				}
			}
			h.press("?")
			if h.m.showHelp {
				t.Fatal("help did not close")
			}
		}
	}
	// In Output, s and n belong to the view, so the actions are hidden.
	h.press("2")
	for _, b := range h.m.actionBindings() {
		if k := b.Help().Key; k == "s" || k == "n" {
			t.Errorf("action %s not shadowed in Output", k)
		}
	}
}

func TestCommandLine(t *testing.T) {
	t.Parallel()
	f := fixture()
	h := newHarness(t, f, Options{})
	run := func(line string) {
		h.press(":")
		h.typeText(line)
		h.press("enter")
	}
	run("create web cpus=3 mem=1G")
	h.waitFor("created", func() bool { s, ok := h.m.sessions.Get("web"); return ok && s.CPUs == 3 })
	run("checkpoint web")
	h.waitFor("checkpoint", func() bool { return f.Calls("Checkpoint") == 1 })
	run("create web2 from=web@c1")
	h.waitFor("created from a checkpoint", func() bool { s, ok := h.m.sessions.Get("web2"); return ok && s.CPUs == 3 && s.MemoryMiB == 1024 })
	run("flush alpha")
	h.waitFor("flush", func() bool { return f.Calls("Flush") == 1 })
	run("exec alpha ls -la")
	h.waitFor("exec output", func() bool { return strings.Contains(h.screen(), "ran: /bin/sh -c ls -la") })
	run("bogus")
	if !strings.Contains(h.flash(), "unknown command :bogus") {
		t.Fatalf("flash %q", h.flash())
	}
	run("sort dirty")
	if c, desc := h.m.sessions.Sort(); c != 5 || !desc {
		t.Fatalf("sort %v %v", c, desc)
	}
	h.press(":")
	h.typeText("quit")
	h.press("esc")
	if h.m.cmdActive || h.d.Quit {
		t.Fatal("esc did not close the command line")
	}
	run("q")
	if !h.d.Quit {
		t.Fatal(":q did not quit")
	}
}

func TestQuitKeys(t *testing.T) {
	t.Parallel()
	for _, k := range []string{"q", "ctrl+c"} {
		h := newHarness(t, fixture(), Options{})
		h.press(k)
		if !h.d.Quit || h.m.c.Ctx.Err() == nil {
			t.Fatalf("%s: quit %v, ctx %v", k, h.d.Quit, h.m.c.Ctx.Err())
		}
	}
}

func TestReadOnlyHidesAndRefusesActions(t *testing.T) {
	t.Parallel()
	f := fixture()
	h := newHarness(t, f, Options{ReadOnly: true, Who: "viewer"})
	if len(h.m.actionBindings()) != 0 {
		t.Fatalf("actions in read-only: %v", h.m.actionBindings())
	}
	for _, k := range []string{"p", "S", "f", "s", "d", "n", "x"} {
		h.press(k)
		if h.m.dialog != nil || len(h.m.Pending()) > 0 {
			t.Fatalf("%s did something in read-only mode", k)
		}
	}
	h.press("?")
	if strings.Contains(h.screen(), "pause/resume") || strings.Contains(h.screen(), "delete session") {
		t.Fatalf("help shows actions:\n%s", h.screen())
	}
	h.press("esc")
	for _, line := range []string{"create web", "flush alpha", "delete alpha", "exec alpha ls"} {
		h.press(":")
		h.typeText(line)
		h.press("enter")
		if !strings.HasPrefix(h.flash(), "read-only:") {
			t.Fatalf("%s: flash %q", line, h.flash())
		}
	}
	for _, op := range []string{"Create", "Flush", "Delete", "Exec", "Pause", "Stop"} {
		if n := f.Calls(op); n != 0 {
			t.Errorf("%s called %d times", op, n)
		}
	}
	if !strings.Contains(h.screen(), "read-only") || !strings.Contains(h.screen(), "viewer") {
		t.Fatalf("no read-only marker:\n%s", h.screen())
	}
}

func TestLiveEvents(t *testing.T) {
	t.Parallel()
	f := fixture()
	h := newHarness(t, f, Options{})
	f.Update("docs", func(s *session.Session) { s.WorkspaceUsed = 1 << 30 })
	h.waitFor("stats", func() bool { s, _ := h.m.sessions.Get("docs"); return s.WorkspaceUsed == 1<<30 })
	f.Crash("alpha", "VMM killed by SIGKILL")
	h.waitFor("crash", func() bool { return strings.Contains(h.screen(), "2 crashed") })
	f.AddSession(session.Session{Name: "zeta", State: session.StateRunning, CPUs: 1})
	h.waitFor("new session", func() bool { _, ok := h.m.sessions.Get("zeta"); return ok })
	f.Delete(t.Context(), "docs")
	h.waitFor("deletion", func() bool { _, ok := h.m.sessions.Get("docs"); return !ok })
}

func TestDetailFollowsEventsAndDeletion(t *testing.T) {
	t.Parallel()
	f := fixture()
	h := newHarness(t, f, Options{})
	h.press("enter", "4")
	h.waitFor("timeline", func() bool { return len(h.m.info.Events()) > 0 })
	n := len(h.m.info.Events())
	f.Note("alpha", session.EventNote, "snapshot taken")
	h.waitFor("note", func() bool { return len(h.m.info.Events()) == n+1 })
	if !strings.Contains(h.screen(), "snapshot taken") {
		t.Fatalf("note not shown:\n%s", h.screen())
	}
	f.Delete(t.Context(), "alpha")
	h.waitFor("back", func() bool { return h.m.page == pageSessions })
	if !strings.Contains(h.flash(), "alpha was deleted") {
		t.Fatalf("flash %q", h.flash())
	}
}

func TestWatchReconnectsAndReconciles(t *testing.T) {
	t.Parallel()
	f := fixture()
	h := newHarness(t, f, Options{})
	if !h.m.connected {
		t.Fatal("not connected")
	}
	f.CloseWatchers()
	h.waitFor("disconnect", func() bool { return !h.m.connected })
	if !strings.Contains(h.screen(), "reconnecting") {
		t.Fatalf("no reconnecting marker:\n%s", h.screen())
	}
	// Deleted while disconnected: no event reaches the UI.
	f.Delete(t.Context(), "docs")
	h.waitFor("reconnect", func() bool { return h.m.connected })
	h.waitFor("reconcile", func() bool { _, ok := h.m.sessions.Get("docs"); return !ok })
}

func TestWatchBatchesBursts(t *testing.T) {
	t.Parallel()
	ch := make(chan session.Event, 2000)
	for i := range 1000 {
		ch <- session.Event{Kind: session.EventStats, Name: "s", Seq: uint64(i + 1)}
	}
	msg := waitEvents(1, ch)().(eventsMsg)
	if len(msg.events) != 1000 || msg.closed {
		t.Fatalf("one wait returned %d events (closed %v), want the whole burst", len(msg.events), msg.closed)
	}
	close(ch)
	if msg := waitEvents(1, ch)().(eventsMsg); !msg.closed {
		t.Fatal("closed stream not reported")
	}
}

func TestMouse(t *testing.T) {
	t.Parallel()
	h := newHarness(t, fixture(), Options{})
	// Row 0 header, row 1 table header, row 2 alpha, row 3 build-cache.
	h.d.Send(tea.MouseClickMsg{X: 10, Y: 3, Button: tea.MouseLeft})
	if got := selected(h); got != "build-cache" {
		t.Fatalf("click selected %q", got)
	}
	h.d.Send(tea.MouseWheelMsg{X: 10, Y: 5, Button: tea.MouseWheelDown})
	if got := selected(h); got != "experiment" {
		t.Fatalf("wheel selected %q", got)
	}
	// Clicking the DIRTY header sorts by it.
	hdr := strings.Split(h.screen(), "\n")[1]
	h.d.Send(tea.MouseClickMsg{X: col(hdr, "DIRTY") + 1, Y: 1, Button: tea.MouseLeft})
	if c, _ := h.m.sessions.Sort(); c != 5 {
		t.Fatalf("header click sorted by %v", c)
	}
	// Tabs are clickable in the detail view.
	h.d.Send(tea.MouseClickMsg{X: 0, Y: 2, Button: tea.MouseLeft})
	h.press("g", "enter")
	tabs := strings.Split(h.screen(), "\n")[2] // below the header and the graphs
	h.d.Send(tea.MouseClickMsg{X: col(tabs, "Info"), Y: 2, Button: tea.MouseLeft})
	if h.m.tab != tabInfo {
		t.Fatalf("tab click: %v\n%s", h.m.tab, tabs)
	}
}

func TestWorkspaceExplainsUnavailableSessions(t *testing.T) {
	t.Parallel()
	f := fixture()
	h := newHarness(t, f, Options{})
	for _, c := range []struct{ name, want string }{
		{"build-cache", "is paused"}, {"docs", "is stopped"}, {"ci-runner-7", "crashed (VMM killed by SIGKILL"}, {"experiment", "is sleeping"},
	} {
		h.press("esc")
		h.m.sessions.Select(c.name)
		h.press("enter", "3")
		if !strings.Contains(h.screen(), c.want) {
			t.Errorf("%s: want %q:\n%s", c.name, c.want, h.screen())
		}
	}
	if n := f.Calls("ListDir"); n != 0 {
		t.Fatalf("ListDir called %d times for unavailable sessions", n)
	}
}

func TestWorkspaceCallsTimeOut(t *testing.T) {
	t.Parallel()
	f := fixture()
	f.Hang("ListDir", "Stat", "ReadFile")
	h := newHarness(t, f, Options{})
	h.m.c.CallTimeout = 150 * time.Millisecond
	h.press("enter", "3")
	h.waitFor("timeout", func() bool { return strings.Contains(h.screen(), "no answer within 150ms") })
}

func TestTinyWindow(t *testing.T) {
	t.Parallel()
	h := newHarness(t, fixture(), Options{})
	h.resize(30, 8)
	if !strings.Contains(h.screen(), "needs at least") {
		t.Fatalf("no size message:\n%s", h.screen())
	}
	for _, sz := range [][2]int{{80, 24}, {100, 30}, {200, 60}, {41, 11}} {
		h.resize(sz[0], sz[1])
		for _, view := range []string{"esc", "enter", "2", "3", "4", "?"} {
			h.press(view)
			lines := strings.Split(h.m.Render(), "\n")
			if len(lines) != sz[1] {
				t.Fatalf("%dx%d %s: %d lines", sz[0], sz[1], view, len(lines))
			}
			for i, l := range lines {
				if w := lipglossWidth(l); w != sz[0] {
					t.Fatalf("%dx%d %s: line %d is %d wide: %q", sz[0], sz[1], view, i, w, l)
				}
			}
			h.press("1")
		}
	}
}

func TestDaemonStatusAndWho(t *testing.T) {
	t.Parallel()
	h := newHarness(t, fixture(), Options{Who: "alice@host", DaemonStatus: func() string { return "ok, 5 VMs" }})
	h.waitFor("daemon status", func() bool { return strings.Contains(h.screen(), "daemon: ok, 5 VMs") })
	if !strings.Contains(h.screen(), "alice@host") {
		t.Fatal("who missing")
	}
}

func TestStylesFollowBackgroundAndProfile(t *testing.T) {
	t.Parallel()
	h := newHarness(t, fixture(), Options{})
	h.d.Send(tea.ColorProfileMsg{Profile: colorprofile.TrueColor})
	dark := h.m.c.Styles.Palette.OK
	h.d.Send(tea.BackgroundColorMsg{Color: whiteBG{}})
	light := h.m.c.Styles.Palette.OK
	if dark == light {
		t.Fatal("palette ignores the background")
	}
	h.d.Send(tea.ColorProfileMsg{Profile: colorprofile.Ascii})
	if _, ok := h.m.c.Styles.Palette.OK.(interface{ RGBA() (r, g, b, a uint32) }); !ok {
		t.Fatal("no colour value")
	}
	// NO_COLOR: the selected row must still be visible (reverse video).
	if !strings.Contains(h.m.Render(), "\x1b[") || !slices.Contains([]bool{h.m.c.Styles.Selected.GetReverse()}, true) {
		t.Fatal("selection not visible without colour")
	}
}

type whiteBG struct{}

func (whiteBG) RGBA() (r, g, b, a uint32) { return 0xffff, 0xffff, 0xffff, 0xffff }

// col returns the screen column where sub starts in a plain line.
func col(line, sub string) int { return lipglossWidth(line[:strings.Index(line, sub)]) }

// A host disk below the floor shows in the header until it recovers.
func TestHostDiskBanner(t *testing.T) {
	t.Parallel()
	f := fixture()
	h := newHarness(t, f, Options{})
	if strings.Contains(h.screen(), "host disk") {
		t.Fatalf("banner with room to spare:\n%s", h.screen())
	}
	f.SetHost(session.HostStatus{DataDir: "/data", Free: 300 << 20, Floor: 1 << 30, Below: true})
	h.waitFor("banner", func() bool { return strings.Contains(h.screen(), "host disk low: 300M free, floor 1.0G") })
	f.SetHost(session.HostStatus{DataDir: "/data", Free: 5 << 30, Floor: 1 << 30})
	h.waitFor("banner gone", func() bool { return !strings.Contains(h.screen(), "host disk") })
}

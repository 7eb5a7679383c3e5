package ui

import (
	"strings"
	"testing"
)

// c takes a checkpoint through a form, u restores the newest after the
// name is typed, F forks into the name asked and selects the fork.
func TestCheckpointRestoreForkKeys(t *testing.T) {
	t.Parallel()
	f := fixture()
	h := newHarness(t, f, Options{})
	h.press("c")
	if !strings.Contains(h.screen(), "Checkpoint alpha") {
		t.Fatalf("no checkpoint form:\n%s", h.screen())
	}
	h.typeText("green")
	h.press("enter")
	h.waitFor("checkpointed", func() bool { return strings.HasPrefix(h.flash(), "checkpoint c1 of alpha") })
	if f.Calls("Checkpoint") != 1 {
		t.Fatalf("Checkpoint calls %d", f.Calls("Checkpoint"))
	}

	h.press("u")
	scr := h.screen()
	if !strings.Contains(scr, "Restore alpha?") || !strings.Contains(scr, "automatic checkpoint") {
		t.Fatalf("no restore dialog:\n%s", scr)
	}
	h.press("enter")
	if f.Calls("Restore") != 0 {
		t.Fatal("restored without the name typed")
	}
	h.typeText("alpha")
	h.press("enter")
	h.waitFor("restored", func() bool { return strings.HasPrefix(h.flash(), "restored alpha to c1") })

	h.press("F")
	if !strings.Contains(h.screen(), "Fork alpha") {
		t.Fatalf("no fork form:\n%s", h.screen())
	}
	h.typeText("Bad Name")
	h.press("enter")
	if h.m.dialog == nil || !strings.Contains(h.screen(), "invalid session name") {
		t.Fatalf("invalid fork name accepted:\n%s", h.screen())
	}
	for range len("Bad Name") {
		h.press("backspace")
	}
	h.typeText("alpha-2")
	h.press("enter")
	h.waitFor("forked", func() bool { _, ok := h.m.sessions.Get("alpha-2"); return ok })
	h.waitFor("selected", func() bool { return selected(h) == "alpha-2" })
}

package ui

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/berthvm/berth/session"
)

// TestActionTable checks the table's entries are whole: every action can
// be reached, says what it does, and asks what its kind of confirmation
// needs.
func TestActionTable(t *testing.T) {
	t.Parallel()
	acts := actionTable()
	verbs, keysSeen := map[string]bool{}, map[string]bool{}
	for i, a := range acts {
		keyed := len(a.key.Keys()) > 0
		switch {
		case a.run == nil:
			t.Errorf("action %d (%v %s) has no handler", i, a.verbs, a.key.Help().Key)
		case !keyed && len(a.verbs) == 0:
			t.Errorf("action %d has neither a key nor a verb", i)
		case keyed && a.key.Help().Desc == "":
			t.Errorf("key %s has no help", a.key.Help().Key)
		case a.confirm != noConfirm && a.prompt == nil:
			t.Errorf("action %d (%v) confirms without a prompt", i, a.verbs)
		case a.confirm == confirmName && a.target != onSession:
			t.Errorf("action %d (%v) wants a session's name typed but has no session", i, a.verbs)
		}
		for _, v := range a.verbs {
			if verbs[v] {
				t.Errorf("verb %q is in the table twice", v)
			}
			verbs[v] = true
		}
		for _, k := range a.key.Keys() {
			if keysSeen[k] {
				t.Errorf("key %q is in the table twice", k)
			}
			keysSeen[k] = true
		}
	}
	sugg := commandSuggestions(acts)
	for _, a := range acts {
		if len(a.verbs) > 0 && !slices.ContainsFunc(sugg, func(s string) bool { return strings.TrimSpace(s) == a.verbs[0] }) {
			t.Errorf("no suggestion for :%s", a.verbs[0])
		}
	}
	if got := len(actionKeys()); got != len(keysSeen) {
		t.Errorf("actionKeys has %d bindings, the table %d keys", got, len(keysSeen))
	}
}

// TestPickFollowsTransitions: a toggle key does the first of its actions
// the transition table allows, and otherwise asks for the first (the
// service then refuses it with a hint).
func TestPickFollowsTransitions(t *testing.T) {
	t.Parallel()
	pr := []session.Action{session.ActionPause, session.ActionResume}
	ss := []session.Action{session.ActionStart, session.ActionStop}
	for _, c := range []struct {
		state session.State
		of    []session.Action
		want  session.Action
	}{
		{session.StateRunning, pr, session.ActionPause},
		{session.StatePaused, pr, session.ActionResume},
		{session.StateSleeping, pr, session.ActionResume},
		{session.StateStopped, pr, session.ActionPause},
		{session.StateRunning, ss, session.ActionStop},
		{session.StatePaused, ss, session.ActionStop},
		{session.StateStopped, ss, session.ActionStart},
		{session.StateCrashed, ss, session.ActionStart},
		{session.StateSleeping, ss, session.ActionStart},
		{session.StateStopping, ss, session.ActionStart},
	} {
		if got := pick(c.state, c.of...); got != c.want {
			t.Errorf("pick(%s, %v) = %s, want %s", c.state, c.of, got, c.want)
		}
	}
}

// TestCommandVerbs runs each ":" verb against the fixture's sessions: it
// acts, asks, or shows the service's refusal.
func TestCommandVerbs(t *testing.T) {
	t.Parallel()
	state := func(name string, want session.State) func(h *harness) bool {
		return func(h *harness) bool { s, _ := h.m.sessions.Get(name); return s.State == want }
	}
	dialog := func(title string) func(h *harness) bool {
		return func(h *harness) bool { return h.m.dialog != nil && strings.Contains(h.screen(), title) }
	}
	flash := func(text string) func(h *harness) bool {
		return func(h *harness) bool { return len(h.m.Pending()) == 0 && strings.Contains(h.flash(), text) }
	}
	for _, c := range []struct {
		line string
		done func(h *harness) bool
	}{
		{"pause alpha", state("alpha", session.StatePaused)},
		{"pause docs", flash(`cannot pause session "docs": it is stopped (start it first)`)},
		{"resume build-cache", state("build-cache", session.StateRunning)},
		{"resume experiment", flash("woke experiment in")},
		{"sleep alpha", flash(`cannot sleep session "alpha": 1 command(s) still running`)},
		{"sleep build-cache", flash(`cannot sleep session "build-cache": it is paused (resume it first)`)},
		{"flush experiment", flash("flushed experiment: nothing was pending")},
		{"start docs", state("docs", session.StateRunning)},
		{"start alpha", flash(`cannot start session "alpha": it is already running`)},
		{"stop alpha", dialog("Stop alpha?")},
		{"delete docs", dialog("Delete docs permanently?")},
		{"open docs", func(h *harness) bool { return h.m.page == pageDetail && h.m.detail == "docs" }},
		{"pause nosuch", flash("no session nosuch")},
		{"exec alpha", flash(":exec NAME COMMAND")},
		{"create web bogus", flash(":create NAME [cpus=N] [mem=SIZE] [disk=SIZE] [image=NAME] [from=SESSION@ID]")},
		{"create web from=alpha@", flash(`From "alpha@": the checkpoint id after @ is empty or malformed`)},
		{"create web from=alpha", flash(`From alpha: session "alpha" has no checkpoints (take one of it first)`)},
		{"create web from=alpha image=mini", flash(`Image "mini" cannot be chosen for a session made from a checkpoint`)},
		{"create web mem=512", flash(`memory "512": 512 means 512 bytes; want a whole number of MiB (did you mean 512M?)`)},
		{"create web_1", flash(`invalid session name "web_1"`)},
		{"create web cpus=0", flash(`vCPUs "0": a number from 1 to 64`)},
		{"create web cpus=65", flash(`vCPUs "65": a number from 1 to 64`)},
		{"create web mem=512M disk=1G", func(h *harness) bool {
			s, ok := h.m.sessions.Get("web")
			return ok && s.MemoryMiB == 512 && s.DiskBytes == 1<<30
		}},
		{"new", dialog("New session")},
		{"x alpha true", flash("started ")},
		{"help", func(h *harness) bool { return h.m.showHelp }},
		{"q!", func(h *harness) bool { return h.d.Quit }},
	} {
		t.Run(c.line, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, fixture(), Options{})
			h.press(":")
			h.typeText(c.line)
			h.press("enter")
			h.waitFor(c.line, func() bool { return c.done(h) })
		})
	}
}

// TestReadOnlyRefusesEveryMutatingVerb: read-only mode comes from the
// table, for every key and verb of every action that changes something.
func TestReadOnlyRefusesEveryMutatingVerb(t *testing.T) {
	t.Parallel()
	f := fixture()
	h := newHarness(t, f, Options{ReadOnly: true})
	for _, a := range h.m.actions {
		if !a.mutates() {
			continue
		}
		if a.key.Enabled() {
			t.Errorf("key %s enabled in read-only mode", a.key.Help().Key)
		}
		for _, v := range a.verbs {
			h.press(":")
			h.typeText(v + " alpha true")
			h.press("enter")
			if want := "read-only: :" + v + " is not allowed"; h.flash() != want || h.m.dialog != nil {
				t.Errorf(":%s: flash %q, want %q", v, h.flash(), want)
			}
		}
	}
	if len(h.m.Pending()) > 0 {
		t.Errorf("pending %v", h.m.Pending())
	}
}

// deny is a Permit that refuses the actions named, as an SSH key's role
// would.
func deny(refused ...session.Action) func(context.Context, session.Action) error {
	return func(_ context.Context, a session.Action) error {
		if slices.Contains(refused, a) {
			return fmt.Errorf("role operator may not %s sessions (needs admin): %w", a, session.ErrPermission)
		}
		return nil
	}
}

// TestChecksComeBeforeConfirmation: what can be known before an action
// asks for confirmation is checked first — the role's permission, the
// session's state, the checkpoint a restore names — so a refusal comes
// instead of the question, not after the name was typed.
func TestChecksComeBeforeConfirmation(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		permit func(context.Context, session.Action) error
		keys   []string
		line   string
		flash  string // the refusal; "" when the dialog must open
		dialog string
	}{
		{name: "restore an unknown checkpoint", line: "restore alpha c9", flash: `alpha has no checkpoint "c9" (the Info tab lists its checkpoints)`},
		{name: "restore without checkpoints", keys: []string{"u"}, flash: "alpha has no checkpoints (c takes one)"},
		{name: "stop a stopped session", line: "stop docs", flash: `cannot stop session "docs": it is already stopped`},
		{name: "delete refused by the role", permit: deny(session.ActionDelete), keys: []string{"d"},
			flash: "not allowed: role operator may not delete sessions (needs admin): permission denied"},
		{name: "replace refused by the role", permit: deny(session.ActionReplace), keys: []string{"R"}, flash: "role operator may not replace sessions"},
		{name: "the role before the checkpoint", permit: deny(session.ActionRestore), line: "restore alpha c9", flash: "role operator may not restore sessions"},
		{name: "stop allowed by the role", permit: deny(session.ActionDelete), line: "stop alpha", dialog: "Stop alpha?"},
		{name: "delete allowed", keys: []string{"d"}, dialog: "Delete alpha permanently?"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := fixture()
			h := newHarness(t, f, Options{Permit: c.permit})
			h.press(c.keys...)
			if c.line != "" {
				h.press(":")
				h.typeText(c.line)
				h.press("enter")
			}
			h.waitFor("the checks", func() bool { return len(h.m.Pending()) == 0 })
			if c.flash == "" {
				if h.m.dialog == nil || !strings.Contains(h.screen(), c.dialog) {
					t.Fatalf("no dialog %q:\n%s", c.dialog, h.screen())
				}
				return
			}
			if h.m.dialog != nil || !strings.Contains(h.flash(), c.flash) {
				t.Fatalf("dialog %v, flash %q; want no dialog and %q:\n%s", h.m.dialog != nil, h.flash(), c.flash, h.screen())
			}
			for _, call := range []string{"Restore", "Delete", "Stop", "Replace"} {
				if n := f.Calls(call); n != 0 {
					t.Errorf("%d %s calls", n, call)
				}
			}
		})
	}
}

// TestTypeAheadGoesToTheConfirmation: keys typed while the checks run are
// the name typed ahead: they go to the dialog once it opens, never to the
// view beneath (where "alpha" would pause alpha); esc gives up.
func TestTypeAheadGoesToTheConfirmation(t *testing.T) {
	t.Parallel()
	f := fixture()
	release := make(chan struct{})
	h := newHarness(t, f, Options{Permit: func(ctx context.Context, _ session.Action) error {
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}})
	h.press("d")
	h.typeText("alpha")
	if h.m.dialog != nil || f.Calls("Pause") != 0 || !slices.Contains(h.m.Pending(), "checking alpha") {
		t.Fatalf("while checking: dialog %v, %d pauses, pending %v", h.m.dialog != nil, f.Calls("Pause"), h.m.Pending())
	}
	close(release)
	h.waitFor("the dialog", func() bool { return h.m.dialog != nil })
	h.press("enter")
	h.waitFor("deleted", func() bool { _, ok := h.m.sessions.Get("alpha"); return !ok })
	if f.Calls("Pause") != 0 {
		t.Fatal("a key typed ahead reached the sessions view")
	}

	h.press("d", "esc")
	h.waitFor("the checks", func() bool { return len(h.m.Pending()) == 0 })
	if h.m.dialog != nil {
		t.Fatal("the dialog opened after esc")
	}
}

package ui

import (
	"strings"
	"testing"

	"github.com/berthvm/berth/session"
)

// TestRunsTab: the Runs tab appears once the session has runs, lists each
// with its executions, and opens an execution's output; without runs the
// tabs are as they were.
func TestRunsTab(t *testing.T) {
	t.Parallel()
	f := fixture()
	h := newHarness(t, f, Options{})
	h.press("enter")
	h.waitFor("executions", func() bool { return h.m.execs.Len() == 4 })
	if strings.Contains(h.screen(), "Runs") {
		t.Fatalf("a session without runs shows a Runs tab:\n%s", h.screen())
	}
	h.press("5")
	if h.m.tab == tabRuns {
		t.Fatal("5 opened the Runs tab of a session without runs")
	}

	ctx := t.Context()
	r, err := f.StartRun(ctx, "alpha", session.RunOptions{Title: "fix the flaky test"})
	if err != nil {
		t.Fatal(err)
	}
	p, err := f.Exec(session.WithRun(ctx, r.ID), "alpha", session.ExecRequest{Argv: []string{"sh", "-c", "go test -run TestFlush"}})
	if err != nil {
		t.Fatal(err)
	}
	p.Wait(ctx)
	h.waitFor("the Runs tab", func() bool { return h.m.runs.Has() && strings.Contains(h.screen(), "5 Runs") })
	h.press("5")
	h.waitFor("the run and its execution", func() bool {
		s := h.screen()
		return h.m.tab == tabRuns && strings.Contains(s, "fix the flaky test") && strings.Contains(s, "└ "+p.ID()[:4])
	})
	// tab cycles through it, back to Executions.
	h.press("tab")
	if h.m.tab != tabExecs {
		t.Errorf("tab from Runs: %v, want Executions", h.m.tab)
	}
	h.press("shift+tab")
	if h.m.tab != tabRuns {
		t.Errorf("shift+tab from Executions: %v, want Runs", h.m.tab)
	}
	h.press("j", "enter")
	h.waitFor("the execution's output", func() bool {
		e, ok := h.m.output.Exec()
		return h.m.tab == tabOutput && ok && e.ID == p.ID()
	})
}

// TestRunsDiffView: a run that kept its start shows its changes with d,
// the patch's lines in the view, and esc goes back to the list.
func TestRunsDiffView(t *testing.T) {
	t.Parallel()
	f := fixture()
	h := newHarness(t, f, Options{})
	ctx := t.Context()
	r, err := f.StartRun(ctx, "alpha", session.RunOptions{Title: "edit", Keep: session.KeepRun(true)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteFile(session.WithRun(ctx, r.ID), "alpha", "notes.txt", strings.NewReader("first\nsecond\n")); err != nil {
		t.Fatal(err)
	}
	h.press("enter")
	h.waitFor("the Runs tab", func() bool { return h.m.runs.Has() && strings.Contains(h.screen(), "5 Runs") })
	h.press("5")
	h.waitFor("the run with its CHANGES column", func() bool { return strings.Contains(h.screen(), "CHANGES") })
	h.press("d")
	h.waitFor("the diff", func() bool {
		s := h.screen()
		return strings.Contains(s, "A notes.txt") && strings.Contains(s, "+second") && strings.Contains(s, "1 file changed, 2 insertions(+)")
	})
	h.press("esc")
	h.waitFor("the list again", func() bool { return strings.Contains(h.screen(), "CHANGES") && h.m.tab == tabRuns })
}

package ui

import (
	"context"
	"fmt"
	"io"
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

// runWithChanges starts a run on alpha that keeps its start, then adds
// notes.txt, edits go.mod and removes src/main.go in it.
func runWithChanges(t *testing.T, f interface {
	StartRun(context.Context, string, session.RunOptions) (session.Run, error)
	WriteFile(context.Context, string, string, io.Reader) (int64, error)
	Remove(context.Context, string, string) error
}) session.Run {
	t.Helper()
	ctx := t.Context()
	r, err := f.StartRun(ctx, "alpha", session.RunOptions{Title: "edit", Keep: session.KeepRun(true)})
	if err != nil {
		t.Fatal(err)
	}
	rctx := session.WithRun(ctx, r.ID)
	if _, err := f.WriteFile(rctx, "alpha", "notes.txt", strings.NewReader("first\nsecond\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteFile(rctx, "alpha", "go.mod", strings.NewReader("module example.com/alpha\n\ngo 1.27\n")); err != nil {
		t.Fatal(err)
	}
	if err := f.Remove(rctx, "alpha", "src/main.go"); err != nil {
		t.Fatal(err)
	}
	return r
}

// openRunDiff opens alpha's Runs tab and the diff of its newest run.
func openRunDiff(h *harness) {
	h.t.Helper()
	h.press("enter")
	h.waitFor("the Runs tab", func() bool { return h.m.runs.Has() && strings.Contains(h.screen(), "5 Runs") })
	h.press("5")
	h.waitFor("the run with its CHANGES column", func() bool { return strings.Contains(h.screen(), "CHANGES") })
	h.press("d")
	h.waitFor("the diff's file list", func() bool {
		s := h.screen()
		return strings.Contains(s, "3 files changed") && strings.Contains(s, " M go.mod") && strings.Contains(s, " A notes.txt") && strings.Contains(s, " D src/main.go")
	})
}

// TestRunsDiffFileList: the diff view lists the files changed, with their
// kinds, on the left, and shows the selected one's diff beside it; moving
// in the list shows another's, and only that one's.
func TestRunsDiffFileList(t *testing.T) {
	t.Parallel()
	f := fixture()
	h := newHarness(t, f, Options{})
	runWithChanges(t, f)
	openRunDiff(h)
	// Sorted by path: go.mod first, its diff shown, not the others'.
	steps := []struct {
		keys      []string
		want, not []string
	}{
		{nil, []string{"│ M go.mod", "-go 1.26", "+go 1.27"}, []string{"+second", "-package main"}},
		{[]string{"j"}, []string{"│ A notes.txt", "+first", "+second", "new file, -rw-r--r--"}, []string{"-go 1.26"}},
		{[]string{"j"}, []string{"│ D src/main.go", "-package main", "removed file"}, []string{"+second"}},
		{[]string{"j"}, []string{"-package main"}, []string{"+second"}}, // the end of the list stays there
		{[]string{"g"}, []string{"+go 1.27"}, []string{"-package main"}},
		{[]string{"G"}, []string{"-package main"}, []string{"+go 1.27"}},
		{[]string{"k"}, []string{"+second"}, []string{"-package main"}},
	}
	for i, st := range steps {
		h.press(st.keys...)
		s := h.screen()
		for _, w := range st.want {
			if !strings.Contains(s, w) {
				t.Fatalf("step %d (%v): no %q:\n%s", i, st.keys, w, s)
			}
		}
		for _, w := range st.not {
			if strings.Contains(s, w) {
				t.Fatalf("step %d (%v): %q shown:\n%s", i, st.keys, w, s)
			}
		}
	}
	if p, _ := h.m.runs.SelectedFile(); p != "notes.txt" {
		t.Errorf("selected %q, want notes.txt", p)
	}
	// The help line says what u and U undo.
	h.press("?")
	if s := h.screen(); !strings.Contains(s, "undo this file") || !strings.Contains(s, "undo the whole run") {
		t.Errorf("the help does not say what u and U undo:\n%s", s)
	}
	h.press("esc")
}

// TestRunsDiffScroll: a long diff scrolls beside the file list.
func TestRunsDiffScroll(t *testing.T) {
	t.Parallel()
	f := fixture()
	h := newHarness(t, f, Options{})
	ctx := t.Context()
	r, err := f.StartRun(ctx, "alpha", session.RunOptions{Keep: session.KeepRun(true)})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for i := range 200 {
		fmt.Fprintf(&b, "line %03d\n", i)
	}
	if _, err := f.WriteFile(session.WithRun(ctx, r.ID), "alpha", "long.txt", strings.NewReader(b.String())); err != nil {
		t.Fatal(err)
	}
	h.press("enter")
	h.waitFor("the Runs tab", func() bool { return h.m.runs.Has() && strings.Contains(h.screen(), "5 Runs") })
	h.press("5", "d")
	h.waitFor("the diff", func() bool { return strings.Contains(h.screen(), "+line 000") })
	h.press("ctrl+d", "ctrl+d", "J", "pgdown")
	if s := h.screen(); strings.Contains(s, "+line 000") || !strings.Contains(s, "\n A long.txt ") {
		t.Fatalf("the diff did not scroll, or the list went with it:\n%s", s)
	}
	h.press("G") // the end of the list: the one file, its diff from the top
	h.press("K", "ctrl+u", "pgup", "ctrl+u", "ctrl+u", "ctrl+u")
	if s := h.screen(); !strings.Contains(s, "+line 000") {
		t.Fatalf("the diff did not scroll back:\n%s", s)
	}
	h.press("q")
	h.waitFor("the list again", func() bool { return !h.m.runs.DiffShown() })
}

// TestRunsDiffUndo: u undoes the selected file, U the whole run, each
// after the session's name is typed (the restore's confirmation); the diff
// reloads after; esc gives an undo up; a viewer is offered neither.
func TestRunsDiffUndo(t *testing.T) {
	t.Parallel()
	t.Run("file", func(t *testing.T) {
		t.Parallel()
		f := fixture()
		h := newHarness(t, f, Options{})
		runWithChanges(t, f)
		openRunDiff(h)
		h.press("j", "u") // notes.txt
		h.waitFor("the undo dialog", func() bool { return strings.Contains(h.screen(), "Undo notes.txt?") })
		if s := h.screen(); !strings.Contains(s, "Type alpha to confirm") {
			t.Fatalf("no typed confirmation:\n%s", s)
		}
		h.press("enter")
		if f.Calls("UndoRun") != 0 {
			t.Fatal("undone without the name typed")
		}
		h.typeText("alpha")
		h.press("enter")
		h.waitFor("undone", func() bool {
			return strings.HasPrefix(h.flash(), "undid run") && strings.Contains(h.flash(), "notes.txt: 0 put back, 1 removed")
		})
		h.waitFor("the diff without notes.txt", func() bool {
			s := h.screen()
			return strings.Contains(s, "2 files changed") && !strings.Contains(s, " A notes.txt")
		})
		if _, err := f.Stat(t.Context(), "alpha", "notes.txt"); err == nil {
			t.Error("notes.txt is still there")
		}
	})
	t.Run("whole", func(t *testing.T) {
		t.Parallel()
		f := fixture()
		h := newHarness(t, f, Options{})
		r := runWithChanges(t, f)
		openRunDiff(h)
		h.press("U")
		h.waitFor("the undo dialog", func() bool { return strings.Contains(h.screen(), "Undo all of run "+r.ID+"?") })
		h.press("esc")
		if h.m.dialog != nil || f.Calls("UndoRun") != 0 {
			t.Fatal("esc did not give the undo up")
		}
		h.press("U")
		h.waitFor("the undo dialog", func() bool { return strings.Contains(h.screen(), "automatic checkpoint") })
		h.typeText("alpha")
		h.press("enter")
		h.waitFor("undone", func() bool { return strings.HasPrefix(h.flash(), "undid run "+r.ID+": alpha is back at "+r.Checkpoint) })
		h.waitFor("nothing changed", func() bool { return strings.Contains(h.screen(), "Nothing changed since the run started") })
	})
	t.Run("refused", func(t *testing.T) {
		t.Parallel()
		f := fixture()
		h := newHarness(t, f, Options{Permit: func(context.Context, session.Action) error {
			return session.Permit(session.Operator, session.ActionUndo)
		}})
		runWithChanges(t, f)
		openRunDiff(h)
		h.press("u")
		h.waitFor("the refusal", func() bool { return strings.Contains(h.flash(), "role operator may not undo runs") })
		if h.m.dialog != nil {
			t.Fatal("a dialog opened for an undo the role may not do")
		}
	})
	t.Run("viewer", func(t *testing.T) {
		t.Parallel()
		f := fixture()
		h := newHarness(t, f, Options{ReadOnly: true})
		runWithChanges(t, f)
		openRunDiff(h)
		h.press("u", "U", "?")
		if s := h.screen(); strings.Contains(s, "undo this file") || h.m.dialog != nil {
			t.Fatalf("a viewer is offered undo:\n%s", s)
		}
		if f.Calls("UndoRun") != 0 {
			t.Fatal("a viewer undid a run")
		}
	})
}

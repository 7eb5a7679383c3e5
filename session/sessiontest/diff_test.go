package sessiontest

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/berthvm/berth/session"
)

func TestFakeRunDiffUndo(t *testing.T) {
	ctx := context.Background()
	f := New(Options{})
	defer f.Close()
	if _, err := f.Create(ctx, session.CreateOptions{Name: "d"}); err != nil {
		t.Fatal(err)
	}
	write := func(p, s string) {
		if _, err := f.WriteFile(ctx, "d", p, strings.NewReader(s)); err != nil {
			t.Fatal(err)
		}
	}
	write("a.txt", "a\n")
	write("b.txt", "b\n")
	plain, err := f.StartRun(ctx, "d", session.RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.RunDiff(ctx, plain.ID, session.DiffOptions{}); session.CodeOf(err) != session.CodeNoStart {
		t.Errorf("diff of a run without a start: %v", err)
	}
	r, err := f.StartRun(ctx, "d", session.RunOptions{Keep: session.KeepRun(true), Title: "t"})
	if err != nil || r.Checkpoint == "" {
		t.Fatalf("keep: %+v %v", r, err)
	}
	write("a.txt", "A\n")
	f.Remove(ctx, "d", "b.txt")
	write("c.txt", "c\n")
	d, err := f.RunDiff(ctx, r.ID, session.DiffOptions{})
	if err != nil || len(d.Changes) != 3 {
		t.Fatalf("diff %+v %v", d, err)
	}
	if _, err := f.RunDiff(ctx, r.ID, session.DiffOptions{Paths: []string{"../x"}}); session.CodeOf(err) != session.CodeEscape {
		t.Errorf("escape: %v", err)
	}
	// A running command of the run holds an undo off.
	rctx := session.WithRun(ctx, r.ID)
	p, err := f.Exec(rctx, "d", session.ExecRequest{Argv: []string{"sleep", "60"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.UndoRun(ctx, r.ID, []string{"a.txt"}); !errors.Is(err, session.ErrInvalidState) || !strings.Contains(err.Error(), "running command") {
		t.Errorf("undo under a running command: %v", err)
	}
	p.Cancel(ctx)
	p.Wait(ctx)
	res, err := f.UndoRun(ctx, r.ID, []string{"a.txt", "c.txt", "b.txt"})
	if err != nil || len(res.Restored) != 2 || len(res.Removed) != 1 {
		t.Fatalf("undo %+v %v", res, err)
	}
	if d, _ := f.RunDiff(ctx, r.ID, session.DiffOptions{}); len(d.Changes) != 0 {
		t.Errorf("after undo: %+v", d.Changes)
	}
	write("z.txt", "z\n")
	res, err = f.UndoRun(ctx, r.ID, nil)
	if err != nil || !res.Whole || res.Restore.Auto.ID == "" {
		t.Fatalf("whole undo %+v %v", res, err)
	}
	if _, err := f.Stat(ctx, "d", "z.txt"); !errors.Is(err, session.ErrNotFound) {
		t.Errorf("z.txt after a whole undo: %v", err)
	}
}

package sessiontest

import (
	"context"
	"strings"
	"testing"

	"github.com/berthvm/berth/session"
)

// suiteCheckpoints: a checkpoint keeps the workspace as it was; a restore
// brings it back and its automatic checkpoint brings the later state back;
// bad ids and names are refused with their classes.
func suiteCheckpoints(t *testing.T, ctx context.Context, svc session.Service, name string) {
	write := func(p, content string) {
		t.Helper()
		if _, err := svc.WriteFile(ctx, name, p, strings.NewReader(content)); err != nil {
			t.Fatalf("WriteFile %s: %v", p, err)
		}
	}
	write("ckpt.txt", "before")
	ck, err := svc.Checkpoint(ctx, name, session.CheckpointOptions{Label: "suite"})
	if err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	if ck.ID == "" || ck.Label != "suite" || ck.Session != name || ck.Auto || ck.Memory {
		t.Errorf("Checkpoint = %+v", ck)
	}
	write("ckpt.txt", "after")
	write("ckpt-new.txt", "new")
	list, err := svc.Checkpoints(ctx, name)
	if err != nil || len(list) == 0 || list[len(list)-1].ID != ck.ID {
		t.Fatalf("Checkpoints = %+v, %v", list, err)
	}
	if s, err := svc.Get(ctx, name); err != nil || s.Checkpoints != len(list) {
		t.Errorf("Get counts %d checkpoints, listed %d (%v)", s.Checkpoints, len(list), err)
	}

	// The contract's checkpoint preconditions, with their fields.
	for _, c := range []struct {
		what  string
		opts  session.CheckpointOptions
		class error
		field string
	}{
		{"label over the most", session.CheckpointOptions{Label: strings.Repeat("l", session.MaxLabel+1)}, session.ErrInvalid, session.FieldLabel},
		{"label of two lines", session.CheckpointOptions{Label: "a\nb"}, session.ErrInvalid, session.FieldLabel},
	} {
		_, err := svc.Checkpoint(ctx, name, c.opts)
		wantClass(t, "Checkpoint "+c.what, err, c.class)
		if got := session.FieldOf(err); got != c.field {
			t.Errorf("Checkpoint %s: %v points at field %q, want %q", c.what, err, got, c.field)
		}
	}
	_, err = svc.Restore(ctx, name, "c999")
	wantClass(t, "Restore unknown", err, session.ErrNotFound)
	if got := session.FieldOf(err); got != session.FieldCheckpoint {
		t.Errorf("Restore unknown: %v points at field %q, want %q", err, got, session.FieldCheckpoint)
	}
	_, err = svc.Restore(ctx, "conf-missing", ck.ID)
	wantClass(t, "Restore missing session", err, session.ErrNotFound)
	wantClass(t, "DeleteCheckpoint unknown", svc.DeleteCheckpoint(ctx, name, "c999"), session.ErrNotFound)
	_, err = svc.Fork(ctx, name, name)
	wantClass(t, "Fork to an existing name", err, session.ErrExists)
	_, err = svc.Fork(ctx, name, "Bad_Name")
	wantClass(t, "Fork to an invalid name", err, session.ErrInvalid)
	_, err = svc.Fork(ctx, "conf-missing", "conf-fork")
	wantClass(t, "Fork missing", err, session.ErrNotFound)

	res, err := svc.Restore(ctx, name, ck.ID)
	if err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if res.Session.State != session.StateRunning || res.Restored.ID != ck.ID || !res.Auto.Auto || res.Auto.ID == "" {
		t.Errorf("Restore = %+v", res)
	}
	if got := readAll(t, ctx, svc, name, "ckpt.txt"); got != "before" {
		t.Errorf("after Restore, ckpt.txt = %q, want %q", got, "before")
	}
	if _, err := svc.Stat(ctx, name, "ckpt-new.txt"); err == nil {
		t.Error("after Restore, a file made after the checkpoint is still there")
	}
	if _, err := svc.Restore(ctx, name, res.Auto.ID); err != nil {
		t.Fatalf("Restore of the automatic checkpoint: %v", err)
	}
	if got := readAll(t, ctx, svc, name, "ckpt.txt"); got != "after" {
		t.Errorf("after restoring the automatic checkpoint, ckpt.txt = %q, want %q", got, "after")
	}
	list, _ = svc.Checkpoints(ctx, name)
	for _, c := range list {
		if err := svc.DeleteCheckpoint(ctx, name, c.ID); err != nil {
			t.Errorf("DeleteCheckpoint %s: %v", c.ID, err)
		}
	}
	if list, err := svc.Checkpoints(ctx, name); err != nil || len(list) != 0 {
		t.Errorf("after removing them all: %+v, %v", list, err)
	}
}

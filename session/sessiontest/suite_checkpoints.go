package sessiontest

import (
	"context"
	"errors"
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
	suiteCreateFrom(t, ctx, svc, name, ck)
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

// suiteCreateFrom: a session made from a checkpoint of another holds the
// checkpoint's files and not those written after it; NAME alone is the
// newest checkpoint; the refusals name the from field (or the one the
// checkpoint decides) with their classes, and leave no session behind.
func suiteCreateFrom(t *testing.T, ctx context.Context, svc session.Service, name string, ck session.Checkpoint) {
	const from = "conf-from"
	s, err := svc.Create(ctx, session.CreateOptions{Name: from, From: name + "@" + ck.ID})
	if err != nil {
		t.Fatalf("Create from %s@%s: %v", name, ck.ID, err)
	}
	defer svc.Delete(context.WithoutCancel(ctx), from)
	src, _ := svc.Get(ctx, name)
	if s.Name != from || s.State != session.StateRunning || s.Image != src.Image || s.DiskBytes != src.DiskBytes || s.CPUs != src.CPUs || s.MemoryMiB != src.MemoryMiB {
		t.Errorf("Create from a checkpoint = %+v; want it running on the source's image, disk and size (%+v)", s, src)
	}
	if got := readAll(t, ctx, svc, from, "ckpt.txt"); got != "before" {
		t.Errorf("made from the checkpoint, ckpt.txt = %q, want %q", got, "before")
	}
	if _, err := svc.Stat(ctx, from, "ckpt-new.txt"); err == nil {
		t.Error("made from the checkpoint, it has a file written after it")
	}
	if got := readAll(t, ctx, svc, name, "ckpt.txt"); got != "after" {
		t.Errorf("the source's ckpt.txt = %q after a create from its checkpoint, want %q", got, "after")
	}
	if _, err := svc.WriteFile(ctx, from, "only-from.txt", strings.NewReader("x")); err != nil {
		t.Errorf("WriteFile in the new session: %v", err)
	}
	if _, err := svc.Stat(ctx, name, "only-from.txt"); err == nil {
		t.Error("a file written in the new session is in the source")
	}
	if err := svc.Delete(ctx, from); err != nil {
		t.Fatalf("Delete %s: %v", from, err)
	}
	// NAME alone: the newest checkpoint, here the one taken above.
	if s, err := svc.Create(ctx, session.CreateOptions{Name: from, From: name}); err != nil || s.State != session.StateRunning {
		t.Fatalf("Create from %s (its newest checkpoint) = %+v, %v", name, s, err)
	}
	if got := readAll(t, ctx, svc, from, "ckpt.txt"); got != "before" {
		t.Errorf("made from the newest checkpoint, ckpt.txt = %q, want %q", got, "before")
	}
	for _, c := range []struct {
		what  string
		opts  session.CreateOptions
		class error
		field string
	}{
		{"of a missing session", session.CreateOptions{From: "conf-missing@" + ck.ID}, session.ErrNotFound, session.FieldFrom},
		{"of a missing checkpoint", session.CreateOptions{From: name + "@c999"}, session.ErrNotFound, session.FieldFrom},
		{"of a session without checkpoints", session.CreateOptions{From: from}, session.ErrNotFound, session.FieldFrom},
		{"with an empty id", session.CreateOptions{From: name + "@"}, session.ErrInvalid, session.FieldFrom},
		{"of a bad name", session.CreateOptions{From: "Bad_Name@c1"}, session.ErrInvalid, session.FieldFrom},
		{"with an image", session.CreateOptions{From: name, Image: src.Image}, session.ErrInvalid, session.FieldImage},
		{"with a disk size", session.CreateOptions{From: name, DiskBytes: 64 << 20}, session.ErrInvalid, session.FieldDisk},
		{"with a system disk size", session.CreateOptions{From: name, SystemBytes: 1 << 30}, session.ErrInvalid, session.FieldSystemDisk},
		{"with too little memory", session.CreateOptions{From: name, MemoryMiB: 64}, session.ErrInvalid, session.FieldMemory},
		{"onto an existing name", session.CreateOptions{Name: name, From: name}, session.ErrExists, ""},
	} {
		if c.opts.Name == "" {
			c.opts.Name = "conf-bad"
		}
		_, err := svc.Create(ctx, c.opts)
		wantClass(t, "Create from a checkpoint "+c.what, err, c.class)
		if got := session.FieldOf(err); got != c.field {
			t.Errorf("Create from a checkpoint %s: %v points at field %q, want %q", c.what, err, got, c.field)
		}
	}
	if _, err := svc.Get(ctx, "conf-bad"); !errors.Is(err, session.ErrNotFound) {
		t.Errorf("a refused create from a checkpoint left session conf-bad: %v", err)
	}
}

package sshd

import (
	"context"

	"github.com/berthvm/berth/session"
)

// Checkpoints: operators may take them and fork; restoring replaces a
// session's disks and removing a checkpoint loses it, so both need admin.

func (g *guard) Checkpoint(ctx context.Context, name string, opts session.CheckpointOptions) (session.Checkpoint, error) {
	return call(g, ctx, session.ActionCheckpoint, func(ctx context.Context) (session.Checkpoint, error) { return g.svc.Checkpoint(ctx, name, opts) })
}

func (g *guard) Checkpoints(ctx context.Context, name string) ([]session.Checkpoint, error) {
	return call(g, ctx, session.ActionRead, func(ctx context.Context) ([]session.Checkpoint, error) { return g.svc.Checkpoints(ctx, name) })
}

func (g *guard) DeleteCheckpoint(ctx context.Context, name, id string) error {
	return call0(g, ctx, session.ActionDeleteCheckpoint, func(ctx context.Context) error { return g.svc.DeleteCheckpoint(ctx, name, id) })
}

func (g *guard) Restore(ctx context.Context, name, id string) (session.RestoreResult, error) {
	return call(g, ctx, session.ActionRestore, func(ctx context.Context) (session.RestoreResult, error) { return g.svc.Restore(ctx, name, id) })
}

func (g *guard) Fork(ctx context.Context, name, newName string) (session.ForkResult, error) {
	return call(g, ctx, session.ActionFork, func(ctx context.Context) (session.ForkResult, error) { return g.svc.Fork(ctx, name, newName) })
}

package sshd

import (
	"context"

	"github.com/berthvm/berth/session"
)

// Checkpoints: operators may take them and fork; restoring replaces a
// session's disks and removing a checkpoint loses it, so both need admin.

func (g *guard) Checkpoint(ctx context.Context, name string, opts session.CheckpointOptions) (session.Checkpoint, error) {
	ctx, err := g.enter(ctx, opCheckpoint)
	if err != nil {
		return session.Checkpoint{}, err
	}
	return g.svc.Checkpoint(ctx, name, opts)
}

func (g *guard) Checkpoints(ctx context.Context, name string) ([]session.Checkpoint, error) {
	ctx, err := g.enter(ctx, opRead)
	if err != nil {
		return nil, err
	}
	return g.svc.Checkpoints(ctx, name)
}

func (g *guard) DeleteCheckpoint(ctx context.Context, name, id string) error {
	ctx, err := g.enter(ctx, opDeleteCheckpoint)
	if err != nil {
		return err
	}
	return g.svc.DeleteCheckpoint(ctx, name, id)
}

func (g *guard) Restore(ctx context.Context, name, id string) (session.RestoreResult, error) {
	ctx, err := g.enter(ctx, opRestore)
	if err != nil {
		return session.RestoreResult{}, err
	}
	return g.svc.Restore(ctx, name, id)
}

func (g *guard) Fork(ctx context.Context, name, newName string) (session.ForkResult, error) {
	ctx, err := g.enter(ctx, opFork)
	if err != nil {
		return session.ForkResult{}, err
	}
	return g.svc.Fork(ctx, name, newName)
}

package sshd

import (
	"context"

	"github.com/berthvm/berth/session"
)

// Diffs read, so every role may; an undo restores or writes, an admin's.

func (g *guard) Diff(ctx context.Context, name, from, to string, opts session.DiffOptions) (session.Diff, error) {
	return call(g, ctx, session.ActionDiff, func(ctx context.Context) (session.Diff, error) { return g.svc.Diff(ctx, name, from, to, opts) })
}

func (g *guard) RunDiff(ctx context.Context, runID string, opts session.DiffOptions) (session.Diff, error) {
	return call(g, ctx, session.ActionDiff, func(ctx context.Context) (session.Diff, error) { return g.svc.RunDiff(ctx, runID, opts) })
}

func (g *guard) UndoRun(ctx context.Context, runID string, paths []string) (session.UndoResult, error) {
	return call(g, ctx, session.ActionUndo, func(ctx context.Context) (session.UndoResult, error) { return g.svc.UndoRun(ctx, runID, paths) })
}

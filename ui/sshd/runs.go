package sshd

import (
	"context"
	"io"

	"github.com/berthvm/berth/session"
)

// The guard also carries agent runs and schedules (for 'runs', 'schedule'
// and 'mcp' over SSH), checked like the rest: reading them is a read,
// starting and ending runs and changing schedules needs an operator.

// ReadOnly reports whether the caller may only read now: the MCP server
// then offers the read tools alone.
func (g *guard) ReadOnly(ctx context.Context) bool {
	role, err := g.role(ctx)
	return err != nil || session.Permit(role, session.ActionExec) != nil
}

func (g *guard) StartRun(ctx context.Context, name string, opts session.RunOptions) (session.Run, error) {
	return call(g, ctx, session.ActionRun, func(ctx context.Context) (session.Run, error) { return g.svc.StartRun(ctx, name, opts) })
}

func (g *guard) EndRun(ctx context.Context, runID string, status session.RunStatus) (session.Run, error) {
	return call(g, ctx, session.ActionRun, func(ctx context.Context) (session.Run, error) { return g.svc.EndRun(ctx, runID, status) })
}

func (g *guard) Runs(ctx context.Context, name string) ([]session.Run, error) {
	return call(g, ctx, session.ActionRead, func(ctx context.Context) ([]session.Run, error) { return g.svc.Runs(ctx, name) })
}

func (g *guard) GetRun(ctx context.Context, runID string) (session.Run, error) {
	return call(g, ctx, session.ActionRead, func(ctx context.Context) (session.Run, error) { return g.svc.GetRun(ctx, runID) })
}

func (g *guard) RemoveRun(ctx context.Context, runID string) (session.RemovedRun, error) {
	return call(g, ctx, session.ActionRemoveRun, func(ctx context.Context) (session.RemovedRun, error) { return g.svc.RemoveRun(ctx, runID) })
}

func (g *guard) AddSchedule(ctx context.Context, name string, req session.ScheduleRequest) (session.Schedule, error) {
	return call(g, ctx, session.ActionSchedule, func(ctx context.Context) (session.Schedule, error) { return g.svc.AddSchedule(ctx, name, req) })
}

func (g *guard) Schedules(ctx context.Context, name string) ([]session.Schedule, error) {
	return call(g, ctx, session.ActionRead, func(ctx context.Context) ([]session.Schedule, error) { return g.svc.Schedules(ctx, name) })
}

func (g *guard) RemoveSchedule(ctx context.Context, name, id string) error {
	return call0(g, ctx, session.ActionSchedule, func(ctx context.Context) error { return g.svc.RemoveSchedule(ctx, name, id) })
}

// Images are the daemon host's: listing and exporting them are reads;
// building, importing, committing and removing them an admin's.

func (g *guard) Images(ctx context.Context) ([]session.ImageInfo, error) {
	return call(g, ctx, session.ActionRead, func(ctx context.Context) ([]session.ImageInfo, error) { return g.svc.Images(ctx) })
}

func (g *guard) BuildImage(ctx context.Context, req session.BuildRequest, progress func(session.BuildProgress)) (session.ImageInfo, error) {
	return call(g, ctx, session.ActionImage, func(ctx context.Context) (session.ImageInfo, error) { return g.svc.BuildImage(ctx, req, progress) })
}

func (g *guard) ImportImage(ctx context.Context, req session.ImportRequest, src io.Reader, progress func(session.BuildProgress)) (session.ImageInfo, error) {
	return call(g, ctx, session.ActionImage, func(ctx context.Context) (session.ImageInfo, error) {
		return g.svc.ImportImage(ctx, req, src, progress)
	})
}

func (g *guard) CommitImage(ctx context.Context, req session.CommitRequest) (session.CommitResult, error) {
	return call(g, ctx, session.ActionCommitImage, func(ctx context.Context) (session.CommitResult, error) { return g.svc.CommitImage(ctx, req) })
}

func (g *guard) ExportImage(ctx context.Context, req session.ExportRequest, open func(session.ImageExport) (io.Writer, error), progress func(session.BuildProgress)) (session.ImageExport, error) {
	return call(g, ctx, session.ActionImageExport, func(ctx context.Context) (session.ImageExport, error) {
		return g.svc.ExportImage(ctx, req, open, progress)
	})
}

func (g *guard) RemoveImage(ctx context.Context, name string) error {
	return call0(g, ctx, session.ActionImage, func(ctx context.Context) error { return g.svc.RemoveImage(ctx, name) })
}

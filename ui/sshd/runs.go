package sshd

import (
	"context"
	"fmt"

	"github.com/berthvm/berth/session"
)

// The guard also carries agent runs and schedules (for 'runs', 'schedule'
// and 'mcp' over SSH), checked like the rest: reading them is a read,
// starting and ending runs and changing schedules needs an operator.

var _ session.Harness = (*guard)(nil)

func (g *guard) harness() (session.Harness, error) {
	h, ok := g.svc.(session.Harness)
	if !ok {
		return nil, fmt.Errorf("this berth server keeps no agent runs or schedules: %w", session.ErrUnavailable)
	}
	return h, nil
}

// ReadOnly reports whether the caller may only read now: the MCP server
// then offers the read tools alone.
func (g *guard) ReadOnly(ctx context.Context) bool {
	role, err := g.role(ctx)
	return err != nil || role.allows(opExec) != nil
}

func (g *guard) StartRun(ctx context.Context, name string, opts session.RunOptions) (session.Run, error) {
	ctx, err := g.enter(ctx, opRun)
	if err != nil {
		return session.Run{}, err
	}
	h, err := g.harness()
	if err != nil {
		return session.Run{}, err
	}
	return h.StartRun(ctx, name, opts)
}

func (g *guard) EndRun(ctx context.Context, runID string, status session.RunStatus) (session.Run, error) {
	ctx, err := g.enter(ctx, opRun)
	if err != nil {
		return session.Run{}, err
	}
	h, err := g.harness()
	if err != nil {
		return session.Run{}, err
	}
	return h.EndRun(ctx, runID, status)
}

func (g *guard) Runs(ctx context.Context, name string) ([]session.Run, error) {
	ctx, err := g.enter(ctx, opRead)
	if err != nil {
		return nil, err
	}
	h, err := g.harness()
	if err != nil {
		return nil, err
	}
	return h.Runs(ctx, name)
}

func (g *guard) GetRun(ctx context.Context, runID string) (session.Run, error) {
	ctx, err := g.enter(ctx, opRead)
	if err != nil {
		return session.Run{}, err
	}
	h, err := g.harness()
	if err != nil {
		return session.Run{}, err
	}
	return h.GetRun(ctx, runID)
}

func (g *guard) AddSchedule(ctx context.Context, name string, req session.ScheduleRequest) (session.Schedule, error) {
	ctx, err := g.enter(ctx, opSchedule)
	if err != nil {
		return session.Schedule{}, err
	}
	h, err := g.harness()
	if err != nil {
		return session.Schedule{}, err
	}
	return h.AddSchedule(ctx, name, req)
}

func (g *guard) Schedules(ctx context.Context, name string) ([]session.Schedule, error) {
	ctx, err := g.enter(ctx, opRead)
	if err != nil {
		return nil, err
	}
	h, err := g.harness()
	if err != nil {
		return nil, err
	}
	return h.Schedules(ctx, name)
}

func (g *guard) RemoveSchedule(ctx context.Context, name, id string) error {
	ctx, err := g.enter(ctx, opSchedule)
	if err != nil {
		return err
	}
	h, err := g.harness()
	if err != nil {
		return err
	}
	return h.RemoveSchedule(ctx, name, id)
}

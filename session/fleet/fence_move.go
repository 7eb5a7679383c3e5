package fleet

import (
	"context"
	"fmt"
	"io"

	"github.com/berthvm/berth/session"
)

// EpochSetter records the epoch at which this host holds a session (the
// engine's Manager): the rejoin's quarantine compares it with the owner
// key's.
type EpochSetter interface {
	SetEpoch(ctx context.Context, name string, epoch int64) error
}

var (
	_ session.Mover     = (*fence)(nil)
	_ session.Relocator = (*fence)(nil)
	_ EpochSetter       = (*fence)(nil)
	_ session.Drainer   = (*fence)(nil)
)

// Drain and Undrain change the fleet: refused while isolated. On the
// host drained, that is the refusal of a host that is isolated; on
// another front door, of one that could not reach etcd to forward it.

func (g *fence) Drain(ctx context.Context, host string, progress func(session.DrainStep)) (session.DrainResult, error) {
	dr, ok := g.Service.(session.Drainer)
	if !ok {
		return session.DrainResult{}, &session.Error{Class: session.ErrUnsupported, Msg: "this berth is one host on its own: draining a host needs a fleet"}
	}
	return gate(g, ctx, func() (session.DrainResult, error) { return dr.Drain(ctx, host, progress) })
}

func (g *fence) Undrain(ctx context.Context, host string) error {
	dr, ok := g.Service.(session.Drainer)
	if !ok {
		return &session.Error{Class: session.ErrUnsupported, Msg: "this berth is one host on its own: draining a host needs a fleet"}
	}
	return gate0(g, ctx, func() error { return dr.Undrain(ctx, host) })
}

// MoveTo is refused while isolated, as every change is.
func (g *fence) MoveTo(ctx context.Context, name, to string) (session.MoveResult, error) {
	rl, ok := g.Service.(session.Relocator)
	if !ok {
		return session.MoveResult{}, &session.Error{Class: session.ErrUnsupported, Msg: "this berth is one host on its own: moving a session needs a fleet"}
	}
	return gate(g, ctx, func() (session.MoveResult, error) { return rl.MoveTo(ctx, name, to) })
}

func (g *fence) mover() (session.Mover, error) {
	mv, ok := g.Service.(session.Mover)
	if !ok {
		return nil, fmt.Errorf("this host's engine does not move sessions: %w", session.ErrUnsupported)
	}
	return mv, nil
}

// A move's calls change this host's sessions or staging: refused while
// isolated, except a discard, which only removes what a failed move
// left.

func (g *fence) SendSession(ctx context.Context, name string, w io.Writer) error {
	mv, err := g.mover()
	if err != nil {
		return err
	}
	return gate0(g, ctx, func() error { return mv.SendSession(ctx, name, w) })
}

func (g *fence) ReceiveSession(ctx context.Context, r io.Reader) (session.MoveStaged, error) {
	mv, err := g.mover()
	if err != nil {
		return session.MoveStaged{}, err
	}
	return gate(g, ctx, func() (session.MoveStaged, error) { return mv.ReceiveSession(ctx, r) })
}

func (g *fence) CommitReceived(ctx context.Context, name string) (session.Session, error) {
	mv, err := g.mover()
	if err != nil {
		return session.Session{}, err
	}
	return gate(g, ctx, func() (session.Session, error) { return mv.CommitReceived(ctx, name) })
}

func (g *fence) DiscardReceived(ctx context.Context, name string) error {
	mv, err := g.mover()
	if err != nil {
		return err
	}
	return mv.DiscardReceived(ctx, name)
}

func (g *fence) SendSessionImage(ctx context.Context, name string, w io.Writer) error {
	mv, err := g.mover()
	if err != nil {
		return err
	}
	return gate0(g, ctx, func() error { return mv.SendSessionImage(ctx, name, w) })
}

func (g *fence) ReceiveImage(ctx context.Context, r io.Reader) error {
	mv, err := g.mover()
	if err != nil {
		return err
	}
	return gate0(g, ctx, func() error { return mv.ReceiveImage(ctx, r) })
}

func (g *fence) DropSent(ctx context.Context, name string) error {
	mv, err := g.mover()
	if err != nil {
		return err
	}
	return gate0(g, ctx, func() error { return mv.DropSent(ctx, name) })
}

// SetEpoch passes through: it records what etcd already decided.
func (g *fence) SetEpoch(ctx context.Context, name string, epoch int64) error {
	es, ok := g.Service.(EpochSetter)
	if !ok {
		return nil
	}
	return es.SetEpoch(ctx, name, epoch)
}

package fleet

import (
	"context"
	"fmt"
	"io"

	"github.com/berthvm/berth/session"
)

var (
	_ session.Replicator = (*fence)(nil)
	_ session.Recoverer  = (*fence)(nil)
)

// A replication and a recovery change what hosts keep: refused while
// isolated, as every change is, except a send (it reads a checkpoint)
// and the listing and drop of replicas (this host's own copies, as a
// move's discard).

func (g *fence) recoverer() (session.Recoverer, error) {
	rc, ok := g.Service.(session.Recoverer)
	if !ok {
		return nil, &session.Error{Class: session.ErrUnsupported, Msg: "this berth is one host on its own: replicas and recovery need a fleet"}
	}
	return rc, nil
}

func (g *fence) replicator() (session.Replicator, error) {
	rp, ok := g.Service.(session.Replicator)
	if !ok {
		return nil, fmt.Errorf("this host's engine keeps no checkpoint replicas: %w", session.ErrUnsupported)
	}
	return rp, nil
}

func (g *fence) ReplicateCheckpoint(ctx context.Context, name, id, to string) (session.Replica, error) {
	rc, err := g.recoverer()
	if err != nil {
		return session.Replica{}, err
	}
	return gate(g, ctx, func() (session.Replica, error) { return rc.ReplicateCheckpoint(ctx, name, id, to) })
}

func (g *fence) Recover(ctx context.Context, name string, opts session.RecoverOptions) (session.RecoverResult, error) {
	rc, err := g.recoverer()
	if err != nil {
		return session.RecoverResult{}, err
	}
	return gate(g, ctx, func() (session.RecoverResult, error) { return rc.Recover(ctx, name, opts) })
}

func (g *fence) SendCheckpoint(ctx context.Context, name, id string, w io.Writer) error {
	rp, err := g.replicator()
	if err != nil {
		return err
	}
	return rp.SendCheckpoint(ctx, name, id, w)
}

func (g *fence) ReceiveReplica(ctx context.Context, r io.Reader) (session.Replica, error) {
	rp, err := g.replicator()
	if err != nil {
		return session.Replica{}, err
	}
	return gate(g, ctx, func() (session.Replica, error) { return rp.ReceiveReplica(ctx, r) })
}

func (g *fence) Replicas(ctx context.Context, name string) ([]session.Replica, error) {
	rp, err := g.replicator()
	if err != nil {
		return nil, err
	}
	return rp.Replicas(ctx, name)
}

func (g *fence) StageReplica(ctx context.Context, name, id string) (session.MoveStaged, error) {
	rp, err := g.replicator()
	if err != nil {
		return session.MoveStaged{}, err
	}
	return gate(g, ctx, func() (session.MoveStaged, error) { return rp.StageReplica(ctx, name, id) })
}

func (g *fence) DropReplica(ctx context.Context, name, id string) error {
	rp, err := g.replicator()
	if err != nil {
		return err
	}
	return rp.DropReplica(ctx, name, id)
}

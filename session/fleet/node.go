package fleet

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/berthvm/berth/session"
)

// Config is a daemon's membership of a fleet.
type Config struct {
	// Endpoints are etcd's client URLs, comma-separated.
	Endpoints string
	// TLS, if set, makes every etcd connection mutual TLS
	// (pki.ClientConfig).
	TLS *tls.Config
	// Local, if set, is the host's engine: at each join its copies that
	// the fleet's owners say are stale are quarantined (QuarantineStale)
	// before the host takes a change. Setting it sets HostConfig.OnJoin.
	Local Local
	HostConfig
}

// Node is what the daemon holds of the fleet: its host's registration
// and an etcd client for reads and placements. It implements
// session.HostLister.
type Node struct {
	cli  *clientv3.Client
	host *Host
}

var _ session.HostLister = (*Node)(nil)

// callTimeout bounds one etcd read for a caller: a fleet whose etcd is
// out of reach answers in one line, not never.
const callTimeout = 5 * time.Second

// Start dials etcd and joins the host; ctx bounds the first contact.
func Start(ctx context.Context, c Config) (_ *Node, err error) {
	cli, err := Dial(c.Endpoints, c.TLS)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			cli.Close()
		}
	}()
	if c.Local != nil {
		log := c.Logger
		if log == nil {
			log = slog.New(slog.DiscardHandler)
		}
		log = log.With("component", "fleet", "host", c.ID)
		c.OnJoin = func(ctx context.Context) error { return QuarantineStale(ctx, cli, c.ID, c.Local, log) }
	}
	h, err := Join(ctx, cli, c.HostConfig)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("join the fleet: etcd at %s did not answer (is it running? berth etcd runs one): %w", c.Endpoints, context.DeadlineExceeded)
		}
		return nil, err
	}
	return &Node{cli: cli, host: h}, nil
}

// Hosts lists the fleet's hosts as etcd has them now.
func (n *Node) Hosts(ctx context.Context) (session.HostList, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	hs, err := List(ctx, n.cli)
	if err != nil {
		msg := fmt.Sprintf("the fleet's etcd did not answer: %v", err)
		if aerr := n.host.Allowed(ctx); aerr != nil {
			msg += "; " + aerr.(*session.Error).Msg
		}
		return session.HostList{}, &session.Error{Class: session.ErrUnavailable, Msg: msg,
			Hint: "check that the fleet's etcd members are up", Err: err}
	}
	if hs == nil {
		hs = []session.HostInfo{}
	}
	// etcd may still list this host while it knows itself isolated (its
	// lease is live there until the TTL from its last renewal): say so.
	if n.host.Allowed(ctx) != nil {
		for i := range hs {
			if hs[i].ID == n.host.ID() && hs[i].State != session.HostGone {
				hs[i].State = session.HostIsolated
			}
		}
	}
	return session.HostList{Fleet: true, Self: n.host.ID(), Hosts: hs}, nil
}

// Allowed returns nil while this host may change what it holds, else
// the refusal (see Host.Allowed).
func (n *Node) Allowed(ctx context.Context) error { return n.host.Allowed(ctx) }

// Status is this host's judgment of its lease.
func (n *Node) Status() LeaseStatus { return n.host.Status() }

// LiveUntil is when the host's lease ends by its own clock, unless a
// renewal is confirmed before.
func (n *Node) LiveUntil() time.Time { return n.host.liveUntil() }

// Client is the node's etcd client, for the fleet's other parts (the
// router, watches); the Node closes it.
func (n *Node) Client() *clientv3.Client { return n.cli }

// Place places a new session (see the package doc).
func (n *Node) Place(ctx context.Context, req Request) (Placement, error) {
	return Place(ctx, n.cli, req)
}

// Close leaves the fleet (the lease revoked, the host recorded as left)
// and closes the etcd client; ctx bounds the leave.
func (n *Node) Close(ctx context.Context) error {
	err := n.host.Leave(ctx)
	return errors.Join(err, n.cli.Close())
}

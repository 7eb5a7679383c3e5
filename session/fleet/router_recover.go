package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/berthvm/berth/session"
)

var (
	_ session.Replicator = (*Router)(nil)
	_ session.Recoverer  = (*Router)(nil)
)

// peerEnd is both ends' calls of a replication and of a recovery.
type peerEnd interface {
	session.Replicator
	session.Mover
}

// ReplicateCheckpoint copies checkpoint id of name to host to (berth
// checkpoint replicate NAME ID --to H). A front door that does not own
// the session forwards the call to its owner, so the bundle goes from
// the owner straight to to; the owner then records the replica under
// the session's keys, at the epoch it holds the session.
func (r *Router) ReplicateCheckpoint(ctx context.Context, name, id, to string) (session.Replica, error) {
	if err := ValidateHostID(to); err != nil {
		return session.Replica{}, err
	}
	t, err := r.route(ctx, name)
	if err != nil {
		return session.Replica{}, err
	}
	if t.remote {
		rc, ok := t.svc.(session.Recoverer)
		if !ok {
			return session.Replica{}, fmt.Errorf("host %s does not replicate checkpoints: %w", t.host, session.ErrUnsupported)
		}
		return rc.ReplicateCheckpoint(t.ctx, name, id, to)
	}
	if t.epoch == 0 {
		return session.Replica{}, &session.Error{Class: session.ErrInvalidState,
			Msg: fmt.Sprintf("session %s was made before host %s joined the fleet and has no owner in it: it cannot be recovered elsewhere", name, r.cfg.Self)}
	}
	if to == r.cfg.Self {
		return session.Replica{}, &session.Error{Class: session.ErrInvalid, Msg: fmt.Sprintf("host %s owns session %s and keeps its checkpoints already", to, name),
			Hint: "replicate to another host"}
	}
	src, ok := r.cfg.Local.(peerEnd)
	if !ok {
		return session.Replica{}, fmt.Errorf("this host's engine does not replicate checkpoints: %w", session.ErrUnsupported)
	}
	dst, err := r.client(ctx, to)
	if err != nil {
		return session.Replica{}, fmt.Errorf("replicate %s to %s: %w", name, to, err)
	}
	rep, err := session.Replicate(t.ctx, src, dst, name, id, r.log)
	if err != nil {
		return rep, err
	}
	rep.Host = to
	rctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	err = RecordReplica(rctx, r.cli, name, t.epoch, to, id, ReplicaRecord{Memory: rep.Memory, TakenAt: rep.TakenAt, CopiedAt: rep.CopiedAt, Bytes: rep.Bytes})
	if err != nil {
		// Not recorded, so never recovered from: drop the copy.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), callTimeout)
		defer cancel()
		if derr := dst.DropReplica(dctx, name, id); derr != nil {
			r.log.Warn("drop an unrecorded replica", "session", name, "host", to, "err", derr)
		}
		return rep, err
	}
	r.log.Info("replicated a checkpoint", "session", name, "checkpoint", id, "to", to, "bytes", rep.Bytes)
	return rep, nil
}

// Recover starts name on opts.On from its replica of checkpoint
// opts.From, once etcd has expired its owner's lease (berth recover).
// The guards are read first (PlanRecover); without Force the call is
// refused with what it would do. With it, opts.On stages its replica,
// one transaction (Recover) makes it the owner at a new epoch, it takes
// the session (retried, as a move's target is, since it owns it now)
// and starts it. A failure before the transaction leaves nothing.
func (r *Router) Recover(ctx context.Context, name string, opts session.RecoverOptions) (session.RecoverResult, error) {
	start := time.Now()
	res := session.RecoverResult{Checkpoint: opts.From}
	pctx, cancel := context.WithTimeout(ctx, callTimeout)
	plan, _, err := PlanRecover(pctx, r.cli, name, opts.From, opts.On)
	cancel()
	res.From = plan.From
	if err != nil && opts.Force && plan.From == opts.On && plan.Epoch != 0 {
		// opts.On owns it: a recovery whose last steps did not finish
		// (the caller's context ended) is finished, if opts.On does not
		// have the session yet.
		if _, gerr := r.Get(ctx, name); errors.Is(gerr, session.ErrNotFound) {
			r.log.Warn("finishing an interrupted recovery", "session", name, "host", opts.On, "epoch", plan.Epoch)
			return r.finishRecovery(ctx, name, opts, plan.Epoch, res, start)
		}
	}
	if err != nil {
		return res, err
	}
	if !opts.Force {
		return res, &session.Error{Class: session.ErrInvalid, Msg: "this would " + plan.Say(),
			Hint: "ask again with force to do it"}
	}
	var dst peerEnd = r
	if opts.On != r.cfg.Self {
		c, err := r.client(ctx, opts.On)
		if err != nil {
			return res, fmt.Errorf("recover %s on %s: %w", name, opts.On, err)
		}
		dst = c
	}
	if _, err := dst.StageReplica(ctx, name, opts.From); err != nil {
		return res, fmt.Errorf("recover %s: stage the replica on %s: %w", name, opts.On, err)
	}
	tctx, cancel := context.WithTimeout(ctx, callTimeout)
	epoch, err := Recover(tctx, r.cli, plan)
	cancel()
	if err != nil {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), callTimeout)
		defer cancel()
		if derr := dst.DiscardReceived(dctx, name); derr != nil {
			r.log.Warn("discard a recovery's staging", "session", name, "host", opts.On, "err", derr)
		}
		return res, err
	}
	r.log.Warn("recovered a session of a gone host", "session", name, "from", plan.From, "to", opts.On, "checkpoint", opts.From, "epoch", epoch)
	return r.finishRecovery(ctx, name, opts, epoch, res, start)
}

// finishRecovery has opts.On, which owns name at epoch now, take the
// session and start it. The take is retried until ctx ends; a staging
// that is gone (discarded by a recovery that lost a race) is made again
// from the replica, which opts.On keeps.
func (r *Router) finishRecovery(ctx context.Context, name string, opts session.RecoverOptions, epoch int64, res session.RecoverResult, start time.Time) (session.RecoverResult, error) {
	res.Epoch = epoch
	var dst peerEnd = r
	if opts.On != r.cfg.Self {
		c, err := r.client(ctx, opts.On)
		if err != nil {
			return res, fmt.Errorf("recover %s: host %s owns it at epoch %d but does not answer: ask again with force: %w", name, opts.On, epoch, err)
		}
		dst = c
	}
	for {
		_, err := dst.CommitReceived(ctx, name)
		if errors.Is(err, session.ErrNotFound) {
			if _, err = dst.StageReplica(ctx, name, opts.From); err == nil {
				_, err = dst.CommitReceived(ctx, name)
			}
		}
		if err == nil {
			break
		}
		if errors.Is(err, session.ErrInvalid) || errors.Is(err, session.ErrExists) || errors.Is(err, session.ErrUnsupported) || errors.Is(err, session.ErrPermission) {
			// Asking again cannot help these.
			return res, fmt.Errorf("recover %s: host %s owns it at epoch %d but cannot take it: %w", name, opts.On, epoch, err)
		}
		r.log.Warn("the recovering host did not take the session yet; retrying", "session", name, "host", opts.On, "err", err)
		select {
		case <-ctx.Done():
			return res, fmt.Errorf("recover %s: host %s owns it at epoch %d but has not taken it (%v): ask again with force: %w", name, opts.On, epoch, err, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
	s, err := r.Start(ctx, name)
	if err != nil {
		return res, fmt.Errorf("recover %s: host %s owns it at epoch %d and has it, stopped; starting it failed: %w", name, opts.On, epoch, err)
	}
	s.Host, s.Epoch = opts.On, epoch
	res.Session, res.Took = s, time.Since(start)
	return res, nil
}

// The host-to-host calls of a replication and a recovery's staging are
// this host's own: they go to the engine, never forwarded.

func (r *Router) replicator() (session.Replicator, error) {
	rp, ok := r.cfg.Local.(session.Replicator)
	if !ok {
		return nil, fmt.Errorf("this host's engine keeps no checkpoint replicas: %w", session.ErrUnsupported)
	}
	return rp, nil
}

func (r *Router) SendCheckpoint(ctx context.Context, name, id string, w io.Writer) error {
	rp, err := r.replicator()
	if err != nil {
		return err
	}
	return rp.SendCheckpoint(ctx, name, id, w)
}

func (r *Router) ReceiveReplica(ctx context.Context, rd io.Reader) (session.Replica, error) {
	rp, err := r.replicator()
	if err != nil {
		return session.Replica{}, err
	}
	rep, err := rp.ReceiveReplica(ctx, rd)
	rep.Host = r.cfg.Self
	return rep, err
}

func (r *Router) Replicas(ctx context.Context, name string) ([]session.Replica, error) {
	rp, err := r.replicator()
	if err != nil {
		return nil, err
	}
	return rp.Replicas(ctx, name)
}

func (r *Router) StageReplica(ctx context.Context, name, id string) (session.MoveStaged, error) {
	rp, err := r.replicator()
	if err != nil {
		return session.MoveStaged{}, err
	}
	return rp.StageReplica(ctx, name, id)
}

func (r *Router) DropReplica(ctx context.Context, name, id string) error {
	rp, err := r.replicator()
	if err != nil {
		return err
	}
	return rp.DropReplica(ctx, name, id)
}

// withReplicas names, on each checkpoint, the hosts the fleet records a
// replica of it on. A failed read leaves the list as it is: the
// checkpoints are the owner's answer.
func (r *Router) withReplicas(ctx context.Context, name string, cks []session.Checkpoint) []session.Checkpoint {
	rctx, cancel := context.WithTimeout(ctx, r.etcdWait())
	defer cancel()
	reps, err := Replicas(rctx, r.cli, name)
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			r.log.Debug("read a session's replicas", "session", name, "err", err)
		}
		return cks
	}
	for i := range cks {
		for _, rp := range reps {
			if rp.Checkpoint == cks[i].ID {
				cks[i].Replicas = append(cks[i].Replicas, rp.Host)
			}
		}
	}
	return cks
}

// replicasOfUnreachable adds to the refusal of a session whose owner
// does not answer the replicas the fleet keeps of its checkpoints: what
// a recovery can start it from.
func (r *Router) replicasOfUnreachable(ctx context.Context, name string, err error) error {
	if !errors.Is(err, session.ErrUnavailable) {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, r.etcdWait())
	defer cancel()
	reps, rerr := Replicas(rctx, r.cli, name)
	if rerr != nil || len(reps) == 0 {
		return err
	}
	var have []string
	for _, rp := range reps {
		have = append(have, fmt.Sprintf("%s (taken %s) on %s", rp.Checkpoint, rp.TakenAt.UTC().Format(time.RFC3339), rp.Host))
	}
	return &session.Error{Class: session.ErrUnavailable, Msg: fmt.Sprintf("%v; the fleet keeps replicas of its checkpoints %s", err, strings.Join(have, ", ")),
		Hint: "once its host is gone, recover it from one of them", Err: err}
}

// dropReplicas asks the hosts that keep replicas of a deleted session to
// remove them. A host that does not answer keeps its copy (logged: it is
// under <data>/replicas/ there, for its operator to remove).
func (r *Router) dropReplicas(ctx context.Context, name string, reps []ReplicaAt) {
	for _, rp := range reps {
		var rep session.Replicator = r
		if rp.Host != r.cfg.Self {
			c, err := r.client(ctx, rp.Host)
			if err != nil {
				r.log.Warn("a deleted session's replica stays on its host", "session", name, "host", rp.Host, "checkpoint", rp.Checkpoint, "err", err)
				continue
			}
			rep = c
		}
		if err := rep.DropReplica(ctx, name, rp.Checkpoint); err != nil {
			r.log.Warn("a deleted session's replica stays on its host", "session", name, "host", rp.Host, "checkpoint", rp.Checkpoint, "err", err)
		}
	}
}

package fleet

import (
	"context"
	"fmt"
	"sort"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/api"
)

var _ session.Drainer = (*Router)(nil)

// Drain drains host (berth host drain H). The host does it itself: its
// draining flag is in its own record, which only it writes, and its
// sessions move from it. So a front door that is not host forwards the
// call there; a host that is gone (or that serves no address) cannot be
// drained, and one that is isolated refuses as it refuses every change.
//
// Here, the flag is written first, so placement puts nothing new here
// from then on (a placement that read this host before fails its guard
// on hosts/H's revision and reads again; one that committed before is
// made here, running, and a second drain lists it); then each session
// is taken in turn, by name: a stopped or sleeping one moves to a host
// placement picks (live, not draining, with room, the image preferred),
// one that runs is left with what to do.
func (r *Router) Drain(ctx context.Context, host string, progress func(session.DrainStep)) (session.DrainResult, error) {
	if err := ValidateHostID(host); err != nil {
		return session.DrainResult{}, err
	}
	if host != r.cfg.Self {
		c, err := r.hostClient(ctx, host, "drain")
		if err != nil {
			return session.DrainResult{}, err
		}
		return c.Drain(session.WithForwarded(ctx, 0), host, progress)
	}
	return r.drainHere(ctx, progress)
}

// Undrain ends host's drain: placement may pick it again. As Drain, it
// is the host's own to do.
func (r *Router) Undrain(ctx context.Context, host string) error {
	if err := ValidateHostID(host); err != nil {
		return err
	}
	if host != r.cfg.Self {
		c, err := r.hostClient(ctx, host, "undrain")
		if err != nil {
			return err
		}
		return c.Undrain(session.WithForwarded(ctx, 0), host)
	}
	if r.cfg.Host == nil {
		return &session.Error{Class: session.ErrUnsupported, Msg: fmt.Sprintf("host %s's front door has no registration to mark", r.cfg.Self)}
	}
	return r.cfg.Host.SetDraining(ctx, false)
}

// hostClient is the API client of host id for a call on the host itself
// (what: "drain"), with a refusal in one line when it cannot be reached:
// gone, unknown, or serving no address. A forwarded call names this
// host or none: it is never forwarded again.
func (r *Router) hostClient(ctx context.Context, id, what string) (*api.Client, error) {
	if _, fwd := session.ForwardedOf(ctx); fwd {
		return nil, &session.Error{Class: session.ErrInvalid, Msg: fmt.Sprintf("host %s was asked to %s host %s: a forwarded call is served only by the host it names", r.cfg.Self, what, id)}
	}
	rctx, cancel := context.WithTimeout(ctx, r.etcdWait())
	defer cancel()
	resp, err := r.cli.Txn(rctx).Then(clientv3.OpGet(hostKey(id)), clientv3.OpGet(seenKey(id), clientv3.WithCountOnly())).Commit()
	if err != nil {
		return nil, unavailable(err)
	}
	live, seen := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Count
	switch {
	case len(live) == 0 && seen > 0:
		return nil, &session.Error{Class: session.ErrInvalidState, Msg: fmt.Sprintf("host %s is gone (its lease expired or it left the fleet): only the host itself can %s it", id, what),
			Hint: "start its berth serve again, then " + what + " it"}
	case len(live) == 0:
		return nil, &session.Error{Class: session.ErrNotFound, Msg: fmt.Sprintf("no host %s in the fleet", id), Hint: "berth host ls lists them"}
	}
	rec, err := ParseHostRecord(id, live[0].Value)
	if err != nil {
		return nil, err
	}
	if rec.Addr == "" {
		return nil, &session.Error{Class: session.ErrUnavailable, Msg: fmt.Sprintf("host %s serves no address for other hosts: %s it on its own socket", id, what),
			Hint: "or start its berth serve with --listen HOST:PORT"}
	}
	return r.clientAt(id, rec.Addr)
}

// drainHere drains this host.
func (r *Router) drainHere(ctx context.Context, progress func(session.DrainStep)) (session.DrainResult, error) {
	res := session.DrainResult{Host: r.cfg.Self, Steps: []session.DrainStep{}}
	if r.cfg.Host == nil {
		return res, &session.Error{Class: session.ErrUnsupported, Msg: fmt.Sprintf("host %s's front door has no registration to mark", r.cfg.Self)}
	}
	if err := r.cfg.Host.SetDraining(ctx, true); err != nil {
		return res, err
	}
	r.log.Info("draining: placement puts nothing new here; moving the stopped and sleeping sessions off")
	list, err := r.cfg.Local.List(ctx)
	if err != nil {
		return res, fmt.Errorf("drain host %s: list its sessions: %w", r.cfg.Self, err)
	}
	sort.Slice(list, func(i, j int) bool { return list[i].Name < list[j].Name })
	for _, s := range list {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		step := r.drainOne(ctx, s)
		res.Steps = append(res.Steps, step)
		r.log.Info("drain", "session", step.Session, "outcome", step.Outcome, "to", step.To, "why", step.Why)
		if progress != nil {
			progress(step)
		}
	}
	return res, nil
}

// drainOne moves s off this host, or says why not.
func (r *Router) drainOne(ctx context.Context, s session.Session) session.DrainStep {
	step := session.DrainStep{Session: s.Name, State: s.State}
	fail := func(err error) session.DrainStep {
		step.Outcome, step.Why = session.DrainFailed, err.Error()
		return step
	}
	o, ok, err := r.lookup(ctx, s.Name, true)
	if err != nil {
		return fail(err)
	}
	owner := ""
	if ok {
		owner = o.host
	}
	if step.Outcome, step.Why = drainPlan(s.Name, s.State, r.cfg.Self, owner); step.Outcome != session.DrainMoved {
		return step
	}
	to, err := r.drainTarget(ctx, s.Name, o.spec)
	if err != nil {
		return fail(err)
	}
	mr, err := r.moveHere(ctx, s.Name, to, o.epoch)
	if err != nil {
		return fail(err)
	}
	step.To, step.Took = to, mr.Took
	return step
}

// drainTarget is where placement would put name now, this host aside.
func (r *Router) drainTarget(ctx context.Context, name string, spec session.CreateOptions) (string, error) {
	rctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	v, _, err := read(rctx, r.cli, false)
	if err != nil {
		return "", unavailable(err)
	}
	delete(v.live, r.cfg.Self) // draining already; and a move goes elsewhere
	spec.Name = name
	// The door is this host: the bundle goes from here to the target,
	// which must serve an address.
	return v.pick(Request{Opts: spec, Door: r.cfg.Self})
}

// drainPlan is what a drain of host self does with a session of its in
// state, which the fleet says owner holds ("": none, it was made before
// the host joined): DrainMoved to move it, else the outcome to report
// and what to do about it.
func drainPlan(name string, state session.State, self, owner string) (session.DrainOutcome, string) {
	again := "then berth host drain " + self + " again"
	switch {
	case owner == "":
		return session.DrainFailed, fmt.Sprintf("it was made before host %s joined the fleet and has no owner in it, so it cannot move: delete it, or keep the host", self)
	case owner != self:
		return session.DrainFailed, fmt.Sprintf("the fleet says host %s owns it: this copy is stale and is set aside when host %s rejoins (berth quarantine)", owner, self)
	}
	switch state {
	case session.StateStopped, session.StateSleeping:
		return session.DrainMoved, ""
	case session.StateRunning:
		return session.DrainLeft, fmt.Sprintf("it is running: berth sleep %s (its processes go with it) or berth stop %s, %s", name, name, again)
	case session.StatePaused:
		return session.DrainLeft, fmt.Sprintf("it is paused: berth resume %s then berth sleep %s, or berth stop %s; %s", name, name, name, again)
	case session.StateCrashed:
		return session.DrainLeft, fmt.Sprintf("it crashed: berth stop %s, %s", name, again)
	}
	return session.DrainLeft, fmt.Sprintf("it is %s: wait until it settles, %s", state, again)
}

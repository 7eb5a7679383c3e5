package fleet

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/berthvm/berth/session"
)

// The owner's own changes. A front door's forward carries the epoch it
// read, and the owner refuses a stale one; but a lifecycle change the
// owner serves (its own caller's, or a forwarded one) must also hold at
// the moment it is made, not only when the owner key was read: so the
// owner first writes sessions/S/status by a transaction guarded by the
// owner key's mod revision being the epoch the call was routed at and
// this host's registration being present, and asks its engine only when
// that commits. A recovery or move that committed meanwhile fails the
// guard, and the change is routed afresh (to the new owner) or refused;
// etcd out of reach refuses it too, in one line, since nothing can be
// recorded. The status, written again with the state the change left, is
// what the fleet last knew of S (a Session CRD's .status).

// Status is sessions/S/status: the last lifecycle change the owner made
// to S, at its epoch.
type Status struct {
	Host  string `json:"host"`
	Epoch int64  `json:"epoch"`
	Op    string `json:"op"`
	// State is what the change left; "" while it runs (or if it failed).
	State session.State `json:"state,omitempty"`
	At    time.Time     `json:"at"`
}

// ParseStatus reads and checks a status record.
func ParseStatus(b []byte) (Status, error) {
	var s Status
	if err := decode(b, &s); err != nil {
		return s, fmt.Errorf("status: %w", err)
	}
	if s.Epoch < 0 || len(s.Op) > 32 || len(s.State) > 32 {
		return s, fmt.Errorf("status out of range: epoch %d, op of %d bytes, state of %d bytes", s.Epoch, len(s.Op), len(s.State))
	}
	return s, ValidateHostID(s.Host)
}

func statusKey(s string) string { return sessionsDir + s + "/status" }

// epochKey marks a call's context with the epoch route served it at here
// (0: not here, or not in the fleet's keys; noEtcd: here, from this
// host's own copy, etcd being out of reach).
type epochKey struct{}

const noEtcd int64 = -1

func routedEpoch(ctx context.Context) int64 {
	e, _ := ctx.Value(epochKey{}).(int64)
	return e
}

// change is onSession for a lifecycle change (op): served here at an
// epoch of the fleet's keys, it is made only once the status
// transaction at that epoch commits, and the status then says the state
// it left.
func (r *Router) change(ctx context.Context, name, op string, f func(svc session.Service, ctx context.Context) (session.Session, error)) (session.Session, error) {
	return r.onSession(ctx, name, func(svc session.Service, ctx context.Context) (session.Session, error) {
		epoch := routedEpoch(ctx)
		if epoch == 0 {
			return f(svc, ctx) // another host's, or not in the fleet's keys
		}
		if err := r.claim(ctx, name, epoch, Status{Op: op}); err != nil {
			return session.Session{}, err
		}
		s, err := f(svc, ctx)
		if err == nil {
			if cerr := r.claim(ctx, name, epoch, Status{Op: op, State: s.State}); cerr != nil {
				r.log.Warn("record the state a change left", "session", name, "op", op, "err", cerr)
			}
		}
		return s, err
	})
}

// changeOn is change for a lifecycle change whose result is not a
// Session (replace, restore): the status says the op, not a state.
func changeOn[T any](r *Router, ctx context.Context, name, op string, f func(svc session.Service, ctx context.Context) (T, error)) (T, error) {
	return on(r, ctx, name, func(svc session.Service, ctx context.Context) (T, error) {
		if epoch := routedEpoch(ctx); epoch != 0 {
			if err := r.claim(ctx, name, epoch, Status{Op: op}); err != nil {
				var zero T
				return zero, err
			}
		}
		return f(svc, ctx)
	})
}

// claim writes st as name's status at epoch, guarded by the owner key
// still being at epoch and this host being registered. A failed guard is
// the stale-epoch refusal (naming the owner now), or, with this host's
// registration gone, the isolated one.
func (r *Router) claim(ctx context.Context, name string, epoch int64, st Status) error {
	if r.beforeClaim != nil && st.State == "" {
		r.beforeClaim(name)
	}
	if epoch == noEtcd {
		return unrecorded(name, st.Op, errors.New("it did not answer"))
	}
	st.Host, st.Epoch, st.At = r.cfg.Self, epoch, time.Now().UTC()
	cctx, cancel := context.WithTimeout(ctx, r.etcdWait())
	defer cancel()
	resp, err := r.cli.Txn(cctx).If(
		clientv3.Compare(clientv3.ModRevision(ownerKey(name)), "=", epoch),
		clientv3.Compare(clientv3.CreateRevision(hostKey(r.cfg.Self)), ">", 0),
	).Then(
		clientv3.OpPut(statusKey(name), mustJSON(st)),
	).Else(
		clientv3.OpGet(ownerKey(name)),
		clientv3.OpGet(hostKey(r.cfg.Self), clientv3.WithCountOnly()),
	).Commit()
	if err != nil {
		return unrecorded(name, st.Op, err)
	}
	if resp.Succeeded {
		return nil
	}
	if resp.Responses[1].GetResponseRange().Count == 0 {
		return &session.Error{Class: session.ErrIsolated,
			Msg: fmt.Sprintf("host %s is not registered in the fleet (its lease ended): session %q was not changed; it waits for the host to rejoin", r.cfg.Self, name)}
	}
	var o ownerAt
	ok := false
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 {
		if ow, perr := ParseOwner(kvs[0].Value); perr == nil {
			o.host, o.epoch, ok = ow.Host, kvs[0].ModRevision, true
		}
	}
	return r.stale(name, epoch, o, ok)
}

// unrecorded is the refusal of a change etcd could not record.
func unrecorded(name, op string, err error) error {
	return &session.Error{Class: session.ErrUnavailable,
		Msg:  fmt.Sprintf("session %q: %s cannot be recorded in the fleet's etcd (%v): nothing was changed", name, op, err),
		Hint: "the fleet's etcd must answer for a session to be started, stopped or changed; berth host ls shows the hosts"}
}

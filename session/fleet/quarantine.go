package fleet

import (
	"context"
	"fmt"
	"log/slog"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/berthvm/berth/session"
)

// Local is what the rejoin pass needs of the host's own engine (the
// Manager): its sessions with their epochs, and a way to set a copy
// aside.
type Local interface {
	List(ctx context.Context) ([]session.Session, error)
	// Quarantine stops the session's VM, moves its copy aside (never
	// merged, never deleted) and forgets it; it returns where the copy is.
	Quarantine(ctx context.Context, name, why string) (string, error)
}

// StaleCopy is a local session the fleet's owner key says this host
// must not run: another host owns it, or it was taken again at a later
// epoch than this copy's.
type StaleCopy struct {
	Name       string
	Epoch      int64 // this copy's (0: not known)
	Owner      string
	OwnerEpoch int64 // the owner key's mod revision
}

// Why says it in one line.
func (c StaleCopy) Why() string {
	if c.Owner != "" {
		return fmt.Sprintf("host %s owns session %s at epoch %d (this copy is at epoch %d)", c.Owner, c.Name, c.OwnerEpoch, c.Epoch)
	}
	return fmt.Sprintf("session %s was taken again at epoch %d, after this copy's epoch %d", c.Name, c.OwnerEpoch, c.Epoch)
}

// txnOps bounds the operations of one etcd transaction (etcd's default
// --max-txn-ops is 128).
const txnOps = 100

// Stale returns the copies among local that self must not run: those
// whose owner key names another host, or names self at a later epoch
// than the copy's. A session without an owner key is not the fleet's (a
// host's own from before it joined): it stays. A copy of epoch 0 owned
// by self is one whose epoch was never recorded: it stays too.
func Stale(ctx context.Context, cli *clientv3.Client, self string, local []session.Session) ([]StaleCopy, error) {
	var out []StaleCopy
	for i := 0; i < len(local); i += txnOps {
		batch := local[i:min(i+txnOps, len(local))]
		ops := make([]clientv3.Op, len(batch))
		for j, s := range batch {
			ops[j] = clientv3.OpGet(ownerKey(s.Name))
		}
		r, err := cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return nil, fmt.Errorf("read the owners of this host's sessions from etcd: %w", err)
		}
		for j, s := range batch {
			kvs := r.Responses[j].GetResponseRange().Kvs
			if len(kvs) == 0 {
				continue
			}
			o, err := ParseOwner(kvs[0].Value)
			if err != nil {
				return nil, fmt.Errorf("session %s: %w", s.Name, err)
			}
			c := StaleCopy{Name: s.Name, Epoch: s.Epoch, OwnerEpoch: kvs[0].ModRevision}
			switch {
			case o.Host != self:
				c.Owner = o.Host
			case s.Epoch != 0 && kvs[0].ModRevision > s.Epoch:
			default:
				continue
			}
			out = append(out, c)
		}
	}
	return out, nil
}

// QuarantineStale sets aside every stale copy of l (see Stale): what a
// host does when it joins or rejoins, before it takes a change. It
// returns the first error after trying every copy; the caller retries.
func QuarantineStale(ctx context.Context, cli *clientv3.Client, self string, l Local, log *slog.Logger) error {
	list, err := l.List(ctx)
	if err != nil {
		return fmt.Errorf("list this host's sessions: %w", err)
	}
	stale, err := Stale(ctx, cli, self, list)
	if err != nil {
		return err
	}
	var first error
	for _, c := range stale {
		dir, err := l.Quarantine(ctx, c.Name, c.Why())
		if err != nil {
			log.Error("quarantine a stale copy", "session", c.Name, "err", err)
			if first == nil {
				first = err
			}
			continue
		}
		log.Warn("quarantined a stale copy: it will not run here again", "session", c.Name, "dir", dir, "why", c.Why())
	}
	return first
}

package fleet

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/berthvm/berth/session"
)

// Transfer is a move's commit: one transaction makes host to the owner
// of name, which host from holds at epoch, and moves the session's
// allocation from one host to the other. It is refused with
// CodeStaleEpoch when the owner key is no longer at epoch (another
// change came first: the source must not drop its copy), and when to
// cannot take the session (gone, draining, no room) with that reason.
// It returns the new epoch.
func Transfer(ctx context.Context, cli *clientv3.Client, name, from string, epoch int64, to string) (int64, error) {
	if to == from {
		return 0, &session.Error{Class: session.ErrInvalid, Msg: fmt.Sprintf("session %s is on host %s already", name, to)}
	}
	for try := 1; ; try++ {
		v, extra, err := read(ctx, cli, false, clientv3.OpGet(ownerKey(name)), clientv3.OpGet(specKey(name)))
		if err != nil {
			return 0, err
		}
		okv, skv := extra[0].GetResponseRange().Kvs, extra[1].GetResponseRange().Kvs
		if len(okv) == 0 {
			return 0, &session.Error{Class: session.ErrNotFound, Code: session.CodeStaleEpoch, Msg: fmt.Sprintf("session %s is no longer in the fleet", name)}
		}
		owner, err := ParseOwner(okv[0].Value)
		if err != nil {
			return 0, fmt.Errorf("move %s: %w", name, err)
		}
		if okv[0].ModRevision != epoch || owner.Host != from {
			return 0, &session.Error{Class: session.ErrConflict, Code: session.CodeStaleEpoch,
				Msg: fmt.Sprintf("move %s at epoch %d from %s: the owner is now at %d on host %s", name, epoch, from, okv[0].ModRevision, owner.Host)}
		}
		var spec session.CreateOptions
		if len(skv) > 0 {
			if err := decode(skv[0].Value, &spec); err != nil {
				return 0, fmt.Errorf("move %s: spec: %w", name, err)
			}
		}
		l, ok := v.live[to]
		if !ok {
			return 0, &session.Error{Class: session.ErrNotFound, Msg: fmt.Sprintf("no live host %s in the fleet", to), Hint: "berth host ls lists them"}
		}
		if why := v.fits(to, spec); why != "" {
			return 0, &session.Error{Class: session.ErrNoSpace, Msg: fmt.Sprintf("host %s cannot take %s: %s", to, name, why)}
		}
		src, dst := v.alloc[from], v.alloc[to]
		sa, da := src.a, dst.a
		sa.CPUs, sa.MemoryMiB, sa.Sessions = max(0, sa.CPUs-spec.CPUs), max(0, sa.MemoryMiB-int64(spec.MemoryMiB)), max(0, sa.Sessions-1)
		da.CPUs, da.MemoryMiB, da.Sessions = da.CPUs+spec.CPUs, da.MemoryMiB+int64(spec.MemoryMiB), da.Sessions+1
		r, err := cli.Txn(ctx).If(
			clientv3.Compare(clientv3.ModRevision(ownerKey(name)), "=", epoch),
			clientv3.Compare(clientv3.ModRevision(allocKey(from)), "=", src.rev),
			clientv3.Compare(clientv3.ModRevision(allocKey(to)), "=", dst.rev),
			clientv3.Compare(clientv3.ModRevision(hostKey(to)), "=", l.rev),
		).Then(
			clientv3.OpPut(ownerKey(name), mustJSON(Owner{Host: to})),
			clientv3.OpPut(allocKey(from), mustJSON(sa)),
			clientv3.OpPut(allocKey(to), mustJSON(da)),
		).Commit()
		if err != nil {
			return 0, fmt.Errorf("move %s: commit to etcd: %w", name, err)
		}
		if r.Succeeded {
			return r.Header.Revision, nil
		}
		if try >= maxTries {
			return 0, fmt.Errorf("move %s: the hosts' allocations kept changing (%d tries): try again: %w", name, try, session.ErrConflict)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(rand.N(time.Duration(min(try, 10)) * time.Millisecond)):
		}
	}
}

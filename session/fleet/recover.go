package fleet

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/berthvm/berth/session"
)

func replicasPrefix(s string) string { return sessionsDir + s + "/replicas/" }

func replicaKey(s, host, id string) string { return replicasPrefix(s) + host + "/" + id }

// RecordReplica records that host keeps a copy of checkpoint id of
// name, if name's owner key is still at epoch (a session moved or
// recovered since is not said to have it).
func RecordReplica(ctx context.Context, cli *clientv3.Client, name string, epoch int64, host, id string, rec ReplicaRecord) error {
	r, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(ownerKey(name)), "=", epoch)).
		Then(clientv3.OpPut(replicaKey(name, host, id), mustJSON(rec))).Commit()
	if err != nil {
		return fmt.Errorf("record the replica of %s on %s: %w", name, host, err)
	}
	if !r.Succeeded {
		return &session.Error{Class: session.ErrConflict, Code: session.CodeStaleEpoch,
			Msg: fmt.Sprintf("session %s changed owner while its checkpoint %s was copied to %s", name, id, host), Hint: "copy it again"}
	}
	return nil
}

// ReplicaAt is a replica as the fleet's keys have it.
type ReplicaAt struct {
	Host, Checkpoint string
	ReplicaRecord
	rev int64
}

// Replicas reads the replicas the fleet records of name, by host then
// checkpoint.
func Replicas(ctx context.Context, cli *clientv3.Client, name string) ([]ReplicaAt, error) {
	r, err := cli.Get(ctx, replicasPrefix(name), clientv3.WithPrefix(), clientv3.WithLimit(MaxHosts))
	if err != nil {
		return nil, unavailable(err)
	}
	return parseReplicas(name, r.Kvs), nil
}

func parseReplicas(name string, kvs []*mvccpb.KeyValue) []ReplicaAt {
	var out []ReplicaAt
	for _, kv := range kvs {
		host, id, ok := strings.Cut(idOf(replicasPrefix(name), string(kv.Key)), "/")
		if !ok || ValidateHostID(host) != nil {
			continue
		}
		rec, err := ParseReplica(kv.Value)
		if err != nil {
			continue
		}
		out = append(out, ReplicaAt{Host: host, Checkpoint: id, ReplicaRecord: rec, rev: kv.ModRevision})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Host != out[j].Host {
			return out[i].Host < out[j].Host
		}
		return out[i].Checkpoint < out[j].Checkpoint
	})
	return out
}

// RecoverPlan is what a recovery would do, as read from etcd at one
// revision: every guard held then.
type RecoverPlan struct {
	Name, Checkpoint string
	// From is the owner, gone; Epoch the owner key's mod revision read.
	From    string
	Epoch   int64
	To      string
	Replica ReplicaAt
	spec    session.CreateOptions
}

// Say says what the plan does, in one line.
func (p RecoverPlan) Say() string {
	holds := "its disks"
	if p.Replica.Memory {
		holds = "its disks and memory"
	}
	return fmt.Sprintf("start session %s on host %s from its replica of checkpoint %s (%s as of %s), at a new epoch; host %s is gone, and its copy is quarantined when it comes back",
		p.Name, p.To, p.Checkpoint, holds, p.Replica.TakenAt.UTC().Format(time.RFC3339), p.From)
}

// PlanRecover checks the guards of a recovery of name on host to from
// its replica of checkpoint id, at one revision of etcd: the session has
// an owner other than to; the owner's registration is gone (etcd expired
// its lease: no host's clock judges it); to is live and records a
// replica of id. A guard that fails is the refusal, in one line.
func PlanRecover(ctx context.Context, cli *clientv3.Client, name, id, to string) (RecoverPlan, *view, error) {
	p := RecoverPlan{Name: name, Checkpoint: id, To: to}
	if err := session.ValidateName(name); err != nil {
		return p, nil, err
	}
	if err := ValidateHostID(to); err != nil {
		return p, nil, err
	}
	v, extra, err := read(ctx, cli, false, clientv3.OpGet(ownerKey(name)), clientv3.OpGet(specKey(name)),
		clientv3.OpGet(replicasPrefix(name), clientv3.WithPrefix(), clientv3.WithLimit(MaxHosts)))
	if err != nil {
		return p, nil, unavailable(err)
	}
	okv, skv := extra[0].GetResponseRange().Kvs, extra[1].GetResponseRange().Kvs
	if len(okv) == 0 {
		return p, nil, &session.Error{Class: session.ErrNotFound, Msg: fmt.Sprintf("session %s is not in the fleet", name)}
	}
	owner, err := ParseOwner(okv[0].Value)
	if err != nil {
		return p, nil, fmt.Errorf("recover %s: %w", name, err)
	}
	p.From, p.Epoch = owner.Host, okv[0].ModRevision
	if len(skv) > 0 {
		if err := decode(skv[0].Value, &p.spec); err != nil {
			return p, nil, fmt.Errorf("recover %s: spec: %w", name, err)
		}
	}
	if owner.Host == to {
		return p, nil, &session.Error{Class: session.ErrInvalid, Msg: fmt.Sprintf("session %s is on host %s already", name, to)}
	}
	if l, ok := v.live[owner.Host]; ok {
		left := ""
		if ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(l.lease)); err == nil && ttl.TTL >= 0 {
			left = fmt.Sprintf(" (it expires in %ds unless renewed)", ttl.TTL)
		}
		return p, nil, &session.Error{Class: session.ErrInvalidState,
			Msg:  fmt.Sprintf("host %s, which owns session %s, still holds its etcd lease%s: only a session of a host that etcd has declared gone is recovered", owner.Host, name, left),
			Hint: "wait for the lease to expire (berth host ls shows the host gone), or move the session if the host answers"}
	}
	reps := parseReplicas(name, extra[2].GetResponseRange().Kvs)
	found := false
	for _, r := range reps {
		if r.Host == to && r.Checkpoint == id {
			p.Replica, found = r, true
		}
	}
	if !found {
		var have []string
		for _, r := range reps {
			have = append(have, r.Checkpoint+" on "+r.Host)
		}
		kept := "none is kept"
		if len(have) > 0 {
			kept = "the fleet keeps " + strings.Join(have, ", ")
		}
		return p, nil, &session.Error{Class: session.ErrNotFound,
			Msg:  fmt.Sprintf("host %s keeps no replica of checkpoint %s of session %s (%s)", to, id, name, kept),
			Hint: "recover from a replica the fleet keeps"}
	}
	if _, ok := v.live[to]; !ok {
		return p, nil, &session.Error{Class: session.ErrNotFound, Msg: fmt.Sprintf("no live host %s in the fleet", to), Hint: "berth host ls lists them"}
	}
	if why := v.fits(to, p.spec); why != "" {
		return p, nil, &session.Error{Class: session.ErrNoSpace, Msg: fmt.Sprintf("host %s cannot take %s: %s", to, name, why)}
	}
	return p, v, nil
}

// Recover makes plan.To the owner of plan.Name at a new epoch, in one
// transaction guarded by the owner key's mod revision being plan.Epoch
// (two recoveries, or a recovery and anything else, race safely: one
// wins), the old owner's registration being absent, the replica's record
// unchanged and plan.To's registration the one read; the session's
// allocation goes from the old host to the new. Any guard that fails is
// read again: a changed owner is refused (CodeStaleEpoch), the rest are
// re-checked as PlanRecover does. It returns the new epoch.
func Recover(ctx context.Context, cli *clientv3.Client, plan RecoverPlan) (int64, error) {
	for try := 1; ; try++ {
		p, v, err := PlanRecover(ctx, cli, plan.Name, plan.Checkpoint, plan.To)
		if p.Epoch != 0 && p.Epoch != plan.Epoch {
			return 0, &session.Error{Class: session.ErrConflict, Code: session.CodeStaleEpoch,
				Msg: fmt.Sprintf("recover %s: its owner changed meanwhile (epoch %d on %s, now %d on %s): nothing was done", plan.Name, plan.Epoch, plan.From, p.Epoch, p.From)}
		}
		if err != nil {
			return 0, err
		}
		l := v.live[p.To]
		src, dst := v.alloc[p.From], v.alloc[p.To]
		sa, da := src.a, dst.a
		sa.CPUs, sa.MemoryMiB, sa.Sessions = max(0, sa.CPUs-p.spec.CPUs), max(0, sa.MemoryMiB-int64(p.spec.MemoryMiB)), max(0, sa.Sessions-1)
		da.CPUs, da.MemoryMiB, da.Sessions = da.CPUs+p.spec.CPUs, da.MemoryMiB+int64(p.spec.MemoryMiB), da.Sessions+1
		r, err := cli.Txn(ctx).If(
			clientv3.Compare(clientv3.ModRevision(ownerKey(p.Name)), "=", plan.Epoch),
			clientv3.Compare(clientv3.CreateRevision(hostKey(p.From)), "=", 0),
			clientv3.Compare(clientv3.ModRevision(replicaKey(p.Name, p.To, p.Checkpoint)), "=", p.Replica.rev),
			clientv3.Compare(clientv3.ModRevision(allocKey(p.From)), "=", src.rev),
			clientv3.Compare(clientv3.ModRevision(allocKey(p.To)), "=", dst.rev),
			clientv3.Compare(clientv3.ModRevision(hostKey(p.To)), "=", l.rev),
		).Then(
			clientv3.OpPut(ownerKey(p.Name), mustJSON(Owner{Host: p.To})),
			clientv3.OpPut(allocKey(p.From), mustJSON(sa)),
			clientv3.OpPut(allocKey(p.To), mustJSON(da)),
		).Commit()
		if err != nil {
			return 0, fmt.Errorf("recover %s: commit to etcd: %w", p.Name, err)
		}
		if r.Succeeded {
			return r.Header.Revision, nil
		}
		if try >= maxTries {
			return 0, fmt.Errorf("recover %s: the hosts' allocations kept changing (%d tries): try again: %w", p.Name, try, session.ErrConflict)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(rand.N(time.Duration(min(try, 10)) * time.Millisecond)):
		}
	}
}

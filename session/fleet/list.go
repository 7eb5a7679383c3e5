package fleet

import (
	"context"
	"fmt"
	"sort"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/berthvm/berth/session"
)

// view is the fleet's hosts and allocations read at one revision.
type view struct {
	rev   int64
	live  map[string]liveHost
	seen  map[string]HostRecord
	alloc map[string]allocAt
	bad   []error // records refused by the parsers: skipped, reported
}

type liveHost struct {
	rec HostRecord
	// rev is hosts/H's mod revision: placement's guard that the
	// registration read is still the one etcd has (not a new lease, not
	// a record marked draining since).
	rev int64
	// lease is hosts/H's lease, for how long it has left.
	lease int64
}

type allocAt struct {
	a   Alloc
	rev int64 // alloc/H's mod revision (0: none yet)
}

// read reads hosts/, alloc/ and (with seen) seen/ in one transaction,
// plus extra operations' responses returned as they are. Placement
// leaves seen/ out: gone hosts take no sessions.
func read(ctx context.Context, cli *clientv3.Client, seen bool, extra ...clientv3.Op) (*view, []*pb.ResponseOp, error) {
	lim := clientv3.WithLimit(MaxHosts)
	seenOp := clientv3.OpGet(seenDir, clientv3.WithPrefix(), lim)
	if !seen {
		seenOp = clientv3.OpGet(seenDir, clientv3.WithPrefix(), clientv3.WithCountOnly())
	}
	ops := append([]clientv3.Op{
		clientv3.OpGet(hostsDir, clientv3.WithPrefix(), lim),
		seenOp,
		clientv3.OpGet(allocDir, clientv3.WithPrefix(), lim),
	}, extra...)
	r, err := cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, nil, fmt.Errorf("read the fleet from etcd: %w", err)
	}
	v := &view{rev: r.Header.Revision, live: map[string]liveHost{}, seen: map[string]HostRecord{}, alloc: map[string]allocAt{}}
	for _, kv := range r.Responses[0].GetResponseRange().Kvs {
		id := idOf(hostsDir, string(kv.Key))
		rec, err := ParseHostRecord(id, kv.Value)
		if err != nil {
			v.bad = append(v.bad, err)
			continue
		}
		v.live[id] = liveHost{rec: rec, rev: kv.ModRevision, lease: kv.Lease}
	}
	for _, kv := range r.Responses[1].GetResponseRange().Kvs {
		id := idOf(seenDir, string(kv.Key))
		rec, err := ParseHostRecord(id, kv.Value)
		if err != nil {
			v.bad = append(v.bad, err)
			continue
		}
		v.seen[id] = rec
	}
	for _, kv := range r.Responses[2].GetResponseRange().Kvs {
		id := idOf(allocDir, string(kv.Key))
		a, err := ParseAlloc(kv.Value)
		if err != nil {
			v.bad = append(v.bad, fmt.Errorf("alloc %q: %w", id, err))
			continue
		}
		v.alloc[id] = allocAt{a: a, rev: kv.ModRevision}
	}
	return v, r.Responses[3:], nil
}

// List returns the fleet's hosts, by id: live ones ready or draining,
// remembered ones gone.
func List(ctx context.Context, cli *clientv3.Client) ([]session.HostInfo, error) {
	v, _, err := read(ctx, cli, true)
	if err != nil {
		return nil, err
	}
	return v.hosts(), nil
}

func (v *view) hosts() []session.HostInfo {
	var out []session.HostInfo
	for _, l := range v.live {
		st := session.HostReady
		if l.rec.Draining {
			st = session.HostDraining
		}
		h := v.info(l.rec, st)
		h.Since = l.rec.Since
		out = append(out, h)
	}
	for id, r := range v.seen {
		if _, ok := v.live[id]; ok {
			continue
		}
		h := v.info(r, session.HostGone)
		h.Since = r.At
		out = append(out, h)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func (v *view) info(r HostRecord, st session.HostState) session.HostInfo {
	a := v.alloc[r.ID].a
	return session.HostInfo{ID: r.ID, Addr: r.Addr, State: st, CPUs: r.CPUs, MemoryMiB: r.MemoryMiB,
		DiskFree: r.DiskFree, Floor: r.Floor, Images: r.Images, Left: r.Left,
		Used: session.HostUse{CPUs: a.CPUs, MemoryMiB: a.MemoryMiB, Sessions: a.Sessions}}
}

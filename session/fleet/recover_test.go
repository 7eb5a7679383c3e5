package fleet

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/fleet/fleettest"
)

// The guards of a recovery, each refusing in one line; and a recovery
// that passes them makes the replica's host the owner at a new epoch,
// moving the session's allocation there.
func TestRecoverGuards(t *testing.T) {
	t.Parallel()
	cli := dial(t, fleettest.Etcd(t))
	ctx := ctxT(t)
	join(t, cli, "h2", big)
	join(t, cli, "h3", big)
	join(t, cli, "alive", big)
	spec := session.CreateOptions{CPUs: 2, MemoryMiB: 1024}
	// make puts a session owned by owner (a host id; "gone" never
	// registered, as one whose lease etcd expired) with replicas given
	// as "host/id", and an allocation on its owner; it returns the epoch.
	mk := func(name, owner string, replicas ...string) int64 {
		t.Helper()
		ops := []clientv3.Op{
			clientv3.OpPut(specKey(name), mustJSON(spec)),
			clientv3.OpPut(allocKey(owner), mustJSON(Alloc{CPUs: 2, MemoryMiB: 1024, Sessions: 1})),
		}
		for _, r := range replicas {
			host, id, _ := strings.Cut(r, "/")
			ops = append(ops, clientv3.OpPut(replicaKey(name, host, id), mustJSON(ReplicaRecord{TakenAt: time.Now(), Bytes: 1})))
		}
		ops = append(ops, clientv3.OpPut(ownerKey(name), mustJSON(Owner{Host: owner})))
		r, err := cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			t.Fatal(err)
		}
		return r.Header.Revision
	}
	for _, tc := range []struct {
		name     string
		owner    string
		replicas []string
		to, id   string
		// meanwhile runs between the plan and the transaction.
		meanwhile func(name string)
		class     error
		code      string
		says      []string
	}{
		{name: "lease-alive", owner: "alive", replicas: []string{"h2/c1"}, to: "h2", id: "c1",
			class: session.ErrInvalidState, says: []string{"host alive", "still holds its etcd lease", "expires in"}},
		{name: "no-replica", owner: "gone", replicas: []string{"h3/c1"}, to: "h2", id: "c1",
			class: session.ErrNotFound, says: []string{"host h2 keeps no replica of checkpoint c1", "c1 on h3"}},
		{name: "other-checkpoint", owner: "gone", replicas: []string{"h2/c2"}, to: "h2", id: "c1",
			class: session.ErrNotFound, says: []string{"keeps no replica", "c2 on h2"}},
		{name: "no-replica-at-all", owner: "gone", to: "h2", id: "c1",
			class: session.ErrNotFound, says: []string{"none is kept"}},
		{name: "on-its-owner", owner: "h2", replicas: []string{"h2/c1"}, to: "h2", id: "c1",
			class: session.ErrInvalid, says: []string{"on host h2 already"}},
		{name: "to-not-live", owner: "gone", replicas: []string{"ghost/c1"}, to: "ghost", id: "c1",
			class: session.ErrNotFound, says: []string{"no live host ghost"}},
		{name: "owner-changed", owner: "gone", replicas: []string{"h2/c1"}, to: "h2", id: "c1",
			meanwhile: func(name string) {
				if _, err := cli.Put(ctx, ownerKey(name), mustJSON(Owner{Host: "h3"})); err != nil {
					t.Fatal(err)
				}
			},
			class: session.ErrConflict, code: session.CodeStaleEpoch, says: []string{"owner changed meanwhile", "nothing was done"}},
		{name: "old-host-back", owner: "gone", replicas: []string{"h2/c1"}, to: "h2", id: "c1",
			meanwhile: func(string) { join(t, cli, "gone", big) },
			class:     session.ErrInvalidState, says: []string{"still holds its etcd lease"}},
		{name: "replica-dropped", owner: "gone2", replicas: []string{"h2/c1"}, to: "h2", id: "c1",
			meanwhile: func(name string) {
				if _, err := cli.Delete(ctx, replicaKey(name, "h2", "c1")); err != nil {
					t.Fatal(err)
				}
			},
			class: session.ErrNotFound, says: []string{"keeps no replica"}},
		{name: "success", owner: "gone3", replicas: []string{"h3/c1"}, to: "h3", id: "c1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "s-" + tc.name
			epoch := mk(name, tc.owner, tc.replicas...)
			plan, _, err := PlanRecover(ctx, cli, name, tc.id, tc.to)
			if err == nil {
				if plan.Epoch != epoch || plan.From != tc.owner {
					t.Errorf("plan %+v, want epoch %d from %s", plan, epoch, tc.owner)
				}
				if tc.meanwhile != nil {
					tc.meanwhile(name)
				}
				var got int64
				got, err = Recover(ctx, cli, plan)
				if err == nil {
					r, gerr := cli.Get(ctx, ownerKey(name))
					if gerr != nil {
						t.Fatal(gerr)
					}
					o, _ := ParseOwner(r.Kvs[0].Value)
					if o.Host != tc.to || r.Kvs[0].ModRevision != got || got <= epoch {
						t.Errorf("after the recovery the owner is %s at %d; want %s at the new epoch %d (> %d)", o.Host, r.Kvs[0].ModRevision, tc.to, got, epoch)
					}
					for host, want := range map[string]int{tc.owner: 0, tc.to: 1} {
						a, _ := cli.Get(ctx, allocKey(host))
						if al, _ := ParseAlloc(a.Kvs[0].Value); al.Sessions != want {
							t.Errorf("alloc of %s: %+v, want %d sessions", host, al, want)
						}
					}
				}
			}
			if tc.class == nil {
				if err != nil {
					t.Fatalf("recover: %v", err)
				}
				return
			}
			if !errors.Is(err, tc.class) || session.CodeOf(err) != tc.code {
				t.Fatalf("recover: %v (code %q); want class %v, code %q", err, session.CodeOf(err), tc.class, tc.code)
			}
			msg := err.Error()
			if strings.Contains(msg, "\n") {
				t.Errorf("refusal in more than one line: %q", msg)
			}
			for _, s := range tc.says {
				if !strings.Contains(msg, s) {
					t.Errorf("refusal %q does not say %q", msg, s)
				}
			}
			t.Log(msg)
		})
	}
}

// Recoveries of one session raced from several front doors to two
// hosts: exactly one wins, the others are refused as stale.
func TestRecoverRace(t *testing.T) {
	t.Parallel()
	cli := dial(t, fleettest.Etcd(t))
	ctx := ctxT(t)
	join(t, cli, "h2", big)
	join(t, cli, "h3", big)
	for round := range 5 {
		name := fmt.Sprintf("race-%d", round)
		_, err := cli.Txn(ctx).Then(
			clientv3.OpPut(specKey(name), mustJSON(session.CreateOptions{CPUs: 1, MemoryMiB: 512})),
			clientv3.OpPut(replicaKey(name, "h2", "c1"), mustJSON(ReplicaRecord{Bytes: 1})),
			clientv3.OpPut(replicaKey(name, "h3", "c1"), mustJSON(ReplicaRecord{Bytes: 1})),
			clientv3.OpPut(ownerKey(name), mustJSON(Owner{Host: "gone"}))).Commit()
		if err != nil {
			t.Fatal(err)
		}
		var plans []RecoverPlan
		for _, to := range []string{"h2", "h3", "h2", "h3"} {
			p, _, err := PlanRecover(ctx, cli, name, "c1", to)
			if err != nil {
				t.Fatal(err)
			}
			plans = append(plans, p)
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		won, stale := map[string]int{}, 0
		for _, p := range plans {
			wg.Go(func() {
				_, err := Recover(ctx, cli, p)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					won[p.To]++
				case session.CodeOf(err) == session.CodeStaleEpoch:
					stale++
				default:
					t.Errorf("recover to %s: %v", p.To, err)
				}
			})
		}
		wg.Wait()
		if len(won) != 1 || stale != len(plans)-1 {
			t.Fatalf("round %d: won %v, %d refused as stale; want exactly one winner", round, won, stale)
		}
		r, _ := cli.Get(ctx, ownerKey(name))
		o, _ := ParseOwner(r.Kvs[0].Value)
		if won[o.Host] != 1 {
			t.Errorf("round %d: the owner is %s; the winner %v", round, o.Host, won)
		}
	}
}

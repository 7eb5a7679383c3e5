package fleet

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/fleet/fleettest"
)

func dial(t *testing.T, eps []string) *clientv3.Client {
	t.Helper()
	cli, err := Dial(eps[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// join registers host id with facts f; the test's end makes it leave.
func join(t *testing.T, cli *clientv3.Client, id string, f Facts) *Host {
	t.Helper()
	h, err := Join(ctxT(t), cli, HostConfig{ID: id, Addr: id + ":7000", Instance: "i-" + id, TTL: time.Second,
		Facts: func(context.Context) (Facts, error) { return f, nil }})
	if err != nil {
		t.Fatalf("join %s: %v", id, err)
	}
	t.Cleanup(func() { h.leaveOnce(context.Background()) })
	return h
}

// setDraining sets h's draining flag once h is ready (just joined, it
// may not be yet).
func setDraining(t *testing.T, h *Host, on bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := h.SetDraining(ctxT(t), on)
		if err == nil {
			return
		}
		if !errors.Is(err, session.ErrIsolated) || time.Now().After(deadline) {
			t.Fatalf("set host %s draining %v: %v", h.ID(), on, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func states(t *testing.T, cli *clientv3.Client) map[string]session.HostInfo {
	t.Helper()
	hs, err := List(ctxT(t), cli)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]session.HostInfo{}
	for _, h := range hs {
		m[h.ID] = h
	}
	return m
}

// waitState polls host ls until host id is in state want.
func waitState(t *testing.T, cli *clientv3.Client, id string, want session.HostState, within time.Duration) session.HostInfo {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		h, ok := states(t, cli)[id]
		if ok && h.State == want {
			return h
		}
		if time.Now().After(deadline) {
			t.Fatalf("host %s: %+v, not %s within %s", id, h, want, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

var big = Facts{CPUs: 64, MemoryMiB: 1 << 20, DiskFree: 1 << 40, Floor: 1 << 30}

func TestJoinListLeave(t *testing.T) {
	t.Parallel()
	cli := dial(t, fleettest.Etcd(t))
	a := join(t, cli, "a", Facts{CPUs: 4, MemoryMiB: 8192, DiskFree: 100 << 30, Floor: 1 << 30, Images: []string{"mini"}})
	setDraining(t, join(t, cli, "b", Facts{CPUs: 2, MemoryMiB: 4096}), true)
	got := states(t, cli)
	if got["a"].State != session.HostReady || got["b"].State != session.HostDraining {
		t.Fatalf("states %+v", got)
	}
	if h := got["a"]; h.CPUs != 4 || h.MemoryMiB != 8192 || h.Addr != "a:7000" || len(h.Images) != 1 || h.Since.IsZero() {
		t.Errorf("host a listed as %+v", h)
	}
	// A clean leave shows at once, not after the TTL.
	if err := a.leaveOnce(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	h := states(t, cli)["a"]
	if h.State != session.HostGone || !h.Left {
		t.Errorf("after leave: %+v, want gone and left", h)
	}
}

// A host whose daemon dies (no revoke) goes gone after its lease's TTL,
// and is remembered, not left.
func TestCrashedHostGoesGone(t *testing.T) {
	t.Parallel()
	cli := dial(t, fleettest.Etcd(t))
	h := join(t, cli, "a", big)
	h.crash()
	if got := states(t, cli)["a"]; got.State != session.HostReady {
		t.Fatalf("just after the crash: %+v, want still ready (the lease lives its TTL)", got)
	}
	got := waitState(t, cli, "a", session.HostGone, 10*time.Second)
	if got.Left {
		t.Errorf("a crashed host is listed as having left: %+v", got)
	}
}

// A lost lease (revoked, or expired while etcd was out of reach) is
// followed by a new registration.
func TestLostLeaseRegistersAgain(t *testing.T) {
	t.Parallel()
	cli := dial(t, fleettest.Etcd(t))
	h := join(t, cli, "a", big)
	revokeAndWait(t, cli, h, "a")
}

// revokeAndWait revokes host id's lease (h's) and waits up to 10 s for
// its registration under a new lease, which it returns.
func revokeAndWait(t *testing.T, cli *clientv3.Client, h *Host, id string) HostRecord {
	t.Helper()
	h.mu.Lock()
	lease := h.lease
	h.mu.Unlock()
	if _, err := cli.Revoke(ctxT(t), lease); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		r, err := cli.Get(ctxT(t), hostKey(id))
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Kvs) == 1 && clientv3.LeaseID(r.Kvs[0].Lease) != lease {
			rec, err := ParseHostRecord(id, r.Kvs[0].Value)
			if err != nil {
				t.Fatal(err)
			}
			return rec
		}
		if time.Now().After(deadline) {
			t.Fatalf("host %s did not register again after its lease was revoked", id)
		}
	}
}

// One host id, one live berth: another is refused, while a daemon
// restarted on the same data directory (same instance) takes over.
func TestHostIDHeldOnce(t *testing.T) {
	t.Parallel()
	cli := dial(t, fleettest.Etcd(t))
	join(t, cli, "a", big)
	_, err := Join(ctxT(t), cli, HostConfig{ID: "a", Instance: "other", TTL: time.Second})
	if !errors.Is(err, session.ErrConflict) {
		t.Fatalf("second host a: %v, want ErrConflict", err)
	}
	h2, err := Join(ctxT(t), cli, HostConfig{ID: "a", Instance: "i-a", TTL: time.Second})
	if err != nil {
		t.Fatalf("restart on the same instance: %v", err)
	}
	h2.leaveOnce(ctxT(t))
	if _, err := Join(ctxT(t), cli, HostConfig{ID: "Bad_ID"}); !errors.Is(err, session.ErrInvalid) {
		t.Errorf("bad id: %v", err)
	}
}

func opts(name string, cpus, mib int) session.CreateOptions {
	return session.CreateOptions{Name: name, CPUs: cpus, MemoryMiB: mib, DiskBytes: 1 << 30, Image: "mini"}
}

// frontDoors are n clients of their own, as n hosts placing at once.
func frontDoors(t *testing.T, eps []string, n int) []*clientv3.Client {
	var out []*clientv3.Client
	for range n {
		out = append(out, dial(t, eps))
	}
	return out
}

// checkAllocs checks every host's allocation is the sum of the specs of
// the sessions it owns, and within its capacity.
func checkAllocs(t *testing.T, cli *clientv3.Client) map[string]int {
	t.Helper()
	ctx := ctxT(t)
	r, err := cli.Get(ctx, sessionsDir, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	specs, owners := map[string]session.CreateOptions{}, map[string]string{}
	for _, kv := range r.Kvs {
		k := idOf(sessionsDir, string(kv.Key))
		name, part, _ := strings.Cut(k, "/")
		switch part {
		case "spec":
			var o session.CreateOptions
			if err := decode(kv.Value, &o); err != nil {
				t.Fatal(err)
			}
			specs[name] = o
		case "owner":
			o, err := ParseOwner(kv.Value)
			if err != nil {
				t.Fatal(err)
			}
			owners[name] = o.Host
		}
	}
	want := map[string]Alloc{}
	perHost := map[string]int{}
	for name, host := range owners {
		s, ok := specs[name]
		if !ok {
			t.Errorf("session %s has an owner and no spec", name)
		}
		a := want[host]
		a.CPUs += s.CPUs
		a.MemoryMiB += int64(s.MemoryMiB)
		a.Sessions++
		want[host] = a
		perHost[host]++
	}
	if len(specs) != len(owners) {
		t.Errorf("%d specs, %d owners", len(specs), len(owners))
	}
	v, _, err := read(ctx, cli, true)
	if err != nil {
		t.Fatal(err)
	}
	for id, at := range v.alloc {
		if at.a != want[id] {
			t.Errorf("host %s: allocation %+v, its sessions sum to %+v", id, at.a, want[id])
		}
		if l, ok := v.live[id]; ok && (at.a.CPUs > l.rec.CPUs || at.a.MemoryMiB > l.rec.MemoryMiB) {
			t.Errorf("host %s promised %+v, has %d CPUs and %d MiB", id, at.a, l.rec.CPUs, l.rec.MemoryMiB)
		}
	}
	return perHost
}

// 3 front doors create the same 50 names at once: each is made exactly
// once, the others are told it exists.
func TestPlaceSameNameOnce(t *testing.T) {
	t.Parallel()
	eps := fleettest.Etcd(t)
	cli := dial(t, eps)
	for _, id := range []string{"a", "b", "c"} {
		join(t, cli, id, big)
	}
	doors := frontDoors(t, eps, 3)
	const names = 50
	made := make([]int, names)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, d := range doors {
		for i := range names {
			wg.Go(func() {
				_, err := Place(ctxT(t), d, Request{Opts: opts(fmt.Sprintf("s%d", i), 1, 256)})
				switch {
				case err == nil:
					mu.Lock()
					made[i]++
					mu.Unlock()
				case !errors.Is(err, session.ErrExists):
					t.Errorf("place s%d: %v", i, err)
				}
			})
		}
	}
	wg.Wait()
	for i, n := range made {
		if n != 1 {
			t.Errorf("s%d made %d times", i, n)
		}
	}
	per := checkAllocs(t, cli)
	total := 0
	for _, n := range per {
		total += n
	}
	if total != names {
		t.Errorf("%d sessions owned, want %d", total, names)
	}
}

// 3 front doors × 50 creates of distinct names against 16 CPUs in all:
// exactly 16 are placed, the rest refused for room, and no host is
// promised more than it has.
func TestPlaceNeverOverpromises(t *testing.T) {
	t.Parallel()
	eps := fleettest.Etcd(t)
	cli := dial(t, eps)
	small := Facts{CPUs: 8, MemoryMiB: 64 << 10, DiskFree: 1 << 40}
	join(t, cli, "a", small)
	join(t, cli, "b", small)
	doors := frontDoors(t, eps, 3)
	var placed, full int
	var mu sync.Mutex
	var wg sync.WaitGroup
	for di, d := range doors {
		for i := range 50 {
			wg.Go(func() {
				_, err := Place(ctxT(t), d, Request{Opts: opts(fmt.Sprintf("d%d-%d", di, i), 1, 512)})
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					placed++
				case errors.Is(err, session.ErrNoSpace):
					full++
				default:
					t.Errorf("place: %v", err)
				}
			})
		}
	}
	wg.Wait()
	if placed != 16 || full != 150-16 {
		t.Errorf("placed %d, refused for room %d; want 16 and %d", placed, full, 150-16)
	}
	per := checkAllocs(t, cli)
	if per["a"] != 8 || per["b"] != 8 {
		t.Errorf("per host %v, want 8 each", per)
	}
}

func TestPlaceChoosesAndPins(t *testing.T) {
	t.Parallel()
	cli := dial(t, fleettest.Etcd(t))
	join(t, cli, "empty", Facts{CPUs: 16, MemoryMiB: 32 << 10, DiskFree: 1 << 40})
	join(t, cli, "imaged", Facts{CPUs: 16, MemoryMiB: 32 << 10, DiskFree: 1 << 40, Images: []string{"debian"}})
	setDraining(t, join(t, cli, "drain", Facts{CPUs: 16, MemoryMiB: 32 << 10, DiskFree: 1 << 40}), true)
	join(t, cli, "tiny", Facts{CPUs: 1, MemoryMiB: 512, DiskFree: 1 << 40})
	join(t, cli, "lowdisk", Facts{CPUs: 16, MemoryMiB: 32 << 10, DiskFree: 2 << 30, Floor: 1536 << 20})
	gone := join(t, cli, "gone", big)
	gone.leaveOnce(ctxT(t))
	// A host without --listen: only it can be the door that places there.
	noaddr, err := Join(ctxT(t), cli, HostConfig{ID: "noaddr", Instance: "i-noaddr", TTL: time.Second,
		Facts: func(context.Context) (Facts, error) { return Facts{CPUs: 1, MemoryMiB: 1024, DiskFree: 1 << 40}, nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer noaddr.leaveOnce(context.Background())
	deb := opts("x", 2, 1024)
	deb.Image = "debian"
	for _, c := range []struct {
		name string
		req  Request
		host string
		err  error
	}{
		{"prefers the image", Request{Opts: deb}, "imaged", nil},
		{"pinned", Request{Opts: opts("p1", 2, 1024), On: "empty"}, "empty", nil},
		{"pinned to a draining host", Request{Opts: opts("p2", 1, 256), On: "drain"}, "", session.ErrInvalidState},
		{"pinned to a full host", Request{Opts: opts("p3", 2, 256), On: "tiny"}, "", session.ErrNoSpace},
		{"pinned below the disk floor", Request{Opts: opts("p4", 1, 256), On: "lowdisk"}, "", session.ErrNoSpace},
		{"pinned to a gone host", Request{Opts: opts("p5", 1, 256), On: "gone"}, "", session.ErrInvalidState},
		{"pinned to no such host", Request{Opts: opts("p6", 1, 256), On: "nope"}, "", session.ErrNotFound},
		{"pinned to a host no door reaches", Request{Opts: opts("p8", 1, 256), On: "noaddr", Door: "empty"}, "", session.ErrInvalidState},
		{"pinned to itself without an address", Request{Opts: opts("p9", 1, 256), On: "noaddr", Door: "noaddr"}, "noaddr", nil},
		{"too big for all", Request{Opts: opts("p7", 32, 256)}, "", session.ErrNoSpace},
		{"name taken", Request{Opts: opts("x", 1, 256)}, "", session.ErrExists},
		{"bad name", Request{Opts: opts("X!", 1, 256)}, "", session.ErrInvalid},
	} {
		p, err := Place(ctxT(t), cli, c.req)
		if c.err != nil {
			if !errors.Is(err, c.err) {
				t.Errorf("%s: %v, want %v", c.name, err, c.err)
			}
			continue
		}
		if err != nil || p.Host != c.host || p.Epoch == 0 {
			t.Errorf("%s: %+v, %v; want host %s", c.name, p, err, c.host)
		}
	}
	// The epoch is the owner key's mod revision.
	r, err := cli.Get(ctxT(t), ownerKey("p1"))
	if err != nil || len(r.Kvs) != 1 {
		t.Fatal(r, err)
	}
	checkAllocs(t, cli)
	if err := Release(ctxT(t), cli, "x"); err != nil {
		t.Fatal(err)
	}
	if err := Release(ctxT(t), cli, "x"); !errors.Is(err, session.ErrNotFound) {
		t.Errorf("second release: %v", err)
	}
	checkAllocs(t, cli)
	if h := states(t, cli)["imaged"]; h.Used != (session.HostUse{}) {
		t.Errorf("after release, imaged uses %+v", h.Used)
	}
}

// A host that leaves after losing its lease is still recorded as left.
func TestLeaveAfterLostLease(t *testing.T) {
	t.Parallel()
	cli := dial(t, fleettest.Etcd(t))
	h := join(t, cli, "a", big)
	h.crash() // the keeper ends; nothing keeps the lease
	waitState(t, cli, "a", session.HostGone, 10*time.Second)
	if err := h.leaveOnce(ctxT(t)); err != nil {
		t.Fatalf("leave after the lease expired: %v", err)
	}
	if got := states(t, cli)["a"]; got.State != session.HostGone || !got.Left {
		t.Errorf("after leave: %+v", got)
	}
}

// Close ends the keeper and the client's lease goroutines: nothing of
// the node outlives it.
func TestNodeCloseLeavesNoGoroutine(t *testing.T) {
	eps := fleettest.Etcd(t)
	n, err := Start(ctxT(t), Config{Endpoints: eps[0], HostConfig: HostConfig{ID: "a", TTL: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	if l, err := n.Hosts(ctxT(t)); err != nil || !l.Fleet || l.Self != "a" || len(l.Hosts) != 1 {
		t.Fatalf("hosts: %+v, %v", l, err)
	}
	if err := n.Close(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		left := ""
		for _, f := range []string{"fleet.(*Host).keep", "client/v3.(*lessor)"} {
			if strings.Contains(stacks, f) {
				left = f
			}
		}
		if left == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("a goroutine in %s outlives Close", left)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A door never places on a host it cannot reach (no address), however
// empty that host is; that host's own door does.
func TestPlaceSkipsHostsTheDoorCannotReach(t *testing.T) {
	t.Parallel()
	cli := dial(t, fleettest.Etcd(t))
	join(t, cli, "busy", Facts{CPUs: 64, MemoryMiB: 64 << 10, DiskFree: 1 << 40})
	h, err := Join(ctxT(t), cli, HostConfig{ID: "quiet", Instance: "i-quiet", TTL: time.Second,
		Facts: func(context.Context) (Facts, error) { return big, nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer h.leaveOnce(context.Background())
	for i := range 10 {
		p, err := Place(ctxT(t), cli, Request{Opts: opts(fmt.Sprintf("s%d", i), 1, 256), Door: "busy"})
		if err != nil || p.Host != "busy" {
			t.Fatalf("place from busy: %+v, %v; want busy (quiet has no address)", p, err)
		}
	}
	if p, err := Place(ctxT(t), cli, Request{Opts: opts("mine", 1, 256), Door: "quiet", On: "quiet"}); err != nil || p.Host != "quiet" {
		t.Errorf("place from quiet on itself: %+v, %v", p, err)
	}
}

func TestBackoff(t *testing.T) {
	ttl := 3 * time.Second
	for _, tc := range []struct{ in, want time.Duration }{
		{200 * time.Millisecond, 400 * time.Millisecond},
		{400 * time.Millisecond, 800 * time.Millisecond},
		{800 * time.Millisecond, time.Second}, // a third of the TTL, not the TTL
		{time.Second, time.Second},
		{0, 200 * time.Millisecond},
	} {
		if got := nextBackoff(tc.in, ttl); got != tc.want {
			t.Errorf("nextBackoff(%s) = %s, want %s", tc.in, got, tc.want)
		}
	}
	lo, hi := time.Hour, time.Duration(0)
	for range 1000 {
		j := jitter(time.Second)
		lo, hi = min(lo, j), max(hi, j)
	}
	if lo < 800*time.Millisecond || hi > 1200*time.Millisecond || hi-lo < 200*time.Millisecond {
		t.Errorf("jitter(1s) spans %s to %s, want within ±20%% and spread", lo, hi)
	}
}

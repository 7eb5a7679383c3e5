package fleet_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/api"
	"github.com/berthvm/berth/session/fleet"
	"github.com/berthvm/berth/session/fleet/pki"
)

// TestBenchScale is the fleet at scale, by simulation: a three-member
// etcd cluster (three processes of this test binary running
// member.Run, the code berth-etcd runs), 50 hosts each in its own
// process (registration under a lease, the sessiontest fake for the
// engine, the Router over it, the API on a mutual-TLS loopback listener;
// see scaleHost), and 10,000 sessions made through the hosts' front
// doors by 8 concurrent clients. Every figure is a ratio against a
// reference measured in the same run, on the same machine at the same
// time (it is noisy): a lone host, the same fake behind the same API
// and TLS in a process of its own, with no etcd; and one etcd Put.
//
//   - create p50/p99 through a front door vs a create on the lone host,
//     and vs one etcd Put; placement alone (fleet.Place) vs the Put;
//   - etcd writes per create: revisions, keys put and range ops, less
//     the idle fleet's own (lease keep-alives, the hosts' record
//     refreshes), measured over one TTL before;
//   - a host's loss (SIGKILL of its process group) until every other
//     host's Hosts says it is gone, vs the lease TTL;
//   - a fleet List of 10,000 sessions vs the lone host's List of as many;
//   - 20 followers on Watch through 20 front doors: one state change,
//     made on its owner, until all 20 have it, vs one follower of the
//     lone host.
//
// etcd is plain HTTP on loopback here (the daemon speaks mutual TLS to
// it with --fleet-ca); the hosts' API, which every forwarded call
// crosses, is mutual TLS as in the daemon. The whole run takes about
// 2.5 minutes on 2 cores, 1.5 of them the 10,000 creates.
//
// # Where it bends
//
// From a run on a shared 2-core machine (load average above 10):
//
//   - A create through a door is 54 ms p50, 77x the lone host's and
//     7.9x one etcd Put (6.9 ms with 8 at once: a commit is a raft round
//     and an fsync on two of three members). Placement alone is 28 ms,
//     4.1x the Put: one linearizable read transaction (hosts/, alloc/,
//     the owner key) and one commit transaction of 3 keys guarded by 3
//     compares, 1.05 tries a create with 8 clients on 50 hosts. The
//     other half is the forward: the door's read of the placed host's
//     record, a TLS call to the owner (with 50 doors and 50 owners most
//     door-owner pairs are cold, so a handshake is likely; not measured
//     apart), the owner's fresh read of its owner key. etcd counts 1.00
//     revision, 3.00 keys put and 15.6 range ops a create (compares
//     included, each counted on all 3 members that apply the commit).
//   - Every placement try reads hosts/ and alloc/ whole: 99 records,
//     15 KB at 50 hosts, about 300 KB and 2,000 JSON records to parse at
//     1,000, on every create and every `host ls`.
//   - A fleet List is 3.5x the lone host's (0.75 s vs 0.21 s for
//     10,000): it reads sessions/ whole (20,000 keys, 2.1 MB, 71 ms of
//     it) and asks all 50 hosts, the slowest setting the pace. At 210
//     bytes a session the client's 64 MiB bound on one etcd answer is
//     reached near 300,000 sessions, and a List then fails outright.
//   - A fleet Watch is one etcd watch (hosts/) and one API stream to
//     every live host: 20 followers are 20 etcd watchers and 980 host
//     streams, 20 on each host; an event reaches all 20 in 5.3 ms p50
//     (20x the lone host's one follower, 3 process hops instead of 1),
//     and the 20 followers' start replays 200,000 events (19 s). At
//     1,000 hosts F followers cost F×1,000 streams and each start
//     replays the whole fleet.
//   - Liveness: 50 leases; the idle fleet costs etcd 4.9 revisions,
//     9.8 keys put and 12.8 lease renewals a second (each host rewrites
//     hosts/H and seen/H every TTL and renews every TTL/3) — 100
//     revisions, 200 puts and 300 renewals a second at 1,000 hosts, and
//     every record rewrite is an event to every fleet Watch's hosts/
//     watch. A host's loss shows gone everywhere 0.78x to 1.04x the TTL
//     after the kill over three runs (where in the TTL/3 renewal cycle the
//     kill lands, plus etcd's expiry sweep and the 250 ms poll): it does
//     not grow with the host count.
//
// # What would carry it to 1,000 hosts (on paper)
//
//   - Key layout: keep placement off the whole of hosts/: each door
//     keeps the hosts' capacity and promises in memory, fed by a watch
//     on hosts/ and alloc/, and commits with today's guards (alloc/H's
//     revision, hosts/H's lease), so a stale cache costs a retry, never
//     a double promise; placement is then one transaction. Split what
//     changes from what does not: hosts/H holds the address and
//     capacity, written at join and on change, not every TTL. Add an
//     index of sessions by host (byhost/H/S) so a door can read one
//     host's owners, and read sessions/ in pages (WithLimit, WithFrom)
//     so no answer nears 64 MiB.
//   - Watch ranges: one etcd watch on hosts/ per door, shared by all its
//     followers, and one stream per host per door, fanned out in the
//     door: F×N streams become N per door, and a follower's start is
//     served from the door's cache, not replayed by every host. Further:
//     the owner writes sessions/S/status at its epoch (the key is
//     reserved) and followers watch one prefix of etcd, from a
//     revision, resumable, with no stream to any host.
//   - Lease count: one lease per host is 1,000 leases, which etcd's
//     lessor holds easily (their expiry is kept in a heap); what grows
//     is the renewals, 300 a second at TTL 10 s, and with records
//     refreshed only on change there are no idle writes at all.
//     Sessions get no lease of their own: a session's liveness is its
//     host's.
func TestBenchScale(t *testing.T) {
	if os.Getenv("BERTH_BENCH") == "" {
		t.Skip("set BERTH_BENCH=1 (make bench)")
	}
	const (
		nHosts     = 50
		nSessions  = 10000
		nClients   = 8
		nFollowers = 20
		rounds     = 30
		ttl        = fleet.DefaultTTL // as the daemon's
	)
	var phases []string
	phase := func(what string, start time.Time) {
		d := time.Since(start).Round(10 * time.Millisecond)
		phases = append(phases, fmt.Sprintf("%s %s", what, d))
		t.Logf("phase %-32s %s", what, d)
	}
	began := time.Now()
	ctx := t.Context()

	ca := filepath.Join(t.TempDir(), "ca")
	if err := pki.Init(ca, "bench"); err != nil {
		t.Fatal(err)
	}
	opDir := filepath.Join(t.TempDir(), "op")
	if err := pki.Issue(ca, opDir, "operator", nil, nil); err != nil {
		t.Fatal(err)
	}
	opTLS, err := pki.ClientConfig(opDir)
	if err != nil {
		t.Fatal(err)
	}

	// etcd: three members, each a process; their peer ports are fixed
	// before they start, as an initial cluster needs.
	start := time.Now()
	etcdGroup := newProcs(t)
	var peers, clients []string
	for range 3 {
		peers = append(peers, "http://"+freePort(t))
		clients = append(clients, "http://"+freePort(t))
	}
	var cluster []string
	for i := range 3 {
		cluster = append(cluster, fmt.Sprintf("e%d=%s", i, peers[i]))
	}
	for i := range 3 {
		etcdGroup.start(t, roleEtcd, envName+"="+fmt.Sprintf("e%d", i), envDir+"="+filepath.Join(t.TempDir(), "etcd"),
			envClient+"="+clients[i], envPeer+"="+peers[i], envCluster+"="+strings.Join(cluster, ","))
	}
	for _, p := range etcdGroup.all {
		p.await(t, "clients on", 2*time.Minute)
	}
	eps := strings.Join(clients, ",")
	cli, err := fleet.Dial(eps, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	phase("etcd, 3 members", start)

	// The lone host and the fleet's 50.
	start = time.Now()
	hostGroup := newProcs(t)
	single := hostGroup.start(t, roleSingle, envName+"=single", envDir+"="+filepath.Join(t.TempDir(), "single"), envCA+"="+ca)
	ids := make([]string, nHosts)
	byID := map[string]*proc{}
	for i := range nHosts {
		ids[i] = fmt.Sprintf("h%02d", i)
		byID[ids[i]] = hostGroup.start(t, roleHost, envName+"="+ids[i], envDir+"="+filepath.Join(t.TempDir(), ids[i]),
			envCA+"="+ca, envEtcd+"="+eps, envTTL+"="+ttl.String())
	}
	addr := map[string]string{}
	for _, id := range append([]string{"single"}, ids...) {
		p := single
		if id != "single" {
			p = byID[id]
		}
		addr[id] = strings.TrimPrefix(p.await(t, "READY ", 2*time.Minute), "READY ")
	}
	dial := func(id string) *api.Client {
		c := api.DialTLS(addr[id], opTLS, api.WithActor("bench"))
		t.Cleanup(func() { c.Close() })
		return c
	}
	lone := dial("single")
	doors := map[string]*api.Client{}
	for _, id := range ids {
		doors[id] = dial(id)
	}
	phase(fmt.Sprintf("start %d hosts + the lone one", nHosts), start)

	// The idle fleet's own load on etcd, over one TTL (one refresh of
	// every host's record, three keep-alives of its lease): subtracted
	// from the creates' counts below.
	start = time.Now()
	bg0 := etcdCounters(t, cli, clients)
	time.Sleep(ttl)
	bg := etcdCounters(t, cli, clients).minus(bg0)
	bgSecs := time.Since(start).Seconds()
	leases, err := cli.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	phase("idle fleet, one TTL", start)

	// Creates on the lone host: the reference.
	start = time.Now()
	loneCreate := creates(t, nSessions, nClients, func(int) *api.Client { return lone })
	phase(fmt.Sprintf("%d creates on the lone host", nSessions), start)

	// One etcd write of a spec's size, as many at once as the creates:
	// the floor under a placement's commit on this cluster and disk.
	start = time.Now()
	spec := strings.Repeat("x", 300)
	puts := make([]time.Duration, 1000)
	var pwg sync.WaitGroup
	for w := range nClients {
		pwg.Go(func() {
			for j := w; j < len(puts); j += nClients {
				s := time.Now()
				if _, err := cli.Put(ctx, fmt.Sprintf("/bench/put/%d", j), spec); err != nil {
					t.Error(err)
					return
				}
				puts[j] = time.Since(s)
			}
		})
	}
	pwg.Wait()
	if _, err := cli.Delete(ctx, "/bench/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	phase("1,000 etcd puts", start)

	start = time.Now()
	c0 := etcdCounters(t, cli, clients)
	fleetCreate := creates(t, nSessions, nClients, func(j int) *api.Client { return doors[ids[j%nHosts]] })
	dc := etcdCounters(t, cli, clients).minus(c0)
	createSecs := time.Since(start).Seconds()
	phase(fmt.Sprintf("%d creates through %d doors", nSessions, nHosts), start)
	var places, tries, failed int
	for _, id := range ids {
		f := strings.Fields(byID[id].ask(t, "stats", "STATS ", 10*time.Second))
		p, _ := strconv.Atoi(f[1])
		tr, _ := strconv.Atoi(f[2])
		fl, _ := strconv.Atoi(f[3])
		places, tries, failed = places+p, tries+tr, failed+fl
	}
	perCreate := func(v, bgv float64) float64 { return (v - bgv/bgSecs*createSecs) / nSessions }
	lp50 := quantile(loneCreate, 0.5)
	t.Logf("BENCH %-40s p50 %8s p99 %8s", "create on the lone host (reference)", lp50.Round(time.Microsecond), quantile(loneCreate, 0.99).Round(time.Microsecond))
	t.Logf("BENCH %-40s p50 %8s p99 %8s  ratio %.2fx p50, %.2fx p99 vs the lone host; %d clients, %.2f placement transactions a create (%d failed)",
		fmt.Sprintf("create through a door, %d hosts", nHosts), quantile(fleetCreate, 0.5).Round(time.Microsecond), quantile(fleetCreate, 0.99).Round(time.Microsecond),
		float64(quantile(fleetCreate, 0.5))/float64(lp50), float64(quantile(fleetCreate, 0.99))/float64(quantile(loneCreate, 0.99)),
		nClients, float64(tries)/float64(max(places, 1)), failed)
	t.Logf("BENCH %-40s p50 %8s p99 %8s  the fleet's create is %.2fx p50 of one etcd write (%d at once)",
		"etcd Put, 300 bytes (reference)", quantile(puts, 0.5).Round(time.Microsecond), quantile(puts, 0.99).Round(time.Microsecond),
		float64(quantile(fleetCreate, 0.5))/float64(quantile(puts, 0.5)), nClients)
	t.Logf("BENCH %-40s %.2f revisions, %.2f keys put, %.2f range ops (compares included, counted on each member that applies a write) a create (idle fleet's own %.1f revisions/s, %.1f ranges/s subtracted; raw %.2f, %.2f, %.2f)",
		"etcd writes per create", perCreate(dc.rev, bg.rev), perCreate(dc.puts, bg.puts), perCreate(dc.ranges, bg.ranges),
		bg.rev/bgSecs, bg.ranges/bgSecs, dc.rev/nSessions, dc.puts/nSessions, dc.ranges/nSessions)
	t.Logf("BENCH %-40s %.1f revisions/s, %.1f keys put/s, %.1f lease renewals/s, %.1f range ops/s; %d leases (%d hosts, TTL %s, over %.1fs)",
		"idle fleet's etcd load", bg.rev/bgSecs, bg.puts/bgSecs, bg.leaseRenew/bgSecs, bg.ranges/bgSecs, len(leases.Leases), nHosts, ttl, bgSecs)

	// A fleet List of 10,000 vs the lone host's.
	start = time.Now()
	var fleetList, loneList []time.Duration
	var hostOf map[string]string
	for i := range 5 {
		s := time.Now()
		l, err := lone.List(ctx)
		if err != nil || len(l) != nSessions {
			t.Fatalf("lone List: %d sessions, %v", len(l), err)
		}
		loneList = append(loneList, time.Since(s))
		s = time.Now()
		l, err = doors[ids[i]].List(ctx)
		if err != nil || len(l) != nSessions {
			t.Fatalf("fleet List through %s: %d sessions, %v", ids[i], len(l), err)
		}
		fleetList = append(fleetList, time.Since(s))
		hostOf = map[string]string{}
		for _, s := range l {
			if s.State != session.StateRunning {
				t.Fatalf("fleet List: %s is %s on %s", s.Name, s.State, s.Host)
			}
			hostOf[s.Name] = s.Host
		}
	}
	var keys, bytes int
	var reads []time.Duration
	for range 5 {
		s := time.Now()
		keys, bytes = rangeSize(t, cli, fleet.Prefix+"sessions/")
		reads = append(reads, time.Since(s))
	}
	phase("5 fleet Lists + 5 lone", start)
	t.Logf("BENCH %-40s %10s vs lone %10s  ratio %.2fx  (median of 5; sessions/ holds %d keys, %.1f MB, read whole by each: %s of it)",
		fmt.Sprintf("fleet List of %d sessions, %d hosts", nSessions, nHosts), quantile(fleetList, 0.5).Round(time.Microsecond), quantile(loneList, 0.5).Round(time.Microsecond),
		float64(quantile(fleetList, 0.5))/float64(quantile(loneList, 0.5)), keys, float64(bytes)/1e6, quantile(reads, 0.5).Round(time.Microsecond))

	// Events: 20 followers through 20 doors, one state change at a time
	// made on its owner directly (so the figure is the fan-out, not the
	// routing of the call), against one follower of the lone host.
	start = time.Now()
	wctx, stopWatch := context.WithCancel(ctx)
	var fs []*follower
	for i := range nFollowers {
		fs = append(fs, follow(t, wctx, doors[ids[i]]))
	}
	for _, f := range fs {
		f.awaitCount(t, nSessions, 2*time.Minute)
	}
	phase(fmt.Sprintf("%d fleet Watches replayed", nFollowers), start)
	w0 := etcdCounters(t, cli, clients)
	start = time.Now()
	var fan, fanEach []time.Duration
	for r := range rounds {
		name := fmt.Sprintf("s%05d", r*7)
		owner := hostOf[name]
		s := time.Now()
		if _, err := doors[owner].Pause(ctx, name); err != nil {
			t.Fatalf("pause %s on %s: %v", name, owner, err)
		}
		var last time.Duration
		for _, f := range fs {
			d := f.awaitPaused(t, name, 30*time.Second).Sub(s)
			fanEach = append(fanEach, d)
			last = max(last, d)
		}
		fan = append(fan, last)
	}
	phase(fmt.Sprintf("%d events to %d followers", rounds, nFollowers), start)
	lf := follow(t, wctx, lone)
	lf.awaitCount(t, nSessions, 2*time.Minute)
	var loneFan []time.Duration
	for r := range rounds {
		name := fmt.Sprintf("s%05d", r*7)
		s := time.Now()
		if _, err := lone.Pause(ctx, name); err != nil {
			t.Fatal(err)
		}
		loneFan = append(loneFan, lf.awaitPaused(t, name, 30*time.Second).Sub(s))
	}
	stopWatch()
	t.Logf("BENCH %-40s p50 %8s p99 %8s vs lone %8s (p99 %8s)  ratio %.2fx p50  (one follower's own p50 %s; %d events; %.0f etcd watchers, %d host streams, %d on each host)",
		fmt.Sprintf("event to all %d followers, %d hosts", nFollowers, nHosts), quantile(fan, 0.5).Round(time.Microsecond), quantile(fan, 0.99).Round(time.Microsecond),
		quantile(loneFan, 0.5).Round(time.Microsecond), quantile(loneFan, 0.99).Round(time.Microsecond),
		float64(quantile(fan, 0.5))/float64(quantile(loneFan, 0.5)), quantile(fanEach, 0.5).Round(time.Microsecond), rounds,
		w0.watchers, nFollowers*(nHosts-1), nFollowers)

	// A host's loss: SIGKILL, then each other host's Hosts polled until
	// it says gone.
	start = time.Now()
	victim := ids[nHosts-1]
	const poll = 250 * time.Millisecond
	killed := time.Now()
	byID[victim].kill()
	var mu sync.Mutex
	var gone []time.Duration
	var wg sync.WaitGroup
	for _, id := range ids[:nHosts-1] {
		wg.Go(func() {
			deadline := killed.Add(3 * ttl)
			for time.Now().Before(deadline) {
				l, err := doors[id].Hosts(ctx)
				if err == nil && slices.ContainsFunc(l.Hosts, func(h session.HostInfo) bool { return h.ID == victim && h.State == session.HostGone }) {
					mu.Lock()
					gone = append(gone, time.Since(killed))
					mu.Unlock()
					return
				}
				time.Sleep(poll)
			}
			t.Errorf("host %s still lists %s as not gone %s after the kill", id, victim, 3*ttl)
		})
	}
	wg.Wait()
	phase("host loss", start)
	if len(gone) == nHosts-1 {
		slices.Sort(gone)
		t.Logf("BENCH %-40s %8s everywhere (first %s, p50 %s) vs TTL %s  ratio %.2fx  (%d hosts polling every %s; etcd renews at TTL/3, so ≥ 0.67x)",
			fmt.Sprintf("host loss shown gone, %d other hosts", nHosts-1), gone[len(gone)-1].Round(time.Millisecond), gone[0].Round(time.Millisecond),
			quantile(gone, 0.5).Round(time.Millisecond), ttl, float64(gone[len(gone)-1])/float64(ttl), nHosts-1, poll)
	}

	// Placement alone, from this process (no door, no forward), as many
	// at once as the creates, against the 49 live hosts left; and the
	// read every placement try makes: hosts/ and alloc/ whole.
	start = time.Now()
	place := make([]time.Duration, 1000)
	var plwg sync.WaitGroup
	for w := range nClients {
		plwg.Go(func() {
			for j := w; j < len(place); j += nClients {
				s := time.Now()
				if _, err := fleet.Place(ctx, cli, fleet.Request{Opts: session.CreateOptions{Name: fmt.Sprintf("p%04d", j)}.WithDefaults(session.DefaultCreate())}); err != nil {
					t.Error(err)
					return
				}
				place[j] = time.Since(s)
			}
		})
	}
	plwg.Wait()
	var hostReads []time.Duration
	for range 20 {
		s := time.Now()
		if _, err := fleet.List(ctx, cli); err != nil {
			t.Fatal(err)
		}
		hostReads = append(hostReads, time.Since(s))
	}
	hk, hb := rangeSize(t, cli, fleet.Prefix+"hosts/")
	ak, ab := rangeSize(t, cli, fleet.Prefix+"alloc/")
	phase("1,000 placements alone", start)
	t.Logf("BENCH %-40s p50 %8s p99 %8s  ratio %.2fx p50 vs etcd Put; a create through a door is %.2fx of it  (each try reads %d host and %d alloc records, %d bytes, in %s p50 with seen/)",
		fmt.Sprintf("placement alone, %d hosts", nHosts-1), quantile(place, 0.5).Round(time.Microsecond), quantile(place, 0.99).Round(time.Microsecond),
		float64(quantile(place, 0.5))/float64(quantile(puts, 0.5)), float64(quantile(fleetCreate, 0.5))/float64(quantile(place, 0.5)),
		hk, ak, hb+ab, quantile(hostReads, 0.5).Round(time.Microsecond))
	t.Logf("BENCH %-40s %s (whole run %s)", "scale simulation phases", strings.Join(phases, "; "), time.Since(began).Round(time.Second))
}

// creates makes n sessions s00000… with k clients at once, each create j
// through door(j), and returns each one's latency.
func creates(t *testing.T, n, k int, door func(j int) *api.Client) []time.Duration {
	t.Helper()
	lat := make([]time.Duration, n)
	var wg sync.WaitGroup
	for w := range k {
		wg.Go(func() {
			for j := w; j < n; j += k {
				s := time.Now()
				if _, err := door(j).Create(t.Context(), session.CreateOptions{Name: fmt.Sprintf("s%05d", j)}); err != nil {
					t.Errorf("create s%05d: %v", j, err)
					return
				}
				lat[j] = time.Since(s)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return lat
}

// follower drains one Watch, counting its events and noting when each
// session's paused state came.
type follower struct {
	mu     sync.Mutex
	n      int
	paused map[string]time.Time
	wake   chan struct{}
}

func follow(t *testing.T, ctx context.Context, c *api.Client) *follower {
	t.Helper()
	ch, err := c.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	f := &follower{paused: map[string]time.Time{}, wake: make(chan struct{}, 1)}
	go func() {
		for ev := range ch {
			at := time.Now()
			f.mu.Lock()
			f.n++
			if ev.Session != nil && ev.Session.State == session.StatePaused {
				if _, ok := f.paused[ev.Name]; !ok {
					f.paused[ev.Name] = at
				}
			}
			f.mu.Unlock()
			select {
			case f.wake <- struct{}{}:
			default:
			}
		}
	}()
	return f
}

func (f *follower) await(t *testing.T, what string, within time.Duration, done func() bool) {
	t.Helper()
	deadline := time.After(within)
	for {
		f.mu.Lock()
		ok := done()
		f.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-f.wake:
		case <-deadline:
			t.Fatalf("watch: no %s within %s", what, within)
		}
	}
}

func (f *follower) awaitCount(t *testing.T, n int, within time.Duration) {
	t.Helper()
	f.await(t, fmt.Sprintf("%d events", n), within, func() bool { return f.n >= n })
}

func (f *follower) awaitPaused(t *testing.T, name string, within time.Duration) time.Time {
	t.Helper()
	var at time.Time
	f.await(t, name+" paused", within, func() bool { var ok bool; at, ok = f.paused[name]; return ok })
	return at
}

// counters are etcd's, summed over the members where a member counts
// only what it served (ranges), from one member where every member
// applies the same (puts).
type counters struct {
	rev, puts, ranges, leaseRenew, watchers float64
}

func (a counters) minus(b counters) counters {
	return counters{a.rev - b.rev, a.puts - b.puts, a.ranges - b.ranges, a.leaseRenew - b.leaseRenew, a.watchers}
}

func etcdCounters(t *testing.T, cli *clientv3.Client, urls []string) counters {
	t.Helper()
	metricLine := regexp.MustCompile(`^([a-z_]+)(\{[^}]*\})? ([0-9.e+-]+)$`)
	r, err := cli.Get(t.Context(), "bench-revision")
	if err != nil {
		t.Fatal(err)
	}
	c := counters{rev: float64(r.Header.Revision)}
	for i, u := range urls {
		resp, err := http.Get(u + "/metrics")
		if err != nil {
			t.Logf("etcd metrics at %s: %v", u, err)
			continue
		}
		s := bufio.NewScanner(resp.Body)
		s.Buffer(nil, 1<<20)
		for s.Scan() {
			m := metricLine.FindStringSubmatch(s.Text())
			if m == nil {
				continue
			}
			v, _ := strconv.ParseFloat(m[3], 64)
			switch {
			case m[1] == "etcd_mvcc_put_total" && i == 0:
				c.puts += v
			case m[1] == "etcd_mvcc_range_total":
				c.ranges += v
			case m[1] == "etcd_debugging_mvcc_watcher_total":
				c.watchers += v
			case m[1] == "etcd_debugging_lease_renewed_total": // the leader's
				c.leaseRenew += v
			}
		}
		resp.Body.Close()
	}
	return c
}

// rangeSize is the keys under prefix and their bytes (keys and values),
// as one range read returns them.
func rangeSize(t *testing.T, cli *clientv3.Client, prefix string) (int, int) {
	t.Helper()
	r, err := cli.Get(t.Context(), prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, kv := range r.Kvs {
		n += len(kv.Key) + len(kv.Value)
	}
	return len(r.Kvs), n
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// procs are child processes of one kind, ended together when the test
// ends: stdin closed (each child exits cleanly on it), then, after a
// grace, SIGKILL to each one's process group. Groups are ended in the
// reverse of their creation, as t.Cleanup runs, so hosts leave before
// etcd goes.
type procs struct {
	all []*proc
}

type proc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	stderr string // the file its stderr goes to
	done   chan struct{}
}

func newProcs(t *testing.T) *procs {
	ps := &procs{}
	t.Cleanup(func() {
		for _, p := range ps.all {
			p.stdin.Close()
		}
		grace := time.After(10 * time.Second)
		for _, p := range ps.all {
			select {
			case <-p.done:
			case <-grace:
			}
			p.kill()
		}
	})
	return ps
}

func (ps *procs) start(t *testing.T, role string, env ...string) *proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), envRole+"="+role), env...)
	// A group of its own: the kill reaches whatever it started too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p := &proc{cmd: cmd, lines: make(chan string, 16), done: make(chan struct{}),
		stderr: filepath.Join(t.TempDir(), role+".stderr")}
	errf, err := os.Create(p.stderr)
	if err != nil {
		t.Fatal(err)
	}
	defer errf.Close()
	cmd.Stderr = errf
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ps.all = append(ps.all, p)
	go func() {
		s := bufio.NewScanner(out)
		for s.Scan() {
			select {
			case p.lines <- s.Text():
			default: // nobody asked: dropped
			}
		}
		cmd.Wait()
		close(p.done)
	}()
	return p
}

// await returns the first line containing want.
func (p *proc) await(t *testing.T, want string, within time.Duration) string {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case l := <-p.lines:
			if strings.Contains(l, want) {
				return l
			}
		case <-p.done:
			b, _ := os.ReadFile(p.stderr)
			t.Fatalf("child exited before %q: %s", want, b)
		case <-deadline:
			b, _ := os.ReadFile(p.stderr)
			t.Fatalf("child said no %q within %s: %s", want, within, b)
		}
	}
}

// ask writes a command line and awaits the answer starting with want.
func (p *proc) ask(t *testing.T, cmd, want string, within time.Duration) string {
	t.Helper()
	if _, err := io.WriteString(p.stdin, cmd+"\n"); err != nil {
		t.Fatal(err)
	}
	return p.await(t, want, within)
}

// kill ends p's process group with SIGKILL, as a host's crash.
func (p *proc) kill() {
	select {
	case <-p.done: // reaped: its pid may be another's now
	default:
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// quantile is the p quantile of d (d is left as it was).
func quantile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

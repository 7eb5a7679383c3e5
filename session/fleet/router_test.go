package fleet_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/api"
	"github.com/berthvm/berth/session/fleet"
	"github.com/berthvm/berth/session/fleet/fleettest"
	"github.com/berthvm/berth/session/fleet/pki"
	"github.com/berthvm/berth/session/sessiontest"
)

// testHost is one host of a test fleet in this process: a fake engine,
// its front door, and the front door's API over mutual TLS on loopback.
type testHost struct {
	id     string
	addr   string
	fake   *sessiontest.Fake
	router *fleet.Router
	host   *fleet.Host
	srv    *http.Server
	mu     sync.Mutex
	places []placed // the placements its creates tried
	// What serve needs again for a restart.
	scfg, ccfg *tls.Config
	facts      fleet.Facts
}

type placed struct {
	tries int
	won   bool
}

// testFleet is hosts on one embedded etcd, with a fleet CA in ca.
type testFleet struct {
	cli   *clientv3.Client
	ca    string
	hosts map[string]*testHost
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// startFleet starts hosts with the given facts (by id) on a new etcd.
// etcdAndCA is a fleet's ground: a client of a test etcd and a fleet CA.
func etcdAndCA(t *testing.T) (*clientv3.Client, string) {
	t.Helper()
	eps := fleettest.Etcd(t)
	cli, err := fleet.Dial(eps[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	ca := filepath.Join(t.TempDir(), "ca")
	if err := pki.Init(ca, "test"); err != nil {
		t.Fatal(err)
	}
	return cli, ca
}

func startFleet(t *testing.T, facts map[string]fleet.Facts) *testFleet {
	t.Helper()
	cli, ca := etcdAndCA(t)
	f := &testFleet{cli: cli, ca: ca, hosts: map[string]*testHost{}}
	for id, fa := range facts {
		f.hosts[id] = f.start(t, id, fa)
	}
	return f
}

func (f *testFleet) start(t *testing.T, id string, fa fleet.Facts) *testHost {
	t.Helper()
	dir := filepath.Join(t.TempDir(), id)
	if err := pki.Issue(f.ca, dir, id, nil, nil); err != nil {
		t.Fatal(err)
	}
	scfg, err := pki.ServerConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	ccfg, err := pki.ClientConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &testHost{id: id, fake: sessiontest.New(sessiontest.Options{}), scfg: scfg, ccfg: ccfg, facts: fa}
	t.Cleanup(func() { h.fake.Close() })
	f.serve(t, h, ln)
	return h
}

// restart kills host h's daemon as SIGKILL would (its lease not
// revoked, its API gone) and starts it again on the same engine.
func (f *testFleet) restart(t *testing.T, h *testHost) {
	t.Helper()
	h.srv.Close()
	h.router.Close()
	h.host.Crash()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.serve(t, h, ln)
}

// serve joins h to the fleet as a daemon does (again, for a restart):
// registered, its front door over its engine (a Mover: movingFake) and
// the front door's API on ln.
func (f *testFleet) serve(t *testing.T, h *testHost, ln net.Listener) {
	t.Helper()
	fa, scfg, ccfg := h.facts, h.scfg, h.ccfg
	id := h.id
	h.addr = ln.Addr().String()
	var err error
	h.host, err = fleet.Join(t.Context(), f.cli, fleet.HostConfig{ID: id, Addr: h.addr, Instance: "i-" + id, TTL: 2 * time.Second,
		Facts: func(context.Context) (fleet.Facts, error) { return fa, nil }})
	if err != nil {
		t.Fatal(err)
	}
	hh := h.host
	t.Cleanup(func() { hh.Leave(context.Background()) })
	h.router = fleet.NewRouter(f.cli, fleet.RouterConfig{Self: id, Local: &movingFake{Fake: h.fake}, Host: h.host, TLS: ccfg, Logger: testLogger(t),
		Defaults: session.DefaultCreate(),
		OnPlace: func(p fleet.Placement, err error) {
			h.mu.Lock()
			h.places = append(h.places, placed{p.Tries, err == nil})
			h.mu.Unlock()
		}})
	rt := h.router
	t.Cleanup(func() { rt.Close() })
	life, stop := context.WithCancel(context.Background())
	srv := &http.Server{Handler: api.NewServer(h.router, testLogger(t), api.WithHosts(h.router)), BaseContext: func(net.Listener) context.Context { return life },
		ErrorLog: slog.NewLogLogger(testLogger(t).Handler(), slog.LevelWarn)}
	h.srv = srv
	go srv.Serve(tls.NewListener(ln, scfg))
	t.Cleanup(func() { stop(); srv.Close() })
}

// operator is an API client with an operator's certificate to host id.
func (f *testFleet) operator(t *testing.T, id string) *api.Client {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "op")
	if err := pki.Issue(f.ca, dir, "operator", nil, nil); err != nil {
		t.Fatal(err)
	}
	cfg, err := pki.ClientConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	c := api.DialTLS(f.hosts[id].addr, cfg, api.WithActor("cli"))
	t.Cleanup(func() { c.Close() })
	return c
}

var roomy = fleet.Facts{CPUs: 64, MemoryMiB: 1 << 20, DiskFree: 1 << 40, Floor: 1 << 30, Images: []string{"mini"}}

// The conformance suite through a front door that holds no session
// itself (no room): every session call is forwarded to the owner, over
// mutual TLS, and the operator reaches the front door over TLS too.
func TestRouterSuite(t *testing.T) {
	f := startFleet(t, map[string]fleet.Facts{"a": {CPUs: 0, MemoryMiB: 0}, "b": roomy, "c": roomy})
	sessiontest.Suite(t, f.operator(t, "a"))
	if n := f.hosts["a"].fake.Calls("Create"); n != 0 {
		t.Errorf("front door a made %d sessions itself; it has no room", n)
	}
}

// The harness suite (runs and schedules by id) through a front door.
func TestRouterHarnessSuite(t *testing.T) {
	f := startFleet(t, map[string]fleet.Facts{"a": {}, "b": roomy})
	sessiontest.HarnessSuite(t, f.hosts["a"].router)
}

func wantClass(t *testing.T, what string, err, class error) {
	t.Helper()
	if !errors.Is(err, class) {
		t.Errorf("%s: %v, want class %v", what, err, class)
	}
}

// Three front doors create the same names at once: each name is made
// exactly once, the others told it exists; no host is promised twice.
func TestRouterConcurrentCreates(t *testing.T) {
	f := startFleet(t, map[string]fleet.Facts{"a": roomy, "b": roomy, "c": roomy})
	const names = 20
	ctx := t.Context()
	ids := []string{"a", "b", "c"}
	var made, exists atomic.Int32
	var wg sync.WaitGroup
	for i := range names {
		for _, id := range ids {
			wg.Go(func() {
				_, err := f.hosts[id].router.Create(ctx, session.CreateOptions{Name: fmt.Sprintf("race-%02d", i)})
				switch {
				case err == nil:
					made.Add(1)
				case errors.Is(err, session.ErrExists):
					exists.Add(1)
				default:
					t.Errorf("create race-%02d from %s: %v", i, id, err)
				}
			})
		}
	}
	wg.Wait()
	if made.Load() != names || exists.Load() != 2*names {
		t.Errorf("made %d, told exists %d; want %d and %d", made.Load(), exists.Load(), names, 2*names)
	}
	total := 0
	for _, id := range ids {
		total += f.hosts[id].fake.Calls("Create")
	}
	if total != names {
		t.Errorf("engines made %d sessions, want %d", total, names)
	}
	list, err := f.hosts["b"].router.List(ctx)
	if err != nil || len(list) != names {
		t.Fatalf("List = %d sessions, %v; want %d", len(list), err, names)
	}
	hosts, err := fleet.List(ctx, f.cli)
	if err != nil {
		t.Fatal(err)
	}
	promised := 0
	for _, h := range hosts {
		promised += h.Used.Sessions
	}
	if promised != names {
		t.Errorf("hosts promised %d sessions, want %d", promised, names)
	}
	// The figure for the report: commit transactions per create.
	var won, lost []int
	for _, id := range ids {
		for _, p := range f.hosts[id].places {
			if p.won {
				won = append(won, p.tries)
			} else {
				lost = append(lost, p.tries)
			}
		}
	}
	stats := func(ts []int) string {
		if len(ts) == 0 {
			return "none"
		}
		slices.Sort(ts)
		sum := 0
		for _, n := range ts {
			sum += n
		}
		return fmt.Sprintf("%d creates, %d transactions: mean %.2f, p50 %d, max %d", len(ts), sum, float64(sum)/float64(len(ts)), ts[len(ts)/2], ts[len(ts)-1])
	}
	t.Logf("placement tries, 3 front doors × %d names at once: made: %s; told it exists: %s", names, stats(won), stats(lost))
}

// An exec through a front door that does not own the session: its
// stdin, stdout, stderr and exit status travel, and a file written
// through one front door reads back through another.
func TestRouterExecThroughNonOwner(t *testing.T) {
	f := startFleet(t, map[string]fleet.Facts{"a": roomy, "b": roomy})
	ctx := t.Context()
	a := f.operator(t, "a")
	s, err := a.Create(ctx, session.CreateOptions{Name: "far", On: "b"})
	if err != nil || s.Host != "b" {
		t.Fatalf("create --on b = %+v, %v", s, err)
	}
	if n := f.hosts["b"].fake.Calls("Create"); n != 1 {
		t.Fatalf("host b made %d sessions, want 1", n)
	}
	r := sessiontest.Run(t, ctx, a, "far", session.ExecRequest{Argv: []string{"cat"}, Stdin: true}, "through a\n")
	if r.Stdout != "through a\n" || r.Exec.ExitCode == nil || *r.Exec.ExitCode != 0 {
		t.Errorf("cat through a: %q, %+v", r.Stdout, r.Exec)
	}
	r = sessiontest.Run(t, ctx, a, "far", session.ExecRequest{Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}}, "")
	if r.Stdout != "out\n" || r.Stderr != "err\n" || r.Exec.ExitCode == nil || *r.Exec.ExitCode != 3 {
		t.Errorf("sh through a: out %q err %q, %+v", r.Stdout, r.Stderr, r.Exec)
	}
	// The execution by id, from a front door that does not hold it.
	x, err := a.Execution(ctx, r.Exec.ID)
	if err != nil || x.ID != r.Exec.ID {
		t.Errorf("Execution(%s) through a = %+v, %v", r.Exec.ID, x, err)
	}
	if _, err := a.WriteFile(ctx, "far", "note.txt", strings.NewReader("kept")); err != nil {
		t.Fatal(err)
	}
	rc, err := f.hosts["b"].fake.ReadFile(ctx, "far", "note.txt")
	if err != nil {
		t.Fatal(err)
	}
	rc.Close()
	// A port forward through a: an echo server in b's guest.
	if err := f.hosts["b"].fake.Serve("far", 8080, func(c net.Conn) { io.Copy(c, c); c.Close() }); err != nil {
		t.Fatal(err)
	}
	conn, err := a.Forward(ctx, "far", 8080)
	if err != nil {
		t.Fatalf("Forward through a: %v", err)
	}
	io.WriteString(conn, "ping")
	buf := make([]byte, 4)
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "ping" {
		t.Errorf("forwarded echo: %q, %v", buf, err)
	}
	conn.Close()
	// Listed with its host, from either front door.
	for _, id := range []string{"a", "b"} {
		list, err := f.hosts[id].router.List(ctx)
		if err != nil || len(list) != 1 || list[0].Host != "b" || list[0].State != session.StateRunning {
			t.Errorf("List from %s = %+v, %v", id, list, err)
		}
	}
	if err := a.Delete(ctx, "far"); err != nil {
		t.Fatal(err)
	}
	hosts, _ := fleet.List(ctx, f.cli)
	for _, h := range hosts {
		if h.Used != (session.HostUse{}) {
			t.Errorf("after delete, host %s still has %+v promised", h.ID, h.Used)
		}
	}
	if _, err := a.Get(ctx, "far"); !errors.Is(err, session.ErrNotFound) {
		t.Errorf("Get after delete: %v", err)
	}
}

// A call forwarded at an epoch the owner key has moved past is refused
// with CodeStaleEpoch, naming the current epoch and host; front doors
// read afresh and go on working.
func TestRouterStaleEpoch(t *testing.T) {
	f := startFleet(t, map[string]fleet.Facts{"a": roomy, "b": roomy})
	ctx := t.Context()
	if _, err := f.hosts["a"].router.Create(ctx, session.CreateOptions{Name: "s", On: "b"}); err != nil {
		t.Fatal(err)
	}
	get, err := f.cli.Get(ctx, fleet.Prefix+"sessions/s/owner")
	if err != nil || len(get.Kvs) != 1 {
		t.Fatal(get, err)
	}
	epoch := get.Kvs[0].ModRevision
	// b's API as another host would call it.
	dir := filepath.Join(t.TempDir(), "peer")
	if err := pki.Issue(f.ca, dir, "a", nil, nil); err != nil {
		t.Fatal(err)
	}
	cfg, _ := pki.ClientConfig(dir)
	b := api.DialTLS(f.hosts["b"].addr, cfg)
	defer b.Close()
	if _, err := b.Get(session.WithForwarded(ctx, epoch), "s"); err != nil {
		t.Fatalf("Get at the current epoch %d: %v", epoch, err)
	}
	// The owner key rewritten (as a move commits a new epoch).
	put, err := f.cli.Put(ctx, fleet.Prefix+"sessions/s/owner", string(get.Kvs[0].Value))
	if err != nil {
		t.Fatal(err)
	}
	now := put.Header.Revision
	for _, c := range []struct {
		what string
		call func(ctx context.Context) error
	}{
		{"Get", func(ctx context.Context) error { _, err := b.Get(ctx, "s"); return err }},
		{"Exec", func(ctx context.Context) error {
			_, err := b.Exec(ctx, "s", session.ExecRequest{Argv: []string{"true"}})
			return err
		}},
		{"Stop", func(ctx context.Context) error { _, err := b.Stop(ctx, "s"); return err }},
		{"WriteFile", func(ctx context.Context) error {
			_, err := b.WriteFile(ctx, "s", "x", strings.NewReader("x"))
			return err
		}},
		{"Delete", func(ctx context.Context) error { return b.Delete(ctx, "s") }},
	} {
		err := c.call(session.WithForwarded(ctx, epoch))
		if !errors.Is(err, session.ErrConflict) || session.CodeOf(err) != session.CodeStaleEpoch {
			t.Errorf("%s at stale epoch %d: %v, want a stale-epoch conflict", c.what, epoch, err)
			continue
		}
		want := fmt.Sprintf(`session "s" moved: epoch %d is stale, the owner is now at %d on host b`, epoch, now)
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %q does not say %q", c.what, err, want)
		}
	}
	if st, _ := f.hosts["b"].fake.Get(ctx, "s"); st.State != session.StateRunning {
		t.Errorf("after refused calls the session is %s, want running", st.State)
	}
	// The front doors read the new epoch and go on.
	if s, err := f.hosts["a"].router.Get(ctx, "s"); err != nil || s.Host != "b" {
		t.Errorf("Get through a after the move = %+v, %v", s, err)
	}
}

// create --on: pinned to the host, refused for a host the fleet does not
// have; a second name for the same host fits beside it.
func TestRouterCreateOn(t *testing.T) {
	f := startFleet(t, map[string]fleet.Facts{"a": roomy, "b": roomy, "c": roomy})
	ctx := t.Context()
	for i, on := range []string{"c", "b", "c", "a"} {
		s, err := f.hosts["a"].router.Create(ctx, session.CreateOptions{Name: fmt.Sprintf("on-%d", i), On: on})
		if err != nil || s.Host != on {
			t.Errorf("create --on %s = host %q, %v", on, s.Host, err)
		}
	}
	_, err := f.hosts["a"].router.Create(ctx, session.CreateOptions{Name: "on-x", On: "nowhere"})
	wantClass(t, "create --on nowhere", err, session.ErrNotFound)
	if n := f.hosts["c"].fake.Calls("Create"); n != 2 {
		t.Errorf("host c made %d sessions, want 2", n)
	}
	// A host gone: its sessions show unreachable, from the spec.
	c := f.hosts["c"]
	c.srv.Close()
	if err := c.host.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	list, err := f.hosts["a"].router.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range list {
		got = append(got, fmt.Sprintf("%s@%s:%s", s.Name, s.Host, s.State))
	}
	sort.Strings(got)
	want := []string{"on-0@c:unreachable", "on-1@b:running", "on-2@c:unreachable", "on-3@a:running"}
	if !slices.Equal(got, want) {
		t.Errorf("List = %v, want %v", got, want)
	}
	s, err := f.hosts["a"].router.Get(ctx, "on-0")
	if err != nil || s.State != session.StateUnreachable || s.CPUs != 1 {
		t.Errorf("Get on-0 = %+v, %v; want unreachable with its spec", s, err)
	}
	_, err = f.hosts["a"].router.Exec(ctx, "on-0", session.ExecRequest{Argv: []string{"true"}})
	wantClass(t, "Exec on a gone host", err, session.ErrUnavailable)
}

// The single-host path is not the only way to a session made before the
// host joined: one without an owner key is served here as it was.
func TestRouterServesUnplacedLocalSessions(t *testing.T) {
	f := startFleet(t, map[string]fleet.Facts{"a": roomy})
	ctx := t.Context()
	a := f.hosts["a"]
	if _, err := a.fake.Create(ctx, session.CreateOptions{Name: "old"}); err != nil {
		t.Fatal(err)
	}
	r := sessiontest.Run(t, ctx, a.router, "old", session.ExecRequest{Argv: []string{"echo", "hi"}}, "")
	if r.Stdout != "hi\n" {
		t.Errorf("exec on a pre-fleet session: %q", r.Stdout)
	}
	list, err := a.router.List(ctx)
	if err != nil || len(list) != 1 || list[0].Host != "a" {
		t.Errorf("List = %+v, %v", list, err)
	}
}

// The figure for the report: exec true through a front door to another
// host's session, against the same exec on the owner's own front door
// (in process, no socket), p50 of each, in one run.
func TestRouterExecLatency(t *testing.T) {
	if testing.Short() {
		t.Skip("a measurement")
	}
	f := startFleet(t, map[string]fleet.Facts{"a": roomy, "b": roomy})
	ctx := t.Context()
	if _, err := f.hosts["a"].router.Create(ctx, session.CreateOptions{Name: "lat", On: "b"}); err != nil {
		t.Fatal(err)
	}
	a := f.operator(t, "a")
	b := f.operator(t, "b")
	run := func(svc session.Service) time.Duration {
		start := time.Now()
		p, err := svc.Exec(ctx, "lat", session.ExecRequest{Argv: []string{"true"}})
		if err != nil {
			t.Fatal(err)
		}
		for range p.Output() {
		}
		if _, err := p.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		return time.Since(start)
	}
	const n = 200
	var local, forwarded, inproc []time.Duration
	for range n {
		inproc = append(inproc, run(f.hosts["b"].fake))
		local = append(local, run(b))
		forwarded = append(forwarded, run(a))
	}
	p50 := func(d []time.Duration) time.Duration { slices.Sort(d); return d[len(d)/2] }
	t.Logf("exec true p50 over %d: engine in process %v; owner's API over TLS %v; through another host's front door %v", n, p50(inproc), p50(local), p50(forwarded))
}

// The front door's listener admits only certificates of the fleet's CA.
func TestRouterListenerRefusesStrangers(t *testing.T) {
	f := startFleet(t, map[string]fleet.Facts{"a": roomy})
	ctx := t.Context()
	// A certificate of another CA, and none at all.
	other := filepath.Join(t.TempDir(), "other")
	if err := pki.Init(other, "other"); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "stranger")
	if err := pki.Issue(other, dir, "stranger", nil, nil); err != nil {
		t.Fatal(err)
	}
	stranger, err := pki.ClientConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	noCert := stranger.Clone()
	noCert.Certificates = nil
	// It trusts the fleet's CA, so only its own certificate is at fault.
	op := filepath.Join(t.TempDir(), "op")
	if err := pki.Issue(f.ca, op, "op", nil, nil); err != nil {
		t.Fatal(err)
	}
	good, _ := pki.ClientConfig(op)
	noCert.RootCAs = good.RootCAs
	strangerTrusting := stranger.Clone()
	strangerTrusting.RootCAs = good.RootCAs
	for what, cfg := range map[string]*tls.Config{"no certificate": noCert, "another CA's certificate": strangerTrusting} {
		c := api.DialTLS(f.hosts["a"].addr, cfg)
		_, err := c.List(ctx)
		c.Close()
		if err == nil {
			t.Errorf("%s: List answered", what)
		}
	}
	c := api.DialTLS(f.hosts["a"].addr, good)
	defer c.Close()
	if _, err := c.List(ctx); err != nil {
		t.Errorf("the fleet's certificate: %v", err)
	}
}

// A fleet's Watch follows hosts that join after it started, and reports
// the sessions of a host that leaves unreachable.
func TestRouterWatchFollowsHosts(t *testing.T) {
	f := startFleet(t, map[string]fleet.Facts{"a": roomy})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	events, err := f.hosts["a"].router.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wait := func(what string, match func(session.Event) bool) {
		t.Helper()
		for {
			select {
			case ev, ok := <-events:
				if !ok {
					t.Fatalf("the watch ended before %s", what)
				}
				if match(ev) {
					return
				}
			case <-ctx.Done():
				t.Fatalf("no event: %s", what)
			}
		}
	}
	c := f.start(t, "c", roomy)
	f.hosts["c"] = c
	if _, err := f.hosts["a"].router.Create(ctx, session.CreateOptions{Name: "late", On: "c"}); err != nil {
		t.Fatal(err)
	}
	wait("late running on c", func(ev session.Event) bool {
		return ev.Name == "late" && ev.Session != nil && ev.Session.Host == "c" && ev.Session.State == session.StateRunning
	})
	c.srv.Close()
	if err := c.host.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	wait("late unreachable", func(ev session.Event) bool {
		return ev.Name == "late" && ev.Session != nil && ev.Session.Host == "c" && ev.Session.State == session.StateUnreachable
	})
	cancel()
	for range events { // closes once ctx is done
	}
}

// The owner's own changes hold at the epoch they are made at: a
// lifecycle change served by the owner (its caller's or a forwarded one)
// writes sessions/S/status by a transaction at the epoch it was routed
// at before its engine is asked, and again with the state it left. An
// owner key that moved on between the routing and the change refuses
// it, or routes it afresh; a host whose registration is gone changes
// nothing.
func TestRouterChangesAtEpoch(t *testing.T) {
	f := startFleet(t, map[string]fleet.Facts{"a": roomy, "b": roomy})
	ctx := t.Context()
	a, b := f.hosts["a"], f.hosts["b"]
	if _, err := a.router.Create(ctx, session.CreateOptions{Name: "s", On: "b"}); err != nil {
		t.Fatal(err)
	}
	owner := func() (string, int64) {
		t.Helper()
		g, err := f.cli.Get(ctx, fleet.Prefix+"sessions/s/owner")
		if err != nil || len(g.Kvs) != 1 {
			t.Fatal(g, err)
		}
		return string(g.Kvs[0].Value), g.Kvs[0].ModRevision
	}
	status := func() fleet.Status {
		t.Helper()
		g, err := f.cli.Get(ctx, fleet.Prefix+"sessions/s/status")
		if err != nil || len(g.Kvs) != 1 {
			t.Fatalf("status: %v %v", g, err)
		}
		st, err := fleet.ParseStatus(g.Kvs[0].Value)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	_, epoch := owner()

	// Through a's door (forwarded) and on b's own: recorded at the epoch.
	for _, c := range []struct {
		via  *testHost
		op   string
		call func(r *fleet.Router) (session.Session, error)
		want session.State
	}{
		{a, "stop", func(r *fleet.Router) (session.Session, error) { return r.Stop(ctx, "s") }, session.StateStopped},
		{b, "start", func(r *fleet.Router) (session.Session, error) { return r.Start(ctx, "s") }, session.StateRunning},
		{a, "sleep", func(r *fleet.Router) (session.Session, error) { return r.Sleep(ctx, "s") }, session.StateSleeping},
	} {
		if _, err := c.call(c.via.router); err != nil {
			t.Fatalf("%s through %s: %v", c.op, c.via.id, err)
		}
		if st := status(); st.Host != "b" || st.Epoch != epoch || st.Op != c.op || st.State != c.want {
			t.Errorf("after %s through %s: status %+v, want b at epoch %d, %s, %s", c.op, c.via.id, st, epoch, c.op, c.want)
		}
	}

	// The owner key moves on (a recovery elsewhere commits) after b routed
	// a change and before it made it: the change is not made.
	value, _ := owner()
	b.router.SetBeforeClaim(func(string) {
		if _, err := f.cli.Put(ctx, fleet.Prefix+"sessions/s/owner", `{"host":"gone-host"}`); err != nil {
			t.Error(err)
		}
	})
	if _, err := b.router.Start(ctx, "s"); err == nil {
		t.Errorf("start on b after the owner key named another host: no error")
	}
	b.router.SetBeforeClaim(nil)
	if st, _ := b.fake.Get(ctx, "s"); st.State != session.StateSleeping {
		t.Errorf("the refused start changed the session: %s", st.State)
	}
	// The owner key rewritten naming b again (a new epoch): the change is
	// routed afresh and made at the new epoch.
	b.router.SetBeforeClaim(func(string) {
		b.router.SetBeforeClaim(nil)
		if _, err := f.cli.Put(ctx, fleet.Prefix+"sessions/s/owner", value); err != nil {
			t.Error(err)
		}
	})
	if _, err := f.cli.Put(ctx, fleet.Prefix+"sessions/s/owner", value); err != nil {
		t.Fatal(err)
	}
	if _, err := b.router.Start(ctx, "s"); err != nil {
		t.Fatalf("start on b at a newer epoch of its own: %v", err)
	}
	_, now := owner()
	if st := status(); st.Epoch != now || st.Epoch <= epoch || st.State != session.StateRunning {
		t.Errorf("status after the start at the new epoch %d: %+v", now, st)
	}

	// b's registration gone: its changes wait for it to rejoin.
	if _, err := f.cli.Delete(ctx, fleet.Prefix+"hosts/b"); err != nil {
		t.Fatal(err)
	}
	_, err := b.router.Stop(ctx, "s")
	if !errors.Is(err, session.ErrIsolated) || !strings.Contains(err.Error(), "host b is not registered in the fleet") {
		t.Errorf("stop on b with its registration gone: %v", err)
	}
	if st, _ := b.fake.Get(ctx, "s"); st.State != session.StateRunning {
		t.Errorf("the refused stop changed the session: %s", st.State)
	}
}

package fleet

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/api"
)

// RouterConfig configures a Router.
type RouterConfig struct {
	// Self is this host's id.
	Self string
	// Local is this host's own Service (the engine's Manager).
	Local session.Service
	// Defaults fill a create's zero sizes, image and VMM before
	// placement, as the owner would: the spec stored is what it makes.
	Defaults session.CreateOptions
	// TLS reaches the other hosts: this host's certificate and the
	// fleet's CA (pki.ClientConfig). Nil: plain TCP, for hosts on
	// loopback only.
	TLS *tls.Config
	// LiveUntil, if set, is when this host's lease ends by its own clock
	// (Node.LiveUntil): a lookup waits for etcd no longer than that, so
	// that a host cut off from etcd answers from its own copies, or
	// refuses as isolated, without waiting out callTimeout first.
	LiveUntil func() time.Time
	// Host, if set, is this host's registration: a drain of this host
	// sets its draining flag through it (Node.Router sets it).
	Host *Host
	// OnPlace, if set, is told of every placement a create tried, with
	// its outcome (tests, figures).
	OnPlace func(Placement, error)
	Logger  *slog.Logger
}

// Router is a fleet host's front door: a session.Service that serves a
// call on a session from the host that owns it — this host's engine
// when it is this host, else the owner's API over mutual TLS, the call
// carrying the epoch its owner key was read at (session.WithForwarded).
// A call forwarded to this host is served here or refused, never
// forwarded again: a stale epoch (the session moved or was made again
// since the front door read it) is refused with CodeStaleEpoch.
//
// Create places the session (Place) and has the placed host make it;
// Delete releases its keys and its host's allocation. List and Watch
// gather every live host's sessions; those on a host that does not
// answer show as StateUnreachable. Calls on an execution or a run by id
// go to this host first, then to each live host until one knows it.
// Sessions made before the host joined the fleet (no owner key) are
// served here as they were.
type Router struct {
	cli *clientv3.Client
	cfg RouterConfig
	log *slog.Logger

	mu    sync.Mutex
	peers map[string]*api.Client // by address; guarded by mu

	// beforeClaim, in tests, runs between a change's routing and its
	// status transaction: where a move or recovery can commit.
	beforeClaim func(name string)
}

var (
	_ session.Service    = (*Router)(nil)
	_ session.HostLister = (*Router)(nil)
)

// NewRouter returns the front door of host cfg.Self over cli. Close it
// when done.
func NewRouter(cli *clientv3.Client, cfg RouterConfig) *Router {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Router{cli: cli, cfg: cfg, log: log.With("component", "router"), peers: map[string]*api.Client{}}
}

// Router is the front door of the node's host over local.
func (n *Node) Router(cfg RouterConfig) *Router {
	cfg.Self = n.host.ID()
	cfg.Host = n.host
	return NewRouter(n.cli, cfg)
}

// Close closes the connections to other hosts; streams still open end
// with their contexts.
func (r *Router) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for addr, c := range r.peers {
		c.Close()
		delete(r.peers, addr)
	}
	return nil
}

// Hosts lists the fleet's hosts as etcd has them now.
func (r *Router) Hosts(ctx context.Context) (session.HostList, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	hs, err := List(ctx, r.cli)
	if err != nil {
		return session.HostList{}, unavailable(err)
	}
	if hs == nil {
		hs = []session.HostInfo{}
	}
	return session.HostList{Fleet: true, Self: r.cfg.Self, Hosts: hs}, nil
}

// ownerAt is a session's owner as read from etcd.
type ownerAt struct {
	host  string
	epoch int64
	spec  session.CreateOptions // what placement stored, sizes filled in
}

func unavailable(err error) error {
	return &session.Error{Class: session.ErrUnavailable, Msg: fmt.Sprintf("the fleet's etcd did not answer: %v", err),
		Hint: "check that the fleet's etcd members are up", Err: err}
}

// etcdWait bounds a wait for etcd: callTimeout, or less when the lease
// ends sooner by this host's clock (a little, when it has ended).
func (r *Router) etcdWait() time.Duration {
	d := callTimeout
	if r.cfg.LiveUntil != nil {
		d = min(d, max(time.Until(r.cfg.LiveUntil()), 200*time.Millisecond))
	}
	return d
}

// lookup reads name's owner and spec, in one range read of its keys;
// ok is false when the fleet has no such session. A front door reads
// serializable (the member's own copy, no round of the cluster): one a
// little behind at worst forwards at an epoch the owner refuses as
// stale, and the call is routed afresh. The owner's check of a
// forwarded call's epoch reads linearizable (fresh).
func (r *Router) lookup(ctx context.Context, name string, fresh bool) (o ownerAt, ok bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, r.etcdWait())
	defer cancel()
	opts := []clientv3.OpOption{clientv3.WithPrefix()}
	if !fresh {
		opts = append(opts, clientv3.WithSerializable())
	}
	resp, err := r.cli.Get(ctx, sessionsDir+name+"/", opts...)
	if err != nil {
		return o, false, unavailable(err)
	}
	for _, kv := range resp.Kvs {
		switch string(kv.Key) {
		case ownerKey(name):
			ow, err := ParseOwner(kv.Value)
			if err != nil {
				return o, false, fmt.Errorf("session %s: %w", name, err)
			}
			o.host, o.epoch, ok = ow.Host, kv.ModRevision, true
		case specKey(name):
			decode(kv.Value, &o.spec) // a bad spec only leaves the placeholder's sizes out
		}
	}
	return o, ok, nil
}

// client is the API client of host id, from its live registration.
func (r *Router) client(ctx context.Context, id string) (*api.Client, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	// Serializable: a registration a little behind at worst sends the
	// call to an address that no longer answers (unavailable), or to a
	// host that refuses it as stale.
	resp, err := r.cli.Get(ctx, hostKey(id), clientv3.WithSerializable())
	if err != nil {
		return nil, unavailable(err)
	}
	if len(resp.Kvs) == 0 {
		return nil, &session.Error{Class: session.ErrUnavailable, Msg: fmt.Sprintf("host %s is unreachable: its lease expired or it left the fleet", id),
			Hint: "berth host ls shows it; its sessions come back when it does"}
	}
	rec, err := ParseHostRecord(id, resp.Kvs[0].Value)
	if err != nil {
		return nil, err
	}
	return r.clientAt(id, rec.Addr)
}

func (r *Router) clientAt(id, addr string) (*api.Client, error) {
	if addr == "" {
		return nil, &session.Error{Class: session.ErrUnavailable, Msg: fmt.Sprintf("host %s serves no address for other hosts", id),
			Hint: "start its berth serve with --listen HOST:PORT"}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if c, ok := r.peers[addr]; ok {
		return c, nil
	}
	var c *api.Client
	if r.cfg.TLS != nil {
		c = api.DialTLS(addr, r.cfg.TLS)
	} else {
		c = api.DialTCP(addr)
	}
	r.peers[addr] = c
	return c, nil
}

// livePeers are the clients of every live host but this one.
func (r *Router) livePeers(ctx context.Context) (map[string]*api.Client, error) {
	rctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	resp, err := r.cli.Get(rctx, hostsDir, clientv3.WithPrefix(), clientv3.WithLimit(MaxHosts))
	if err != nil {
		return nil, unavailable(err)
	}
	out := map[string]*api.Client{}
	for _, kv := range resp.Kvs {
		id := idOf(hostsDir, string(kv.Key))
		if id == r.cfg.Self {
			continue
		}
		rec, err := ParseHostRecord(id, kv.Value)
		if err != nil {
			continue
		}
		if c, err := r.clientAt(id, rec.Addr); err == nil {
			out[id] = c
		}
	}
	return out, nil
}

// stale is the refusal of a forwarded call whose epoch is not the
// owner key's.
func (r *Router) stale(name string, epoch int64, o ownerAt, ok bool) error {
	if !ok {
		return &session.Error{Class: session.ErrNotFound, Code: session.CodeStaleEpoch,
			Msg: fmt.Sprintf("session %q is no longer in the fleet: epoch %d is stale", name, epoch)}
	}
	return &session.Error{Class: session.ErrConflict, Code: session.CodeStaleEpoch,
		Msg:  fmt.Sprintf("session %q moved: epoch %d is stale, the owner is now at %d on host %s", name, epoch, o.epoch, o.host),
		Hint: "ask again: a front door reads the owner afresh"}
}

// target is where a call on one session goes.
type target struct {
	svc    session.Service
	ctx    context.Context // the call's, marked forwarded when remote
	host   string
	epoch  int64 // 0: the session is not in the fleet's keys
	remote bool
	spec   session.CreateOptions
}

// route finds the host that serves a call on name. A forwarded call is
// served here if this host owns name at the epoch it carries, else
// refused.
func (r *Router) route(ctx context.Context, name string) (target, error) {
	if err := session.ValidateName(name); err != nil {
		// Checked here too: a bad name is no etcd key.
		return target{}, err
	}
	epoch, fwd := session.ForwardedOf(ctx)
	o, ok, err := r.lookup(ctx, name, fwd)
	if err == nil && !ok && !fwd {
		// A session just placed may not have reached this member yet:
		// a miss is read again, fresh, before it is taken for one
		// outside the fleet.
		o, ok, err = r.lookup(ctx, name, true)
	}
	if err != nil && !fwd {
		// etcd out of reach: this host's own copies are served here. It
		// still holds its lease (past it the fence refuses every change),
		// and no other host can take a session of a host whose lease
		// lives: a move needs this host, a recovery the lease's end.
		if s, gerr := r.cfg.Local.Get(ctx, name); gerr == nil {
			// No change can be recorded now: change() refuses at once.
			return target{svc: r.cfg.Local, ctx: context.WithValue(ctx, epochKey{}, noEtcd), host: r.cfg.Self, epoch: s.Epoch}, nil
		}
	}
	if err != nil {
		return target{}, err
	}
	if fwd {
		if (!ok && epoch != 0) || (ok && (o.host != r.cfg.Self || o.epoch != epoch)) {
			return target{}, r.stale(name, epoch, o, ok)
		}
		return target{svc: r.cfg.Local, ctx: context.WithValue(ctx, epochKey{}, o.epoch), host: r.cfg.Self, epoch: o.epoch, spec: o.spec}, nil
	}
	if !ok || o.host == r.cfg.Self {
		// Not in the fleet's keys: one made before this host joined, or
		// none, which the engine says.
		return target{svc: r.cfg.Local, ctx: context.WithValue(ctx, epochKey{}, o.epoch), host: r.cfg.Self, epoch: o.epoch, spec: o.spec}, nil
	}
	c, err := r.client(ctx, o.host)
	if err != nil {
		return target{host: o.host, epoch: o.epoch, remote: true, spec: o.spec}, fmt.Errorf("session %s: %w", name, err)
	}
	// Served elsewhere: the owner records its own change.
	rctx := context.WithValue(session.WithForwarded(ctx, o.epoch), epochKey{}, int64(0))
	return target{svc: c, ctx: rctx, host: o.host, epoch: o.epoch, remote: true, spec: o.spec}, nil
}

// on runs f on the host that owns name. A forward refused as stale (the
// session moved between the lookup and the call, so the owner did
// nothing) is routed afresh, once.
func on[T any](r *Router, ctx context.Context, name string, f func(svc session.Service, ctx context.Context) (T, error)) (T, error) {
	v, _, err := onHost(r, ctx, name, true, f)
	return v, err
}

// onStreaming is on for a call that sends a stream (WriteFile, CopyIn):
// a stale refusal is not retried, since part of the stream may have
// gone with the refused call.
func onStreaming[T any](r *Router, ctx context.Context, name string, f func(svc session.Service, ctx context.Context) (T, error)) (T, error) {
	v, _, err := onHost(r, ctx, name, false, f)
	return v, err
}

// onHost is on, also returning the host that answered.
func onHost[T any](r *Router, ctx context.Context, name string, retry bool, f func(svc session.Service, ctx context.Context) (T, error)) (T, string, error) {
	for try := 0; ; try++ {
		t, err := r.route(ctx, name)
		if err != nil {
			var zero T
			return zero, t.host, err
		}
		v, err := f(t.svc, t.ctx)
		// Stale here too: a change's status transaction found the owner
		// key moved on (router_status.go) before anything was done.
		if retry && try == 0 && session.CodeOf(err) == session.CodeStaleEpoch {
			continue
		}
		return v, t.host, err
	}
}

// onSession runs f on the host that owns name and stamps the session
// it returns with that host.
func (r *Router) onSession(ctx context.Context, name string, f func(svc session.Service, ctx context.Context) (session.Session, error)) (session.Session, error) {
	s, host, err := onHost(r, ctx, name, true, f)
	if err == nil {
		s.Host = host
	}
	return s, err
}

func onErr(r *Router, ctx context.Context, name string, f func(svc session.Service, ctx context.Context) error) error {
	_, err := on(r, ctx, name, func(svc session.Service, ctx context.Context) (struct{}, error) { return struct{}{}, f(svc, ctx) })
	return err
}

// byID runs f here, then, while the answer is ErrNotFound, on each live
// host: executions and runs are named by ids that do not say their
// host. A forwarded call is answered here only.
func byID[T any](r *Router, ctx context.Context, f func(svc session.Service, ctx context.Context) (T, error)) (T, error) {
	v, err := f(r.cfg.Local, ctx)
	if _, fwd := session.ForwardedOf(ctx); fwd || !errors.Is(err, session.ErrNotFound) {
		return v, err
	}
	peers, perr := r.livePeers(ctx)
	if perr != nil {
		return v, err
	}
	ids := make([]string, 0, len(peers))
	for id := range peers {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		pv, perr := f(peers[id], session.WithForwarded(ctx, 0))
		if perr == nil || !(errors.Is(perr, session.ErrNotFound) || errors.Is(perr, session.ErrUnavailable)) {
			return pv, perr
		}
	}
	return v, err
}

func byIDErr(r *Router, ctx context.Context, f func(svc session.Service, ctx context.Context) error) error {
	_, err := byID(r, ctx, func(svc session.Service, ctx context.Context) (struct{}, error) { return struct{}{}, f(svc, ctx) })
	return err
}

// unreachable is what the fleet knows of a session whose host does not
// answer.
func unreachable(name string, t target, why string) session.Session {
	o := t.spec
	return session.Session{Name: name, State: session.StateUnreachable, Cause: why, Host: t.host,
		CPUs: o.CPUs, MemoryMiB: o.MemoryMiB, DiskBytes: o.DiskBytes, Image: o.Image, VMM: o.VMM, Net: o.Net}
}

// Get returns the session from its owner; one whose owner does not
// answer is returned as StateUnreachable, with what its spec says.
func (r *Router) Get(ctx context.Context, name string) (session.Session, error) {
	t, err := r.route(ctx, name)
	if t.remote && errors.Is(err, session.ErrUnavailable) {
		return unreachable(name, t, err.Error()), nil
	}
	if err != nil {
		return session.Session{}, err
	}
	s, err := t.svc.Get(t.ctx, name)
	if t.remote && errors.Is(err, session.ErrUnavailable) {
		return unreachable(name, t, fmt.Sprintf("host %s does not answer: %v", t.host, err)), nil
	}
	if err == nil {
		s.Host = t.host
	}
	return s, err
}

// sessionKeys reads every session's owner and spec, by name, and the
// live hosts.
func (r *Router) sessionKeys(ctx context.Context) (map[string]ownerAt, map[string]HostRecord, error) {
	owners, live, _, err := r.sessionKeysAt(ctx)
	return owners, live, err
}

// sessionKeysAt is sessionKeys with the revision read at.
func (r *Router) sessionKeysAt(ctx context.Context) (map[string]ownerAt, map[string]HostRecord, int64, error) {
	rctx, cancel := context.WithTimeout(ctx, r.etcdWait())
	defer cancel()
	resp, err := r.cli.Txn(rctx).Then(
		clientv3.OpGet(sessionsDir, clientv3.WithPrefix()),
		clientv3.OpGet(hostsDir, clientv3.WithPrefix(), clientv3.WithLimit(MaxHosts)),
	).Commit()
	if err != nil {
		return nil, nil, 0, unavailable(err)
	}
	owners := map[string]ownerAt{}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		name, field, ok := strings.Cut(idOf(sessionsDir, string(kv.Key)), "/")
		if !ok {
			continue
		}
		o := owners[name]
		switch field {
		case "owner":
			ow, err := ParseOwner(kv.Value)
			if err != nil {
				continue
			}
			o.host, o.epoch = ow.Host, kv.ModRevision
		case "spec":
			decode(kv.Value, &o.spec)
		}
		owners[name] = o
	}
	for name, o := range owners {
		if o.host == "" {
			delete(owners, name) // a spec without its owner: nothing to show
		}
	}
	live := map[string]HostRecord{}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		id := idOf(hostsDir, string(kv.Key))
		if rec, err := ParseHostRecord(id, kv.Value); err == nil {
			live[id] = rec
		}
	}
	return owners, live, resp.Header.Revision, nil
}

// listTimeout bounds one host's answer to a fleet's list: one that is
// slower shows its sessions unreachable rather than hold up the rest.
const listTimeout = 5 * time.Second

// List gathers every live host's sessions, each with its host. A
// session whose host is gone or does not answer shows as
// StateUnreachable; one placed but not made yet as StateCreating. A
// forwarded list is this host's own.
func (r *Router) List(ctx context.Context) ([]session.Session, error) {
	if _, fwd := session.ForwardedOf(ctx); fwd {
		return r.localList(ctx)
	}
	owners, live, err := r.sessionKeys(ctx)
	if err != nil {
		// etcd out of reach: this host's own sessions are what it can
		// still say (an isolated host answers reads).
		if l, lerr := r.localList(ctx); lerr == nil {
			r.log.Warn("ls: etcd out of reach, listing this host's sessions only", "err", err)
			return l, nil
		}
		return nil, err
	}
	type answer struct {
		list []session.Session
		err  error
	}
	answers := make(map[string]answer, len(live))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for id, rec := range live {
		wg.Go(func() {
			lctx, cancel := context.WithTimeout(ctx, listTimeout)
			defer cancel()
			var a answer
			if id == r.cfg.Self {
				a.list, a.err = r.cfg.Local.List(lctx)
			} else if c, err := r.clientAt(id, rec.Addr); err != nil {
				a.err = err
			} else {
				a.list, a.err = c.List(session.WithForwarded(lctx, 0))
			}
			mu.Lock()
			answers[id] = a
			mu.Unlock()
		})
	}
	if _, ok := live[r.cfg.Self]; !ok {
		// This host's lease is gone (isolated): its own sessions still
		// show, as it has them.
		wg.Go(func() {
			list, err := r.cfg.Local.List(ctx)
			mu.Lock()
			answers[r.cfg.Self] = answer{list, err}
			mu.Unlock()
		})
	}
	wg.Wait()
	var out []session.Session
	shown := map[string]bool{}
	for id, a := range answers {
		if a.err != nil {
			r.log.Warn("list: a host did not answer", "host", id, "err", a.err)
			continue
		}
		for _, s := range a.list {
			if o, ok := owners[s.Name]; ok && o.host != id {
				continue // a copy the fleet does not own there
			}
			s.Host = id
			out = append(out, s)
			shown[s.Name] = true
		}
	}
	for name, o := range owners {
		if shown[name] {
			continue
		}
		t := target{host: o.host, spec: o.spec}
		a, answered := answers[o.host]
		switch {
		case !answered:
			out = append(out, unreachable(name, t, fmt.Sprintf("host %s is gone: its lease expired or it left", o.host)))
		case a.err != nil:
			out = append(out, unreachable(name, t, fmt.Sprintf("host %s does not answer: %v", o.host, a.err)))
		default:
			s := unreachable(name, t, fmt.Sprintf("placed on host %s, not made there yet", o.host))
			s.State = session.StateCreating
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	if out == nil {
		out = []session.Session{}
	}
	return out, nil
}

func (r *Router) localList(ctx context.Context) ([]session.Session, error) {
	list, err := r.cfg.Local.List(ctx)
	for i := range list {
		list[i].Host = r.cfg.Self
	}
	return list, err
}

// Host is this host's data directory's space.
func (r *Router) Host(ctx context.Context) (session.HostStatus, error) {
	return r.cfg.Local.Host(ctx)
}

// Watch merges this host's events with every live host's, each session
// stamped with its host, and the fleet's own changes from now on (see
// WatchSince). It follows the fleet: a host that joins later is
// followed from then on; a host whose registration goes, or whose
// stream ends, has its sessions reported StateUnreachable (as do, at the
// start, sessions whose host is gone). The channel closes when ctx ends.
// A forwarded watch is this host's own.
func (r *Router) Watch(ctx context.Context) (<-chan session.Event, error) {
	return r.WatchSince(ctx, 0)
}

// WatchSince is Watch with the fleet's changes (EventFleet: placements,
// moves, owners, hosts joining, going, leaving, draining) from the one
// after revision since (0: from now), in revision order and each once,
// across etcd connections lost and revisions compacted (followFleet).
// The hosts' own session events carry no revision: they are merged in
// as they come, from now.
func (r *Router) WatchSince(ctx context.Context, since int64) (<-chan session.Event, error) {
	if since < 0 {
		return nil, &session.Error{Class: session.ErrInvalid, Msg: fmt.Sprintf("revision %d: want 0 or more", since)}
	}
	lch, err := r.cfg.Local.Watch(ctx)
	if err != nil {
		return nil, err
	}
	if _, fwd := session.ForwardedOf(ctx); fwd {
		return stamp(ctx, lch, r.cfg.Self), nil
	}
	owners, live, rev, err := r.sessionKeysAt(ctx)
	if err != nil {
		return nil, err
	}
	if since == 0 {
		since = rev
	}
	fleet, err := r.followFleet(ctx, since)
	if err != nil {
		return nil, err
	}
	out := make(chan session.Event)
	f := &follower{r: r, ctx: ctx, out: out, in: make(chan hostEvent), feeds: map[string]*feed{}, seen: map[string]map[string]session.Session{}, rev: rev}
	self := &feed{cancel: func() {}} // lives as long as ctx
	f.feeds[r.cfg.Self] = self
	f.wg.Go(func() { f.feed(r.cfg.Self, self, lch) })
	for id, rec := range live {
		f.start(id, rec)
	}
	go f.run(fleet, owners, live) // ends when ctx ends; then closes out
	return out, nil
}

var _ session.FleetWatcher = (*Router)(nil)

// hostEvent is one event from host's stream (of feed from); ended marks
// the stream's end.
type hostEvent struct {
	host  string
	from  *feed
	ev    session.Event
	ended bool
}

// feed is one host's stream followed; cancel ends it.
type feed struct{ cancel context.CancelFunc }

// follower is one fleet Watch: a feed goroutine per host followed,
// joined into run, which alone owns feeds and seen.
type follower struct {
	r     *Router
	ctx   context.Context
	out   chan<- session.Event
	in    chan hostEvent
	wg    sync.WaitGroup
	feeds map[string]*feed                      // hosts followed now
	seen  map[string]map[string]session.Session // by host, by name: the last state sent
	// rev is the revision the feeds were started at: fleet changes up
	// to it (a follow resumed from before) are shown, not acted on.
	rev int64
}

// start follows host id's stream, unless it is followed already.
func (f *follower) start(id string, rec HostRecord) {
	if f.feeds[id] != nil {
		return
	}
	c, err := f.r.clientAt(id, rec.Addr)
	if err != nil {
		return
	}
	ctx, cancel := context.WithCancel(f.ctx)
	ch, err := c.Watch(session.WithForwarded(ctx, 0))
	if err != nil {
		cancel()
		f.r.log.Warn("watch: a host did not answer", "host", id, "err", err)
		return
	}
	fd := &feed{cancel: cancel}
	f.feeds[id] = fd
	f.wg.Go(func() { f.feed(id, fd, ch) })
}

// feed passes ch's events to run until ch closes (its context ending
// closes it).
func (f *follower) feed(id string, fd *feed, ch <-chan session.Event) {
	for ev := range ch {
		select {
		case f.in <- hostEvent{host: id, from: fd, ev: ev}:
		case <-f.ctx.Done():
		}
	}
	select {
	case f.in <- hostEvent{host: id, from: fd, ended: true}:
	case <-f.ctx.Done():
	}
}

func (f *follower) send(ev session.Event) {
	select {
	case f.out <- ev:
	case <-f.ctx.Done():
	}
}

// lost reports host's sessions unreachable and ends its feed: its
// registration went, or its stream ended. A registration made again
// starts a new feed, whose opening states follow; the old one's last
// events, if any come late, are dropped (run), so none comes twice.
func (f *follower) lost(id, why string) {
	if id == f.r.cfg.Self {
		return // this host's own feed lives as long as ctx
	}
	if fd := f.feeds[id]; fd != nil {
		fd.cancel()
	}
	delete(f.feeds, id)
	for name, s := range f.seen[id] {
		u := unreachable(name, target{host: id, spec: session.CreateOptions{CPUs: s.CPUs, MemoryMiB: s.MemoryMiB, DiskBytes: s.DiskBytes,
			Image: s.Image, VMM: s.VMM, Net: s.Net}}, why)
		f.send(session.Event{Time: time.Now(), Kind: session.EventState, Name: name, Message: why, Session: &u})
	}
	delete(f.seen, id)
}

func (f *follower) run(fleet <-chan fleetEvent, owners map[string]ownerAt, live map[string]HostRecord) {
	defer close(f.out)
	defer func() {
		// The feeds end with ctx; drain them so none blocks.
		go func() {
			for range f.in {
			}
		}()
		f.wg.Wait()
		close(f.in)
	}()
	for name, o := range owners {
		if _, ok := live[o.host]; !ok && o.host != f.r.cfg.Self {
			u := unreachable(name, target{host: o.host, spec: o.spec}, fmt.Sprintf("host %s is gone: its lease expired or it left", o.host))
			f.send(session.Event{Time: time.Now(), Kind: session.EventState, Name: name, Session: &u})
		}
	}
	for {
		select {
		case <-f.ctx.Done():
			return
		case he := <-f.in:
			if f.feeds[he.host] != he.from {
				continue // a feed ended by lost: its host is followed anew, or not at all
			}
			if he.ended {
				if f.ctx.Err() == nil {
					f.lost(he.host, fmt.Sprintf("host %s stopped answering", he.host))
				}
				continue
			}
			ev := he.ev
			if ev.Session != nil {
				ev.Session.Host = he.host
				m := f.seen[he.host]
				if m == nil {
					m = map[string]session.Session{}
					f.seen[he.host] = m
				}
				m[ev.Name] = *ev.Session
			}
			if ev.Kind == session.EventDeleted {
				delete(f.seen[he.host], ev.Name)
			}
			f.send(ev)
		case fe, ok := <-fleet:
			if !ok {
				return // it ends only with ctx
			}
			if fe.ev != nil {
				f.send(*fe.ev)
			}
			if fe.rev <= f.rev || fe.host == "" || fe.host == f.r.cfg.Self {
				continue // this host's own events come from its own feed, which lives as long as ctx
			}
			switch {
			case fe.rec != nil:
				f.start(fe.host, *fe.rec) // joined, or registered again: followed if not followed now
			case fe.gone && f.feeds[fe.host] != nil:
				f.lost(fe.host, fmt.Sprintf("host %s is gone: its lease expired or it left", fe.host))
			}
		}
	}
}

// stamp passes ch on with each session stamped with host; it ends when
// ch closes.
func stamp(ctx context.Context, ch <-chan session.Event, host string) <-chan session.Event {
	out := make(chan session.Event)
	go func() {
		defer close(out)
		for ev := range ch {
			if ev.Session != nil {
				ev.Session.Host = host
			}
			select {
			case out <- ev:
			case <-ctx.Done():
			}
		}
	}()
	return out
}

func (r *Router) Timeline(ctx context.Context, name string, limit int) ([]session.Event, error) {
	return on(r, ctx, name, func(svc session.Service, ctx context.Context) ([]session.Event, error) {
		return svc.Timeline(ctx, name, limit)
	})
}

// Create places the session (with On pinned) and has the placed host
// make it; a host that fails to make it releases the placement. A
// forwarded create is the placed host's part: made here if the
// placement read is still the owner's.
func (r *Router) Create(ctx context.Context, opts session.CreateOptions) (session.Session, error) {
	if epoch, fwd := session.ForwardedOf(ctx); fwd {
		if err := session.ValidateName(opts.Name); err != nil {
			return session.Session{}, err
		}
		o, ok, err := r.lookup(ctx, opts.Name, true)
		if err != nil {
			return session.Session{}, err
		}
		if !ok || o.host != r.cfg.Self || o.epoch != epoch {
			return session.Session{}, r.stale(opts.Name, epoch, o, ok)
		}
		return r.createHere(ctx, opts, epoch)
	}
	req := Request{On: opts.On, Door: r.cfg.Self}
	opts.On = ""
	if opts.From != "" {
		// Made where its checkpoint is, of its source's sizes where
		// left out.
		ref, err := session.CheckCreateFrom(opts)
		if err != nil {
			return session.Session{}, err
		}
		src, err := r.Get(ctx, ref.Session)
		if errors.Is(err, session.ErrNotFound) {
			return session.Session{}, &session.Error{Class: session.ErrNotFound, Field: session.FieldFrom,
				Msg: fmt.Sprintf("%q: there is no session %s", opts.From, ref.Session), Err: err}
		}
		if err != nil {
			return session.Session{}, err
		}
		if req.On != "" && req.On != src.Host {
			return session.Session{}, &session.Error{Class: session.ErrInvalid, Field: session.FieldFrom,
				Msg: fmt.Sprintf("%s is on host %s, and a session from its checkpoint is made there, not on %s", ref.Session, src.Host, req.On), Hint: "leave the host out"}
		}
		req.On = src.Host
		req.Opts = opts
		req.Opts.CPUs, req.Opts.MemoryMiB = cmp(opts.CPUs, src.CPUs), cmp(opts.MemoryMiB, src.MemoryMiB)
		req.Opts.DiskBytes, req.Opts.Image, req.Opts.VMM = src.DiskBytes, src.Image, cmpS(opts.VMM, src.VMM)
	} else {
		opts = opts.WithDefaults(r.cfg.Defaults)
		if _, err := session.ValidateCreate(opts, session.Limits{}); err != nil {
			return session.Session{}, err
		}
		req.Opts = opts
	}
	p, err := Place(ctx, r.cli, req)
	if r.cfg.OnPlace != nil {
		r.cfg.OnPlace(p, err)
	}
	if err != nil {
		return session.Session{}, err
	}
	if p.Host == r.cfg.Self {
		return r.createHere(ctx, opts, p.Epoch)
	}
	c, err := r.client(ctx, p.Host)
	if err != nil {
		r.release(ctx, opts.Name, p.Epoch)
		return session.Session{}, fmt.Errorf("create %s: placed on %s: %w", opts.Name, p.Host, err)
	}
	s, err := c.Create(session.WithForwarded(ctx, p.Epoch), opts)
	if err != nil {
		return s, err
	}
	s.Host = p.Host
	return s, nil
}

func cmp(a, b int) int {
	if a != 0 {
		return a
	}
	return b
}

func cmpS(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// createHere makes a session placed on this host at epoch, releasing the
// placement when the engine refuses it.
func (r *Router) createHere(ctx context.Context, opts session.CreateOptions, epoch int64) (session.Session, error) {
	s, err := r.cfg.Local.Create(ctx, opts)
	if err != nil {
		r.release(ctx, opts.Name, epoch)
		return s, err
	}
	r.setEpoch(ctx, opts.Name, epoch)
	s.Host = r.cfg.Self
	return s, nil
}

// setEpoch records on this host's copy the epoch it holds name at, for
// the rejoin's quarantine; a failure is logged (the copy keeps the epoch
// it had, which the quarantine reads as this host's while the owner key
// names it).
func (r *Router) setEpoch(ctx context.Context, name string, epoch int64) {
	es, ok := r.cfg.Local.(EpochSetter)
	if !ok || epoch == 0 {
		return
	}
	if err := es.SetEpoch(ctx, name, epoch); err != nil {
		r.log.Warn("record the session's epoch", "session", name, "epoch", epoch, "err", err)
	}
}

// release gives up a placement at epoch; the caller's error stands, so
// a failure here is logged.
func (r *Router) release(ctx context.Context, name string, epoch int64) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), callTimeout)
	defer cancel()
	if err := ReleaseAt(rctx, r.cli, name, epoch); err != nil && !errors.Is(err, session.ErrNotFound) {
		r.log.Warn("release a placement", "session", name, "epoch", epoch, "err", err)
	}
}

// Delete deletes the session on its owner, which then releases its keys
// and its allocation in one transaction.
func (r *Router) Delete(ctx context.Context, name string) error {
	return r.delete(ctx, name, false)
}

func (r *Router) delete(ctx context.Context, name string, retried bool) error {
	t, err := r.route(ctx, name)
	if err != nil {
		return err
	}
	if t.remote {
		err := t.svc.Delete(t.ctx, name)
		if _, fwd := session.ForwardedOf(ctx); !fwd && !retried && session.CodeOf(err) == session.CodeStaleEpoch {
			// Moved or made again since the lookup: the owner did
			// nothing, so it is asked afresh, once.
			return r.delete(ctx, name, true)
		}
		return err
	}
	err = t.svc.Delete(t.ctx, name)
	if t.epoch != 0 && (err == nil || errors.Is(err, session.ErrNotFound)) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), callTimeout)
		defer cancel()
		reps, _ := Replicas(rctx, r.cli, name) // their records go with the release
		if rerr := ReleaseAt(rctx, r.cli, name, t.epoch); rerr != nil && !errors.Is(rerr, session.ErrNotFound) {
			return errors.Join(err, fmt.Errorf("delete %s: release its place in the fleet: %w", name, rerr))
		}
		r.dropReplicas(rctx, name, reps)
		if err != nil {
			// Placed, never made (or gone from the engine already): the
			// placement was all there was.
			return nil
		}
	}
	return err
}

func (r *Router) Pause(ctx context.Context, name string) (session.Session, error) {
	return r.change(ctx, name, "pause", func(svc session.Service, ctx context.Context) (session.Session, error) { return svc.Pause(ctx, name) })
}

func (r *Router) Resume(ctx context.Context, name string) (session.Session, error) {
	return r.change(ctx, name, "resume", func(svc session.Service, ctx context.Context) (session.Session, error) { return svc.Resume(ctx, name) })
}

func (r *Router) Stop(ctx context.Context, name string) (session.Session, error) {
	return r.change(ctx, name, "stop", func(svc session.Service, ctx context.Context) (session.Session, error) { return svc.Stop(ctx, name) })
}

func (r *Router) Start(ctx context.Context, name string) (session.Session, error) {
	return r.change(ctx, name, "start", func(svc session.Service, ctx context.Context) (session.Session, error) { return svc.Start(ctx, name) })
}

func (r *Router) Sleep(ctx context.Context, name string) (session.Session, error) {
	return r.change(ctx, name, "sleep", func(svc session.Service, ctx context.Context) (session.Session, error) { return svc.Sleep(ctx, name) })
}

func (r *Router) Flush(ctx context.Context, name string) (session.FlushResult, error) {
	return on(r, ctx, name, func(svc session.Service, ctx context.Context) (session.FlushResult, error) {
		return svc.Flush(ctx, name)
	})
}

func (r *Router) Replace(ctx context.Context, name string, opts session.ReplaceOptions) (session.ReplaceResult, error) {
	return changeOn(r, ctx, name, "replace", func(svc session.Service, ctx context.Context) (session.ReplaceResult, error) {
		return svc.Replace(ctx, name, opts)
	})
}

// Exec runs the command on the session's owner; a remote one's streams
// and exit status come through the owner's API.
func (r *Router) Exec(ctx context.Context, name string, req session.ExecRequest) (session.Process, error) {
	return on(r, ctx, name, func(svc session.Service, ctx context.Context) (session.Process, error) {
		return svc.Exec(ctx, name, req)
	})
}

func (r *Router) Attach(ctx context.Context, execID string, fromSeq uint64) (session.Process, error) {
	return byID(r, ctx, func(svc session.Service, ctx context.Context) (session.Process, error) {
		return svc.Attach(ctx, execID, fromSeq)
	})
}

func (r *Router) Executions(ctx context.Context, name string, all bool) ([]session.Execution, error) {
	return on(r, ctx, name, func(svc session.Service, ctx context.Context) ([]session.Execution, error) {
		return svc.Executions(ctx, name, all)
	})
}

func (r *Router) Execution(ctx context.Context, execID string) (session.Execution, error) {
	return byID(r, ctx, func(svc session.Service, ctx context.Context) (session.Execution, error) {
		return svc.Execution(ctx, execID)
	})
}

func (r *Router) Output(ctx context.Context, execID string, fromSeq uint64, limit int) (session.OutputPage, error) {
	return byID(r, ctx, func(svc session.Service, ctx context.Context) (session.OutputPage, error) {
		return svc.Output(ctx, execID, fromSeq, limit)
	})
}

func (r *Router) Cancel(ctx context.Context, execID string) error {
	return byIDErr(r, ctx, func(svc session.Service, ctx context.Context) error { return svc.Cancel(ctx, execID) })
}

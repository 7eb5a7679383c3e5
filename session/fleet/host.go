package fleet

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/berthvm/berth/session"
)

// DefaultTTL is a host lease's time to live: how long a host that stops
// answering stays listed as ready.
const DefaultTTL = 10 * time.Second

// DialTimeout bounds the first contact with etcd.
const DialTimeout = 5 * time.Second

// Dial returns an etcd client of endpoints (comma-separated URLs),
// over mutual TLS when tlsCfg is set (pki.ClientConfig): then every URL
// must be https, else http. It does not wait for etcd: the first call
// does, bounded by its context.
func Dial(endpoints string, tlsCfg *tls.Config) (*clientv3.Client, error) {
	var eps []string
	for _, e := range strings.Split(endpoints, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		switch {
		case tlsCfg != nil && !strings.HasPrefix(e, "https://"):
			return nil, fmt.Errorf("--fleet %s: with a fleet CA every etcd URL must be https://", e)
		case tlsCfg == nil && strings.HasPrefix(e, "https://"):
			return nil, fmt.Errorf("--fleet %s: an https etcd needs the fleet's CA (--fleet-ca DIR)", e)
		case tlsCfg == nil && !strings.HasPrefix(e, "http://"):
			return nil, fmt.Errorf("--fleet %s: want http://HOST:PORT (or https:// with --fleet-ca)", e)
		}
		eps = append(eps, e)
	}
	if len(eps) == 0 {
		return nil, errors.New("--fleet: no etcd URL given (want URL[,URL…], such as http://127.0.0.1:2379)")
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: eps, DialTimeout: DialTimeout, Logger: zap.NewNop(), TLS: tlsCfg,
		// Bounds what a peer (an etcd member) can send in one reply.
		MaxCallRecvMsgSize: 64 << 20,
	})
	if err != nil {
		return nil, fmt.Errorf("--fleet %s: %w", endpoints, err)
	}
	return cli, nil
}

// Facts are what a host says of itself when it registers.
type Facts struct {
	CPUs      int
	MemoryMiB int64
	DiskFree  int64
	Floor     int64
	Images    []string
}

// HostConfig is one host's membership.
type HostConfig struct {
	ID   string
	Addr string
	// Instance is the data directory's own id (see HostRecord.Instance).
	Instance string
	// TTL is the lease's time to live; 0: DefaultTTL.
	TTL time.Duration
	// Refresh is how often the record is rewritten with fresh Facts;
	// 0: TTL.
	Refresh time.Duration
	// Facts reports the host's capacity and images; it is called at each
	// registration and refresh.
	Facts func(ctx context.Context) (Facts, error)
	// Margin is taken off the TTL when the host judges by its own clock
	// how long its lease lives: it covers the difference between its
	// clock's rate and etcd's. 0: DefaultMargin(TTL).
	Margin time.Duration
	// Interval is how often the lease is renewed; 0: (TTL-Margin)/4, so
	// that three renewals in a row can fail before the lease lapses.
	Interval time.Duration
	// OnJoin, if set, runs after each registration (the first and every
	// one after a lost lease) before the host takes changes again: the
	// quarantine of local copies another host may own by now. It is
	// retried until it succeeds or the new lease is lost too; its
	// context ends when that lease is lost.
	OnJoin func(ctx context.Context) error
	Logger *slog.Logger
}

// DefaultMargin is the safety margin for a lease of ttl: a sixth of it,
// at least 250ms, at most 2s.
func DefaultMargin(ttl time.Duration) time.Duration {
	return min(max(ttl/6, 250*time.Millisecond), 2*time.Second)
}

// Host is one host's registration in the fleet. Join starts it; its
// keeper goroutine keeps the lease alive and registers again after a
// lost lease until Leave, which ends the goroutine and then revokes the
// lease.
//
// The host judges its lease by its own monotonic clock: the lease lives
// until the send time of the last renewal etcd confirmed, plus the TTL,
// minus Margin. etcd expires a lease no earlier than TTL after it
// received that renewal (and only extends leases on a leader change),
// so the host always knows itself isolated before any other host can
// see its lease gone. Past that instant, or before a new registration's
// OnJoin has run, the host is isolated: Allowed refuses.
type Host struct {
	cli  *clientv3.Client
	cfg  HostConfig
	log  *slog.Logger
	stop context.CancelFunc
	done chan struct{}
	left sync.Once

	mu    sync.Mutex
	lease clientv3.LeaseID // guarded by mu
	since time.Time        // guarded by mu
	// until is when the lease stops being live by this host's clock
	// (it carries a monotonic reading); ready is set once OnJoin ran
	// for the current lease. Both guarded by mu.
	until time.Time
	ready bool
	// why says what last went wrong with etcd, for the refusal; lost is
	// when the host last stopped being ready (zero before). Guarded by mu.
	why  string
	lost time.Time
	// confirmed is the send time of the last renewal etcd confirmed.
	// Guarded by mu.
	confirmed time.Time
	// draining is the host's draining flag (SetDraining). Guarded by mu.
	//
	// It is kept in the host's own record, which the host alone writes:
	// hosts/H under its lease, which placement reads, and seen/H, which
	// has no lease. Every registration and refresh writes it again, so a
	// renewal or a new lease keeps it; at Join the host reads it back
	// from seen/H, so a restarted daemon (or one on a new data
	// directory with the same host id) is still draining. Not a key of
	// its own that any front door writes: the one-writer rule stays
	// whole (a front door asks the host), and placement reads nothing
	// more than the registrations it reads now.
	draining bool
	// wmu serializes the writes of the record, so that a refresh that
	// read the flag before SetDraining changed it cannot land after it.
	wmu sync.Mutex
}

// Join registers the host under a new lease and starts keeping it. It
// fails when etcd does not answer within ctx or another live berth holds
// the host id.
func Join(ctx context.Context, cli *clientv3.Client, cfg HostConfig) (*Host, error) {
	if err := ValidateHostID(cfg.ID); err != nil {
		return nil, err
	}
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.TTL < time.Second {
		return nil, fmt.Errorf("fleet lease TTL %s: want at least 1s", cfg.TTL)
	}
	if cfg.Refresh <= 0 {
		cfg.Refresh = cfg.TTL
	}
	if cfg.Facts == nil {
		cfg.Facts = func(context.Context) (Facts, error) { return Facts{}, nil }
	}
	if cfg.Margin <= 0 {
		cfg.Margin = DefaultMargin(cfg.TTL)
	}
	if cfg.Margin >= cfg.TTL {
		return nil, fmt.Errorf("fleet lease margin %s: want less than the TTL %s", cfg.Margin, cfg.TTL)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = (cfg.TTL - cfg.Margin) / 4
	}
	h := &Host{cli: cli, cfg: cfg, log: cfg.Logger, done: make(chan struct{})}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	h.log = h.log.With("component", "fleet", "host", cfg.ID)
	if err := h.loadDraining(ctx); err != nil {
		return nil, err
	}
	if err := h.register(ctx); err != nil {
		return nil, err
	}
	life, stop := context.WithCancel(context.Background())
	h.stop = stop
	go h.keep(life)
	return h, nil
}

// ID is the host's id.
func (h *Host) ID() string { return h.cfg.ID }

// loadDraining takes the draining flag from the host's last
// registration, seen/H (see Host.draining).
func (h *Host) loadDraining(ctx context.Context) error {
	r, err := h.cli.Get(ctx, seenKey(h.cfg.ID))
	if err != nil {
		return fmt.Errorf("join the fleet: read host %s's last registration: %w", h.cfg.ID, err)
	}
	if len(r.Kvs) == 0 {
		return nil
	}
	rec, err := ParseHostRecord(h.cfg.ID, r.Kvs[0].Value)
	if err != nil {
		// Unreadable, it says nothing: the host is not draining, and its
		// registration replaces the record.
		h.log.Warn("the host's last registration is unreadable: not draining", "err", err)
		return nil
	}
	if rec.Draining {
		h.log.Info("draining, as its last registration says (berth host undrain ends it)")
	}
	h.mu.Lock()
	h.draining = rec.Draining
	h.mu.Unlock()
	return nil
}

// Draining reports the host's draining flag.
func (h *Host) Draining() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.draining
}

// SetDraining sets the host's draining flag and writes its record at
// once under its lease, so that placement, reading it afterwards, puts
// nothing new here (on) or may again (off). It is refused while the
// host is isolated (Allowed's error); a write that fails leaves the flag
// as it was.
func (h *Host) SetDraining(ctx context.Context, on bool) error {
	if err := h.Allowed(ctx); err != nil {
		return err
	}
	h.wmu.Lock()
	defer h.wmu.Unlock()
	h.mu.Lock()
	was, lease := h.draining, h.lease
	h.draining = on
	h.mu.Unlock()
	if err := h.write(ctx, lease); err != nil {
		h.mu.Lock()
		h.draining = was
		h.mu.Unlock()
		what := "mark host %s draining"
		if !on {
			what = "end host %s's drain"
		}
		return fmt.Errorf(what+": write its record to etcd: %w", h.cfg.ID, err)
	}
	if was != on {
		h.log.Info("draining flag set", "draining", on)
	}
	return nil
}

// record is the host's record now.
func (h *Host) record(ctx context.Context) (HostRecord, error) {
	f, err := h.cfg.Facts(ctx)
	if err != nil {
		return HostRecord{}, fmt.Errorf("host facts: %w", err)
	}
	h.mu.Lock()
	since, draining := h.since, h.draining
	h.mu.Unlock()
	r := HostRecord{ID: h.cfg.ID, Addr: h.cfg.Addr, CPUs: f.CPUs, MemoryMiB: f.MemoryMiB, DiskFree: f.DiskFree, Floor: f.Floor,
		Images: f.Images, Draining: draining, Instance: h.cfg.Instance, Since: since, At: time.Now().UTC()}
	return r, r.check()
}

// register grants a lease and writes hosts/H under it and seen/H, unless
// another live berth holds hosts/H. One that was this data directory's
// (a daemon killed and restarted) is taken over: its lease is revoked.
func (h *Host) register(ctx context.Context) error {
	h.wmu.Lock()
	defer h.wmu.Unlock()
	h.mu.Lock()
	h.since = time.Now().UTC()
	h.mu.Unlock()
	rec, err := h.record(ctx)
	if err != nil {
		return err
	}
	for range 2 {
		sent := time.Now()
		g, err := h.cli.Grant(ctx, int64((h.cfg.TTL+time.Second-1)/time.Second))
		if err != nil {
			return fmt.Errorf("join the fleet: grant a lease: %w", err)
		}
		r, err := h.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(hostKey(h.cfg.ID)), "=", 0)).
			Then(clientv3.OpPut(hostKey(h.cfg.ID), mustJSON(rec), clientv3.WithLease(g.ID)), clientv3.OpPut(seenKey(h.cfg.ID), mustJSON(rec))).
			Else(clientv3.OpGet(hostKey(h.cfg.ID))).Commit()
		if err != nil {
			h.revoke(g.ID)
			return fmt.Errorf("join the fleet: register host %s: %w", h.cfg.ID, err)
		}
		if r.Succeeded {
			h.mu.Lock()
			h.lease = g.ID
			h.ready = false
			h.until = time.Time{}
			h.confirmLocked(g.ID, sent, g.TTL)
			h.mu.Unlock()
			h.log.Info("registered", "lease", fmt.Sprintf("%x", int64(g.ID)), "ttl", h.cfg.TTL)
			return nil
		}
		h.revoke(g.ID)
		kvs := r.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			continue // it just expired
		}
		old, perr := ParseHostRecord(h.cfg.ID, kvs[0].Value)
		if perr != nil || h.cfg.Instance == "" || old.Instance != h.cfg.Instance {
			return fmt.Errorf("host id %s is registered by another live berth (at %q): pick another --host-id, or stop that one: %w",
				h.cfg.ID, old.Addr, session.ErrConflict)
		}
		// Our own data directory's previous daemon: it is dead (we hold the
		// directory's lock), its lease just not expired yet.
		h.revoke(clientv3.LeaseID(kvs[0].Lease))
	}
	return fmt.Errorf("host id %s: registration kept conflicting: %w", h.cfg.ID, session.ErrConflict)
}

func (h *Host) revoke(id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.Background(), DialTimeout)
	defer cancel()
	h.cli.Revoke(ctx, id)
}

// keep keeps the lease alive and rewrites the record every Refresh;
// after a lost lease it registers again, retrying until ctx ends. With
// each lease it runs OnJoin beside the renewals, and only then is the
// host ready.
func (h *Host) keep(ctx context.Context) {
	defer close(h.done)
	for ctx.Err() == nil {
		h.mu.Lock()
		lease := h.lease
		h.mu.Unlock()
		jctx, cancel := context.WithCancel(ctx)
		joined := make(chan struct{})
		go func() {
			defer close(joined)
			h.join(jctx, lease)
		}()
		h.keepLease(ctx, lease)
		cancel()
		<-joined
		if ctx.Err() != nil {
			return
		}
		h.isolate()
		backoff := 200 * time.Millisecond
		for ctx.Err() == nil {
			rctx, cancel := context.WithTimeout(ctx, h.cfg.TTL)
			err := h.renewOrRegister(rctx, lease)
			cancel()
			if err == nil {
				break
			}
			h.noteErr(err)
			h.log.Warn("register again", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(jitter(backoff)):
			}
			backoff = nextBackoff(backoff, h.cfg.TTL)
		}
	}
}

// nextBackoff doubles a retry's wait up to a third of the TTL: when
// quorum returns, every host is ready again within about that, not a
// whole TTL after.
func nextBackoff(b, ttl time.Duration) time.Duration {
	return max(200*time.Millisecond, min(2*b, ttl/3))
}

// jitter spreads the hosts' retries (±20%) so that they do not all reach
// a recovering etcd at once.
func jitter(d time.Duration) time.Duration {
	return d + time.Duration(rand.Int64N(int64(d)*2/5+1)) - d/5
}

// renewOrRegister, after the host judged lease lapsed, renews it if etcd
// still has it (the host was only late to confirm it: no other host can
// have seen it gone, and its registration stays as it was), or else
// registers under a new lease.
func (h *Host) renewOrRegister(ctx context.Context, lease clientv3.LeaseID) error {
	sent := time.Now()
	r, err := h.cli.KeepAliveOnce(ctx, lease)
	switch {
	case err == nil:
		h.confirm(lease, sent, r.TTL)
		h.log.Info("lease confirmed again: it had not expired in etcd")
		return nil
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		return h.register(ctx)
	}
	return err
}

// join runs OnJoin for lease until it succeeds or ctx ends (the lease
// was lost), then makes the host ready.
func (h *Host) join(ctx context.Context, lease clientv3.LeaseID) {
	backoff := 200 * time.Millisecond
	for h.cfg.OnJoin != nil {
		err := h.cfg.OnJoin(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		h.log.Warn("rejoin the fleet: check local sessions against it", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(jitter(backoff)):
		}
		backoff = nextBackoff(backoff, h.cfg.TTL)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lease != lease || ctx.Err() != nil {
		return
	}
	h.ready = true
	h.why = ""
	if !h.lost.IsZero() {
		h.log.Info("ready again: rejoined the fleet", "isolated_for", time.Since(h.lost).Round(time.Millisecond))
	} else {
		h.log.Info("ready")
	}
}

// keepLease renews lease every Interval, each renewal bounded by the
// instant the lease stops being live by this host's clock; it returns
// when that instant passes, when etcd says the lease is gone, or when
// ctx ends.
func (h *Host) keepLease(ctx context.Context, lease clientv3.LeaseID) {
	t := time.NewTicker(h.cfg.Interval)
	defer t.Stop()
	nextRefresh := time.Now().Add(h.cfg.Refresh)
	for {
		sent := time.Now()
		until := h.liveUntil()
		if !sent.Before(until) {
			return
		}
		kctx, cancel := context.WithDeadline(ctx, until)
		r, err := h.cli.KeepAliveOnce(kctx, lease)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			h.noteWhy("etcd says its lease is gone (expired or revoked)")
			return
		case err != nil:
			h.noteErr(err)
		default:
			h.confirm(lease, sent, r.TTL)
		}
		if err == nil && !time.Now().Before(nextRefresh) {
			nextRefresh = time.Now().Add(h.cfg.Refresh)
			if err := h.refresh(ctx, lease); err != nil {
				h.log.Warn("refresh the host record", "err", err)
				if errors.Is(err, rpctypes.ErrLeaseNotFound) {
					return
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// confirm records that etcd renewed lease with ttl seconds to live on a
// request sent at sent.
func (h *Host) confirm(lease clientv3.LeaseID, sent time.Time, ttl int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.confirmLocked(lease, sent, ttl)
}

func (h *Host) confirmLocked(lease clientv3.LeaseID, sent time.Time, ttl int64) {
	if lease != h.lease || ttl <= 0 {
		return
	}
	// etcd grants whole seconds; the host counts no more than it asked.
	d := min(time.Duration(ttl)*time.Second, h.cfg.TTL) - h.cfg.Margin
	if u := sent.Add(d); u.After(h.until) {
		h.until = u
		h.confirmed = sent
	}
	h.why = "" // an earlier failure no longer explains anything
}

func (h *Host) liveUntil() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.until
}

// isolate marks the host isolated once its lease is lost.
func (h *Host) isolate() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ready {
		h.lost = time.Now()
		if h.until.Before(h.lost) {
			h.lost = h.until
		}
	}
	h.ready = false
	h.log.Warn("isolated from the fleet: its lease lapsed; running VMs go on, changes are refused until it rejoins",
		"why", h.why, "lapsed", time.Since(h.until).Round(time.Millisecond))
}

// noteErr keeps what an etcd call failed with, for the refusal.
func (h *Host) noteErr(err error) {
	h.noteWhy(fmt.Sprintf("etcd at %s unreachable: %v", strings.Join(h.cli.Endpoints(), ","), err))
}

func (h *Host) noteWhy(why string) {
	h.mu.Lock()
	h.why = why
	h.mu.Unlock()
}

// round rounds d for people: tenths of a second under 10s, else seconds.
func round(d time.Duration) time.Duration {
	if d < 10*time.Second {
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Second)
}

// ago says how long ago something was that happened d ago.
func ago(d time.Duration) string {
	if d = round(d); d == 0 {
		return "just now"
	}
	return d.String() + " ago"
}

// LeaseStatus is a host's judgment of its own lease.
type LeaseStatus struct {
	// Ready: the lease is live by the host's clock and OnJoin ran.
	Ready bool
	// Until is when the lease stops being live by the host's clock.
	Until time.Time
	// Why says what last went wrong with etcd ("" while ready).
	Why string
}

// Status returns the host's judgment of its lease now.
func (h *Host) Status() LeaseStatus {
	h.mu.Lock()
	defer h.mu.Unlock()
	return LeaseStatus{Ready: h.ready && time.Now().Before(h.until), Until: h.until, Why: h.why}
}

// Allowed returns nil while the host may change what it holds: its lease
// is live by its own clock and it has rejoined. Otherwise it returns the
// refusal, of class session.ErrIsolated, in one line that says why and
// that running VMs and commands go on.
func (h *Host) Allowed(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := time.Now()
	if h.ready && now.Before(h.until) {
		return nil
	}
	var cause string
	why := h.why
	if !now.Before(h.until) {
		cause = "its etcd lease expired " + ago(now.Sub(h.until))
		if why == "" {
			// The renewal under way has not failed yet: it is only late.
			why = fmt.Sprintf("etcd at %s unreachable: no renewal confirmed for %s", strings.Join(h.cli.Endpoints(), ","), round(now.Sub(h.confirmed)))
		}
	} else {
		cause = "it is rejoining (checking its sessions against the fleet's owners)"
	}
	if why != "" {
		cause += " (" + why + ")"
	}
	return &session.Error{Class: session.ErrIsolated,
		Msg: fmt.Sprintf("host %s is isolated from the fleet: %s; running VMs and commands go on, changes wait for it to rejoin", h.cfg.ID, cause)}
}

// refresh rewrites the record with fresh facts, under the lease.
func (h *Host) refresh(ctx context.Context, lease clientv3.LeaseID) error {
	h.wmu.Lock()
	defer h.wmu.Unlock()
	return h.write(ctx, lease)
}

// write writes the record now, under lease; the caller holds wmu.
func (h *Host) write(ctx context.Context, lease clientv3.LeaseID) error {
	rctx, cancel := context.WithDeadline(ctx, h.liveUntil())
	defer cancel()
	rec, err := h.record(rctx)
	if err != nil {
		return err
	}
	_, err = h.cli.Txn(rctx).Then(
		clientv3.OpPut(hostKey(h.cfg.ID), mustJSON(rec), clientv3.WithLease(lease)),
		clientv3.OpPut(seenKey(h.cfg.ID), mustJSON(rec))).Commit()
	return err
}

// Leave ends the keeper, then deregisters: the lease is revoked (hosts/H
// goes at once) and seen/H says the host left. Only the first call does
// anything; ctx bounds the etcd calls.
func (h *Host) Leave(ctx context.Context) error { return h.leaveOnce(ctx) }

func (h *Host) leaveOnce(ctx context.Context) error {
	var err error
	h.left.Do(func() { err = h.leave(ctx) })
	return err
}

func (h *Host) leave(ctx context.Context) error {
	h.stop()
	<-h.done
	h.mu.Lock()
	lease := h.lease
	h.mu.Unlock()
	rec, err := h.record(ctx)
	if err != nil {
		rec = HostRecord{ID: h.cfg.ID, Addr: h.cfg.Addr}
	}
	rec.Left = true
	// A lease already lost (the keeper was registering again) is gone
	// as leaving wants it.
	if _, err := h.cli.Revoke(ctx, lease); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("leave the fleet: revoke host %s's lease: %w", h.cfg.ID, err)
	}
	if _, err := h.cli.Put(ctx, seenKey(h.cfg.ID), mustJSON(rec)); err != nil {
		return fmt.Errorf("leave the fleet: record host %s as left: %w", h.cfg.ID, err)
	}
	h.log.Info("left the fleet")
	return nil
}

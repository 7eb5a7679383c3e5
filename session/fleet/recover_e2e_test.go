package fleet_test

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/api"
	"github.com/berthvm/berth/session/fleet"
	"github.com/berthvm/berth/session/fleet/pki"
	"github.com/berthvm/berth/session/sessiontest"
)

// recoverFake is the fake engine with what a replication and a
// recovery ask of a host's engine: a checkpoint's workspace files (taken
// when the checkpoint is), sent as a hashed bundle, kept apart from the
// sessions, staged and committed as a session; the epochs the router
// records; and the quarantine the rejoin asks for.
type recoverFake struct {
	*sessiontest.Fake
	mu          sync.Mutex
	ckpts       map[string]map[string]string // name/id → workspace files when taken
	replicas    map[string]fakeBundle        // name/id → kept here
	staged      map[string]fakeBundle        // name → staged here
	epochs      map[string]int64
	quarantined []string
}

type fakeBundle struct {
	Name, ID string
	Files    map[string]string
	Sum      [32]byte
}

func (b fakeBundle) sum() [32]byte {
	x, _ := json.Marshal(b.Files)
	return sha256.Sum256(append([]byte(b.Name+"/"+b.ID+"\x00"), x...))
}

func newRecoverFake() *recoverFake {
	return &recoverFake{Fake: sessiontest.New(sessiontest.Options{}), ckpts: map[string]map[string]string{},
		replicas: map[string]fakeBundle{}, staged: map[string]fakeBundle{}, epochs: map[string]int64{}}
}

var (
	_ session.Replicator = (*recoverFake)(nil)
	_ session.Mover      = (*recoverFake)(nil)
	_ fleet.EpochSetter  = (*recoverFake)(nil)
	_ fleet.Local        = (*recoverFake)(nil)
)

func (f *recoverFake) Checkpoint(ctx context.Context, name string, opts session.CheckpointOptions) (session.Checkpoint, error) {
	ck, err := f.Fake.Checkpoint(ctx, name, opts)
	if err != nil {
		return ck, err
	}
	files := map[string]string{}
	list, err := f.Fake.ListDir(ctx, name, "")
	if err != nil {
		return ck, err
	}
	for _, fi := range list {
		if fi.IsDir() {
			continue
		}
		rc, err := f.Fake.ReadFile(ctx, name, fi.Name)
		if err != nil {
			return ck, err
		}
		b, _ := io.ReadAll(rc)
		rc.Close()
		files[fi.Name] = string(b)
	}
	f.mu.Lock()
	f.ckpts[name+"/"+ck.ID] = files
	f.mu.Unlock()
	return ck, nil
}

func (f *recoverFake) SendCheckpoint(ctx context.Context, name, id string, w io.Writer) error {
	f.mu.Lock()
	files, ok := f.ckpts[name+"/"+id]
	f.mu.Unlock()
	if !ok {
		return session.NoCheckpoint(name, id)
	}
	b := fakeBundle{Name: name, ID: id, Files: files}
	b.Sum = b.sum()
	return json.NewEncoder(w).Encode(b)
}

func (f *recoverFake) ReceiveReplica(ctx context.Context, r io.Reader) (session.Replica, error) {
	var b fakeBundle
	if err := json.NewDecoder(io.LimitReader(r, 1<<20)).Decode(&b); err != nil {
		return session.Replica{}, fmt.Errorf("replica bundle: %v: %w", err, session.ErrInvalid)
	}
	if b.sum() != b.Sum {
		return session.Replica{}, fmt.Errorf("replica bundle fails its hash: %w", session.ErrInvalid)
	}
	f.mu.Lock()
	f.replicas[b.Name+"/"+b.ID] = b
	f.mu.Unlock()
	return session.Replica{Session: b.Name, Checkpoint: b.ID, Files: len(b.Files), CopiedAt: time.Now()}, nil
}

func (f *recoverFake) Replicas(ctx context.Context, name string) ([]session.Replica, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []session.Replica
	for _, b := range f.replicas {
		if name == "" || b.Name == name {
			out = append(out, session.Replica{Session: b.Name, Checkpoint: b.ID})
		}
	}
	return out, nil
}

func (f *recoverFake) StageReplica(ctx context.Context, name, id string) (session.MoveStaged, error) {
	if _, err := f.Fake.Get(ctx, name); err == nil {
		return session.MoveStaged{}, fmt.Errorf("session %q exists here: %w", name, session.ErrExists)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if st, ok := f.staged[name]; ok {
		if st.ID == id {
			return session.MoveStaged{Name: name, State: session.StateStopped, Checkpoint: id, Files: len(st.Files)}, nil
		}
		return session.MoveStaged{}, fmt.Errorf("a recovery of %s from %s is staged here: %w", name, st.ID, session.ErrExists)
	}
	b, ok := f.replicas[name+"/"+id]
	if !ok {
		return session.MoveStaged{}, fmt.Errorf("no replica of %s of %s here: %w", id, name, session.ErrNotFound)
	}
	f.staged[name] = b
	return session.MoveStaged{Name: name, State: session.StateStopped, Checkpoint: id, Files: len(b.Files)}, nil
}

func (f *recoverFake) DropReplica(ctx context.Context, name, id string) error {
	f.mu.Lock()
	delete(f.replicas, name+"/"+id)
	f.mu.Unlock()
	return nil
}

// CommitReceived makes the staged replica a stopped session with the
// checkpoint's workspace files.
func (f *recoverFake) CommitReceived(ctx context.Context, name string) (session.Session, error) {
	f.mu.Lock()
	b, ok := f.staged[name]
	f.mu.Unlock()
	if !ok {
		return f.Fake.Get(ctx, name)
	}
	if _, err := f.Fake.Create(ctx, session.CreateOptions{Name: name}); err != nil {
		return session.Session{}, err
	}
	for p, data := range b.Files {
		if _, err := f.Fake.WriteFile(ctx, name, p, strings.NewReader(data)); err != nil {
			return session.Session{}, err
		}
	}
	s, err := f.Fake.Stop(ctx, name)
	if err != nil {
		return s, err
	}
	f.mu.Lock()
	delete(f.staged, name)
	f.mu.Unlock()
	return s, nil
}

func (f *recoverFake) DiscardReceived(ctx context.Context, name string) error {
	f.mu.Lock()
	delete(f.staged, name)
	f.mu.Unlock()
	return nil
}

func (f *recoverFake) SendSession(context.Context, string, io.Writer) error {
	return session.ErrUnsupported
}
func (f *recoverFake) ReceiveSession(context.Context, io.Reader) (session.MoveStaged, error) {
	return session.MoveStaged{}, session.ErrUnsupported
}
func (f *recoverFake) SendSessionImage(context.Context, string, io.Writer) error {
	return session.ErrUnsupported
}
func (f *recoverFake) ReceiveImage(context.Context, io.Reader) error { return session.ErrUnsupported }
func (f *recoverFake) DropSent(context.Context, string) error        { return session.ErrUnsupported }

func (f *recoverFake) SetEpoch(ctx context.Context, name string, epoch int64) error {
	f.mu.Lock()
	f.epochs[name] = epoch
	f.mu.Unlock()
	return nil
}

func (f *recoverFake) Get(ctx context.Context, name string) (session.Session, error) {
	s, err := f.Fake.Get(ctx, name)
	f.mu.Lock()
	s.Epoch = f.epochs[name]
	f.mu.Unlock()
	return s, err
}

func (f *recoverFake) List(ctx context.Context) ([]session.Session, error) {
	l, err := f.Fake.List(ctx)
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range l {
		l[i].Epoch = f.epochs[l[i].Name]
	}
	return l, err
}

// Quarantine stops the session's "VM" and forgets it, as the engine's
// does (which also keeps its files aside).
func (f *recoverFake) Quarantine(ctx context.Context, name, why string) (string, error) {
	if s, err := f.Fake.Get(ctx, name); err == nil && s.State == session.StateRunning {
		if _, err := f.Fake.Stop(ctx, name); err != nil {
			return "", err
		}
	}
	if err := f.Fake.Delete(ctx, name); err != nil {
		return "", err
	}
	f.mu.Lock()
	f.quarantined = append(f.quarantined, name)
	f.mu.Unlock()
	return "/quarantine/" + name, nil
}

func (f *recoverFake) wasQuarantined() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.quarantined)
}

// recoverHost is one host of the recovery's fleet: its fake engine, and
// its registration, front door and API while it runs.
type recoverHost struct {
	id, addr string
	fake     *recoverFake
	host     *fleet.Host
	router   *fleet.Router
	srv      *http.Server
}

const recoverTTL = 2 * time.Second

// up registers h (again), with the rejoin's quarantine of its stale
// copies, and serves its front door on its address.
func (h *recoverHost) up(t *testing.T, cli *clientv3.Client, ca string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), h.id)
	if err := pki.Issue(ca, dir, h.id, nil, nil); err != nil {
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
	addr := h.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	h.addr = ln.Addr().String()
	log := testLogger(t)
	h.host, err = fleet.Join(t.Context(), cli, fleet.HostConfig{ID: h.id, Addr: h.addr, Instance: "i-" + h.id, TTL: recoverTTL,
		Facts:  func(context.Context) (fleet.Facts, error) { return roomy, nil },
		OnJoin: func(ctx context.Context) error { return fleet.QuarantineStale(ctx, cli, h.id, h.fake, log) }})
	if err != nil {
		t.Fatal(err)
	}
	h.router = fleet.NewRouter(cli, fleet.RouterConfig{Self: h.id, Local: h.fake, TLS: ccfg, Logger: log, Defaults: session.DefaultCreate()})
	h.srv = &http.Server{Handler: api.NewServer(h.router, log, api.WithHosts(h.router)),
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	go h.srv.Serve(tls.NewListener(ln, scfg))
	host, router, srv := h.host, h.router, h.srv
	t.Cleanup(func() { srv.Close(); router.Close(); host.Leave(context.Background()) })
}

// kill is a SIGKILL of the host's daemon: its lease is not revoked, its
// API stops answering, and its engine's sessions run on.
func (h *recoverHost) kill() {
	h.host.Crash()
	h.srv.Close()
	h.router.Close()
}

// A checkpoint replicated to b; a, the owner, killed; recover refused
// while etcd holds a's lease, and without force; accepted once etcd has
// expired it: the session runs on b at a new epoch with the
// checkpoint's workspace (not what was written after it). a, back,
// quarantines its copy at once: one host runs the session.
func TestRecoverEndToEnd(t *testing.T) {
	cli, ca := etcdAndCA(t)
	hosts := map[string]*recoverHost{}
	for _, id := range []string{"a", "b", "c"} {
		hosts[id] = &recoverHost{id: id, fake: newRecoverFake()}
		hosts[id].up(t, cli, ca)
	}
	a, b := hosts["a"], hosts["b"]
	f := &testFleet{cli: cli, ca: ca, hosts: map[string]*testHost{"c": {id: "c", addr: hosts["c"].addr}}}
	op := f.operator(t, "c") // the operator's berth, through front door c
	ctx := t.Context()

	if _, err := op.Create(ctx, session.CreateOptions{Name: "rec", On: "a"}); err != nil {
		t.Fatal(err)
	}
	write := func(p, data string) {
		t.Helper()
		if _, err := op.WriteFile(ctx, "rec", p, strings.NewReader(data)); err != nil {
			t.Fatal(err)
		}
	}
	write("state", "at the checkpoint")
	ck, err := op.Checkpoint(ctx, "rec", session.CheckpointOptions{Label: "good"})
	if err != nil {
		t.Fatal(err)
	}
	write("state", "after the checkpoint")
	write("later", "lost with host a")

	// Replicate through front door c: a sends it straight to b.
	if _, err := op.ReplicateCheckpoint(ctx, "rec", ck.ID, "a"); !errors.Is(err, session.ErrInvalid) {
		t.Errorf("replicate to the owner: %v, want ErrInvalid", err)
	}
	rep, err := op.ReplicateCheckpoint(ctx, "rec", ck.ID, "b")
	if err != nil {
		t.Fatalf("replicate: %v", err)
	}
	if rep.Host != "b" || rep.Checkpoint != ck.ID || rep.Files != 1 {
		t.Errorf("replica %+v", rep)
	}
	if reps, _ := b.fake.Replicas(ctx, "rec"); len(reps) != 1 {
		t.Errorf("b keeps %+v", reps)
	}
	if _, err := b.fake.Get(ctx, "rec"); !errors.Is(err, session.ErrNotFound) {
		t.Errorf("the replica made a session on b: %v", err)
	}
	cks, err := op.Checkpoints(ctx, "rec")
	if err != nil || len(cks) != 1 || !slices.Equal(cks[0].Replicas, []string{"b"}) {
		t.Errorf("checkpoints = %+v, %v; want %s with a replica on b", cks, err, ck.ID)
	}
	before, err := op.Get(ctx, "rec")
	if err != nil || before.Host != "a" || before.State != session.StateRunning {
		t.Fatalf("before the kill: %+v, %v", before, err)
	}

	// a's daemon is killed: its session runs on, unreachable; its
	// checkpoints' listing names the replicas to recover from.
	a.kill()
	killed := time.Now()
	if _, err := op.Checkpoints(ctx, "rec"); !errors.Is(err, session.ErrUnavailable) || !strings.Contains(err.Error(), "the fleet keeps replicas of its checkpoints "+ck.ID+" (taken ") || !strings.Contains(err.Error(), ") on b") {
		t.Errorf("checkpoints of a session whose host is unreachable: %v", err)
	}
	recoverOpts := session.RecoverOptions{From: ck.ID, On: "b", Force: true}
	_, err = op.Recover(ctx, "rec", recoverOpts)
	if !errors.Is(err, session.ErrInvalidState) || !strings.Contains(err.Error(), "still holds its etcd lease (it expires in") {
		t.Fatalf("recover while a's lease lives: %v", err)
	}
	t.Logf("before the TTL: %v", err)
	// Refused until etcd expires the lease; without force, it says what
	// it would do.
	deadline := killed.Add(recoverTTL + 5*time.Second)
	for {
		_, err = op.Recover(ctx, "rec", session.RecoverOptions{From: ck.ID, On: "b"})
		if !errors.Is(err, session.ErrInvalidState) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a's lease lived %s after the kill: %v", time.Since(killed), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	gone := time.Since(killed)
	if gone < recoverTTL*2/3-200*time.Millisecond {
		t.Errorf("recovery allowed %s after the kill, before two thirds of the %s TTL", gone, recoverTTL)
	}
	if !errors.Is(err, session.ErrInvalid) || !strings.Contains(err.Error(), "this would start session rec on host b from its replica of checkpoint "+ck.ID) {
		t.Fatalf("recover without force: %v", err)
	}
	if _, err := b.fake.Get(ctx, "rec"); !errors.Is(err, session.ErrNotFound) {
		t.Errorf("recover without force made the session on b: %v", err)
	}
	if _, err := op.Recover(ctx, "rec", session.RecoverOptions{From: "c99", On: "b", Force: true}); !errors.Is(err, session.ErrNotFound) {
		t.Errorf("recover from a checkpoint b does not keep: %v", err)
	}
	if _, err := op.Recover(ctx, "rec", session.RecoverOptions{From: ck.ID, On: "c", Force: true}); !errors.Is(err, session.ErrNotFound) {
		t.Errorf("recover on a host with no replica: %v", err)
	}

	res, err := op.Recover(ctx, "rec", recoverOpts)
	if err != nil {
		t.Fatalf("recover after the lease expired (%s after the kill): %v", gone, err)
	}
	t.Logf("recovered %s after the kill: %+v", gone, res)
	if res.From != "a" || res.Epoch <= before.Epoch || res.Session.State != session.StateRunning || res.Session.Host != "b" {
		t.Errorf("recover result %+v; want from a, an epoch past %d, running on b", res, before.Epoch)
	}
	got, err := op.Get(ctx, "rec")
	if err != nil || got.Host != "b" || got.Epoch != res.Epoch || got.State != session.StateRunning {
		t.Errorf("after the recovery: %+v, %v", got, err)
	}
	read := func(p string) (string, error) {
		rc, err := op.ReadFile(ctx, "rec", p)
		if err != nil {
			return "", err
		}
		defer rc.Close()
		bs, err := io.ReadAll(rc)
		return string(bs), err
	}
	if s, err := read("state"); err != nil || s != "at the checkpoint" {
		t.Errorf("state on b: %q, %v; want the checkpoint's", s, err)
	}
	if _, err := read("later"); !errors.Is(err, session.ErrNotFound) {
		t.Errorf("a file written after the checkpoint is on b: %v", err)
	}
	if _, err := op.Recover(ctx, "rec", recoverOpts); !errors.Is(err, session.ErrInvalid) {
		t.Errorf("a second recovery: %v; want refused, the session being on b", err)
	}
	// a's copy still runs while a is away (nothing reaches it).
	if s, err := a.fake.Get(ctx, "rec"); err != nil || s.State != session.StateRunning {
		t.Fatalf("a's copy while away: %+v, %v", s, err)
	}

	// a comes back: before it takes any change, its copy is stopped and
	// quarantined; b's runs; exactly one host runs the session.
	back := time.Now()
	a.up(t, cli, ca)
	for a.host.Allowed(ctx) != nil {
		if time.Since(back) > 5*time.Second {
			t.Fatalf("a is not ready 5s after its restart: %v", a.host.Allowed(ctx))
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("a ready again, its copy set aside, %s after its restart", time.Since(back))
	if q := a.fake.wasQuarantined(); !slices.Equal(q, []string{"rec"}) {
		t.Errorf("a quarantined %v, want [rec]", q)
	}
	running := 0
	for id, h := range hosts {
		if s, err := h.fake.Get(ctx, "rec"); err == nil && s.State == session.StateRunning {
			running++
			if id != "b" {
				t.Errorf("host %s runs rec", id)
			}
		}
	}
	if running != 1 {
		t.Errorf("%d hosts run rec, want 1", running)
	}
	if l, err := op.List(ctx); err != nil || len(l) != 1 || l[0].Host != "b" || l[0].State != session.StateRunning {
		t.Errorf("ls after a's return: %+v, %v", l, err)
	}
	if _, err := op.Exec(ctx, "rec", session.ExecRequest{Argv: []string{"true"}}); err != nil {
		t.Errorf("exec in the recovered session: %v", err)
	}
	// Deleted, the session takes its replicas with it.
	if err := op.Delete(ctx, "rec"); err != nil {
		t.Fatal(err)
	}
	if reps, _ := b.fake.Replicas(ctx, ""); len(reps) != 0 {
		t.Errorf("b keeps %+v of a deleted session", reps)
	}
}

// A recovery whose front door stopped after the transaction (the
// staging gone, as a recovery that lost a race discards it) is finished
// by asking again: the new owner stages its replica again, takes the
// session and starts it; asked once more, it is refused.
func TestRecoverFinishesAnInterruptedRecovery(t *testing.T) {
	cli, ca := etcdAndCA(t)
	a, b := &recoverHost{id: "a", fake: newRecoverFake()}, &recoverHost{id: "b", fake: newRecoverFake()}
	a.up(t, cli, ca)
	b.up(t, cli, ca)
	f := &testFleet{cli: cli, ca: ca, hosts: map[string]*testHost{"b": {id: "b", addr: b.addr}}}
	op := f.operator(t, "b")
	ctx := t.Context()
	if _, err := op.Create(ctx, session.CreateOptions{Name: "half", On: "a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := op.WriteFile(ctx, "half", "state", strings.NewReader("checkpointed")); err != nil {
		t.Fatal(err)
	}
	ck, err := op.Checkpoint(ctx, "half", session.CheckpointOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := op.ReplicateCheckpoint(ctx, "half", ck.ID, "b"); err != nil {
		t.Fatal(err)
	}
	a.kill()
	var plan fleet.RecoverPlan
	for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		if plan, _, err = fleet.PlanRecover(ctx, cli, "half", ck.ID, "b"); err == nil {
			break
		}
		if time.Since(start) > recoverTTL+5*time.Second {
			t.Fatalf("plan: %v", err)
		}
	}
	// The transaction alone, as a front door that stopped right after it.
	epoch, err := fleet.Recover(ctx, cli, plan)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := op.Get(ctx, "half"); !errors.Is(err, session.ErrNotFound) {
		t.Fatalf("b has the session before it took it: %v", err)
	}
	res, err := op.Recover(ctx, "half", session.RecoverOptions{From: ck.ID, On: "b", Force: true})
	if err != nil {
		t.Fatalf("recover again: %v", err)
	}
	if res.Epoch != epoch || res.Session.State != session.StateRunning {
		t.Errorf("finished recovery %+v; want epoch %d, running", res, epoch)
	}
	rc, err := op.ReadFile(ctx, "half", "state")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(rc)
	rc.Close()
	if string(got) != "checkpointed" {
		t.Errorf("state %q", got)
	}
	if _, err := op.Recover(ctx, "half", session.RecoverOptions{From: ck.ID, On: "b", Force: true}); !errors.Is(err, session.ErrInvalid) || !strings.Contains(err.Error(), "on host b already") {
		t.Errorf("a recovery of a session b has: %v", err)
	}
}

package fleetbed

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/api"
	"github.com/berthvm/berth/session/fleet"
	"github.com/berthvm/berth/session/fleet/pki"
	"github.com/berthvm/berth/session/sessiontest"
)

// fakeHostEnv, set, makes the test binary a fake host (RunHelper): the
// fleet wired as `berth serve --fleet` wires it (the registration under
// a lease with the rejoin's quarantine, the Router, the fence, the API
// on the data directory's socket and on --listen over mutual TLS) over
// the sessiontest fake instead of the engine, so a bed runs sessions
// without booting VMs.
const fakeHostEnv = "BERTH_FLEETBED_FAKE_HOST"

type fakeHostConfig struct {
	ID, Data, Listen string
	Endpoints, CA    string
	TTL              time.Duration
}

// fakeHost runs a fake host until SIGTERM or SIGINT.
func fakeHost(c fakeHostConfig) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	certs := filepath.Join(c.Data, "fleet-tls")
	host, _, err := net.SplitHostPort(c.Listen)
	if err != nil {
		return err
	}
	if err := pki.Ensure(c.CA, certs, c.ID, nil, []net.IP{net.ParseIP(host)}); err != nil {
		return err
	}
	scfg, err := pki.ServerConfig(certs)
	if err != nil {
		return err
	}
	scfg.NextProtos = []string{"http/1.1"}
	peer, err := pki.ClientConfig(certs)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return err
	}
	defer ln.Close()

	fake := sessiontest.New(sessiontest.Options{})
	defer fake.Close()
	fake.Handle("tick", tick)
	local := &epochs{Fake: fake, at: map[string]int64{}, log: log}
	jctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	node, err := fleet.Start(jctx, fleet.Config{Endpoints: c.Endpoints, TLS: peer, Local: local, HostConfig: fleet.HostConfig{
		ID: c.ID, Addr: c.Listen, Instance: "fake-" + c.ID, TTL: c.TTL, Logger: log,
		Facts: func(context.Context) (fleet.Facts, error) {
			return fleet.Facts{CPUs: 64, MemoryMiB: 1 << 20, DiskFree: 1 << 40, Images: []string{session.DefaultImage}}, nil
		}}})
	cancel()
	if err != nil {
		return err
	}
	router := node.Router(fleet.RouterConfig{Local: local, TLS: peer, Logger: log, LiveUntil: node.LiveUntil, Defaults: session.DefaultCreate()})
	defer func() {
		router.Close()
		lctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		node.Close(lctx)
	}()
	life, endLife := context.WithCancel(context.Background())
	defer endLife()
	srv := &http.Server{Handler: api.NewServer(fleet.Fence(router, node), log, api.WithHosts(node)),
		BaseContext: func(net.Listener) context.Context { return life },
		ErrorLog:    slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	sock, err := api.Listen(daemonSocket(c.Data))
	if err != nil {
		return err
	}
	served := make(chan error, 2)
	go func() { served <- srv.Serve(tls.NewListener(ln, scfg)) }()
	go func() { served <- srv.Serve(sock) }()
	defer srv.Close()
	log.Info("fake host serving", "host", c.ID, "listen", c.Listen)
	select {
	case <-ctx.Done():
		return nil
	case err := <-served:
		return err
	}
}

// tick prints 1, 2, 3, … every 100 ms until killed: a command that goes
// on, its output recorded as it grows.
func tick(ctx context.Context, p *sessiontest.Proc) (int, error) {
	for i := 1; ; i++ {
		fmt.Fprintln(p.Stdout, i)
		select {
		case <-ctx.Done():
			return 0, sessiontest.Signal("SIGKILL")
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// epochs gives the fake what the engine has of the fleet: each copy's
// epoch (fleet.EpochSetter, shown in Get and List, read by the rejoin's
// quarantine) and Quarantine, which the fake cannot do: it refuses and
// logs "QUARANTINE", for a test to find.
type epochs struct {
	*sessiontest.Fake
	mu  sync.Mutex
	at  map[string]int64
	log *slog.Logger
}

func (e *epochs) SetEpoch(_ context.Context, name string, epoch int64) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.at[name] = epoch
	return nil
}

func (e *epochs) stamp(s session.Session) session.Session {
	e.mu.Lock()
	defer e.mu.Unlock()
	s.Epoch = e.at[s.Name]
	return s
}

func (e *epochs) Get(ctx context.Context, name string) (session.Session, error) {
	s, err := e.Fake.Get(ctx, name)
	return e.stamp(s), err
}

func (e *epochs) List(ctx context.Context) ([]session.Session, error) {
	list, err := e.Fake.List(ctx)
	for i := range list {
		list[i] = e.stamp(list[i])
	}
	return list, err
}

func (e *epochs) Quarantine(_ context.Context, name, why string) (string, error) {
	e.log.Error("QUARANTINE asked of the fake", "session", name, "why", why)
	return "", errors.New("the fake host quarantines nothing")
}

var (
	_ fleet.Local       = (*epochs)(nil)
	_ fleet.EpochSetter = (*epochs)(nil)
)

// fakeHostCmd is the command line that runs h as a fake host.
func (h *Host) fakeHostCmd() (name string, args, env []string) {
	raw, _ := json.Marshal(fakeHostConfig{ID: h.ID, Data: h.Data, Listen: h.IP + ":7443", Endpoints: h.b.Endpoints(), CA: h.b.CA, TTL: h.b.TTL})
	return os.Args[0], []string{"-test.run=^$"}, []string{fakeHostEnv + "=" + string(raw)}
}

// runFakeHost runs a fake host when the test binary was started as one,
// and then exits; otherwise it returns.
func runFakeHost() {
	raw := os.Getenv(fakeHostEnv)
	if raw == "" {
		return
	}
	var c fakeHostConfig
	if err := json.Unmarshal([]byte(raw), &c); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if err := fakeHost(c); err != nil {
		fmt.Fprintf(os.Stderr, "fake host %s: %v\n", c.ID, err)
		os.Exit(1)
	}
	os.Exit(0)
}

package fleet_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/api"
	"github.com/berthvm/berth/session/fleet"
	"github.com/berthvm/berth/session/fleet/member"
	"github.com/berthvm/berth/session/fleet/pki"
	"github.com/berthvm/berth/session/sessiontest"
)

// The scale simulation's child processes are this test binary run again
// with envRole set (see TestMain); the rest of their configuration comes
// in these variables, so that a child needs no flags the testing
// package would try to parse.
const (
	envRole    = "BERTH_SCALE_ROLE"    // roleEtcd, roleHost or roleSingle
	envName    = "BERTH_SCALE_NAME"    // the member's or the host's id
	envDir     = "BERTH_SCALE_DIR"     // its own directory (etcd data, certificates)
	envCA      = "BERTH_SCALE_CA"      // the fleet CA's directory
	envEtcd    = "BERTH_SCALE_ETCD"    // etcd client URLs, comma-separated (host)
	envTTL     = "BERTH_SCALE_TTL"     // the host's lease TTL (host)
	envClient  = "BERTH_SCALE_CLIENT"  // the member's client URL (etcd)
	envPeer    = "BERTH_SCALE_PEER"    // the member's peer URL (etcd)
	envCluster = "BERTH_SCALE_CLUSTER" // the initial cluster, N=URL,… (etcd)

	roleEtcd   = "etcd"
	roleHost   = "host"
	roleSingle = "single"
)

// scaleChild runs one child of the simulation until its stdin closes
// (the test ended it, or the test process died: either way no child
// outlives the run) or SIGTERM, and returns the exit code.
func scaleChild(role string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	cmds := make(chan string)
	go func() {
		s := bufio.NewScanner(os.Stdin)
		for s.Scan() {
			cmds <- s.Text()
		}
		stop()
	}()
	var err error
	switch role {
	case roleEtcd:
		err = member.Run(ctx, member.Config{Name: os.Getenv(envName), Dir: os.Getenv(envDir),
			ListenClient: os.Getenv(envClient), ListenPeer: os.Getenv(envPeer), InitialCluster: os.Getenv(envCluster)}, os.Stdout)
	case roleHost, roleSingle:
		err = scaleHost(ctx, role == roleHost, log, cmds)
	default:
		err = fmt.Errorf("unknown %s %q", envRole, role)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s %s: %v\n", role, os.Getenv(envName), err)
		return 1
	}
	return 0
}

// scaleHost is one simulated host, wired as session/daemon wires a fleet
// host (fleet.go, daemon.go) with the fake engine for the Manager: its
// certificate from the fleet CA, the API's mutual-TLS listener on
// loopback opened before it registers (so what it registers answers),
// the registration under a lease, the Router over the fake, and the API
// server over the Router. A lone host (fleet false) is the same fake
// behind the same API and TLS, with no etcd: the reference the fleet's
// figures are measured against. It prints "READY ADDR", then answers
// "stats" with the placements its creates tried.
func scaleHost(ctx context.Context, inFleet bool, log *slog.Logger, cmds <-chan string) error {
	id, dir := os.Getenv(envName), os.Getenv(envDir)
	if err := pki.Ensure(os.Getenv(envCA), dir, id, nil, []net.IP{net.IPv4(127, 0, 0, 1)}); err != nil {
		return err
	}
	scfg, err := pki.ServerConfig(dir)
	if err != nil {
		return err
	}
	scfg.NextProtos = []string{"http/1.1"} // as the daemon's listenFleet
	peer, err := pki.ClientConfig(dir)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	fake := sessiontest.New(sessiontest.Options{})
	defer fake.Close()

	var svc session.Service = fake
	var hosts session.HostLister
	var mu sync.Mutex
	var places, tries, failed int
	if inFleet {
		ttl, err := time.ParseDuration(os.Getenv(envTTL))
		if err != nil {
			return fmt.Errorf("%s: %w", envTTL, err)
		}
		jctx, cancel := context.WithTimeout(ctx, time.Minute)
		node, err := fleet.Start(jctx, fleet.Config{Endpoints: os.Getenv(envEtcd), HostConfig: fleet.HostConfig{
			ID: id, Addr: ln.Addr().String(), Instance: "i-" + id, TTL: ttl, Logger: log,
			// Room for every session the run makes: placement's choice is
			// then the power of two choices alone, not who is full.
			Facts: func(context.Context) (fleet.Facts, error) {
				return fleet.Facts{CPUs: 1 << 16, MemoryMiB: 1 << 30, DiskFree: 1 << 50, Images: []string{session.DefaultImage}}, nil
			}}})
		cancel()
		if err != nil {
			return err
		}
		router := node.Router(fleet.RouterConfig{Local: fake, TLS: peer, Logger: log, Defaults: session.DefaultCreate(),
			OnPlace: func(p fleet.Placement, err error) {
				mu.Lock()
				places++
				tries += p.Tries
				if err != nil {
					failed++
				}
				mu.Unlock()
			}})
		defer func() {
			router.Close()
			lctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			node.Close(lctx)
		}()
		svc, hosts = router, router
	}
	life, stopLife := context.WithCancel(context.Background())
	defer stopLife()
	srv := &http.Server{Handler: api.NewServer(svc, log, api.WithHosts(hosts)),
		BaseContext: func(net.Listener) context.Context { return life },
		ErrorLog:    slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(tls.NewListener(ln, scfg)) }()
	defer srv.Close()
	fmt.Printf("READY %s\n", ln.Addr())
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-served:
			return err
		case c := <-cmds:
			if strings.TrimSpace(c) == "stats" {
				mu.Lock()
				fmt.Printf("STATS %d %d %d\n", places, tries, failed)
				mu.Unlock()
			}
		}
	}
}

// Package daemon is what runs on `berth serve`, the server's composition
// root: it holds the data directory's lock, reads the config, opens the
// store, builds the VMM drivers and the session Manager, serves the API
// socket (and the extras the caller adds, such as the SSH server; in a
// fleet, also the --listen address, all of them the fleet's front door
// over the Manager), collects
// the store's garbage, and shuts them down in order. VMs keep running when
// the daemon stops. It imports no front end.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthvm/berth/guest/image"
	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/api"
	"github.com/berthvm/berth/session/engine"
	"github.com/berthvm/berth/session/fleet"
	"github.com/berthvm/berth/session/metrics"
	"github.com/berthvm/berth/store"
	"github.com/berthvm/berth/vmm"
	"github.com/berthvm/berth/vmm/cloudhypervisor"
	"github.com/berthvm/berth/vmm/qemu"
)

// Options configure the daemon.
type Options struct {
	DataDir  string
	CacheDir string
	// Agent is the guest agent binary images are built from; default
	// berth-agent next to the running executable.
	Agent string
	// CHBinary is the cloud-hypervisor binary (name on PATH or a path).
	CHBinary string
	Version  string
	Logger   *slog.Logger
	// Out receives the lines meant for the person who started the daemon.
	Out io.Writer
	// Ready, if set, is called once the socket accepts calls.
	Ready func()
	// Extra services that run with the daemon (the SSH server), with the
	// daemon's Service: the Manager, or in a fleet its front door. Each runs until its context ends; one that
	// fails ends the daemon.
	Extra []func(ctx context.Context, svc session.Service) error
	// Forbidden are host ports no session's egress reaches (the SSH
	// server's).
	Forbidden []int
	// Hosts pins names to addresses for the egress resolver (tests:
	// "name=10.0.0.1,other=127.0.0.1").
	Hosts string

	// Metrics, when set, is the address /metrics and /healthz are served
	// on (a bare port means loopback); MetricsPublic allows an address
	// others can reach.
	Metrics       string
	MetricsPublic bool

	// LockWatch, when positive, logs every hold of the engine's locks
	// longer than it, with the holder's stack (berth serve -v).
	LockWatch time.Duration

	// Fleet overrides config.toml's fleet keys where a field is set
	// (serve's --fleet, --host-id, --listen, --fleet-ttl, --fleet-ca).
	Fleet FleetConfig

	// Test knobs, passed to session.Config as they are.
	CrashAt     string // a step at which the daemon kills itself
	NoTemplates bool   // every create boots cold
	// ForwardViaAgent: forwards go through the agent, also into a
	// guest with a NIC (the benchmark of the two carriers).
	ForwardViaAgent bool
}

// SocketPath is where the daemon's API socket lives in a data directory.
func SocketPath(dataDir string) string { return api.SocketPath(dataDir) }

// Lock holds the data directory for one daemon.
type Lock struct{ f *os.File }

// LockDataDir takes the data directory's lock, or says which daemon holds it.
func LockDataDir(dataDir string) (*Lock, error) {
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return nil, err
	}
	path := filepath.Join(dataDir, "daemon.lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		b, _ := os.ReadFile(path)
		f.Close()
		holder := strings.TrimSpace(string(b))
		if holder == "" {
			holder = "another process"
		} else {
			holder = "berth daemon pid " + holder
		}
		return nil, fmt.Errorf("data directory %s is in use by %s: %w", dataDir, holder, session.ErrConflict)
	}
	f.Truncate(0)
	f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return &Lock{f: f}, nil
}

// Unlock releases the lock.
func (l *Lock) Unlock() {
	l.f.Truncate(0)
	unix.Flock(int(l.f.Fd()), unix.LOCK_UN)
	l.f.Close()
}

// DefaultAgent is berth-agent next to the running executable.
func DefaultAgent() string {
	exe, err := os.Executable()
	if err != nil {
		return "berth-agent"
	}
	return filepath.Join(filepath.Dir(exe), "berth-agent")
}

// Images returns the data directory's image store.
func Images(o Options) *image.Store {
	return &image.Store{Dir: filepath.Join(o.DataDir, "images"), CacheDir: o.CacheDir, Agent: o.Agent}
}

// miniImage returns the mini image, building it when missing: the KVM
// probe boots it.
func miniImage(ctx context.Context, st *image.Store) (image.Image, error) {
	if im, err := st.Load("mini", ""); err == nil {
		return im, nil
	}
	im, _, err := st.Build(ctx, image.Options{Name: "mini"})
	return im, err
}

// Drivers builds the VMM drivers. KVM is probed once per host boot by a
// test boot of the mini image.
func Drivers(o Options, images *image.Store, log *slog.Logger) map[string]vmm.Driver {
	var once sync.Once
	var works bool
	kvm := func(ctx context.Context) bool {
		once.Do(func() {
			if vmm.KVMDevice() != nil {
				return
			}
			// The verdict is kept for the daemon's life: the caller
			// going away must not decide it.
			ctx := context.WithoutCancel(ctx)
			im, err := miniImage(ctx, images)
			if err != nil {
				return
			}
			r := vmm.KVMProbe{QEMU: qemu.DefaultBinary, Kernel: im.Kernel, Initramfs: im.Initramfs, CacheDir: o.CacheDir}.Run(ctx)
			log.Info("KVM probe", "works", r.Works, "reason", r.Reason)
			works = r.Works
		})
		return works
	}
	return map[string]vmm.Driver{
		qemu.Name:            qemu.New(qemu.Options{KVM: kvm, Logger: log}),
		cloudhypervisor.Name: cloudhypervisor.New(cloudhypervisor.Options{Binary: o.CHBinary, KVM: kvm, Logger: log}),
	}
}

// Run runs the daemon until ctx ends (SIGTERM) or the API server or an
// extra fails, then shuts down in order: listeners, streams and extras, the
// Manager, the store, the lock. VMs keep running. It returns what made it
// stop, joined with every error of the shutdown.
func Run(ctx context.Context, o Options) (err error) {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	if o.Agent == "" {
		o.Agent = DefaultAgent()
	}
	lock, err := LockDataDir(o.DataDir)
	if err != nil {
		return err
	}
	defer lock.Unlock()
	cfg, err := LoadConfig(o.DataDir)
	if err != nil {
		return err
	}
	// The metrics listener first: an address in use or not allowed is
	// refused before anything starts.
	var mln net.Listener
	if o.Metrics != "" {
		if mln, err = metrics.Listen(o.Metrics, o.MetricsPublic); err != nil {
			return err
		}
		defer mln.Close()
	}
	obs := metrics.New()
	st, err := store.Open(filepath.Join(o.DataDir, "store"), log)
	if err != nil {
		return fmt.Errorf("open the store: %w", err)
	}
	defer func() {
		if cerr := st.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("close the store: %w", cerr))
		}
	}()
	st.SetOutputBudget(cfg.OutputBudget)
	images := Images(o)
	// The fleet's node comes after the Manager (its facts come from it);
	// the Manager's own changes (idle sleep, schedules) ask it once it is
	// there.
	var fleetNode atomic.Pointer[fleet.Node]
	allowed := func(ctx context.Context) error {
		if n := fleetNode.Load(); n != nil {
			return n.Allowed(ctx)
		}
		return nil
	}
	mgr, err := engine.NewManager(ctx, st, engine.Config{Allowed: allowed,
		DataDir: o.DataDir, Defaults: cfg.Defaults, Drivers: Drivers(o, images, log), Images: images,
		IdleTimeout: cfg.IdleTimeout, RunTimeout: cfg.RunTimeout, KeepRuns: cfg.RunCheckpoint, RunRecordLimit: cfg.RunRecordLimit, Floor: cfg.Floor,
		CheckpointLimit: cfg.CheckpointLimit, CheckpointBytes: cfg.CheckpointBytes, CrashAt: o.CrashAt, NoTemplates: o.NoTemplates, ForwardViaAgent: o.ForwardViaAgent, NIC: cfg.NetNIC,
		Logger: log, Observer: obs, Net: netConfig(cfg, o), LockWatch: o.LockWatch,
	})
	if err != nil {
		return err
	}
	defer func() {
		if cerr := mgr.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("close the session manager: %w", cerr))
		}
	}()

	// The fleet after the Manager (its facts come from it) and before the
	// API: its deferred leave runs after the listeners stop and before
	// the Manager closes.
	//
	// In a fleet, every front end (the socket, the --listen address, the
	// extras such as SSH) is given the fleet's front door, which serves
	// each session from its owner; alone, the Manager itself. The front
	// door stands behind the fence: an isolated host refuses changes at
	// once (it could not route them: etcd is out of its reach) and
	// answers what reads it can.
	var hostList session.HostLister
	var svc session.Service = mgr
	var fleetLn net.Listener
	fc := fleetConfig(cfg.Fleet, o.Fleet)
	switch {
	case fc.Endpoints != "":
		var fm *fleetMember
		if fm, err = joinFleet(ctx, fc, o.DataDir, cfg.Floor, mgr, mgr, log); err != nil {
			return err
		}
		if fm.ln != nil {
			defer fm.ln.Close() // served below, and closed by the shutdown; this is for an early return
		}
		d := cfg.Defaults.WithFallbacks()
		router := fm.node.Router(fleet.RouterConfig{Local: mgr, TLS: fm.peerTLS, Logger: log, LiveUntil: fm.node.LiveUntil,
			Defaults: session.CreateOptions{CPUs: d.CPUs, MemoryMiB: d.MemoryMiB, DiskBytes: d.DiskBytes, Image: d.Image, VMM: d.VMM, SystemBytes: d.SystemBytes}})
		defer func() {
			router.Close()
			lctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if cerr := fm.node.Close(lctx); cerr != nil {
				err = errors.Join(err, cerr)
			}
		}()
		fleetNode.Store(fm.node)
		// host ls from the node: it says when this host is isolated.
		hostList, svc, fleetLn = fm.node, fleet.Fence(router, fm.node), fm.ln
		fmt.Fprintf(o.Out, "joined the fleet at %s as host %s\n", fc.Endpoints, fc.HostID)
	case fc.Listen != "":
		return fmt.Errorf("--listen %s serves the API to a fleet's hosts and operators: it needs --fleet ETCD_URLS (or fleet in config.toml)", fc.Listen)
	}

	life, stop := context.WithCancel(context.Background())
	defer stop()
	sock := SocketPath(o.DataDir)
	ln, err := api.Listen(sock)
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           api.NewServer(svc, log, api.WithVersion(o.Version), api.WithHosts(hostList)),
		BaseContext:       func(net.Listener) context.Context { return life },
		ReadHeaderTimeout: 10 * time.Second,
		// A refused TLS handshake (no certificate of the fleet's CA) is
		// the server's to log, in the daemon's log.
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	// failed holds what the API servers and the extras end with; each
	// sends at most once, so it never blocks.
	failed := make(chan error, 3+len(o.Extra))
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			failed <- fmt.Errorf("API server on %s: %w", sock, err)
		}
	})
	if fleetLn != nil {
		wg.Go(func() {
			if err := srv.Serve(fleetLn); !errors.Is(err, http.ErrServerClosed) {
				failed <- fmt.Errorf("API server on %s: %w", fleetLn.Addr(), err)
			}
		})
	}
	for _, x := range o.Extra {
		wg.Go(func() {
			if err := x(life, svc); err != nil {
				failed <- err
			}
		})
	}
	wg.Go(func() {
		t := time.NewTicker(10 * time.Minute)
		defer t.Stop()
		for {
			select {
			case <-life.Done():
				return
			case <-t.C:
				if err := st.GC(); err != nil {
					log.Warn("store GC", "err", err)
				}
			}
		}
	})
	if mln != nil {
		if err := obs.Sessions(mgr); err != nil {
			return err
		}
		prober := NewProber(mgr, o.Version, ManagerBound)
		h := obs.Handler(func(ctx context.Context) (any, error) { return prober.Check(ctx) })
		wg.Go(func() {
			if err := metrics.Serve(life, mln, h, log); err != nil {
				failed <- err
			}
		})
	}
	fmt.Fprintf(o.Out, "berth daemon %s (pid %d): data %s, socket %s\n", o.Version, os.Getpid(), o.DataDir, sock)
	if fleetLn != nil {
		how := "mutual TLS with the fleet CA"
		if fc.CA == "" {
			how = "plain text, loopback only"
		}
		fmt.Fprintf(o.Out, "API for the fleet on %s (%s)\n", fleetLn.Addr(), how)
	}
	if mln != nil {
		fmt.Fprintf(o.Out, "metrics on http://%s/metrics, health on http://%s/healthz\n", mln.Addr(), mln.Addr())
	}
	if o.Ready != nil {
		o.Ready()
	}
	var errs []error
	select {
	case <-ctx.Done():
	case err := <-failed:
		errs = append(errs, err)
	}
	log.Info("shutting down; VMs keep running")
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stop() // ends watch and exec streams, and the extras
	if err := srv.Shutdown(sctx); err != nil {
		errs = append(errs, fmt.Errorf("shut the API server down: %w", err))
		srv.Close()
	}
	wg.Wait()
	close(failed)
	for err := range failed {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

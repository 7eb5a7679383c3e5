package engine

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthvm/berth/guest/agent"
	"github.com/berthvm/berth/guest/image"
	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/store"
	"github.com/berthvm/berth/vmm"
)

// agentDriver is a VMM with no VM: each "VM" is the real guest agent
// running in the test process, its workspace a directory, its channel a
// net.Pipe. Commands run as host processes. It lets the engine's locking
// be churned in seconds, with the Manager's real code on every path.
//
// The workspaces live on a tmpfs the test mounts: the agent freezes its
// workspace's filesystem for a checkpoint, and tmpfs refuses that
// (EOPNOTSUPP) where a host filesystem would freeze.
type agentDriver struct {
	root string // tmpfs holding one workspace directory per session
	log  *slog.Logger
}

func (d *agentDriver) Name() string { return "qemu" }

func (d *agentDriver) Start(ctx context.Context, cfg vmm.Config) (vmm.VM, error) {
	name := filepath.Base(filepath.Dir(cfg.Dir))
	ws := filepath.Join(d.root, name)
	if err := os.MkdirAll(ws, 0o755); err != nil {
		return nil, err
	}
	vm := &agentVM{done: make(chan struct{})}
	vm.ctx, vm.cancel = context.WithCancel(context.Background())
	a, err := agent.New(agent.Config{Workspace: ws, Device: "/dev/vdb", UUID: "fake", Home: ws, Logger: d.log, PowerOff: vm.powerOff})
	if err != nil {
		return nil, err
	}
	vm.agent = a
	return vm, nil
}

func (d *agentDriver) Attach(ctx context.Context, dir string) (vmm.VM, error) {
	return nil, vmm.ErrNotRunning
}

type agentVM struct {
	agent  *agent.Agent
	ctx    context.Context // the VM's life: ends its agent's connections
	cancel context.CancelFunc

	mu     sync.Mutex
	paused bool
	once   sync.Once
	done   chan struct{}
	wg     sync.WaitGroup
}

func (v *agentVM) Pid() int              { return 0 }
func (v *agentVM) Accel() vmm.Accel      { return vmm.AccelTCG }
func (v *agentVM) Exit() vmm.Exit        { return vmm.Exit{Code: 0, Time: time.Now()} }
func (v *agentVM) Done() <-chan struct{} { return v.done }

func (v *agentVM) DialAgent(ctx context.Context) (net.Conn, error) {
	select {
	case <-v.done:
		return nil, vmm.ErrNotRunning
	default:
	}
	host, guest := net.Pipe()
	v.wg.Go(func() {
		v.agent.ServeConn(v.ctx, guest)
		guest.Close()
	})
	return host, nil
}

func (v *agentVM) Pause(ctx context.Context) error  { return v.setPaused(true) }
func (v *agentVM) Resume(ctx context.Context) error { return v.setPaused(false) }

func (v *agentVM) setPaused(p bool) error {
	select {
	case <-v.done:
		return vmm.ErrNotRunning
	default:
	}
	v.mu.Lock()
	v.paused = p
	v.mu.Unlock()
	return nil
}

func (v *agentVM) Status(ctx context.Context) (vmm.State, error) {
	select {
	case <-v.done:
		return vmm.StateStopped, nil
	default:
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.paused {
		return vmm.StatePaused, nil
	}
	return vmm.StateRunning, nil
}

func (v *agentVM) powerOff() { v.Kill(context.Background()) }

func (v *agentVM) Kill(ctx context.Context) error {
	v.once.Do(func() {
		v.cancel()
		close(v.done)
	})
	return nil
}

func (v *agentVM) Close() error {
	v.Kill(context.Background())
	v.wg.Wait()
	return nil
}

// newAgentManager returns a Manager whose sessions run on agentDriver,
// with a stand-in mini image (no kernel is read), no templates, and
// statistics refreshed every statsEvery.
func newAgentManager(t testing.TB, statsEvery time.Duration) *Manager {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("mounts a tmpfs for the agents' workspaces: needs root")
	}
	dir := t.TempDir()
	root := filepath.Join(dir, "ws")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", root, "tmpfs", 0, "size=256m"); err != nil {
		t.Skipf("mount a tmpfs for the agents' workspaces: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(root, unix.MNT_DETACH) })
	images := filepath.Join(dir, "images")
	digest := "fake"
	bdir := filepath.Join(images, "mini", digest)
	if err := os.MkdirAll(bdir, 0o755); err != nil {
		t.Fatal(err)
	}
	man, _ := json.Marshal(image.Image{Name: "mini", Digest: digest})
	for f, b := range map[string][]byte{"manifest.json": man, "vmlinuz": nil, "initramfs.cpio.gz": nil} {
		if err := os.WriteFile(filepath.Join(bdir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(images, "mini", "current"), []byte(digest+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(filepath.Join(dir, "store"), nil)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError}))
	m, err := NewManager(t.Context(), st, Config{
		DataDir:       dir,
		Defaults:      Defaults{DiskBytes: 16 << 20, MemoryMiB: 128},
		Drivers:       map[string]vmm.Driver{"qemu": &agentDriver{root: root, log: log}},
		Images:        &image.Store{Dir: images},
		NoTemplates:   true,
		StatsInterval: statsEvery,
		Floor:         1,
		Logger:        log,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		listed := make(chan []session.Session, 1)
		go func() {
			list, _ := m.List(ctx)
			listed <- list
		}()
		var list []session.Session
		select {
		case list = <-listed:
		case <-time.After(10 * time.Second):
			t.Log("the engine does not answer: cleanup skipped")
			return
		}
		for _, s := range list {
			m.Delete(ctx, s.Name)
		}
		m.Close()
		st.Close()
	})
	return m
}

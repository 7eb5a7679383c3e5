package cloudhypervisor

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthvm/berth/vmm"
	"github.com/berthvm/berth/vmm/cloudhypervisor/chfake"
	"github.com/berthvm/berth/vmm/cloudhypervisor/internal/chapi"
)

// echoCheck checks the fake guest's greeting arrives intact right after
// the handshake, then that bytes round-trip.
func echoCheck(t *testing.T, conn net.Conn) {
	t.Helper()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	defer conn.SetDeadline(time.Time{})
	buf := make([]byte, len(chfake.Greeting))
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != chfake.Greeting {
		t.Fatalf("greeting = %q, %v; want %q", buf, err, chfake.Greeting)
	}
	if _, err := io.WriteString(conn, "ping\n"); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || line != "ping\n" {
		t.Fatalf("echo = %q, %v", line, err)
	}
}

func vmInfo(t *testing.T, v *VM) chapi.VmInfo {
	t.Helper()
	info, err := v.api.info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info
}

func TestLifecycle(t *testing.T) {
	d := newTestDriver(t, fakeBinary(t), nil)
	cfg := testConfig(t)
	ctx := context.Background()
	v := startVM(t, d, cfg)

	pid, err := vmm.ReadPidFile(filepath.Join(cfg.Dir, PidFile))
	if err != nil || pid != v.Pid() {
		t.Fatalf("%s = %d, %v; want %d", PidFile, pid, err, v.Pid())
	}
	if pgid, err := unix.Getpgid(v.Pid()); err != nil || pgid != v.Pid() {
		t.Errorf("VMM process group = %d, %v; want its own (%d)", pgid, err, v.Pid())
	}
	if v.Accel() != vmm.AccelKVM {
		t.Errorf("Accel = %s", v.Accel())
	}

	// What CH was asked for.
	c := vmInfo(t, v).Config
	if c.Serial == nil || c.Serial.Mode != chapi.ConsoleModeFile || *c.Serial.File != filepath.Join(cfg.Dir, ConsoleLog) {
		t.Errorf("serial = %+v, want File %s", c.Serial, ConsoleLog)
	}
	if c.Console == nil || c.Console.Mode != chapi.ConsoleModeOff {
		t.Errorf("console = %+v, want Off", c.Console)
	}
	if c.Disks == nil || len(*c.Disks) != 1 || *(*c.Disks)[0].ImageType != chapi.Raw || *(*c.Disks)[0].Path != cfg.Workspace {
		t.Errorf("disks = %+v, want the workspace as Raw", c.Disks)
	}
	if c.Vsock == nil || c.Vsock.Socket != filepath.Join(cfg.Dir, VsockSocket) || c.Vsock.Cid != guestCID {
		t.Errorf("vsock = %+v", c.Vsock)
	}
	if *c.Payload.Cmdline != "console=ttyS0 quiet" || c.Cpus.BootVcpus != 2 || c.Memory.Size != 64<<20 {
		t.Errorf("payload/cpus/memory = %q %+v %+v", *c.Payload.Cmdline, c.Cpus, c.Memory)
	}

	if st, err := v.Status(ctx); err != nil || st != vmm.StateRunning {
		t.Fatalf("Status = %s, %v; want running", st, err)
	}
	conn, err := v.DialAgent(ctx)
	if err != nil {
		t.Fatalf("DialAgent: %v", err)
	}
	echoCheck(t, conn)
	conn.Close()

	for range 2 { // pausing a paused VM is not an error
		if err := v.Pause(ctx); err != nil {
			t.Fatalf("Pause: %v", err)
		}
	}
	if st, _ := v.Status(ctx); st != vmm.StatePaused {
		t.Fatalf("Status = %s, want paused", st)
	}
	snap := filepath.Join(t.TempDir(), "snap")
	if err := v.Snapshot(ctx, snap); err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	for range 2 {
		if err := v.Resume(ctx); err != nil {
			t.Fatalf("Resume: %v", err)
		}
	}
	if st, _ := v.Status(ctx); st != vmm.StateRunning {
		t.Fatalf("Status = %s, want running", st)
	}

	for range 2 { // killing a stopped VM is not an error
		if err := v.Kill(ctx); err != nil {
			t.Fatalf("Kill: %v", err)
		}
	}
	waitDone(t, v)
	e := v.Exit()
	if e.Signal != "SIGKILL" || e.Code != -1 || e.Time.IsZero() {
		t.Errorf("Exit = %+v, want killed by SIGKILL", e)
	}
	if !strings.Contains(e.LogTail, "chfake:") {
		t.Errorf("LogTail = %q, want the fake's log lines", e.LogTail)
	}
	if st, err := v.Status(ctx); err != nil || st != vmm.StateStopped {
		t.Errorf("Status after kill = %s, %v; want stopped", st, err)
	}
	if err := v.Pause(ctx); !errors.Is(err, vmm.ErrNotRunning) {
		t.Errorf("Pause after kill = %v, want ErrNotRunning", err)
	}
	if _, err := v.DialAgent(ctx); !errors.Is(err, vmm.ErrNotRunning) {
		t.Errorf("DialAgent after kill = %v, want ErrNotRunning", err)
	}
	if err := v.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := v.Resume(ctx); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Resume after Close = %v, want net.ErrClosed", err)
	}
}

// TestStartSlow: a VMM slow to bind its socket and slow to boot (CH's
// single API thread holds vmm.ping meanwhile) still starts.
func TestStartSlow(t *testing.T) {
	d := newTestDriver(t, fakeBinary(t, chfake.EnvStartDelay+"=300ms", chfake.EnvBootDelay+"=300ms"), nil)
	v := startVM(t, d, testConfig(t))
	if st, err := v.Status(context.Background()); err != nil || st != vmm.StateRunning {
		t.Fatalf("Status = %s, %v", st, err)
	}
}

func TestStartFailures(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     []string
		mod     func(*vmm.Config)
		timeout time.Duration
		want    []string
		check   func(t *testing.T, err error)
	}{
		{
			name: "dies before ready",
			env:  []string{chfake.EnvFail + "=start"},
			want: []string{"exited with code 1", "before its API answered", "simulated failure"},
			check: func(t *testing.T, err error) {
				if !errors.Is(err, vmm.ErrNotRunning) {
					t.Errorf("not ErrNotRunning: %v", err)
				}
			},
		},
		{
			name: "dies during boot",
			env:  []string{chfake.EnvFail + "=boot"},
			want: []string{"exited with code 101", "while starting the VM", "panicked"},
			check: func(t *testing.T, err error) {
				if !errors.Is(err, vmm.ErrNotRunning) {
					t.Errorf("not ErrNotRunning: %v", err)
				}
			},
		},
		{
			name:    "never answers",
			env:     []string{chfake.EnvFail + "=hang"},
			timeout: 500 * time.Millisecond,
			want:    []string{"did not answer", "took longer than 500ms"},
		},
		{
			name: "boot refused",
			mod:  func(c *vmm.Config) { c.Kernel = c.Kernel + ".missing" },
			want: []string{"vm.boot", "Cannot open payload file", "HTTP 500", "check the kernel"},
			check: func(t *testing.T, err error) {
				var ae *APIError
				if !errors.As(err, &ae) || ae.Status != 500 || len(ae.Messages) < 2 {
					t.Errorf("no *APIError with CH's messages in %v", err)
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newTestDriver(t, fakeBinary(t, tc.env...), func(o *Options) {
				if tc.timeout > 0 {
					o.StartTimeout = tc.timeout
				}
			})
			cfg := testConfig(t)
			if tc.mod != nil {
				tc.mod(&cfg)
			}
			v, err := d.Start(context.Background(), cfg)
			if err == nil {
				killVM(t, v)
				t.Fatal("Start succeeded")
			}
			t.Logf("Start: %v", err)
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q", w)
				}
			}
			if tc.check != nil {
				tc.check(t, err)
			}
			// The VMM that failed to start is gone, and left no lock.
			pid, perr := vmm.ReadPidFile(filepath.Join(cfg.Dir, PidFile))
			if perr != nil {
				t.Fatalf("pid file: %v", perr)
			}
			if alive(pid) {
				t.Errorf("VMM %d still alive after a failed start", pid)
			}
			if held, _ := locked(cfg.Workspace); held {
				t.Error("workspace still locked after a failed start")
			}
		})
	}
}

func TestStartRefuses(t *testing.T) {
	fake := fakeBinary(t)
	for _, tc := range []struct {
		name        string
		opts        func(*Options)
		cfg         func(*vmm.Config)
		unavailable bool
		want        string
	}{
		{"no KVM check", func(o *Options) { o.KVM = nil }, nil, true, "cloud-hypervisor needs a working KVM: "},
		{"KVM broken", func(o *Options) { o.KVM = func(context.Context) bool { return false } }, nil, true, "needs a working KVM"},
		{"TCG", nil, func(c *vmm.Config) { c.Accel = vmm.AccelTCG }, true, "runs only on KVM"},
		{"not on PATH", func(o *Options) { o.Binary = "berth-no-such-cloud-hypervisor" }, nil, true, "berth-no-such-cloud-hypervisor: not found on PATH"},
		{"bad path", func(o *Options) { o.Binary = "/nonexistent/cloud-hypervisor" }, nil, true, "no such file"},
		{"relative dir", nil, func(c *vmm.Config) { c.Dir = "vm" }, false, "absolute"},
		{"no kernel", nil, func(c *vmm.Config) { c.Kernel = "" }, false, "no kernel"},
		{"long dir", nil, func(c *vmm.Config) { c.Dir = "/tmp/" + strings.Repeat("x", 120) }, false, "unix socket limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newTestDriver(t, fake, tc.opts)
			cfg := testConfig(t)
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			v, err := d.Start(context.Background(), cfg)
			if err == nil {
				killVM(t, v)
				t.Fatal("Start succeeded")
			}
			if got := errors.Is(err, vmm.ErrUnavailable); got != tc.unavailable {
				t.Errorf("errors.Is(%v, ErrUnavailable) = %v", err, got)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q lacks %q", err, tc.want)
			}
			if _, err := os.Stat(filepath.Join(cfg.Dir, PidFile)); err == nil {
				t.Error("a VMM was launched")
			}
		})
	}
}

func TestAvailable(t *testing.T) {
	fake := fakeBinary(t)
	notExec := filepath.Join(t.TempDir(), "cloud-hypervisor")
	os.WriteFile(notExec, []byte("x"), 0o644)

	t.Setenv("PATH", t.TempDir())
	for _, tc := range []struct {
		binary string
		kvm    bool
		want   string // "" for nil
	}{
		{"", true, "cloud-hypervisor: not found on PATH"},
		{"", false, "cloud-hypervisor: not found on PATH"},
		{fake, false, "cloud-hypervisor needs a working KVM: "},
		{fake, true, ""},
		{"/nonexistent/cloud-hypervisor", true, "/nonexistent/cloud-hypervisor: no such file"},
		{notExec, true, "not executable"},
	} {
		err := Available(tc.binary, tc.kvm)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("Available(%q, %v) = %v, want nil", tc.binary, tc.kvm, err)
		case tc.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.want) && !strings.Contains(err.Error(), tc.want)):
			t.Errorf("Available(%q, %v) = %v, want %q", tc.binary, tc.kvm, err, tc.want)
		case tc.want != "" && !errors.Is(err, vmm.ErrUnavailable):
			t.Errorf("Available(%q, %v) = %v, not ErrUnavailable", tc.binary, tc.kvm, err)
		}
	}
	if err := Available("", true); !strings.HasPrefix(err.Error(), "cloud-hypervisor: not found on PATH") || !errors.Is(err, exec.ErrNotFound) {
		t.Errorf("Available on empty PATH = %v, want the exact message and exec.ErrNotFound", err)
	}
}

func TestWorkspaceInUse(t *testing.T) {
	fake := fakeBinary(t)
	d := newTestDriver(t, fake, nil)
	ctx := context.Background()
	cfg := testConfig(t)
	startVM(t, d, cfg)

	// Another VM on the same workspace is refused before anything runs.
	cfg2 := testConfig(t)
	cfg2.Workspace = cfg.Workspace
	if _, err := d.Start(ctx, cfg2); !errors.Is(err, vmm.ErrInUse) {
		t.Fatalf("second Start = %v, want ErrInUse", err)
	}
	if _, err := os.Stat(filepath.Join(cfg2.Dir, PidFile)); err == nil {
		t.Error("a VMM was launched for the refused start")
	}

	// Any OFD lock counts, QEMU's included.
	cfg3 := testConfig(t)
	f, err := os.OpenFile(cfg3.Workspace, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	lk := unix.Flock_t{Type: unix.F_RDLCK, Start: 100, Len: 1}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Start(ctx, cfg3); !errors.Is(err, vmm.ErrInUse) {
		t.Fatalf("Start on a locked workspace = %v, want ErrInUse", err)
	}
}

// TestWorkspaceTakenDuringBoot: the image is locked by someone else after
// Start's check but before vm.boot opens it. CH fails the boot; the driver
// must still say ErrInUse.
func TestWorkspaceTakenDuringBoot(t *testing.T) {
	d := newTestDriver(t, fakeBinary(t, chfake.EnvBootDelay+"=1s"), nil)
	cfg := testConfig(t)
	errc := make(chan error, 1)
	go func() {
		v, err := d.Start(context.Background(), cfg)
		if err == nil {
			killVM(t, v)
		}
		errc <- err
	}()
	// The pid file appears after the check and well before vm.boot opens
	// the disk (the fake's boot takes 1 s).
	for {
		if _, err := os.Stat(filepath.Join(cfg.Dir, PidFile)); err == nil {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	f, err := os.OpenFile(cfg.Workspace, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	lk := unix.Flock_t{Type: unix.F_WRLCK}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk); err != nil {
		t.Fatal(err)
	}
	err = <-errc
	if !errors.Is(err, vmm.ErrInUse) {
		t.Fatalf("Start = %v, want ErrInUse", err)
	}
	t.Logf("Start: %v", err)
}

func TestStartTwiceInOneDir(t *testing.T) {
	d := newTestDriver(t, fakeBinary(t), nil)
	ctx := context.Background()
	cfg := testConfig(t)
	v := startVM(t, d, cfg)
	cfg.Workspace = ""
	if _, err := d.Start(ctx, cfg); err == nil || !strings.Contains(err.Error(), "already has a running cloud-hypervisor") {
		t.Fatalf("second Start in the same dir = %v", err)
	}
	// The first VM's sockets were left alone.
	if st, err := v.Status(ctx); err != nil || st != vmm.StateRunning {
		t.Fatalf("first VM: Status = %s, %v", st, err)
	}
	conn, err := v.DialAgent(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
}

// staleSocket leaves a socket file nothing listens on, as a killed VMM does.
func staleSocket(t *testing.T, path string) {
	t.Helper()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
}

func deadPid(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", "exit 0")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

func TestStartCleansStaleFiles(t *testing.T) {
	d := newTestDriver(t, fakeBinary(t), nil)
	cfg := testConfig(t)
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	staleSocket(t, filepath.Join(cfg.Dir, APISocket))
	staleSocket(t, filepath.Join(cfg.Dir, VsockSocket))
	vmm.WritePidFile(filepath.Join(cfg.Dir, PidFile), deadPid(t))

	v := startVM(t, d, cfg)
	conn, err := v.DialAgent(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	echoCheck(t, conn)
	conn.Close()

	// Killed, the VMM leaves stale sockets; the next start copes.
	if err := v.Kill(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(cfg.Dir, VsockSocket)); err != nil {
		t.Fatalf("expected a stale vsock socket after SIGKILL: %v", err)
	}
	startVM(t, d, cfg)
}

func TestAttach(t *testing.T) {
	fake := fakeBinary(t)
	d := newTestDriver(t, fake, nil)
	ctx := context.Background()
	cfg := testConfig(t)
	v := startVM(t, d, cfg)
	v.Close()

	// The same driver shares its child's exit status.
	va, err := d.Attach(ctx, cfg.Dir)
	if err != nil {
		t.Fatal(err)
	}
	if !va.(*VM).proc.child {
		t.Error("Attach in the starting driver did not find its child")
	}

	// A fresh driver (a restarted daemon) follows the VMM through a pidfd.
	d2 := newTestDriver(t, fake, nil)
	vb, err := d2.Attach(ctx, cfg.Dir)
	if err != nil {
		t.Fatal(err)
	}
	if vb.Pid() != v.Pid() || vb.(*VM).proc.child {
		t.Fatalf("attached pid %d child=%v, want %d via pidfd", vb.Pid(), vb.(*VM).proc.child, v.Pid())
	}
	if st, err := vb.Status(ctx); err != nil || st != vmm.StateRunning {
		t.Fatalf("Status = %s, %v", st, err)
	}
	if err := vb.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if st, _ := va.Status(ctx); st != vmm.StatePaused {
		t.Errorf("the other handle sees %s, want paused", st)
	}
	if err := vb.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	conn, err := vb.DialAgent(ctx)
	if err != nil {
		t.Fatal(err)
	}
	echoCheck(t, conn)
	conn.Close()

	if err := vb.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	waitDone(t, vb)
	if e := vb.Exit(); e.Code != -1 || e.Signal != "" || !strings.Contains(e.LogTail, "chfake:") {
		t.Errorf("attached Exit = %+v, want code -1 (unknown) with the log tail", e)
	}
	waitDone(t, va)
	if e := va.Exit(); e.Signal != "SIGKILL" {
		t.Errorf("child Exit = %+v, want SIGKILL", e)
	}
	if _, err := d2.Attach(ctx, cfg.Dir); !errors.Is(err, vmm.ErrNotRunning) {
		t.Errorf("Attach to a dead VM = %v, want ErrNotRunning", err)
	}
}

// TestAttachClose: closing an attached handle stops its pidfd watcher
// and leaves the VMM running.
func TestAttachClose(t *testing.T) {
	fake := fakeBinary(t)
	cfg := testConfig(t)
	v := startVM(t, newTestDriver(t, fake, nil), cfg)
	vb, err := newTestDriver(t, fake, nil).Attach(context.Background(), cfg.Dir)
	if err != nil {
		t.Fatal(err)
	}
	vb.Close()
	if err := vb.Kill(context.Background()); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Kill after Close = %v, want net.ErrClosed", err)
	}
	if st, err := v.Status(context.Background()); err != nil || st != vmm.StateRunning {
		t.Errorf("VM after closing a handle: %s, %v", st, err)
	}
}

func TestAttachErrors(t *testing.T) {
	d := newTestDriver(t, fakeBinary(t), nil)
	ctx := context.Background()
	write := func(t *testing.T, pid string) string {
		dir := t.TempDir()
		if pid != "" {
			os.WriteFile(filepath.Join(dir, PidFile), []byte(pid), 0o644)
		}
		return dir
	}
	t.Run("no pid file", func(t *testing.T) {
		if _, err := d.Attach(ctx, write(t, "")); !errors.Is(err, vmm.ErrNotRunning) {
			t.Errorf("= %v, want ErrNotRunning", err)
		}
	})
	t.Run("garbage pid file", func(t *testing.T) {
		_, err := d.Attach(ctx, write(t, "hello"))
		if err == nil || errors.Is(err, vmm.ErrNotRunning) {
			t.Errorf("= %v, want a plain error", err)
		}
	})
	t.Run("dead pid", func(t *testing.T) {
		if _, err := d.Attach(ctx, write(t, strconv.Itoa(deadPid(t)))); !errors.Is(err, vmm.ErrNotRunning) {
			t.Errorf("= %v, want ErrNotRunning", err)
		}
	})
	t.Run("recycled pid", func(t *testing.T) {
		// A live process that is no VMM: no socket answers for it.
		dir := write(t, strconv.Itoa(os.Getpid()))
		staleSocket(t, filepath.Join(dir, APISocket))
		if _, err := d.Attach(ctx, dir); !errors.Is(err, vmm.ErrNotRunning) {
			t.Errorf("= %v, want ErrNotRunning", err)
		}
	})
	t.Run("pid reused by a later process", func(t *testing.T) {
		// The recorded start time is not this process's.
		dir := write(t, strconv.Itoa(os.Getpid())+" 1")
		if _, err := d.Attach(ctx, dir); !errors.Is(err, vmm.ErrNotRunning) {
			t.Errorf("= %v, want ErrNotRunning", err)
		}
	})
	t.Run("another VMM answers", func(t *testing.T) {
		dir := write(t, strconv.Itoa(os.Getpid()))
		srv := chfake.New(chfake.Options{Pid: 1})
		if err := srv.Serve(filepath.Join(dir, APISocket)); err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		_, err := d.Attach(ctx, dir)
		if err == nil || errors.Is(err, vmm.ErrNotRunning) || !strings.Contains(err.Error(), "names pid") {
			t.Errorf("= %v, want a pid mismatch error", err)
		}
	})
}

// TestGuestPoweroff: a guest poweroff ends CH with status 0, a clean stop.
func TestGuestPoweroff(t *testing.T) {
	d := newTestDriver(t, fakeBinary(t), nil)
	ctx := context.Background()
	v := startVM(t, d, testConfig(t))
	conn, err := v.DialAgent(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := v.PowerButton(ctx); err != nil {
		t.Fatal(err)
	}
	waitDone(t, v)
	if e := v.Exit(); e.Code != 0 || e.Signal != "" || e.String() != "exited with code 0" {
		t.Errorf("Exit = %+v (%s), want a clean exit", e, e)
	}
	if st, err := v.Status(ctx); err != nil || st != vmm.StateStopped {
		t.Errorf("Status = %s, %v; want stopped", st, err)
	}
	if err := v.Kill(ctx); err != nil {
		t.Errorf("Kill after poweroff = %v, want nil", err)
	}
	if err := v.Pause(ctx); !errors.Is(err, vmm.ErrNotRunning) {
		t.Errorf("Pause after poweroff = %v, want ErrNotRunning", err)
	}
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadAll(conn); err != nil {
		t.Errorf("agent connection after poweroff: %v, want EOF", err)
	}
}

func TestShutdown(t *testing.T) {
	d := newTestDriver(t, fakeBinary(t), nil)
	cfg := testConfig(t)
	v := startVM(t, d, cfg)
	if err := v.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if e := v.Exit(); e.Code != 0 {
		t.Errorf("Exit = %+v, want code 0", e)
	}
	for _, f := range []string{APISocket, VsockSocket} {
		if _, err := os.Lstat(filepath.Join(cfg.Dir, f)); !os.IsNotExist(err) {
			t.Errorf("%s after an orderly shutdown: %v, want it removed", f, err)
		}
	}
	if err := v.Shutdown(context.Background()); err != nil {
		t.Errorf("second Shutdown = %v, want nil", err)
	}
}

func TestSnapshotRestore(t *testing.T) {
	d := newTestDriver(t, fakeBinary(t), nil)
	ctx := context.Background()
	cfg := testConfig(t)
	v := startVM(t, d, cfg)

	snap := filepath.Join(t.TempDir(), "snap")
	err := v.Snapshot(ctx, snap)
	if err == nil || !strings.Contains(err.Error(), "pause it first") {
		t.Fatalf("Snapshot of a running VM = %v, want a pause hint", err)
	}
	if _, err := os.Stat(snap); !os.IsNotExist(err) {
		t.Errorf("failed snapshot left %s behind", snap)
	}
	if err := v.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.Snapshot(ctx, snap); err != nil {
		t.Fatal(err)
	}
	if err := v.Snapshot(ctx, snap); err == nil || !strings.Contains(err.Error(), "already holds a snapshot") {
		t.Fatalf("second Snapshot = %v", err)
	}
	if err := v.Kill(ctx); err != nil {
		t.Fatal(err)
	}

	// Restore in place: the VM comes back running, agent reachable.
	in := cfg
	in.Incoming = snap
	v2 := startVM(t, d, in)
	if st, err := v2.Status(ctx); err != nil || st != vmm.StateRunning {
		t.Fatalf("restored Status = %s, %v", st, err)
	}
	conn, err := v2.DialAgent(ctx)
	if err != nil {
		t.Fatal(err)
	}
	echoCheck(t, conn)
	conn.Close()
	if err := v2.Kill(ctx); err != nil {
		t.Fatal(err)
	}

	// Restore into another directory: the snapshot's paths are rewritten.
	other := testConfig(t)
	other.Workspace = cfg.Workspace
	other.Incoming = snap
	v3 := startVM(t, d, other)
	var sc struct {
		Vsock  struct{ Socket string }
		Serial struct{ File string }
	}
	raw, _ := os.ReadFile(filepath.Join(snap, snapConfig))
	if err := json.Unmarshal(raw, &sc); err != nil {
		t.Fatal(err)
	}
	if sc.Vsock.Socket != filepath.Join(other.Dir, VsockSocket) || sc.Serial.File != filepath.Join(other.Dir, ConsoleLog) {
		t.Errorf("snapshot config after restore elsewhere: %+v", sc)
	}
	conn, err = v3.DialAgent(ctx)
	if err != nil {
		t.Fatal(err)
	}
	echoCheck(t, conn)
	conn.Close()
}

func TestRestoreErrors(t *testing.T) {
	d := newTestDriver(t, fakeBinary(t), nil)
	cfg := testConfig(t)
	cfg.Incoming = t.TempDir() // empty: no config.json
	if _, err := d.Start(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "not a cloud-hypervisor snapshot") {
		t.Errorf("restore from an empty dir = %v", err)
	}
	// A snapshot whose memory file is missing is refused by the VMM, and
	// the VMM is not left behind.
	os.WriteFile(filepath.Join(cfg.Incoming, snapConfig), []byte(`{"payload":{}}`), 0o600)
	cfg.Workspace = ""
	_, err := d.Start(context.Background(), cfg)
	var ae *APIError
	if !errors.As(err, &ae) || ae.Op != "vm.restore" {
		t.Fatalf("restore without memory = %v, want a vm.restore APIError", err)
	}
	pid, _ := vmm.ReadPidFile(filepath.Join(cfg.Dir, PidFile))
	if alive(pid) {
		t.Error("VMM left running after a failed restore")
	}
}

func TestDialAgentLateGuest(t *testing.T) {
	d := newTestDriver(t, fakeBinary(t, chfake.EnvGuestDelay+"=300ms"), nil)
	v := startVM(t, d, testConfig(t))
	conn, err := v.DialAgent(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	echoCheck(t, conn)
	conn.Close()
}

// TestDialAgentVMMExits: a dial waiting for a guest that never listens
// ends with ErrNotRunning as soon as the VMM dies, not at AgentWait.
func TestDialAgentVMMExits(t *testing.T) {
	d := newTestDriver(t, fakeBinary(t, chfake.EnvGuestDelay+"=1h"), func(o *Options) { o.AgentWait = time.Minute })
	v := startVM(t, d, testConfig(t))
	errc := make(chan error, 1)
	go func() {
		_, err := v.DialAgent(context.Background())
		errc <- err
	}()
	if err := v.Kill(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, vmm.ErrNotRunning) {
			t.Errorf("DialAgent = %v, want ErrNotRunning", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("DialAgent still waiting after the VMM died")
	}
}

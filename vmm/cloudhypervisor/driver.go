// Package cloudhypervisor drives Cloud Hypervisor VMs through CH's REST API.
//
// CH runs detached in its own process group with its API on a unix socket
// in the VM's directory; the API client is generated from CH's OpenAPI spec
// (internal/chapi) and wrapped by a thin layer that knows CH's real status
// codes and error bodies. The agent channel is CH's hybrid vsock.
// CH needs KVM: without a working KVM the driver refuses to start.
package cloudhypervisor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/berthvm/berth/vmm"
	"github.com/berthvm/berth/vmm/cloudhypervisor/internal/chapi"
)

// Name is the driver's name as users type it.
const Name = "cloud-hypervisor"

// DefaultBinary is the executable looked up on PATH when Options.Binary is empty.
const DefaultBinary = "cloud-hypervisor"

// Defaults for Config fields left zero.
const (
	DefaultCPUs      = 1
	DefaultMemoryMiB = 512
)

// guestCID is the guest's vsock context id. Each VM has its own vsock
// device and socket, so every guest can use the first free CID.
const guestCID = 3

const defaultStartTimeout = 30 * time.Second

// Options configure a Driver. The zero value is usable but refuses to
// start VMs, since KVM is unset.
type Options struct {
	// Binary is the cloud-hypervisor executable: a path, or a name looked
	// up on PATH. Empty means DefaultBinary.
	Binary string
	// Logger receives the driver's logs; nil discards them.
	Logger *slog.Logger
	// KVM reports whether KVM can really run guests on this host. CH has
	// no TCG fallback and a nested /dev/kvm can hang stock kernels, so nil
	// means "no": Start refuses.
	KVM vmm.KVMCheck
	// StartTimeout bounds Start from launching the VMM until the VM runs.
	// Zero means 30 s. CH answers on one thread and vm.boot or vm.restore
	// hold it, so short bounds fail under load.
	StartTimeout time.Duration
	// AgentWait bounds how long DialAgent retries while the guest agent is
	// not listening yet. Zero means 30 s.
	AgentWait time.Duration
}

// Driver starts and re-attaches Cloud Hypervisor VMs. It is safe for
// concurrent use.
type Driver struct {
	opts Options
	log  *slog.Logger

	mu sync.Mutex
	// children are the VMMs this Driver started and that have not exited,
	// by pid: Attach to one of them shares its exit status.
	children map[int]*process
}

var _ vmm.Driver = (*Driver)(nil)

// New returns a driver with opts.
func New(opts Options) *Driver {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if opts.Binary == "" {
		opts.Binary = DefaultBinary
	}
	opts.StartTimeout = cmpOr(opts.StartTimeout, defaultStartTimeout)
	opts.AgentWait = cmpOr(opts.AgentWait, defaultVsockMaxWait)
	return &Driver{
		opts:     opts,
		log:      log.With("component", "vmm", "driver", Name),
		children: make(map[int]*process),
	}
}

// Name implements vmm.Driver.
func (d *Driver) Name() string { return Name }

// StartsNIC implements vmm.NICStarter: the NIC is a tap in the VMM's own
// network namespace (see nic.go), which only a berth with CAP_SYS_ADMIN
// can make; without it the engine boots sessions with the proxy alone.
func (d *Driver) StartsNIC() bool { return canMakeNetns() }

// unavailableError carries an exact message for operators while matching
// both vmm.ErrUnavailable and its cause with errors.Is.
type unavailableError struct {
	msg   string
	cause error
}

func (e *unavailableError) Error() string { return e.msg }

func (e *unavailableError) Unwrap() []error {
	if e.cause == nil {
		return []error{vmm.ErrUnavailable}
	}
	return []error{vmm.ErrUnavailable, e.cause}
}

// Available reports whether the driver can run VMs here: nil, or an error
// wrapping vmm.ErrUnavailable that says why. binary is a path or a name
// to look up on PATH ("" means DefaultBinary); kvmWorks is the verdict of
// berth's KVM check.
func Available(binary string, kvmWorks bool) error {
	if _, err := lookBinary(binary); err != nil {
		return err
	}
	if !kvmWorks {
		return &unavailableError{msg: "cloud-hypervisor needs a working KVM: " +
			"the KVM check failed on this host (/dev/kvm missing, not accessible, or unable to boot a guest); " +
			"use the qemu driver, which falls back to TCG"}
	}
	return nil
}

// lookBinary resolves binary to an executable path.
func lookBinary(binary string) (string, error) {
	if binary == "" {
		binary = DefaultBinary
	}
	path, err := exec.LookPath(binary)
	if err == nil {
		return path, nil
	}
	if !strings.Contains(binary, "/") {
		return "", &unavailableError{
			msg:   binary + ": not found on PATH (install Cloud Hypervisor or configure the binary's path)",
			cause: err,
		}
	}
	if errors.Is(err, fs.ErrNotExist) {
		return "", &unavailableError{msg: binary + ": no such file (fix the configured cloud-hypervisor path)", cause: err}
	}
	return "", &unavailableError{msg: binary + ": not executable: " + errors.Unwrap(err).Error(), cause: err}
}

// Start implements vmm.Driver. It launches cloud-hypervisor, waits for its
// API, then either creates and boots the VM or, with cfg.Incoming, restores
// the snapshot there and resumes it. It returns once vm.info says Running.
// On any failure the VMM it launched is killed.
func (d *Driver) Start(ctx context.Context, cfg vmm.Config) (_ vmm.VM, err error) {
	if cfg.Accel == vmm.AccelTCG {
		return nil, &unavailableError{msg: "cloud-hypervisor runs only on KVM, and accel tcg was asked for: use the qemu driver"}
	}
	binary, err := lookBinary(d.opts.Binary)
	if err != nil {
		return nil, err
	}
	if d.opts.KVM == nil || !d.opts.KVM(ctx) {
		return nil, Available(binary, false)
	}
	if err := validate(cfg); err != nil {
		return nil, err
	}
	p := pathsIn(cfg.Dir)
	if err := p.checkSocketPaths(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("create VM directory: %w", err)
	}
	if pid, live := liveVMM(ctx, p); live {
		return nil, fmt.Errorf("%s already has a running cloud-hypervisor (pid %d): attach to it, or kill it before starting another", cfg.Dir, pid)
	}
	if err := checkDisksFree(cfg); err != nil {
		return nil, err
	}
	if cfg.Incoming != "" {
		if err := prepareRestore(cfg, p); err != nil {
			return nil, err
		}
	}
	// No live VMM owns the directory, so any socket here is stale.
	for _, s := range []string{p.api, p.vsock} {
		if err := removeStaleSocket(s); err != nil {
			return nil, err
		}
	}

	log := d.log.With("dir", cfg.Dir)
	proc, err := startProcess(binary, []string{"--api-socket", "path=" + p.api}, p, cfg.NIC)
	if err != nil {
		return nil, err
	}
	log = log.With("pid", proc.pid)
	log.Info("started cloud-hypervisor", "binary", binary)
	api := newAPIClient(p.api)
	defer func() {
		if err != nil {
			d.abandon(proc, log)
			if !errors.Is(err, vmm.ErrInUse) {
				// CH fails at boot when another VMM locked an image after
				// our check; with ours gone, a lock left means exactly that.
				if ierr := checkDisksFree(cfg); errors.Is(ierr, vmm.ErrInUse) {
					err = fmt.Errorf("%w (%w)", ierr, err)
				}
			}
		}
	}()

	if err := vmm.WritePidFile(p.pid, proc.pid); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeoutCause(ctx, d.opts.StartTimeout,
		fmt.Errorf("cloud-hypervisor start took longer than %s", d.opts.StartTimeout))
	defer cancel()

	if err := waitReady(ctx, api, proc); err != nil {
		return nil, err
	}
	os.Remove(filepath.Join(p.dir, nicMarkFile))
	if cfg.NIC {
		// Before vm.boot or vm.restore: CH opens the tap by name there.
		if err := inNetns(proc.pid, makeTap); err != nil {
			return nil, fmt.Errorf("the guest NIC: %w", err)
		}
		if err := os.WriteFile(filepath.Join(p.dir, nicMarkFile), nil, 0o600); err != nil {
			return nil, err
		}
	}
	if cfg.Incoming == "" {
		if err := api.create(ctx, vmConfig(cfg, p)); err != nil {
			return nil, explainStart(ctx, api, proc, err)
		}
		if err := api.boot(ctx); err != nil {
			return nil, explainStart(ctx, api, proc, fmt.Errorf("%w (check the kernel, initramfs and disk paths, and %s)", err, p.log))
		}
	} else {
		if err := api.restore(ctx, cfg.Incoming, true); err != nil {
			return nil, explainStart(ctx, api, proc, fmt.Errorf("restore %s: %w", cfg.Incoming, err))
		}
	}
	st, err := api.stateAfter(ctx)
	if err != nil {
		return nil, explainStart(ctx, api, proc, err)
	}
	if st != chapi.Running {
		return nil, fmt.Errorf("cloud-hypervisor reports the VM %s after start, not Running: see %s", st, p.log)
	}

	d.adopt(proc, log)
	log.Info("VM running", "restored", cfg.Incoming != "")
	return d.newVM(p, api, proc, log), nil
}

// Attach implements vmm.Driver: it finds the VMM through dir's vmm.pid and
// checks, through the API socket, that this pid still is that VMM.
func (d *Driver) Attach(ctx context.Context, dir string) (vmm.VM, error) {
	p := pathsIn(dir)
	pid, err := vmm.ReadPidFile(p.pid)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("attach %s: no %s: %w", dir, PidFile, vmm.ErrNotRunning)
	}
	if err != nil {
		return nil, fmt.Errorf("attach %s: %w", dir, err)
	}
	log := d.log.With("dir", dir, "pid", pid)

	d.mu.Lock()
	proc := d.children[pid]
	d.mu.Unlock()
	if proc == nil {
		if proc, err = watchProcess(pid, p.log); err != nil {
			return nil, fmt.Errorf("attach %s: %w", dir, err)
		}
	}
	release := func() {
		if proc.release != nil {
			proc.release()
		}
	}
	api := newAPIClient(p.api)
	ping, err := api.ping(ctx)
	if err != nil {
		release()
		if proc.exited() || errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
			// A live pid whose socket is gone or refusing is a recycled
			// pid, not our VMM.
			return nil, fmt.Errorf("attach %s: cloud-hypervisor (pid %d) does not answer on %s: %w", dir, pid, p.api, vmm.ErrNotRunning)
		}
		return nil, fmt.Errorf("attach %s: %w", dir, err)
	}
	if ping.Pid != nil && int(*ping.Pid) != pid {
		release()
		return nil, fmt.Errorf("attach %s: %s names pid %d but pid %d answers on %s: remove the stale pid file after checking which VMM is live",
			dir, PidFile, pid, *ping.Pid, p.api)
	}
	log.Info("attached to cloud-hypervisor", "child", proc.child, "version", ping.Version)
	return d.newVM(p, api, proc, log), nil
}

// adopt records a started child so Attach in this process can share it.
func (d *Driver) adopt(proc *process, log *slog.Logger) {
	d.mu.Lock()
	d.children[proc.pid] = proc
	d.mu.Unlock()
	// Ends when the child exits.
	go func() {
		<-proc.done
		d.mu.Lock()
		delete(d.children, proc.pid)
		d.mu.Unlock()
		logExit(log, proc.exit)
	}()
}

func logExit(log *slog.Logger, e vmm.Exit) {
	if e.Code == 0 {
		// A guest poweroff ends CH this way, as does vmm.shutdown.
		log.Info("cloud-hypervisor stopped cleanly")
		return
	}
	log.Warn("cloud-hypervisor exited", "exit", e.String(), "log_tail", e.LogTail)
}

// abandon kills a VMM whose start failed and waits (briefly) for it to go,
// so its locks and sockets are released before Start returns.
func (d *Driver) abandon(proc *process, log *slog.Logger) {
	if err := proc.signal(syscall.SIGKILL); err != nil {
		log.Warn("kill cloud-hypervisor after failed start", "err", err)
	}
	select {
	case <-proc.done:
	case <-time.After(5 * time.Second):
		log.Warn("cloud-hypervisor has not exited 5 s after SIGKILL")
	}
}

// waitReady polls vmm.ping until the VMM answers, the child exits, or ctx
// ends. CH has no readiness signal; short tries keep one lost request from
// eating the whole budget.
func waitReady(ctx context.Context, api *apiClient, proc *process) error {
	const perTry = time.Second
	delay := 5 * time.Millisecond
	for {
		tctx, cancel := context.WithTimeout(ctx, perTry)
		ping, err := api.ping(tctx)
		cancel()
		if err == nil {
			if ping.Pid != nil && int(*ping.Pid) != proc.pid {
				return fmt.Errorf("another cloud-hypervisor (pid %d) answers on %s, not the one just started (pid %d)", *ping.Pid, api.socket, proc.pid)
			}
			return nil
		}
		select {
		case <-proc.done:
			return exitedError("before its API answered", proc)
		case <-ctx.Done():
			return fmt.Errorf("cloud-hypervisor (pid %d) did not answer on %s: %w (last error: %v)", proc.pid, api.socket, context.Cause(ctx), err)
		case <-time.After(delay):
		}
		delay = min(delay*2, 100*time.Millisecond)
	}
}

// explainStart applies the vm.info rule to a failed start step: a transport
// error usually means the VMM died, which the exit status and log explain
// better than "EOF".
func explainStart(ctx context.Context, api *apiClient, proc *process, err error) error {
	var ae *APIError
	if !errors.As(err, &ae) {
		// The connection broke: give the process a moment to be reaped.
		select {
		case <-proc.done:
		case <-ctx.Done():
		case <-time.After(2 * time.Second):
		}
	}
	if proc.exited() {
		return fmt.Errorf("%w: %w", exitedError("while starting the VM", proc), err)
	}
	if st, ierr := api.stateAfter(ctx); ierr == nil {
		return fmt.Errorf("%w (VM state now %s)", err, st)
	}
	return err
}

// exitedError describes a VMM that is gone, with its log tail.
func exitedError(when string, proc *process) error {
	msg := fmt.Sprintf("cloud-hypervisor (pid %d) %s %s", proc.pid, proc.exit, when)
	if proc.exit.LogTail != "" {
		msg += "; end of " + proc.logPath + ":\n" + proc.exit.LogTail
	}
	return fmt.Errorf("%s: %w", msg, vmm.ErrNotRunning)
}

func validate(cfg vmm.Config) error {
	switch {
	case cfg.Dir == "" || !filepath.IsAbs(cfg.Dir):
		return fmt.Errorf("VM directory %q must be an absolute path", cfg.Dir)
	case cfg.Incoming == "" && cfg.Kernel == "":
		return errors.New("no kernel given: set Config.Kernel")
	case cfg.CPUs < 0 || cfg.MemoryMiB < 0:
		return fmt.Errorf("invalid size: %d CPUs, %d MiB", cfg.CPUs, cfg.MemoryMiB)
	case cfg.Incoming != "" && !filepath.IsAbs(cfg.Incoming):
		return fmt.Errorf("snapshot path %q must be absolute", cfg.Incoming)
	}
	return validateDisks(cfg)
}

// vmConfig is the VM berth asks CH for. Serial and console are set
// explicitly because CH's defaults put the virtio console on CH's own
// stdio; the guest's console is ttyS0, written to ConsoleLog.
func vmConfig(cfg vmm.Config, p paths) chapi.VmConfig {
	cpus := cfg.CPUs
	if cpus == 0 {
		cpus = DefaultCPUs
	}
	mem := cfg.MemoryMiB
	if mem == 0 {
		mem = DefaultMemoryMiB
	}
	cmdline := strings.TrimSpace("console=ttyS0 " + cfg.Cmdline)
	c := chapi.VmConfig{
		Payload: chapi.PayloadConfig{Kernel: &cfg.Kernel, Cmdline: &cmdline},
		Cpus:    &chapi.CpusConfig{BootVcpus: cpus, MaxVcpus: cpus},
		Memory:  &chapi.MemoryConfig{Size: int64(mem) << 20},
		Serial:  &chapi.SerialConfig{Mode: chapi.ConsoleModeFile, File: &p.console},
		Console: &chapi.ConsoleConfig{Mode: chapi.ConsoleModeOff},
		Vsock:   &chapi.VsockConfig{Cid: guestCID, Socket: p.vsock},
	}
	if cfg.Initramfs != "" {
		c.Payload.Initramfs = &cfg.Initramfs
	}
	c.Disks = diskConfigs(cfg)
	if cfg.NIC {
		c.Net = &[]chapi.NetConfig{netConfig(cfg.NICAddress())}
	}
	return c
}

// Package qemu is berth's QEMU driver: VMs are qemu-system-x86_64 processes
// controlled over QMP, with the agent channel on a virtio-serial port.
package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/vmm"
)

// Files in a VM's directory.
const (
	qmpSock   = "qmp.sock"
	agentSock = "agent.sock"
	nicSock   = "nic.sock"
	logFile   = "vmm.log"
	consoleF  = "console.log"
	accelFile = "accel"
)

// PCI slots of berth's devices. The read-only layers take the slots
// from layerSlot0 on, one each.
const (
	vserSlot   = "0x3"
	wsSlot     = "0x4"
	sysSlot    = "0x5"
	layerSlot0 = 0x6
	// nicSlot is past the layers' slots (vmm.MaxLayers of them).
	nicSlot = "0x1e"
)

// diskSlot is where a hot-pluggable disk goes, with its drive and device ids.
func diskSlot(d vmm.Disk) (slot, drive, dev string) {
	if d == vmm.DiskSystem {
		return sysSlot, "sys", "sysdev"
	}
	return wsSlot, "ws", "wsdev"
}

// Name is the driver's name as users type it.
const Name = "qemu"

// DefaultBinary is the executable looked up on PATH when Options.Binary is empty.
const DefaultBinary = "qemu-system-x86_64"

// Options configure a Driver. The zero value is usable: QEMU from PATH,
// TCG for Accel auto, no logs.
type Options struct {
	// Binary is the QEMU executable: a path, or a name looked up on PATH.
	// Empty means DefaultBinary.
	Binary string
	// Logger receives the driver's logs; nil discards them.
	Logger *slog.Logger
	// KVM reports whether KVM really works, for Accel auto; nil means it
	// does not (auto picks TCG).
	KVM vmm.KVMCheck
}

// Driver starts QEMU VMs. It is safe for concurrent use.
type Driver struct {
	opts Options
	log  *slog.Logger
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
	return &Driver{opts: opts, log: log.With("component", "vmm", "driver", Name)}
}

// Name implements vmm.Driver.
func (d *Driver) Name() string { return Name }

// StartsNIC: QEMU serves a guest NIC on its stream netdev (vmm.NICStarter).
func (d *Driver) StartsNIC() bool { return true }

// Available reports whether QEMU can run here.
func (d *Driver) Available() error {
	if _, err := exec.LookPath(d.opts.Binary); err != nil {
		return fmt.Errorf("%w: %s not found on PATH (install Debian's qemu-system-x86)", vmm.ErrUnavailable, d.opts.Binary)
	}
	return nil
}

func (d *Driver) accel(ctx context.Context, a vmm.Accel) (vmm.Accel, error) {
	switch a {
	case vmm.AccelTCG:
		return a, nil
	case vmm.AccelKVM:
		if err := vmm.KVMDevice(); err != nil {
			return "", fmt.Errorf("%w: accel kvm: %v", vmm.ErrUnavailable, err)
		}
		return a, nil
	case "", vmm.AccelAuto:
		if d.opts.KVM != nil && d.opts.KVM(ctx) {
			return vmm.AccelKVM, nil
		}
		return vmm.AccelTCG, nil
	}
	return "", fmt.Errorf("unknown accelerator %q (auto, kvm or tcg)", a)
}

// Args returns QEMU's command line for cfg, with sockets relative to the
// VM's directory (QEMU runs there, and unix socket paths are short).
func Args(cfg vmm.Config, accel vmm.Accel) []string {
	cpus := max(cfg.CPUs, 1)
	mem := cfg.MemoryMiB
	if mem <= 0 {
		mem = 512
	}
	args := []string{"-name", "berth-" + filepath.Base(cfg.Dir), "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot"}
	if accel == vmm.AccelKVM {
		args = append(args, "-accel", "kvm", "-cpu", "host")
	} else {
		args = append(args, "-accel", "tcg,thread=multi", "-cpu", "qemu64")
	}
	args = append(args,
		"-smp", strconv.Itoa(cpus), "-m", strconv.Itoa(mem),
		"-kernel", cfg.Kernel, "-initrd", cfg.Initramfs,
		// acpi=noirq: PCI interrupts are routed from the BIOS's table, not
		// by running the ACPI link methods, which under TCG take ~400 ms
		// per device enabled: a hot-plugged workspace showed after 480-700
		// ms, now after 60-75 ms. (virtio devices use MSI-X anyway.)
		"-append", strings.TrimSpace("console=ttyS0 quiet panic=-1 acpi=noirq "+cfg.Cmdline),
		"-serial", "file:"+consoleF,
		// Fixed slots: a hot-plugged workspace (templates) must land where
		// a cold boot puts it, or snapshots would not restore.
		"-device", "virtio-serial-pci,id=vser,addr="+vserSlot,
		"-chardev", "socket,id=agent,path="+agentSock+",server=on,wait=off",
		"-device", "virtserialport,bus=vser.0,chardev=agent,name="+guest.PortName,
		"-qmp", "unix:"+qmpSock+",server=on,wait=off",
	)
	// cache=writeback: a guest FLUSH becomes fdatasync of the image.
	// locking=on: a second QEMU writing the same image is refused; read-only
	// layers take a shared lock, which refuses a writer.
	for _, d := range []struct {
		disk vmm.Disk
		path string
	}{{vmm.DiskWorkspace, cfg.Workspace}, {vmm.DiskSystem, cfg.System}} {
		if d.path == "" {
			continue
		}
		slot, drive, dev := diskSlot(d.disk)
		args = append(args,
			"-drive", "file="+d.path+",if=none,id="+drive+",format=raw,cache=writeback,file.locking=on,discard=unmap",
			// werror=enospc: a write the host cannot store pauses the VM
			// (berth shows why and resumes it when space returns) instead
			// of failing in the guest; other errors reach the guest.
			"-device", "virtio-blk-pci,drive="+drive+",id="+dev+",addr="+slot+",werror=enospc,rerror=report")
	}
	for i, l := range cfg.Layers {
		id := fmt.Sprintf("layer%d", i)
		args = append(args,
			"-drive", "file="+l+",if=none,id="+id+",format=raw,readonly=on,file.locking=on",
			"-device", fmt.Sprintf("virtio-blk-pci,drive=%s,id=%sdev,addr=0x%x", id, id, layerSlot0+i))
	}
	if cfg.NIC {
		// QEMU listens (server=on) and berth connects, as for the agent
		// channel: a daemon that restarts connects again, and QEMU keeps
		// listening after a client leaves. host_mtu tells the guest the
		// link's MTU: the stream carries no offloads, so large frames are
		// what makes bulk transfers fast.
		args = append(args,
			"-netdev", "stream,id=nic0,server=on,addr.type=unix,addr.path="+nicSock,
			"-device", fmt.Sprintf("virtio-net-pci,netdev=nic0,id=nicdev,addr=%s,mac=%s,host_mtu=%d", nicSlot, cfg.NICAddress(), guest.NICMTU))
	}
	if cfg.Incoming != "" {
		// Start passes the snapshot open as fd 3. QEMU reads it straight
		// (a third of the time through a pipe from cat), and loading runs
		// while berth connects to QMP.
		args = append(args, "-incoming", "fd:3")
	}
	return args
}

// Start launches QEMU for cfg and returns once QMP answers.
func (d *Driver) Start(ctx context.Context, cfg vmm.Config) (vmm.VM, error) {
	if err := d.Available(); err != nil {
		return nil, err
	}
	accel, err := d.accel(ctx, cfg.Accel)
	if err != nil {
		return nil, err
	}
	var extra []*os.File
	if cfg.Incoming != "" {
		f, err := os.Open(cfg.Incoming)
		if err != nil {
			return nil, fmt.Errorf("restore: %w", err)
		}
		defer f.Close() // QEMU has its own copy once started
		extra = append(extra, f)
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, err
	}
	// Stale sockets from a dead VM would make QEMU fail to bind.
	for _, f := range []string{qmpSock, agentSock, nicSock, vmm.PidFile} {
		os.Remove(filepath.Join(cfg.Dir, f))
	}
	os.Remove(filepath.Join(cfg.Dir, consoleF))
	os.WriteFile(filepath.Join(cfg.Dir, accelFile), []byte(accel), 0o644)
	proc, err := vmm.StartProcess(cfg.Dir, d.opts.Binary, Args(cfg, accel), filepath.Join(cfg.Dir, logFile), extra...)
	if err != nil {
		return nil, err
	}
	vm, err := d.connect(ctx, cfg.Dir, proc, accel)
	if err == nil && cfg.Incoming != "" {
		// The VM is paused afterwards, as it was when saved.
		if err = vm.waitMigration(ctx, "restore"); err != nil {
			vm.Close()
		}
	}
	if err == nil && cfg.Incoming != "" && cfg.NIC {
		// QEMU 7.2's stream netdev writes the frames a restored virtio-net
		// had queued as the VM resumes, to its client, without checking
		// there is one: with none, `cont` dies of SIGSEGV
		// (qio_channel_writev on a NULL channel, from vm_start's flush).
		// So a restored VM's NIC has a client before anyone can resume it;
		// DialNIC hands it to the NIC's server.
		if vm.parked, err = vmm.WaitDial(ctx, filepath.Join(cfg.Dir, nicSock), proc); err == nil {
			err = vm.waitNICClient(ctx)
		}
		if err != nil {
			vm.Close()
		}
	}
	if err != nil {
		proc.Kill(5 * time.Second)
		<-proc.Done()
		return nil, d.explain(cfg, proc, err)
	}
	d.log.Info("VM started", "dir", cfg.Dir, "pid", proc.Pid, "accel", accel)
	return vm, nil
}

// explain turns QEMU's early failures into berth's words.
func (d *Driver) explain(cfg vmm.Config, proc *vmm.Process, err error) error {
	tail := proc.Exit().LogTail
	if strings.Contains(tail, `Failed to get "write" lock`) || strings.Contains(tail, "Is another process using the image") {
		what, path := "workspace", cfg.Workspace
		if cfg.System != "" && strings.Contains(tail, cfg.System) {
			what, path = "system disk", cfg.System
		}
		holder := ""
		if pid := vmm.HolderPid(path); pid > 0 {
			holder = fmt.Sprintf(" by VM pid %d", pid)
		}
		return fmt.Errorf("%s %s is in use%s: %w", what, path, holder, vmm.ErrInUse)
	}
	return err
}

func (d *Driver) connect(ctx context.Context, dir string, proc *vmm.Process, accel vmm.Accel) (*VM, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := vmm.WaitDial(ctx, filepath.Join(dir, qmpSock), proc)
	if err != nil {
		return nil, err
	}
	mon, err := NewMonitor(ctx, conn)
	if err != nil {
		return nil, err
	}
	vm := &VM{dir: dir, proc: proc, mon: mon, accel: accel, stops: make(chan vmm.Stop, 8)}
	go vm.watch(mon)
	return vm, nil
}

// Attach re-connects to a QEMU started earlier in dir.
func (d *Driver) Attach(ctx context.Context, dir string) (vmm.VM, error) {
	proc, err := vmm.AttachProcess(dir, filepath.Join(dir, logFile))
	if err != nil {
		return nil, err
	}
	b, _ := os.ReadFile(filepath.Join(dir, accelFile))
	vm, err := d.connect(ctx, dir, proc, vmm.Accel(strings.TrimSpace(string(b))))
	if err != nil {
		return nil, fmt.Errorf("attach to VM pid %d: %w", proc.Pid, err)
	}
	return vm, nil
}

// VM is a running QEMU.
type VM struct {
	dir   string
	proc  *vmm.Process
	accel vmm.Accel
	stops chan vmm.Stop // closed when the monitor's events end

	mu  sync.Mutex
	mon *Monitor
	// parked is a connection to the NIC made before a restored VM first
	// runs, which DialNIC hands out first (see Start).
	parked net.Conn
}

var (
	_ vmm.VM          = (*VM)(nil)
	_ vmm.NICDialer   = (*VM)(nil)
	_ vmm.Snapshotter = (*VM)(nil)
	_ vmm.Stopper     = (*VM)(nil)
)

// Stops reports QEMU stopping the VM on a failed disk write.
func (v *VM) Stops() <-chan vmm.Stop { return v.stops }

// watch turns the monitor's BLOCK_IO_ERROR events that stopped the VM
// into Stops. It ends with the monitor (Close, or QEMU's exit).
func (v *VM) watch(mon *Monitor) {
	defer close(v.stops)
	for ev := range mon.Events() {
		if ev.Event != "BLOCK_IO_ERROR" {
			continue
		}
		var d struct {
			Device   string `json:"device"`
			NodeName string `json:"node-name"`
			Action   string `json:"action"`
			NoSpace  bool   `json:"nospace"`
			Reason   string `json:"reason"`
		}
		if json.Unmarshal(ev.Data, &d) != nil || d.Action != "stop" {
			continue
		}
		disk := d.Device
		if disk == "" {
			disk = d.NodeName
		}
		select {
		case v.stops <- vmm.Stop{Disk: disk, NoSpace: d.NoSpace, Reason: d.Reason}:
		default: // the first of a burst is what matters
		}
	}
}

func (v *VM) Pid() int              { return v.proc.Pid }
func (v *VM) Accel() vmm.Accel      { return v.accel }
func (v *VM) Done() <-chan struct{} { return v.proc.Done() }
func (v *VM) Exit() vmm.Exit        { return v.proc.Exit() }
func (v *VM) Dir() string           { return v.dir }
func (v *VM) Monitor() *Monitor     { v.mu.Lock(); defer v.mu.Unlock(); return v.mon }
func (v *VM) ConsoleLog() string    { return filepath.Join(v.dir, consoleF) }
func (v *VM) alive() bool           { return v.proc.Alive() }
func (v *VM) notRunning() error {
	e := v.proc.Exit()
	if l := e.LastLogLine(); l != "" {
		return fmt.Errorf("%w: VMM pid %d %s: %s", vmm.ErrNotRunning, v.proc.Pid, e, l)
	}
	return fmt.Errorf("%w: VMM pid %d %s", vmm.ErrNotRunning, v.proc.Pid, e)
}
func (v *VM) exec(ctx context.Context, cmd string, args, out any) error {
	if !v.alive() {
		return v.notRunning()
	}
	err := v.Monitor().Execute(ctx, cmd, args, out)
	var qe *QMPError
	if err != nil && !errors.As(err, &qe) {
		// A monitor cut off mid-command is most often QEMU exiting: give
		// its exit a moment to be reaped, so the error carries its log.
		select {
		case <-v.proc.Done():
			return v.notRunning()
		case <-time.After(time.Second):
		case <-ctx.Done():
		}
	}
	return err
}

func (v *VM) DialAgent(ctx context.Context) (net.Conn, error) {
	if !v.alive() {
		return nil, v.notRunning()
	}
	return vmm.DialUnix(ctx, filepath.Join(v.dir, agentSock))
}

// HasNIC reports whether the VM has a NIC: QEMU made its socket.
func (v *VM) HasNIC() bool {
	_, err := os.Stat(filepath.Join(v.dir, nicSock))
	return err == nil
}

// waitNICClient waits until QEMU has taken the NIC's client: a connect
// completes in the kernel's backlog before QEMU's main loop accepts it,
// and a `cont` in between still finds no client. `info network` names the
// client's address on the stream netdev once it is accepted (7.2 prints
// "type=stream," alone until then).
func (v *VM) waitNICClient(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		var out string
		if err := v.exec(ctx, "human-monitor-command", map[string]string{"command-line": "info network"}, &out); err != nil {
			return fmt.Errorf("waiting for QEMU to take the NIC's client: %w", err)
		}
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, "nic0: ") && !strings.HasSuffix(strings.TrimSpace(l), "type=stream,") {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for QEMU to take the NIC's client: %w (info network: %q)", ctx.Err(), out)
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// DialNIC connects to the host end of the guest's NIC (Config.NIC).
func (v *VM) DialNIC(ctx context.Context) (net.Conn, error) {
	if !v.alive() {
		return nil, v.notRunning()
	}
	v.mu.Lock()
	c := v.parked
	v.parked = nil
	v.mu.Unlock()
	if c != nil {
		return c, nil
	}
	return vmm.DialUnix(ctx, filepath.Join(v.dir, nicSock))
}

func (v *VM) Pause(ctx context.Context) error  { return v.exec(ctx, "stop", nil, nil) }
func (v *VM) Resume(ctx context.Context) error { return v.exec(ctx, "cont", nil, nil) }

func (v *VM) Status(ctx context.Context) (vmm.State, error) {
	if !v.alive() {
		return vmm.StateStopped, nil
	}
	var st struct {
		Status  string `json:"status"`
		Running bool   `json:"running"`
	}
	if err := v.exec(ctx, "query-status", nil, &st); err != nil {
		if errors.Is(err, vmm.ErrNotRunning) {
			return vmm.StateStopped, nil
		}
		return "", err
	}
	switch {
	case st.Running:
		return vmm.StateRunning, nil
	case st.Status == "shutdown" || st.Status == "guest-panicked" || st.Status == "internal-error":
		return vmm.StateStopped, nil
	case st.Status == "io-error":
		return vmm.StateIOError, nil
	}
	return vmm.StatePaused, nil
}

// Kill asks QEMU to quit at once and falls back to SIGKILL.
func (v *VM) Kill(ctx context.Context) error {
	if !v.alive() {
		return nil
	}
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	v.exec(qctx, "quit", nil, nil)
	select {
	case <-v.proc.Done():
		return nil
	case <-qctx.Done():
	}
	return v.proc.Kill(5 * time.Second)
}

func (v *VM) Close() error {
	v.mu.Lock()
	if v.parked != nil {
		v.parked.Close()
		v.parked = nil
	}
	v.mu.Unlock()
	return v.Monitor().Close()
}

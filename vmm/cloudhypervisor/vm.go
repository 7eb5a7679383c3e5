package cloudhypervisor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/berthvm/berth/vmm"
	"github.com/berthvm/berth/vmm/cloudhypervisor/internal/chapi"
)

// VM is a Cloud Hypervisor VM. Its methods are safe for concurrent use.
//
// Every action follows one rule: on an error, read vm.info before deciding
// what happened, because CH's status code does not say. An action whose
// goal state holds anyway (pausing a paused VM) succeeds; an action on a
// VMM that has exited fails with vmm.ErrNotRunning.
type VM struct {
	p         paths
	api       *apiClient
	proc      *process
	log       *slog.Logger
	agentWait time.Duration

	closeOnce sync.Once
	closed    chan struct{}
}

var (
	_ vmm.VM          = (*VM)(nil)
	_ vmm.Snapshotter = (*VM)(nil)
	_ vmm.NICDialer   = (*VM)(nil)
)

// HasNIC implements vmm.NICDialer: the VM was started with a NIC.
func (v *VM) HasNIC() bool {
	_, err := os.Stat(filepath.Join(v.p.dir, nicMarkFile))
	return err == nil
}

// DialNIC implements vmm.NICDialer: the frames of the tap in the VMM's
// network namespace, each after its length.
func (v *VM) DialNIC(ctx context.Context) (net.Conn, error) {
	if v.proc.exited() {
		return nil, fmt.Errorf("guest NIC: %w", vmm.ErrNotRunning)
	}
	if !v.HasNIC() {
		return nil, fmt.Errorf("the VM in %s has no NIC: %w", v.p.dir, fs.ErrNotExist)
	}
	return dialNIC(v.proc.pid, v.proc.done)
}

func (d *Driver) newVM(p paths, api *apiClient, proc *process, log *slog.Logger) *VM {
	return &VM{
		p:         p,
		api:       api,
		proc:      proc,
		log:       log,
		agentWait: d.opts.AgentWait,
		closed:    make(chan struct{}),
	}
}

// Pid implements vmm.VM.
func (v *VM) Pid() int { return v.proc.pid }

// Accel implements vmm.VM: CH runs only on KVM.
func (v *VM) Accel() vmm.Accel { return vmm.AccelKVM }

// Dir is the VM's directory.
func (v *VM) Dir() string { return v.p.dir }

// Done implements vmm.VM. For a VM found by Attach, Close stops watching
// the process and Done then stays open.
func (v *VM) Done() <-chan struct{} { return v.proc.done }

// Exit implements vmm.VM. Exit.Code is -1 for a VMM found by Attach in a
// later berth process: only a parent can collect an exit status. Code 0
// is a clean stop: the guest powered off, or vmm.shutdown.
func (v *VM) Exit() vmm.Exit {
	select {
	case <-v.proc.done:
		return v.proc.exit
	default:
		return vmm.Exit{Code: -1}
	}
}

// Close implements vmm.VM. The VMM keeps running.
func (v *VM) Close() error {
	v.closeOnce.Do(func() {
		close(v.closed)
		if v.proc.release != nil {
			v.proc.release()
		}
	})
	return nil
}

// usable returns an error if the handle was closed or the VMM has exited.
func (v *VM) usable(op string) error {
	select {
	case <-v.closed:
		return fmt.Errorf("cloud-hypervisor %s: VM handle for %s: %w", op, v.p.dir, net.ErrClosed)
	default:
	}
	if v.proc.exited() {
		return v.notRunning(op)
	}
	return nil
}

func (v *VM) notRunning(op string) error {
	return fmt.Errorf("cloud-hypervisor %s: VMM (pid %d) %s: %w", op, v.proc.pid, v.proc.exit, vmm.ErrNotRunning)
}

// vmmGone reports whether err came from a VMM that has exited. A broken
// connection usually means the process is on its way out, so it waits a
// little (bounded by ctx) for the exit to be observed.
func (v *VM) vmmGone(ctx context.Context, err error) bool {
	var ae *APIError
	if !errors.As(err, &ae) {
		select {
		case <-v.proc.done:
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	return v.proc.exited()
}

// settle applies the vm.info rule after action op failed with err: nil if
// the VM is in want anyway, else an error saying what state it is in.
func (v *VM) settle(ctx context.Context, op string, err error, want chapi.VmState) error {
	if v.vmmGone(ctx, err) {
		return v.notRunning(op)
	}
	st, ierr := v.api.stateAfter(ctx)
	switch {
	case errors.Is(ierr, errNoVM):
		return fmt.Errorf("%w; this cloud-hypervisor holds no VM: kill it and start the session again", err)
	case ierr != nil:
		return fmt.Errorf("%w (vm.info failed too: %v)", err, ierr)
	case st == want:
		v.log.Debug("action failed but the VM is in the wanted state", "op", op, "state", st, "err", err)
		return nil
	default:
		return fmt.Errorf("%w (VM is %s)", err, st)
	}
}

// Pause implements vmm.VM. It stops the vCPUs; nothing is flushed (CH
// v53.0 drains in-flight block requests but fsyncs nothing for raw disks).
func (v *VM) Pause(ctx context.Context) error {
	if err := v.usable("vm.pause"); err != nil {
		return err
	}
	if err := v.api.pause(ctx); err != nil {
		return v.settle(ctx, "vm.pause", err, chapi.Paused)
	}
	return nil
}

// Resume implements vmm.VM.
func (v *VM) Resume(ctx context.Context) error {
	if err := v.usable("vm.resume"); err != nil {
		return err
	}
	if err := v.api.resume(ctx); err != nil {
		return v.settle(ctx, "vm.resume", err, chapi.Running)
	}
	return nil
}

// Status implements vmm.VM. A VMM that has exited, or one that holds no
// booted VM (CH reports a shut-down VM as Created), is StateStopped.
func (v *VM) Status(ctx context.Context) (vmm.State, error) {
	select {
	case <-v.closed:
		return "", v.usable("vm.info")
	case <-v.proc.done:
		return vmm.StateStopped, nil
	default:
	}
	info, err := v.api.info(ctx)
	switch {
	case errors.Is(err, errNoVM):
		return vmm.StateStopped, nil
	case err != nil:
		if v.vmmGone(ctx, err) {
			return vmm.StateStopped, nil
		}
		return "", err
	}
	switch info.State {
	case chapi.Running:
		return vmm.StateRunning, nil
	case chapi.Paused:
		return vmm.StatePaused, nil
	case chapi.Created, chapi.Shutdown:
		return vmm.StateStopped, nil
	default:
		return "", fmt.Errorf("cloud-hypervisor vm.info: unknown VM state %q", info.State)
	}
}

// Kill implements vmm.VM: SIGKILL, then wait for the exit. The guest gets
// no chance to flush.
func (v *VM) Kill(ctx context.Context) error {
	select {
	case <-v.closed:
		return v.usable("kill")
	case <-v.proc.done:
		return nil
	default:
	}
	if err := v.proc.signal(syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill cloud-hypervisor (pid %d): %w", v.proc.pid, err)
	}
	select {
	case <-v.proc.done:
		v.log.Info("cloud-hypervisor killed")
		return nil
	case <-ctx.Done():
		return fmt.Errorf("killed cloud-hypervisor (pid %d) but it has not exited yet: %w", v.proc.pid, ctx.Err())
	}
}

// Shutdown stops the VMM in order (vmm.shutdown: CH shuts the VM down,
// closes its disks and sockets, and exits) and waits for the exit. Like
// Kill it gives the guest no chance to flush: flush through the agent
// first. If ctx ends before the VMM is gone, Shutdown kills it.
func (v *VM) Shutdown(ctx context.Context) error {
	if err := v.usable("vmm.shutdown"); err != nil {
		if errors.Is(err, vmm.ErrNotRunning) {
			return nil
		}
		return err
	}
	if err := v.api.shutdownVMM(ctx); err != nil && !v.vmmGone(ctx, err) {
		v.log.Warn("vmm.shutdown failed; killing", "err", err)
		return errors.Join(err, v.Kill(context.WithoutCancel(ctx)))
	}
	select {
	case <-v.proc.done:
		return nil
	case <-ctx.Done():
		v.log.Warn("cloud-hypervisor still running after vmm.shutdown; killing")
		return v.Kill(context.WithoutCancel(ctx))
	}
}

// DialAgent implements vmm.VM over hybrid vsock to AgentPort. It retries
// while the guest agent is not listening, for up to Options.AgentWait, and
// fails with vmm.ErrNotRunning as soon as the VMM exits.
func (v *VM) DialAgent(ctx context.Context) (net.Conn, error) {
	if err := v.usable("dial agent"); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// Ends when the dial returns (cancel) or the VMM exits.
	go func() {
		select {
		case <-v.proc.done:
			cancel(v.notRunning("dial agent"))
		case <-ctx.Done():
		}
	}()
	return VsockDialer{MaxWait: v.agentWait}.Dial(ctx, v.p.vsock, AgentPort)
}

// PowerButton presses the VM's ACPI power button. A guest that handles it
// powers off, and CH then exits with status 0, which Done and Exit report
// as a clean stop.
func (v *VM) PowerButton(ctx context.Context) error {
	if err := v.usable("vm.power-button"); err != nil {
		return err
	}
	if err := v.api.powerButton(ctx); err != nil {
		if v.vmmGone(ctx, err) {
			return nil // it powered off already
		}
		return err
	}
	return nil
}

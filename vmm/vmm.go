// Package vmm drives hypervisors behind one Driver interface.
//
// A driver starts a VM as a detached process that outlives berth, and can
// re-attach to it later from the files it left in the VM's directory
// (sockets and vmm.pid). The agent channel a VM exposes is a raw byte stream;
// the guest package speaks the agent protocol over it.
package vmm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/berthvm/berth/guest"
)

// Errors shared by every driver, so callers can use errors.Is.
var (
	// ErrInUse means the workspace image is already attached as a writer
	// by another VM (or another berth daemon).
	ErrInUse = errors.New("disk is in use by another VM")
	// ErrNotRunning means the VMM process is gone.
	ErrNotRunning = errors.New("VM is not running")
	// ErrUnavailable means the driver cannot run on this host (binary
	// missing, accelerator not usable).
	ErrUnavailable = errors.New("hypervisor unavailable")
)

// Accel selects the CPU accelerator.
type Accel string

const (
	AccelAuto Accel = "auto" // KVM if a test boot shows it works, else TCG
	AccelKVM  Accel = "kvm"
	AccelTCG  Accel = "tcg"
)

// Config describes a VM to start. Paths are absolute.
type Config struct {
	// Dir is the VM's directory: the driver puts its sockets, vmm.pid and
	// logs here, and Attach finds them here again.
	Dir string

	Kernel    string
	Initramfs string
	Cmdline   string // appended to the driver's own console arguments

	CPUs      int
	MemoryMiB int

	// Workspace is the raw ext4 image attached read-write as the first
	// virtio-blk disk. Empty means no workspace disk.
	Workspace string
	// System is the session's system disk (raw ext4, read-write), the
	// upper layer of the root overlay of root filesystem images. Empty
	// means none.
	System string
	// Layers are the image's read-only root layers (raw ext4), bottom
	// first, shared by every VM of the image: attached read-only, so any
	// number of VMs may hold them while no VM may write them.
	Layers []string

	Accel Accel

	// NIC, when set, gives the guest a virtio-net NIC whose host end is a
	// unix socket of raw Ethernet frames that the VM's DialNIC connects
	// to (berth's userspace network stack serves it). Drivers whose VMs do
	// not implement NICDialer refuse it.
	NIC bool
	// NICMAC is the NIC's MAC address; empty is guest.NICMAC. A VM
	// restored from a snapshot has the MAC the snapshot's device state
	// holds, whatever this says.
	NICMAC string

	// Incoming, when set, names a memory snapshot to restore instead of
	// booting (drivers whose VMs implement Snapshotter). The device
	// configuration must be the one the snapshot was taken with. The
	// restored VM may be left paused (QEMU) or running (Cloud Hypervisor):
	// callers Resume it, which is a no-op on a running VM.
	Incoming string
}

// State is what the hypervisor reports about a VM.
type State string

const (
	StateRunning State = "running"
	StatePaused  State = "paused"
	StateStopped State = "stopped" // process gone
	// StateIOError: the VMM stopped the VM itself because a disk request
	// failed on the host (QEMU's werror=enospc); Resume retries it.
	StateIOError State = "io-error"
)

// Driver starts and re-attaches VMs of one hypervisor.
type Driver interface {
	// Name is the driver's name as users type it ("qemu").
	Name() string
	// Start launches a VM from cfg as a detached process in its own process
	// group and returns once the VMM answers on its control socket; the guest
	// may still be booting. A workspace held by another VM yields ErrInUse.
	Start(ctx context.Context, cfg Config) (VM, error)
	// Attach connects to a VM that an earlier process started in dir,
	// using the pid file and sockets there. A dead VM yields ErrNotRunning.
	Attach(ctx context.Context, dir string) (VM, error)
}

// VM is a running (or paused) virtual machine. Methods are safe for
// concurrent use. Closing a VM releases berth's handles; the VM keeps running.
type VM interface {
	// Pid is the VMM process id.
	Pid() int
	// Accel is the accelerator the VM runs on.
	Accel() Accel
	// DialAgent opens the raw agent channel. Only one connection can be open
	// at a time; bytes from a previous connection may still arrive, which the
	// guest package's handshake discards.
	DialAgent(ctx context.Context) (net.Conn, error)
	// Pause stops the vCPUs. It does not flush anything: guest dirty pages
	// stay dirty. Pausing a paused VM returns nil.
	Pause(ctx context.Context) error
	// Resume continues a paused VM. Resuming a running VM returns nil.
	Resume(ctx context.Context) error
	// Status asks the VMM for the VM's state.
	Status(ctx context.Context) (State, error)
	// Kill stops the VM at once, like pulling the plug: writes the guest has
	// not flushed are lost. Killing a stopped VM returns nil.
	Kill(ctx context.Context) error
	// Done is closed when the VMM process has exited.
	Done() <-chan struct{}
	// Exit describes how the VMM exited, once Done is closed.
	Exit() Exit
	// Close releases berth's connections to the VM without stopping it.
	Close() error
}

// Exit describes a VMM process's end.
type Exit struct {
	Code   int    // -1 when unknown (not our child) or signalled
	Signal string // set when killed by a signal
	Time   time.Time
	// LogTail holds the last lines of the VMM's log, for crash reports.
	LogTail string
}

func (e Exit) String() string {
	switch {
	case e.Signal != "":
		return "killed by " + e.Signal
	case e.Code >= 0:
		return fmt.Sprintf("exited with code %d", e.Code)
	default:
		return "exited"
	}
}

// A Stop is the VMM pausing a VM by itself: a write to one of its disks
// failed on the host, for lack of space when NoSpace. Resume retries the
// failed request.
type Stop struct {
	Disk    string // the drive or disk id ("ws", "sys", "workspace"…)
	NoSpace bool
	Reason  string // the host's error text
}

// Stopper is implemented by VMs whose VMM stops them on a host-side disk
// error instead of handing the error to the guest. Stops delivers one Stop
// per event until the VM is closed; a listener that falls behind misses
// repeats, never the first.
type Stopper interface {
	Stops() <-chan Stop
}

// Snapshotter is implemented by VMs that can save their memory and device
// state to a file and by drivers that can restore it (Config.Incoming).
type Snapshotter interface {
	// Snapshot saves a paused VM's memory and device state to path.
	Snapshot(ctx context.Context, path string) error
}

// NICAddress is the MAC the VM's NIC is given: NICMAC, or guest.NICMAC.
func (c *Config) NICAddress() string {
	if c.NICMAC != "" {
		return c.NICMAC
	}
	return guest.NICMAC
}

// NICDialer is implemented by VMs started with Config.NIC: DialNIC
// connects to the host end of the guest's NIC, a stream of Ethernet frames
// each after its length (4 bytes, big endian). One connection at a time;
// a new one after the last ended gets the NIC again (daemon restart,
// wake).
type NICDialer interface {
	// HasNIC reports whether the VM was started with a NIC.
	HasNIC() bool
	DialNIC(ctx context.Context) (net.Conn, error)
}

// NICStarter is implemented by drivers that can start a VM with
// Config.NIC. A driver without it refuses Config.NIC, and the engine boots
// its sessions without a NIC (the proxy still serves them).
type NICStarter interface {
	StartsNIC() bool
}

// MaxLayers bounds an image's read-only layers.
const MaxLayers = 8

// Disk names a hot-pluggable disk of a session.
type Disk string

const (
	DiskWorkspace Disk = "workspace"
	DiskSystem    Disk = "system"
)

// DiskAdder is implemented by VMs that can hot-plug a session's disks,
// as a VM restored from a template (booted without them) needs. Each disk
// lands where a cold boot with Config.Workspace or Config.System puts it,
// so later snapshots of the VM restore with the ordinary configuration. A
// disk held by another writer yields ErrInUse.
type DiskAdder interface {
	AddDisk(ctx context.Context, d Disk, path string) error
}

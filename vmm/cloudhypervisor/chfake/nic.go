package chfake

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/berthvm/berth/vmm/cloudhypervisor/internal/chapi"
)

// A virtio-net device, as CH v53.0 makes one from a NetConfig with a tap
// name (net_util/src/tap.rs Tap::open_named): /dev/net/tun opened with
// TUNSETIFF on that name, IFF_TAP | IFF_NO_PI | IFF_VNET_HDR, which
// attaches to the tap if the network namespace of the VMM has one of that
// name (and makes it, as root, if not). Net devices come after the disks
// and before the virtio-rng (device_manager.rs make_virtio_devices), with
// ids _net0, _net1… unless named. vhost-user and taps CH would create
// with ip and mask are not faked.
//
// The fake's guest answers on its NIC by sending each frame it receives
// back as it came: a test sees its frames cross the tap both ways.

// openNIC opens the tap of nc and starts the echoing guest on it.
func openNIC(nc chapi.NetConfig) (*os.File, []string) {
	if nc.VhostUser != nil && *nc.VhostUser {
		return nil, []string{"Cannot create virtio-net device", "vhost-user net is not supported by the fake"}
	}
	if nc.Tap == nil || *nc.Tap == "" {
		return nil, []string{"Cannot create virtio-net device", "a tap the VMM creates (no tap name) is not supported by the fake"}
	}
	name := *nc.Tap
	if len(name) >= unix.IFNAMSIZ {
		return nil, []string{"Cannot create virtio-net device", fmt.Sprintf("Failed to open tap device: Interface name too long: %s", name)}
	}
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, []string{"Cannot create virtio-net device", "Failed to open tap device", err.Error()}
	}
	var r struct {
		name  [unix.IFNAMSIZ]byte
		flags uint16
		_     [22]byte
	}
	copy(r.name[:], name)
	r.flags = unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, uintptr(unsafe.Pointer(&r))); e != 0 {
		unix.Close(fd)
		return nil, []string{"Cannot create virtio-net device", "Failed to open tap device", fmt.Sprintf("Unable to configure tap interface: %v", e)}
	}
	f := os.NewFile(uintptr(fd), "tap:"+name) // non-blocking: Close ends a Read
	go func() {
		buf := make([]byte, 1<<17)
		for {
			n, err := f.Read(buf)
			if err != nil {
				return
			}
			if _, err := f.Write(buf[:n]); err != nil {
				return
			}
		}
	}()
	return f, nil
}

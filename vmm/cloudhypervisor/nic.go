package cloudhypervisor

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/vmm/cloudhypervisor/internal/chapi"
)

// A guest NIC (vmm.Config.NIC) on Cloud Hypervisor. Its API (v53.0) takes
// a tap by name or a vhost-user socket, not a stream of frames as QEMU's
// stream netdev is; and a tap on the host's own network would put guests
// on it. So each VMM starts in a network namespace of its own (made with
// the process, gone with it), berth makes a persistent tap there before
// vm.boot or vm.restore, and CH opens it by name. berth reads and writes
// the tap's kernel side through a packet socket in the same namespace and
// hands DialNIC's caller the same stream QEMU gives: each frame after its
// length, 4 bytes big endian. The namespace has nothing else: no address,
// no route, IPv6 off, so the kernel there neither answers nor sends.

// tapName is the tap of every VM's namespace. A snapshot's config names
// it, so a restore into another VM's namespace finds its own.
const tapName = "berth0"

// nicMarkFile, in the VM's directory, says the VM was started with a NIC
// (Attach after a daemon restart reads it).
const nicMarkFile = "nic"

// nicID is the net device's id in the VM config.
const nicID = "_net0"

// maxNICFrame bounds a frame read from the tap: the MTU, the Ethernet
// header and a VLAN tag.
const maxNICFrame = guest.NICMTU + 14 + 4

// netConfig is the VM config's NIC: the namespace's tap, the session's
// MAC, berth's MTU, and no offloads, so every frame is a whole, checksummed packet as
// the stream of QEMU's netdev carries (berth's stack has no GSO).
func netConfig(mac string) chapi.NetConfig {
	tap, mtu, off := tapName, guest.NICMTU, false
	id := nicID
	return chapi.NetConfig{Id: &id, Tap: &tap, Mac: &mac, Mtu: &mtu, OffloadTso: &off, OffloadUfo: &off, OffloadCsum: &off}
}

// inNetns runs f on an OS thread moved into the network namespace of
// process pid, then moves the thread back. A thread that cannot be moved
// back is never handed to another goroutine: it ends with this one
// (runtime.LockOSThread without Unlock).
func inNetns(pid int, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("berth's network namespace: %w", err)
			return
		}
		defer orig.Close()
		ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("the VMM's network namespace: %w", err)
			return
		}
		defer ns.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter the VMM's network namespace (berth needs CAP_SYS_ADMIN for a guest NIC on cloud-hypervisor): %w", err)
			return
		}
		err = f()
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// ifreq is struct ifreq with the union as flags or an int.
type ifreq struct {
	name  [unix.IFNAMSIZ]byte
	value uint32
	_     [20]byte
}

func newIfreq(name string) *ifreq {
	var r ifreq
	copy(r.name[:], name)
	return &r
}

func ioctl(fd int, req uint, r *ifreq) error {
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(unsafe.Pointer(r)))
	if e != 0 {
		return e
	}
	return nil
}

// makeTap makes the namespace's persistent tap, with the NIC's MTU, up.
// It runs inside the namespace (inNetns).
func makeTap() error {
	tun, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open /dev/net/tun: %w", err)
	}
	defer unix.Close(tun)
	r := newIfreq(tapName)
	r.value = unix.IFF_TAP | unix.IFF_NO_PI
	if err := ioctl(tun, unix.TUNSETIFF, r); err != nil {
		return fmt.Errorf("create tap %s: %w", tapName, err)
	}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(tun), unix.TUNSETPERSIST, 1); e != 0 {
		return fmt.Errorf("keep tap %s: %w", tapName, e)
	}
	// IPv6 would give the tap a link-local address and send router
	// solicitations to the guest.
	os.WriteFile(filepath.Join("/proc/sys/net/ipv6/conf", tapName, "disable_ipv6"), []byte("1"), 0o644)
	s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(s)
	r = newIfreq(tapName)
	r.value = guest.NICMTU
	if err := ioctl(s, unix.SIOCSIFMTU, r); err != nil {
		return fmt.Errorf("tap %s: MTU %d: %w", tapName, guest.NICMTU, err)
	}
	r = newIfreq(tapName)
	if err := ioctl(s, unix.SIOCGIFFLAGS, r); err != nil {
		return fmt.Errorf("tap %s: %w", tapName, err)
	}
	r.value |= unix.IFF_UP
	if err := ioctl(s, unix.SIOCSIFFLAGS, r); err != nil {
		return fmt.Errorf("tap %s: up: %w", tapName, err)
	}
	return nil
}

// canMakeNetns reports whether this process has CAP_SYS_ADMIN (a network
// namespace, setns into it) and CAP_NET_ADMIN (the tap) in effect.
func canMakeNetns() bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	has := func(c uint) bool { return data[c/32].Effective&(1<<(c%32)) != 0 }
	return has(unix.CAP_SYS_ADMIN) && has(unix.CAP_NET_ADMIN)
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// openPacket opens a packet socket on the namespace's tap: every frame the
// guest sends, and a way to send it frames. It runs inside the namespace.
func openPacket() (int, error) {
	ifi, err := net.InterfaceByName(tapName)
	if err != nil {
		return -1, fmt.Errorf("the VMM's tap: %w", err)
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, int(htons(unix.ETH_P_ALL)))
	if err != nil {
		return -1, fmt.Errorf("packet socket: %w", err)
	}
	// Frames this socket sends come back to packet sockets as outgoing:
	// only the guest's are wanted.
	unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1)
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi.Index}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("bind a packet socket to %s: %w", tapName, err)
	}
	return fd, nil
}

// dialNIC connects to the tap in the network namespace of pid: the
// returned conn carries the frames length-first; done ends it with the VM.
func dialNIC(pid int, done <-chan struct{}) (net.Conn, error) {
	var fd int
	if err := inNetns(pid, func() (err error) { fd, err = openPacket(); return err }); err != nil {
		return nil, err
	}
	pkt := os.NewFile(uintptr(fd), "packet:"+tapName) // non-blocking: Close ends a Read
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		pkt.Close()
		return nil, err
	}
	ours, err := fileConn(pair[0])
	if err != nil {
		unix.Close(pair[1])
		pkt.Close()
		return nil, err
	}
	theirs, err := fileConn(pair[1])
	if err != nil {
		ours.Close()
		pkt.Close()
		return nil, err
	}
	// The pumps end when either side ends: the caller closes theirs, or
	// the VM exits; each closes both so the other ends too.
	stopped := make(chan struct{})
	var once sync.Once
	stop := func() {
		once.Do(func() {
			close(stopped)
			ours.Close()
			pkt.Close()
		})
	}
	go func() {
		select {
		case <-done:
			stop()
		case <-stopped:
		}
	}()
	go func() {
		defer stop()
		buf := make([]byte, 4+maxNICFrame)
		for {
			n, err := pkt.Read(buf[4:])
			if err != nil {
				return
			}
			binary.BigEndian.PutUint32(buf, uint32(n))
			if _, err := ours.Write(buf[:4+n]); err != nil {
				return
			}
		}
	}()
	go func() {
		defer stop()
		r := bufio.NewReaderSize(ours, 256<<10)
		buf := make([]byte, maxNICFrame)
		var n [4]byte
		for {
			if _, err := io.ReadFull(r, n[:]); err != nil {
				return
			}
			size := binary.BigEndian.Uint32(n[:])
			if size == 0 || size > maxNICFrame {
				return // out of step: the stream cannot be resynced
			}
			if _, err := io.ReadFull(r, buf[:size]); err != nil {
				return
			}
			if _, err := pkt.Write(buf[:size]); err != nil && !errors.Is(err, unix.ENOBUFS) {
				return
			}
		}
	}()
	return theirs, nil
}

func fileConn(fd int) (net.Conn, error) {
	f := os.NewFile(uintptr(fd), "nic")
	defer f.Close() // FileConn dups it
	return net.FileConn(f)
}

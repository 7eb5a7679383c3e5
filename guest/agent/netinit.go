package agent

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/berthvm/berth/guest"
)

// SetupNet readies the guest's network: loopback for the agent's proxy
// and DNS server, and, when the VM has a NIC (the session's policy is not
// none and the host serves one), eth0 with its address, the default route
// and berth's DNS on the NIC's network. Without a NIC /etc/resolv.conf
// names the agent's DNS on loopback. Run by PID 1 at boot and again after
// the root changes; each step is idempotent.
func SetupNet() error {
	if err := linkUp("lo"); err != nil {
		return fmt.Errorf("bring up lo: %w", err)
	}
	host, _, _ := net.SplitHostPort(guest.DNSAddr)
	resolver := "# berth: the agent answers what the session's network policy allows\nnameserver " + host + "\n"
	hw, nicErr := nicHWAddr(guest.NICName)
	if errors.Is(nicErr, unix.ENODEV) {
		nicErr = nil // no NIC: the proxy alone
	} else if nicErr == nil {
		if nicErr = nicUp(hw); nicErr == nil {
			resolver = "# berth: berth's DNS on the guest's NIC answers what the session's network policy allows\nnameserver " + guest.NICDNS + "\n"
		}
	}
	writeIfChanged("/etc/resolv.conf", resolver, 0o644)
	if nicErr != nil {
		return fmt.Errorf("configure %s: %w", guest.NICName, nicErr)
	}
	return nil
}

// nicUp gives eth0 the address its MAC names (guest.NICAddrOf) and
// brings it up (ioctls), then adds the default route through the gateway
// (netlink): no ip binary needed. An address already there is replaced
// (SIOCSIFADDR changes the primary one).
func nicUp(hw net.HardwareAddr) error {
	pfx := guest.NICAddrOf(hw)
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(guest.NICName)
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFINDEX, ifr); err != nil {
		return fmt.Errorf("index: %w", err)
	}
	index := int(ifr.Uint32())
	if err := ifr.SetInet4Addr(pfx.Addr().AsSlice()); err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFADDR, ifr); err != nil {
		return fmt.Errorf("set address %s: %w", pfx.Addr(), err)
	}
	mask := net.CIDRMask(pfx.Bits(), 32)
	if err := ifr.SetInet4Addr(mask); err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFNETMASK, ifr); err != nil {
		return fmt.Errorf("set netmask /%d: %w", pfx.Bits(), err)
	}
	if err := linkUp(guest.NICName); err != nil {
		return fmt.Errorf("bring it up: %w", err)
	}
	if err := addDefaultRoute(index, netip.MustParseAddr(guest.NICGateway)); err != nil {
		return fmt.Errorf("default route via %s: %w", guest.NICGateway, err)
	}
	return nil
}

func linkDown(name string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() &^ unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

func linkUp(name string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	if ifr.Uint16()&unix.IFF_UP != 0 {
		return nil
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

// addDefaultRoute adds 0.0.0.0/0 via gw on interface index with an
// RTM_NEWROUTE message; a route already there is fine.
func addDefaultRoute(index int, gw netip.Addr) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	msg := routeMessage(index, gw)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	tv := unix.Timeval{Sec: 2}
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return fmt.Errorf("netlink answer: %w", err)
	}
	// The answer is one nlmsghdr of type NLMSG_ERROR whose data begins
	// with the error code (0: done).
	b := buf[:n]
	if len(b) < unix.NLMSG_HDRLEN+4 || binary.NativeEndian.Uint16(b[4:6]) != unix.NLMSG_ERROR {
		return errors.New("netlink gave no answer")
	}
	code := int32(binary.NativeEndian.Uint32(b[unix.NLMSG_HDRLEN:]))
	if code == 0 || unix.Errno(-code) == unix.EEXIST {
		return nil
	}
	return unix.Errno(-code)
}

// routeMessage is RTM_NEWROUTE for the default route via gw on index.
func routeMessage(index int, gw netip.Addr) []byte {
	attr := func(b []byte, typ uint16, data []byte) []byte {
		b = binary.NativeEndian.AppendUint16(b, uint16(unix.SizeofRtAttr+len(data)))
		b = binary.NativeEndian.AppendUint16(b, typ)
		b = append(b, data...)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
		return b
	}
	var body []byte
	// struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags
	body = append(body, unix.AF_INET, 0, 0, 0, unix.RT_TABLE_MAIN, unix.RTPROT_BOOT, unix.RT_SCOPE_UNIVERSE, unix.RTN_UNICAST)
	body = binary.NativeEndian.AppendUint32(body, 0)
	g := gw.As4()
	body = attr(body, unix.RTA_GATEWAY, g[:])
	body = attr(body, unix.RTA_OIF, binary.NativeEndian.AppendUint32(nil, uint32(index)))
	var out []byte
	out = binary.NativeEndian.AppendUint32(out, uint32(unix.NLMSG_HDRLEN+len(body)))
	out = binary.NativeEndian.AppendUint16(out, unix.RTM_NEWROUTE)
	out = binary.NativeEndian.AppendUint16(out, unix.NLM_F_REQUEST|unix.NLM_F_ACK|unix.NLM_F_CREATE|unix.NLM_F_EXCL)
	out = binary.NativeEndian.AppendUint32(out, 1)                   // seq
	out = binary.NativeEndian.AppendUint32(out, uint32(os.Getpid())) // pid
	return append(out, body...)
}

// SetNICMAC gives eth0 a new MAC and the address it names: the NIC of a
// fork or of a session restored from a template, which the restored
// device state gave the source's MAC. The link goes down for the change (not
// every virtio-net can change its MAC while up), which drops its address
// and routes: the caller's SetupNet then puts back the address the MAC
// names, the default route, and the link (whether the change was made
// or not).
func SetNICMAC(mac string) error {
	hw, err := net.ParseMAC(mac)
	if err != nil || len(hw) != 6 {
		return fmt.Errorf("NIC MAC %q: not a 6-byte MAC", mac)
	}
	// The host names a MAC only for a VM that has a NIC: one not found
	// may still be coming up.
	var cur net.HardwareAddr
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		cur, err = nicHWAddr(guest.NICName)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.ENODEV) || time.Now().After(deadline) {
			return fmt.Errorf("%s: %w", guest.NICName, err)
		}
	}
	if cur.String() == hw.String() {
		return nil
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := linkDown(guest.NICName); err != nil {
		return fmt.Errorf("take %s down: %w", guest.NICName, err)
	}
	// struct ifreq: the name, then struct sockaddr ifr_hwaddr (the
	// family, then the address).
	var ifr [unix.IFNAMSIZ + 24]byte
	copy(ifr[:unix.IFNAMSIZ-1], guest.NICName)
	binary.NativeEndian.PutUint16(ifr[unix.IFNAMSIZ:], unix.ARPHRD_ETHER)
	copy(ifr[unix.IFNAMSIZ+2:], hw)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCSIFHWADDR, uintptr(unsafe.Pointer(&ifr[0]))); e != 0 {
		return fmt.Errorf("set %s's MAC to %s: %w", guest.NICName, hw, e)
	}
	return nil
}

// nicHWAddr is interface name's MAC (SIOCGIFHWADDR); unix.ENODEV when
// there is no such interface. An ioctl, not net.InterfaceByName's
// netlink dump, so that "no NIC" and a failure to ask are told apart.
func nicHWAddr(name string) (net.HardwareAddr, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var ifr [unix.IFNAMSIZ + 24]byte
	copy(ifr[:unix.IFNAMSIZ-1], name)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCGIFHWADDR, uintptr(unsafe.Pointer(&ifr[0]))); e != 0 {
		return nil, e
	}
	return net.HardwareAddr(slices.Clone(ifr[unix.IFNAMSIZ+2 : unix.IFNAMSIZ+8])), nil
}

package agent

import (
	"fmt"
	"net"

	"golang.org/x/sys/unix"

	"github.com/berthvm/berth/guest"
)

// SetupNet readies the guest's only network, loopback, for the agent's
// proxy and DNS server: it brings lo up (the kernel assigns 127.0.0.1) and
// points /etc/resolv.conf at the agent. Run by PID 1 at boot and again
// after the root changes.
func SetupNet() error {
	if err := loUp(); err != nil {
		return fmt.Errorf("bring up lo: %w", err)
	}
	host, _, _ := net.SplitHostPort(guest.DNSAddr)
	writeIfChanged("/etc/resolv.conf", "# berth: the agent answers what the session's network policy allows\nnameserver "+host+"\n", 0o644)
	return nil
}

func loUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
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

package sshd

import (
	"net"

	"golang.org/x/sys/unix"
)

// A new connection's reads are acknowledged at once until it has read
// this much: enough for the key exchange and authentication (the version
// line alone is read a byte at a time).
const (
	quickAckReads = 256
	quickAckBytes = 32 << 10
)

// quickAckConn acknowledges what it reads at once during a connection's
// first exchanges. OpenSSH's client leaves Nagle's algorithm on until a
// session starts, so each small handshake packet it sends right after
// another (KEX_ECDH_INIT after KEXINIT, SERVICE_REQUEST after NEWKEYS)
// waits for the ACK of the one before — and Linux delays that ACK by 40 ms
// when the server has nothing to send. Two such waits made a connection
// cost ~100 ms; TCP_QUICKACK (which the kernel clears again, hence once per
// read) removes them.
//
// It embeds net.Conn, not *net.TCPConn, so that every read goes through
// Read (TCPConn's WriteTo would bypass it).
type quickAckConn struct {
	net.Conn
	tc           *net.TCPConn
	reads, bytes int
}

func (c *quickAckConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if c.reads < quickAckReads && c.bytes < quickAckBytes {
		c.reads++
		c.bytes += n
		if rc, rerr := c.tc.SyscallConn(); rerr == nil {
			rc.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_QUICKACK, 1) })
		}
	}
	return n, err
}

// withQuickAck wraps a TCP connection; others are returned as they are.
func withQuickAck(c net.Conn) net.Conn {
	if tc, ok := c.(*net.TCPConn); ok {
		return &quickAckConn{Conn: tc, tc: tc}
	}
	return c
}

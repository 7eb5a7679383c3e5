package guest

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
)

// Network ops on the agent channel. A guest with a NIC (below) reaches the
// world through it; these serve the proxy and DNS on the guest's loopback
// (every guest, and the only way out of one without a NIC) and the port
// forwards the NIC cannot carry.
//
// Guest to host (the agent opens the stream):
//   - OpEgress: a connection to the agent's proxy port; after the request
//     frame the stream carries the connection's bytes, both ways, and the
//     host serves it as an HTTP proxy under the session's policy.
//   - OpDNS: one DNS query in Request.Data; the host answers with a
//     FrameResult holding a DNSReply.
//
// Host to guest:
//   - OpDial: connect to 127.0.0.1:Request.Port in the guest; a FrameResult
//     (or a FrameError, ECONNREFUSED for a port nobody listens on), then the
//     connection's bytes, both ways.
//   - OpPorts: the guest's listening TCP ports.
const (
	OpEgress = "egress"
	OpDNS    = "dns"
	OpDial   = "dial"
	OpPorts  = "ports"
)

// Guest-side addresses of the network services the agent runs.
const (
	// ProxyAddr is the agent's HTTP proxy, named by http_proxy and
	// https_proxy in every managed command's environment.
	ProxyAddr = "127.0.0.1:3128"
	// DNSAddr is the agent's DNS server, named in /etc/resolv.conf.
	DNSAddr = "127.0.0.1:53"
	// NoProxy is no_proxy: the guest's own loopback stays direct.
	NoProxy = "localhost,127.0.0.1,::1"
)

// The guest's NIC (eth0), when the session has one: a virtual network
// served by berth's userspace stack on the host (session/engine/netstack),
// where every flow is decided by the session's policy.
const (
	// NICAddr is the address and network of a guest whose NIC has
	// NICMAC; a NIC with another MAC has NICAddrOf's address in the same
	// network.
	NICAddr = "10.0.2.15/24"
	// NICGateway is the default route, and host.berth.internal: flows to
	// it reach the host's loopback where the policy names the host.
	NICGateway = "10.0.2.2"
	// NICDNS is berth's DNS on the guest's network, named in
	// /etc/resolv.conf when eth0 is up.
	NICDNS = "10.0.2.3"
	// NICMAC is the MAC of the NICs of sessions made before each had one
	// of its own (NewNICMAC), and of a VM whose config names none.
	NICMAC = "52:54:00:12:34:56"
	// NICName is the interface the agent configures.
	NICName = "eth0"
	// NICMTU is the link's MTU. The stream netdev carries no offloads,
	// so every segment costs a trip through QEMU and the host stack: a
	// large MTU (virtio-net's host_mtu tells the guest) is what makes
	// bulk transfers fast under TCG.
	NICMTU = 65520
)

// MaxDNSMessage bounds a DNS query or answer on the channel.
const MaxDNSMessage = 4096

// DNSReply is the host's answer to an OpDNS query.
type DNSReply struct {
	Data []byte `json:"data"`
}

// ListenPort is a TCP port a guest process listens on.
type ListenPort struct {
	Port int    `json:"port"`
	Addr string `json:"addr"` // the bound address: 0.0.0.0, 127.0.0.1, ::
}

// StreamConn is a yamux stream used as a connection: CloseWrite sends the
// end of the bytes (a half close), Close ends both directions.
type StreamConn struct {
	*yamux.Stream
	once sync.Once
}

// CloseWrite ends what this side sends; reads go on until the peer ends.
func (c *StreamConn) CloseWrite() error { return c.Stream.Close() }

// Close ends the stream both ways.
func (c *StreamConn) Close() error {
	c.once.Do(func() {
		c.Stream.SetDeadline(time.Now())
		c.Stream.Close()
	})
	return nil
}

// DialGuest connects to 127.0.0.1:port inside the guest. ctx bounds the
// connect only.
func (c *Client) DialGuest(ctx context.Context, port int) (*StreamConn, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("dial: port %d: use 1 to 65535", port)
	}
	cl, err := c.open(ctx, &Request{Op: OpDial, Port: port})
	if err != nil {
		return nil, err
	}
	t, p, err := cl.fr.Next()
	if err != nil {
		cl.close()
		return nil, cl.err(ctx, OpDial, err)
	}
	switch t {
	case FrameResult:
	case FrameError:
		cl.close()
		return nil, decodeError(p)
	default:
		cl.close()
		return nil, fmt.Errorf("dial: unexpected frame %d", t)
	}
	if !cl.stop() { // ctx ended just now: the stream is being closed
		cl.st.Close()
		return nil, fmt.Errorf("dial: %w", ctx.Err())
	}
	return &StreamConn{Stream: cl.st}, nil
}

// Ports lists the guest's listening TCP ports.
func (c *Client) Ports(ctx context.Context) ([]ListenPort, error) {
	var l []ListenPort
	err := c.do(ctx, &Request{Op: OpPorts}, &l)
	return l, err
}

// Incoming is a stream the guest opened, after its request frame.
type Incoming struct {
	Req  Request
	Conn *StreamConn
}

// Reply answers an incoming unary request (OpDNS) and ends the stream.
func (in *Incoming) Reply(v any) error {
	defer in.Conn.Close()
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	in.Conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	return WriteFrame(in.Conn, FrameResult, b)
}

// Fail answers an incoming request with an error and ends the stream.
func (in *Incoming) Fail(code, msg string) error {
	defer in.Conn.Close()
	b, _ := json.Marshal(&Error{Code: code, Op: in.Req.Op, Message: msg})
	in.Conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	return WriteFrame(in.Conn, FrameError, b)
}

// incomingHeaderWait bounds how long a guest-opened stream may take to
// send its request frame.
const incomingHeaderWait = 10 * time.Second

// ServeIncoming accepts the streams the guest opens and hands each to
// handle on its own goroutine, until the connection ends or ctx is done.
// It returns once every handler has returned; handlers own their streams.
func (c *Client) ServeIncoming(ctx context.Context, handle func(context.Context, *Incoming)) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { c.sess.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		st, err := c.sess.AcceptStream()
		if err != nil {
			return
		}
		wg.Go(func() {
			conn := &StreamConn{Stream: st}
			conn.SetReadDeadline(time.Now().Add(incomingHeaderWait))
			t, p, err := NewFrameReader(st).Next()
			if err != nil {
				conn.Close()
				return
			}
			in := &Incoming{Conn: conn}
			if t != FrameRequest || len(p) > MaxFrame || json.Unmarshal(p, &in.Req) != nil {
				in.Fail(CodeBadRequest, "first frame must be a request")
				return
			}
			conn.SetReadDeadline(time.Time{})
			handle(ctx, in)
		})
	}
}

var _ net.Conn = (*StreamConn)(nil)

// NICNet is the guest's network.
var NICNet = netip.MustParsePrefix(NICAddr).Masked()

// NICAddrOf is the guest's address on its network when its NIC has mac:
// 10.0.2.15 for NICMAC, otherwise 10.0.2.16 to .254 by the MAC's last
// byte. The agent reads its MAC from eth0 and the host's stack is told
// the session's, so both derive the same address with no message
// between them; a fork's new MAC gives it a new address
// (NewNICMAC(avoid) sees that it differs).
func NICAddrOf(mac net.HardwareAddr) netip.Prefix {
	if len(mac) != 6 || mac.String() == NICMAC {
		return netip.MustParsePrefix(NICAddr)
	}
	b := NICNet.Addr().As4()
	b[3] = byte(16 + int(mac[5])%239)
	return netip.PrefixFrom(netip.AddrFrom4(b), NICNet.Bits())
}

// NewNICMAC is a random MAC for a session's NIC, unicast and locally
// administered (QEMU's 52:54:00 prefix), whose address (NICAddrOf)
// differs from the address of every MAC in avoid: a fork's from its
// source's.
func NewNICMAC(avoid ...string) string {
	for {
		mac := net.HardwareAddr{0x52, 0x54, 0x00, 0, 0, 0}
		rand.Read(mac[3:])
		clash := mac.String() == NICMAC
		for _, a := range avoid {
			m, err := net.ParseMAC(a)
			if a == "" {
				m, err = net.ParseMAC(NICMAC)
			}
			if err == nil && (m.String() == mac.String() || NICAddrOf(m) == NICAddrOf(mac)) {
				clash = true
			}
		}
		if !clash {
			return mac.String()
		}
	}
}

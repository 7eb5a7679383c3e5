// Package netstack is the host end of a guest's NIC: a userspace network
// stack (gVisor's tcpip) on the unix socket of QEMU's stream netdev. It
// has one job: every outbound TCP connection and UDP flow the guest opens
// is put to the session's policy (Peer.Decide); an allowed one is
// connected to the host's socket for it, a refused one answered at once
// (TCP with a reset, UDP with ICMP port unreachable). DNS at
// guest.NICDNS is berth's, so the names the policy allows map to the
// addresses the guest was given.
package netstack

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
	"gvisor.dev/gvisor/pkg/tcpip/link/ethernet"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/icmp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/engine/egress"
)

// Peer is the session a stack serves.
type Peer interface {
	// Decide is the policy's verdict on a flow.
	Decide(f egress.Flow) egress.Verdict
	// Refused counts a refusal and notes it in the session's timeline.
	Refused(v egress.Verdict)
	// AnswerDNS answers a DNS query from the guest.
	AnswerDNS(ctx context.Context, q []byte, tcp bool) []byte
	// Counters are the session's egress figures: open flows count in
	// Conns, against MaxFlows.
	Counters() *egress.Counters
	// Touch counts as activity.
	Touch()
}

// Config configures a stack. Zero values take the defaults.
type Config struct {
	// MaxFlows bounds the session's open flows (with its proxy
	// connections: both count in Counters.Conns); 0 is
	// egress.DefaultMaxConns.
	MaxFlows int
	// Dial connects to an allowed destination on the host; nil dials
	// directly.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// GuestAddr is the guest's address, where DialTCP connects; the zero
	// Addr is guest.NICAddr's.
	GuestAddr netip.Addr
	// Up, if set, is called with the running stack's Guest once the
	// stack is built, and with nil when Serve is about to return.
	Up func(*Guest)
}

// Guest is a running stack's way into its guest: TCP connections from the
// host (host.berth.internal on the guest's network) to the guest's
// address, as a port forward through the NIC. Its connections end with
// the stack.
type Guest struct{ n *netw }

// defaultGuestAddr is the address of a guest whose NIC has guest.NICMAC.
var defaultGuestAddr = netip.MustParsePrefix(guest.NICAddr).Addr()

// DialTCP connects to port on the guest's address. A port nothing listens
// on there (nothing, or only on the guest's loopback) is
// syscall.ECONNREFUSED; a stack that stopped is net.ErrClosed.
func (g *Guest) DialTCP(ctx context.Context, port int) (net.Conn, error) {
	n := g.n
	if !n.track() {
		return nil, fmt.Errorf("the guest's NIC: %w", net.ErrClosed)
	}
	defer n.flows.Done()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(n.ctx, cancel) // the stack's end ends the dial
	defer stop()
	guestAddr := n.cfg.GuestAddr
	if !guestAddr.IsValid() {
		guestAddr = defaultGuestAddr
	}
	local := tcpip.FullAddress{NIC: nicID, Addr: tcpip.AddrFrom4(gatewayAddr.As4())}
	remote := tcpip.FullAddress{NIC: nicID, Addr: tcpip.AddrFrom4(guestAddr.As4()), Port: uint16(port)}
	c, err := gonet.DialTCPWithBind(ctx, n.st, local, remote, ipv4.ProtocolNumber)
	if err != nil {
		if n.ctx.Err() != nil {
			return nil, fmt.Errorf("the guest's NIC: %w", net.ErrClosed)
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("connect to %s through the guest's NIC: %w", remote.Addr, ctx.Err())
		}
		// gonet reports the stack's error as text only.
		if strings.Contains(err.Error(), (&tcpip.ErrConnectionRefused{}).String()) {
			return nil, fmt.Errorf("connect to %s:%d through the guest's NIC: %w", guestAddr, port, syscall.ECONNREFUSED)
		}
		return nil, fmt.Errorf("connect to %s:%d through the guest's NIC: %w", guestAddr, port, err)
	}
	// The stack's Close, when Serve returns, closes every endpoint: the
	// connection is cut then, as the guest's own are.
	return c, nil
}

// Limits of a stack.
const (
	dialWait      = 10 * time.Second
	udpIdle       = 60 * time.Second
	maxDNSPending = 64
	dnsTCPIdle    = 10 * time.Second
	// queueLen is how many frames wait for the socket to QEMU.
	queueLen = 1024
	// tcpWindow is the receive window of the guest's connections.
	tcpWindow = 1 << 20
	// maxHandshakes bounds connections being set up at once (the guest
	// cannot park unbounded dials on the host).
	maxHandshakes = 256
)

// nicID is the stack's one NIC.
const nicID = 1

// Addresses of the stack on the guest's network.
var (
	gatewayAddr = netip.MustParseAddr(guest.NICGateway)
	dnsAddr     = netip.MustParseAddr(guest.NICDNS)
)

// StackMAC is the stack's MAC address on the guest's network (the
// gateway's and the DNS server's).
const StackMAC = "5a:94:ef:e4:0c:dd"

// Serve runs the guest's network on conn (the stream netdev's socket)
// until ctx ends or conn fails, then stops every flow and returns. It
// returns nil when ctx ended it.
func Serve(ctx context.Context, conn net.Conn, peer Peer, cfg Config) error {
	if cfg.MaxFlows <= 0 {
		cfg.MaxFlows = egress.DefaultMaxConns
	}
	if cfg.Dial == nil {
		d := net.Dialer{Timeout: dialWait}
		cfg.Dial = d.DialContext
	}
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	n := &netw{peer: peer, cfg: cfg, ctx: ctx}
	if err := n.build(); err != nil {
		conn.Close()
		return err
	}
	defer func() {
		if cfg.Up != nil {
			cfg.Up(nil)
		}
		n.shut()
		n.st.Close()
		n.st.Wait()
	}()
	if cfg.Up != nil {
		cfg.Up(&Guest{n})
	}
	var (
		wg   sync.WaitGroup
		once sync.Once
		ferr error
	)
	fail := func(err error) {
		once.Do(func() { ferr = err })
		cancel()
	}
	stop := context.AfterFunc(ctx, func() { conn.Close(); n.link.Close() })
	defer stop()
	wg.Go(func() { fail(n.readGuest(conn)) })
	wg.Go(func() { fail(n.writeGuest(ctx, conn)) })
	wg.Go(func() { n.serveDNSUDP() })
	wg.Go(func() { n.serveDNSTCP() })
	<-ctx.Done()
	n.dnsUDP.Close()
	n.dnsTCP.Close()
	wg.Wait()
	if parent.Err() != nil {
		return nil // the session's end, not a failure
	}
	if errors.Is(ferr, io.EOF) || errors.Is(ferr, io.ErrClosedPipe) || errors.Is(ferr, net.ErrClosed) {
		return fmt.Errorf("QEMU closed the NIC's socket: %w", ferr)
	}
	return fmt.Errorf("the NIC's socket: %w", ferr)
}

// netw is one running stack.
type netw struct {
	peer Peer
	cfg  Config
	ctx  context.Context

	st     *stack.Stack
	link   *channel.Endpoint
	dnsUDP *gonet.UDPConn
	dnsTCP *gonet.TCPListener

	// flows tracks every goroutine serving a flow; after shut no new
	// one starts (the stack's own forwarder goroutines check in here).
	mu     sync.Mutex
	closed bool
	flows  sync.WaitGroup
}

func (n *netw) build() error {
	n.st = stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol, icmp.NewProtocol4},
	})
	mac, _ := net.ParseMAC(StackMAC)
	n.link = channel.New(queueLen, guest.NICMTU+ethHeader, tcpip.LinkAddress(mac))
	const nic = nicID
	if err := n.st.CreateNIC(nic, ethernet.New(n.link)); err != nil {
		return fmt.Errorf("create the guest's NIC: %s", err)
	}
	for _, a := range []netip.Addr{gatewayAddr, dnsAddr} {
		pa := tcpip.ProtocolAddress{Protocol: ipv4.ProtocolNumber, AddressWithPrefix: tcpip.AddrFrom4(a.As4()).WithPrefix()}
		if err := n.st.AddProtocolAddress(nic, pa, stack.AddressProperties{}); err != nil {
			return fmt.Errorf("address %s: %s", a, err)
		}
	}
	// Promiscuous and spoofing: the stack takes packets for any address
	// (the guest's flows go to the world through the gateway) and
	// answers from it.
	n.st.SetPromiscuousMode(nic, true)
	n.st.SetSpoofing(nic, true)
	n.st.SetRouteTable([]tcpip.Route{{Destination: header.IPv4EmptySubnet, NIC: nic}})
	sack := tcpip.TCPSACKEnabled(true)
	n.st.SetTransportProtocolOption(tcp.ProtocolNumber, &sack)
	rcv := tcpip.TCPReceiveBufferSizeRangeOption{Min: tcp.MinBufferSize, Default: tcpWindow, Max: 4 << 20}
	n.st.SetTransportProtocolOption(tcp.ProtocolNumber, &rcv)
	snd := tcpip.TCPSendBufferSizeRangeOption{Min: tcp.MinBufferSize, Default: tcpWindow, Max: 4 << 20}
	n.st.SetTransportProtocolOption(tcp.ProtocolNumber, &snd)

	tfwd := tcp.NewForwarder(n.st, 0, maxHandshakes, n.tcpFlow)
	n.st.SetTransportProtocolHandler(tcp.ProtocolNumber, func(id stack.TransportEndpointID, pkt *stack.PacketBuffer) bool {
		// Returning false leaves the packet to the stack, which answers a
		// SYN nobody takes with a reset.
		h := header.TCP(pkt.TransportHeader().Slice())
		if len(h) < header.TCPMinimumSize || h.Flags()&(header.TCPFlagSyn|header.TCPFlagAck) != header.TCPFlagSyn {
			return false
		}
		if virtual(dst(id).Addr()) {
			return false // nothing else listens on the guest's network
		}
		if v := n.peer.Decide(egress.Flow{Dst: dst(id)}); !v.Allow {
			n.peer.Refused(v)
			return false
		}
		return tfwd.HandlePacket(id, pkt)
	})
	ufwd := udp.NewForwarder(n.st, n.udpFlow)
	n.st.SetTransportProtocolHandler(udp.ProtocolNumber, func(id stack.TransportEndpointID, pkt *stack.PacketBuffer) bool {
		// Returning false leaves the datagram to the stack, which answers
		// with ICMP port unreachable.
		if virtual(dst(id).Addr()) {
			return false
		}
		v := n.peer.Decide(egress.Flow{UDP: true, Dst: dst(id)})
		if !v.Allow {
			n.peer.Refused(v)
			return false
		}
		return ufwd.HandlePacket(id, pkt)
	})

	var err error
	dnsFull := tcpip.FullAddress{NIC: nic, Addr: tcpip.AddrFrom4(dnsAddr.As4()), Port: 53}
	if n.dnsUDP, err = gonet.DialUDP(n.st, &dnsFull, nil, ipv4.ProtocolNumber); err != nil {
		return fmt.Errorf("berth's DNS on the guest's network: %w", err)
	}
	if n.dnsTCP, err = gonet.ListenTCP(n.st, dnsFull, ipv4.ProtocolNumber); err != nil {
		n.dnsUDP.Close()
		return fmt.Errorf("berth's DNS over TCP on the guest's network: %w", err)
	}
	return nil
}

// virtual reports an address of the guest's network other than the
// gateway: the DNS server (answered by the stack itself), the guest, the
// rest nobody's; never dialled on the host, whatever the policy names.
func virtual(a netip.Addr) bool { return guest.NICNet.Contains(a) && a != gatewayAddr }

// dst is a flow's destination: the local end of the stack's endpoint.
func dst(id stack.TransportEndpointID) netip.AddrPort {
	a, _ := netip.AddrFromSlice(id.LocalAddress.AsSlice())
	return netip.AddrPortFrom(a.Unmap(), id.LocalPort)
}

// track registers a flow's goroutine; false once the stack is shutting.
func (n *netw) track() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return false
	}
	n.flows.Add(1)
	return true
}

// shut stops new flows and waits for the open ones, which end with ctx.
func (n *netw) shut() {
	n.mu.Lock()
	n.closed = true
	n.mu.Unlock()
	n.flows.Wait()
}

// admit takes one of the session's flow slots.
func (n *netw) admit() bool {
	ns := n.peer.Counters()
	if ns.Conns.Add(1) > int64(n.cfg.MaxFlows) {
		ns.Conns.Add(-1)
		return false
	}
	return true
}

func (n *netw) release() { n.peer.Counters().Conns.Add(-1) }

func (n *netw) tooMany(f egress.Flow) egress.Verdict {
	return egress.Verdict{Msg: fmt.Sprintf("berth: a connection to %s was refused: the session has %d connections open, the most allowed (net_max_conns)", f.Dst, n.cfg.MaxFlows)}
}

// tcpFlow serves one TCP connection the policy allowed at its SYN: the
// host connection first, so a destination that refuses is a reset in
// the guest too, then the guest's handshake completes.
func (n *netw) tcpFlow(r *tcp.ForwarderRequest) {
	if !n.track() {
		r.Complete(true)
		return
	}
	defer n.flows.Done()
	f := egress.Flow{Dst: dst(r.ID())}
	v := n.peer.Decide(f) // again: the policy may have changed since the SYN
	if !v.Allow {
		n.peer.Refused(v)
		r.Complete(true)
		return
	}
	if !n.admit() {
		n.peer.Refused(n.tooMany(f))
		r.Complete(true)
		return
	}
	defer n.release()
	n.peer.Touch()
	dctx, cancel := context.WithTimeout(n.ctx, dialWait)
	up, err := n.cfg.Dial(dctx, "tcp", v.Dial.String())
	cancel()
	if err != nil {
		r.Complete(true)
		return
	}
	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq)
	r.Complete(false)
	if terr != nil {
		up.Close()
		return
	}
	ns := n.peer.Counters()
	ns.Accepted.Add(1)
	gc := gonet.NewTCPConn(&wq, ep)
	stop := context.AfterFunc(n.ctx, func() { gc.Close(); up.Close() })
	defer stop()
	tx, rx := session.Splice(gc, up)
	ns.TX.Add(tx)
	ns.RX.Add(rx)
}

// udpFlow serves one UDP flow (a source and destination pair) the policy
// allowed: datagrams both ways until it is idle for udpIdle.
func (n *netw) udpFlow(r *udp.ForwarderRequest) {
	f := egress.Flow{UDP: true, Dst: dst(r.ID())}
	v := n.peer.Decide(f)
	if !v.Allow {
		n.peer.Refused(v)
		return
	}
	if !n.track() {
		return
	}
	if !n.admit() {
		n.flows.Done()
		n.peer.Refused(n.tooMany(f))
		return
	}
	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq) // takes the first datagram
	if terr != nil {
		n.release()
		n.flows.Done()
		return
	}
	gc := gonet.NewUDPConn(&wq, ep)
	n.peer.Counters().Accepted.Add(1)
	n.peer.Touch()
	go func() { // tracked above: shut waits for it
		defer n.flows.Done()
		defer n.release()
		defer gc.Close()
		dctx, cancel := context.WithTimeout(n.ctx, dialWait)
		up, err := n.cfg.Dial(dctx, "udp", v.Dial.String())
		cancel()
		if err != nil {
			return
		}
		defer up.Close()
		n.relayUDP(gc, up)
	}()
}

// relayUDP copies datagrams both ways until neither side sends for
// udpIdle, or the stack stops.
func (n *netw) relayUDP(gc *gonet.UDPConn, up net.Conn) {
	stop := context.AfterFunc(n.ctx, func() { gc.Close(); up.Close() })
	defer stop()
	ns := n.peer.Counters()
	var last sync.Mutex
	seen := time.Now()
	touch := func() { last.Lock(); seen = time.Now(); last.Unlock() }
	idle := func() bool { last.Lock(); defer last.Unlock(); return time.Since(seen) > udpIdle }
	cp := func(dst, src net.Conn, count func(int)) {
		buf := make([]byte, 65536)
		for {
			src.SetReadDeadline(time.Now().Add(udpIdle))
			k, err := src.Read(buf)
			if err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() && !idle() {
					continue
				}
				gc.Close()
				up.Close()
				return
			}
			touch()
			count(k)
			dst.Write(buf[:k])
		}
	}
	var wg sync.WaitGroup
	wg.Go(func() { cp(up, gc, func(k int) { ns.TX.Add(int64(k)) }) })
	cp(gc, up, func(k int) { ns.RX.Add(int64(k)) })
	wg.Wait()
}

// serveDNSUDP answers queries to guest.NICDNS:53 over UDP, a bounded
// number at once (a resolver retries what is dropped).
func (n *netw) serveDNSUDP() {
	sem := make(chan struct{}, maxDNSPending)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		buf := make([]byte, guest.MaxDNSMessage)
		k, from, err := n.dnsUDP.ReadFrom(buf)
		if err != nil {
			return
		}
		if k < 12 {
			continue
		}
		select {
		case sem <- struct{}{}:
		default:
			continue
		}
		wg.Go(func() {
			defer func() { <-sem }()
			if reply := n.peer.AnswerDNS(n.ctx, buf[:k], false); reply != nil {
				n.dnsUDP.WriteTo(reply, from)
			}
		})
	}
}

// serveDNSTCP answers DNS over TCP at guest.NICDNS:53 (a reply cut for
// UDP is asked again here): two-byte length before each message.
func (n *netw) serveDNSTCP() {
	sem := make(chan struct{}, maxDNSPending)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := n.dnsTCP.Accept()
		if err != nil {
			return
		}
		select {
		case sem <- struct{}{}:
		default:
			c.Close()
			continue
		}
		wg.Go(func() {
			defer func() { <-sem }()
			defer c.Close()
			stop := context.AfterFunc(n.ctx, func() { c.Close() })
			defer stop()
			var hdr [2]byte
			for {
				c.SetDeadline(time.Now().Add(dnsTCPIdle))
				if _, err := io.ReadFull(c, hdr[:]); err != nil {
					return
				}
				size := int(binary.BigEndian.Uint16(hdr[:]))
				if size < 12 || size > guest.MaxDNSMessage {
					return
				}
				q := make([]byte, size)
				if _, err := io.ReadFull(c, q); err != nil {
					return
				}
				reply := n.peer.AnswerDNS(n.ctx, q, true)
				if reply == nil {
					return
				}
				if _, err := c.Write(binary.BigEndian.AppendUint16(nil, uint16(len(reply)))); err != nil {
					return
				}
				if _, err := c.Write(reply); err != nil {
					return
				}
			}
		})
	}
}

// readGuest passes the guest's frames to the stack until conn ends.
func (n *netw) readGuest(conn net.Conn) error {
	r := bufio.NewReaderSize(conn, 256<<10)
	buf := make([]byte, maxFrame)
	for {
		f, err := readFrame(r, buf)
		if err != nil {
			return err
		}
		pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(f)})
		n.link.InjectInbound(0, pkt) // the Ethernet header names the protocol
		pkt.DecRef()
	}
}

// writeGuest passes the stack's frames to the guest, flushing when no
// more wait.
func (n *netw) writeGuest(ctx context.Context, conn net.Conn) error {
	w := bufio.NewWriterSize(conn, 256<<10)
	var hdr [4]byte
	for {
		pkt := n.link.ReadContext(ctx)
		if pkt == nil {
			return ctx.Err()
		}
		binary.BigEndian.PutUint32(hdr[:], uint32(pkt.Size()))
		w.Write(hdr[:])
		for _, s := range pkt.AsSlices() {
			w.Write(s)
		}
		pkt.DecRef()
		if n.link.NumQueued() == 0 {
			if err := w.Flush(); err != nil {
				return err
			}
		}
	}
}

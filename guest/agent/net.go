package agent

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/session"
)

// Bounds on what the agent's network services take at once: the host
// bounds each session again, these keep the agent itself healthy.
const (
	maxProxyConns  = 1024
	maxDNSInFlight = 64
	dialTimeout    = 5 * time.Second
)

// ServeNet runs the agent's proxy and DNS listeners (Config.Proxy and
// Config.DNS) until ctx ends. Each proxy connection and each DNS query
// travels to the host as a stream of its own; with no host connected,
// clients get a clear refusal.
func (a *Agent) ServeNet(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	if a.cfg.Proxy != "" {
		l, err := net.Listen("tcp", a.cfg.Proxy)
		if err != nil {
			return fmt.Errorf("egress proxy: %w", err)
		}
		context.AfterFunc(ctx, func() { l.Close() })
		wg.Go(func() { a.serveProxy(ctx, l) })
	}
	if a.cfg.DNS != "" {
		pc, err := net.ListenPacket("udp", a.cfg.DNS)
		if err != nil {
			return fmt.Errorf("dns: %w", err)
		}
		context.AfterFunc(ctx, func() { pc.Close() })
		wg.Go(func() { a.serveDNS(ctx, pc) })
		// Over TCP too: a reply cut for UDP says so with the TC bit, and
		// the resolver asks again here.
		l, err := net.Listen("tcp", a.cfg.DNS)
		if err != nil {
			return fmt.Errorf("dns over tcp: %w", err)
		}
		context.AfterFunc(ctx, func() { l.Close() })
		wg.Go(func() { a.serveDNSTCP(ctx, l) })
	}
	return nil
}

// dnsTCPIdle is how long a DNS client's TCP connection may sit idle.
const dnsTCPIdle = 10 * time.Second

// serveDNSTCP answers DNS over TCP: each message framed by its two-byte
// length (RFC 1035 4.2.2), several on one connection.
func (a *Agent) serveDNSTCP(ctx context.Context, l net.Listener) {
	// A connection over the bound is closed: the resolver retries.
	serveConns(ctx, l, maxDNSInFlight, func(c net.Conn) { c.Close() }, func(c net.Conn) {
		defer c.Close()
		stop := context.AfterFunc(ctx, func() { c.Close() })
		defer stop()
		var n [2]byte
		for {
			c.SetDeadline(time.Now().Add(dnsTCPIdle))
			if _, err := io.ReadFull(c, n[:]); err != nil {
				return
			}
			size := int(binary.BigEndian.Uint16(n[:]))
			if size < 12 || size > guest.MaxDNSMessage {
				return
			}
			q := make([]byte, size)
			if _, err := io.ReadFull(c, q); err != nil {
				return
			}
			reply := a.askHost(q, true)
			if reply == nil {
				return
			}
			out := binary.BigEndian.AppendUint16(make([]byte, 0, 2+len(reply)), uint16(len(reply)))
			if _, err := c.Write(append(out, reply...)); err != nil {
				return
			}
		}
	})
}

// host returns the current host session, or nil.
func (a *Agent) hostSession() *yamux.Session {
	a.sessMu.Lock()
	defer a.sessMu.Unlock()
	return a.current
}

func (a *Agent) openToHost(req *guest.Request) (*yamux.Stream, error) {
	sess := a.hostSession()
	if sess == nil {
		return nil, fmt.Errorf("the host is not connected")
	}
	st, err := sess.OpenStream()
	if err != nil {
		return nil, fmt.Errorf("the host is not connected: %v", err)
	}
	b, _ := json.Marshal(req)
	st.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if err := guest.WriteFrame(st, guest.FrameRequest, b); err != nil {
		st.Close()
		return nil, fmt.Errorf("the host is not answering: %v", err)
	}
	st.SetWriteDeadline(time.Time{})
	return st, nil
}

func (a *Agent) serveProxy(ctx context.Context, l net.Listener) {
	serveConns(ctx, l, maxProxyConns, func(c net.Conn) {
		refuseProxy(c, "503 berth: too many connections through the egress proxy in this VM")
	}, func(c net.Conn) {
		st, err := a.openToHost(&guest.Request{Op: guest.OpEgress})
		if err != nil {
			refuseProxy(c, "503 berth: egress unavailable: "+err.Error())
			return
		}
		session.Splice(c, &guest.StreamConn{Stream: st})
	})
}

// serveConns accepts l's connections until ctx ends, serving each with
// serve while at most max are served; a connection over that goes to
// busy, which closes it.
func serveConns(ctx context.Context, l net.Listener, max int, busy, serve func(net.Conn)) {
	sem := make(chan struct{}, max)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		select {
		case sem <- struct{}{}:
		default:
			busy(c)
			continue
		}
		wg.Go(func() {
			defer func() { <-sem }()
			serve(c)
		})
	}
}

// refuseProxy answers a proxy client that cannot be served with an HTTP
// error it can show, instead of a connection that just closes.
func refuseProxy(c net.Conn, status string) {
	c.SetDeadline(time.Now().Add(2 * time.Second))
	msg := status[4:]
	fmt.Fprintf(c, "HTTP/1.1 %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s\n", status, len(msg)+1, msg)
	c.Close()
}

func (a *Agent) serveDNS(ctx context.Context, pc net.PacketConn) {
	sem := make(chan struct{}, maxDNSInFlight)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		buf := make([]byte, guest.MaxDNSMessage)
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if n < 12 {
			continue
		}
		select {
		case sem <- struct{}{}:
		default:
			continue // the resolver retries
		}
		wg.Go(func() {
			defer func() { <-sem }()
			if reply := a.askHost(buf[:n], false); reply != nil {
				pc.WriteTo(reply, from)
			}
		})
	}
}

// askHost asks the host to answer a DNS query that came over UDP or TCP.
func (a *Agent) askHost(q []byte, tcp bool) []byte {
	st, err := a.openToHost(&guest.Request{Op: guest.OpDNS, Data: q, TCP: tcp})
	if err != nil {
		return dnsServFail(q)
	}
	defer st.Close()
	st.SetDeadline(time.Now().Add(8 * time.Second))
	t, p, err := guest.NewFrameReader(st).Next()
	if err != nil || t != guest.FrameResult {
		return dnsServFail(q)
	}
	var r guest.DNSReply
	if json.Unmarshal(p, &r) != nil || len(r.Data) > guest.MaxDNSMessage {
		return dnsServFail(q)
	}
	return r.Data
}

// dnsServFail answers q with SERVFAIL, for when the host cannot be asked.
func dnsServFail(q []byte) []byte {
	if len(q) < 12 {
		return nil
	}
	r := append([]byte(nil), q...)
	r[2] = 0x80 | q[2]&0x79 // QR, keep opcode and RD
	r[3] = 0x80 | 2         // RA, SERVFAIL
	return r
}

// dial connects a host stream to 127.0.0.1:port in the guest.
func (a *Agent) dial(ctx context.Context, s *stream, rw any, port int) error {
	st, ok := rw.(*yamux.Stream)
	if !ok {
		return &guest.Error{Code: guest.CodeBadRequest, Op: guest.OpDial, Message: "dial needs a multiplexed stream"}
	}
	if port < 1 || port > 65535 {
		return &guest.Error{Code: "EINVAL", Op: guest.OpDial, Message: fmt.Sprintf("port %d: use 1 to 65535", port)}
	}
	d := net.Dialer{Timeout: dialTimeout}
	c, err := d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		e := guest.ErrorFrom(guest.OpDial, "", err)
		e.Message = fmt.Sprintf("nothing answers on 127.0.0.1:%d in the VM (%s)", port, e.Message)
		return e
	}
	if err := s.sendJSON(guest.FrameResult, struct{}{}); err != nil {
		c.Close()
		return nil
	}
	session.Splice(c, &guest.StreamConn{Stream: st})
	return nil // the reply went before the bytes
}

// listenPorts reads the guest's listening TCP sockets from /proc.
func listenPorts() ([]guest.ListenPort, error) {
	seen := map[guest.ListenPort]bool{}
	var out []guest.ListenPort
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		fh, err := os.Open(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			p, ok := parseProcNetLine(sc.Text())
			if ok && !seen[p] && len(out) < 4096 {
				seen[p] = true
				out = append(out, p)
			}
		}
		fh.Close()
	}
	return out, nil
}

// parseProcNetLine parses one line of /proc/net/tcp{,6}, keeping listeners.
func parseProcNetLine(line string) (guest.ListenPort, bool) {
	f := strings.Fields(line)
	if len(f) < 4 || f[3] != "0A" { // TCP_LISTEN
		return guest.ListenPort{}, false
	}
	addr, port, ok := strings.Cut(f[1], ":")
	if !ok {
		return guest.ListenPort{}, false
	}
	n, err := strconv.ParseUint(port, 16, 16)
	if err != nil {
		return guest.ListenPort{}, false
	}
	raw, err := hex.DecodeString(addr)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return guest.ListenPort{}, false
	}
	// The kernel prints each 32-bit word in host (little endian) order.
	for i := 0; i+4 <= len(raw); i += 4 {
		raw[i], raw[i+1], raw[i+2], raw[i+3] = raw[i+3], raw[i+2], raw[i+1], raw[i]
	}
	return guest.ListenPort{Port: int(n), Addr: net.IP(raw).String()}, true
}

// proxyEnv is what managed commands get so proxy-aware tools use the
// host's egress proxy.
func (a *Agent) proxyEnv(env map[string]string) {
	if a.cfg.Proxy == "" {
		return
	}
	u := "http://" + a.cfg.Proxy
	for _, k := range []string{"http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"} {
		env[k] = u
	}
	env["no_proxy"], env["NO_PROXY"] = guest.NoProxy, guest.NoProxy
}

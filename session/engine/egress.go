package engine

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/engine/internal/lock"
)

// NetConfig configures sessions' networking. Zero values take the
// defaults.
type NetConfig struct {
	// Default is the policy of sessions created without one; "" is
	// DefaultNet.
	Default string
	// MaxConns bounds one session's open connections through the egress
	// proxy; 0 is DefaultNetMaxConns.
	MaxConns int
	// Forbidden are host ports no policy reaches, on any of the host's
	// addresses (the SSH server's port).
	Forbidden []int
	// Resolve looks names up; nil uses the system resolver. Tests point
	// names at loopback with it.
	Resolve func(ctx context.Context, host string) ([]netip.Addr, error)
	// HostAddr is where host.berth.internal leads on the host; "" is
	// 127.0.0.1.
	HostAddr string
}

// DefaultNetMaxConns bounds a session's open egress connections.
const DefaultNetMaxConns = 256

// Limits of the egress proxy.
const (
	proxyHeaderMax   = 64 << 10
	proxyHeaderWait  = 30 * time.Second
	egressDialWait   = 10 * time.Second
	resolveWait      = 5 * time.Second
	refusalNoteEvery = 10 * time.Second
)

// netState is one session's network runtime: its open egress
// connections, its refusals, its forwarded connections.
type netState struct {
	conns    atomic.Int64
	refused  atomic.Int64
	accepted atomic.Int64
	fwd      atomic.Int64 // open forwarded connections
	rx, tx   atomic.Int64 // egress bytes received from and sent to the network

	mu         lock.Mutex
	lastNote   time.Time
	suppressed int
	fwdPorts   map[int]int // open forwarded connections per guest port
}

func (m *Manager) netConfig() NetConfig {
	c := m.cfg.Net
	if c.Default == "" {
		c.Default = session.DefaultNet
	}
	if c.MaxConns <= 0 {
		c.MaxConns = DefaultNetMaxConns
	}
	if c.HostAddr == "" {
		c.HostAddr = "127.0.0.1"
	}
	return c
}

// policy returns the session's parsed policy; a record that does not
// parse (it cannot, but records come from disk) is none.
func (s *sess) policy() session.Policy {
	s.mu.Lock()
	raw := s.rec.Net
	s.mu.Unlock()
	if raw == "" {
		return session.Policy{Mode: session.NetNone}
	}
	p, err := session.ParsePolicy(raw)
	if err != nil {
		return session.Policy{Mode: session.NetNone}
	}
	return p
}

// serveGuest answers the streams c's guest opens (its egress proxy
// connections and DNS queries) until c ends.
func (s *sess) serveGuest(c *guest.Client) {
	s.m.wg.Go(func() {
		c.ServeIncoming(s.m.ctx, func(ctx context.Context, in *guest.Incoming) {
			switch in.Req.Op {
			case guest.OpEgress:
				s.serveEgress(ctx, in.Conn)
			case guest.OpDNS:
				in.Reply(guest.DNSReply{Data: s.answerDNS(ctx, in.Req.Data)})
			default:
				in.Fail(guest.CodeBadRequest, "unknown operation "+in.Req.Op)
			}
		})
	})
}

// refusal records a refused connection: counted always, noted in the
// timeline at most once per refusalNoteEvery.
func (s *sess) refusal(msg, reason string) {
	ns := &s.net
	ns.refused.Add(1)
	ns.mu.Lock()
	now := time.Now()
	if now.Sub(ns.lastNote) < refusalNoteEvery {
		ns.suppressed++
		ns.mu.Unlock()
		return
	}
	more := ns.suppressed
	ns.lastNote, ns.suppressed = now, 0
	ns.mu.Unlock()
	note := msg
	if reason != "" {
		note += ": " + reason
	}
	if more > 0 {
		note += fmt.Sprintf(" (and %d more refusals since the last note)", more)
	}
	if s.note != nil {
		s.note(note)
		return
	}
	s.m.event(session.Event{Kind: session.EventNote, Name: s.name, Message: note})
}

// errRefused is a connection the policy does not allow.
type errRefused struct{ msg, reason string }

func (e *errRefused) Error() string { return e.msg }

// dialEgress checks hostport against the session's policy and connects to
// an address it allows. The name is resolved here, never in the guest, and
// every address is checked before it is dialled.
func (s *sess) dialEgress(ctx context.Context, hostport string) (net.Conn, error) {
	cfg := s.m.netConfig()
	pol := s.policy()
	host, ps, err := net.SplitHostPort(hostport)
	if err != nil {
		return nil, fmt.Errorf("bad target %q: %v", hostport, err)
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port < 1 || port > 65535 {
		return nil, fmt.Errorf("bad port in %q", hostport)
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	refuse := func(reason string) error {
		return &errRefused{msg: session.EgressRefused(net.JoinHostPort(host, ps), s.name, pol.String()), reason: reason}
	}
	// berth's own ports, on loopback and on every address of this host
	// (an SSH server on :2222 listens on the public one too).
	forbidden := func(a netip.Addr) bool {
		if !slices.Contains(cfg.Forbidden, port) {
			return false
		}
		return session.Reserved(a) || localAddr(a)
	}
	if guestLoopback(host) {
		// Only a client that ignores no_proxy sends these here (busybox
		// wget does): it means the guest's own loopback, never the host's.
		c, err := s.connectedAgent()
		if err != nil {
			return nil, err
		}
		sc, err := c.DialGuest(ctx, port)
		if err != nil {
			return nil, fmt.Errorf("nothing listens on %s in the VM: %v", net.JoinHostPort(host, ps), err)
		}
		return sc, nil
	}
	var addrs []netip.Addr
	switch a, aerr := netip.ParseAddr(host); {
	case host == session.HostName:
		if !pol.AllowsHost(port) {
			return nil, refuse("the host is reachable only where the policy names " + session.HostName)
		}
		ha, err := netip.ParseAddr(cfg.HostAddr)
		if err != nil {
			return nil, fmt.Errorf("host address %q: %v", cfg.HostAddr, err)
		}
		if forbidden(ha) {
			return nil, refuse("berth's own ports are never reachable")
		}
		addrs = []netip.Addr{ha}
	case aerr == nil:
		if forbidden(a) || !pol.AllowsAddr(a, port, false) {
			return nil, refuse("")
		}
		addrs = []netip.Addr{a}
	default:
		if !pol.AllowsName(host, port) {
			return nil, refuse("")
		}
		rctx, cancel := context.WithTimeout(ctx, resolveWait)
		found, err := s.m.resolve(rctx, host)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("cannot resolve %s: %v", host, err)
		}
		for _, a := range found {
			if !forbidden(a) && pol.AllowsAddr(a, port, true) {
				addrs = append(addrs, a)
			}
		}
		if len(addrs) == 0 {
			if len(found) > 0 {
				return nil, refuse(fmt.Sprintf("%s resolves to %s, which the policy does not name", host, found[0]))
			}
			return nil, fmt.Errorf("cannot resolve %s: no addresses", host)
		}
	}
	d := net.Dialer{Timeout: egressDialWait}
	var last error
	for _, a := range addrs {
		c, err := d.DialContext(ctx, "tcp", netip.AddrPortFrom(a, uint16(port)).String())
		if err == nil {
			return c, nil
		}
		last = err
	}
	return nil, last
}

// localAddr reports whether a is an address of one of this host's
// interfaces.
func localAddr(a netip.Addr) bool {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return true // cannot tell: treat it as ours
	}
	for _, ia := range addrs {
		if n, ok := ia.(*net.IPNet); ok {
			if b, ok := netip.AddrFromSlice(n.IP); ok && b.Unmap() == a.Unmap() {
				return true
			}
		}
	}
	return false
}

// guestLoopback reports whether a request's host is loopback as written:
// localhost, 127.0.0.0/8 or ::1.
func guestLoopback(host string) bool {
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.Unmap().IsLoopback()
}

func (m *Manager) resolve(ctx context.Context, host string) ([]netip.Addr, error) {
	if r := m.cfg.Net.Resolve; r != nil {
		return r(ctx, host)
	}
	return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
}

// budgetReader fails once more than its budget is read: it bounds a
// request's header.
type budgetReader struct {
	r io.Reader
	n int64
}

func (b *budgetReader) Read(p []byte) (int, error) {
	if b.n <= 0 {
		return 0, errors.New("request header too large")
	}
	if int64(len(p)) > b.n {
		p = p[:b.n]
	}
	n, err := b.r.Read(p)
	b.n -= int64(n)
	return n, err
}

// proxyReply writes an HTTP error the guest's client shows: the message is
// the reason phrase and the body.
func proxyReply(w io.Writer, code int, msg string) {
	body := msg + "\n"
	fmt.Fprintf(w, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\nX-Berth-Error: %s\r\n\r\n%s",
		code, strings.ReplaceAll(msg, "\n", " "), len(body), strings.ReplaceAll(msg, "\n", " "), body)
}

// hop-by-hop headers a proxy does not pass on.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// serveEgress serves one guest connection to the agent's proxy port as an
// HTTP proxy: CONNECT tunnels and absolute-URL requests, each checked
// against the session's policy.
func (s *sess) serveEgress(ctx context.Context, conn net.Conn) {
	defer conn.Close()
	cfg := s.m.netConfig()
	ns := &s.net
	if ns.conns.Add(1) > int64(cfg.MaxConns) {
		ns.conns.Add(-1)
		s.refusal(fmt.Sprintf("berth: session %s has %d egress connections open, the most allowed (net_max_conns)", s.name, cfg.MaxConns), "")
		proxyReply(conn, http.StatusServiceUnavailable, fmt.Sprintf("berth: session %s has too many egress connections open (net_max_conns = %d)", s.name, cfg.MaxConns))
		return
	}
	defer ns.conns.Add(-1)
	budget := &budgetReader{r: conn, n: proxyHeaderMax}
	br := bufio.NewReaderSize(budget, 16<<10)
	conn.SetReadDeadline(time.Now().Add(proxyHeaderWait))
	req, err := http.ReadRequest(br)
	if err != nil {
		if err != io.EOF {
			proxyReply(conn, http.StatusBadRequest, "berth: the egress proxy could not read the request: "+trimErr(err))
		}
		return
	}
	conn.SetReadDeadline(time.Time{})
	budget.n = 1 << 62 // the body and the tunnel are not bounded here
	s.touch()
	if req.Method == http.MethodConnect {
		s.tunnel(ctx, conn, br, req)
		return
	}
	s.forwardHTTP(ctx, conn, req)
}

func trimErr(err error) string {
	msg := err.Error()
	if len(msg) > 200 {
		msg = msg[:200]
	}
	return msg
}

// fail answers a connection that could not be made: 403 for a refusal,
// 502 otherwise.
func (s *sess) failEgress(conn net.Conn, err error) {
	var r *errRefused
	if errors.As(err, &r) {
		s.refusal(r.msg, r.reason)
		proxyReply(conn, http.StatusForbidden, r.msg)
		return
	}
	proxyReply(conn, http.StatusBadGateway, "berth: egress failed: "+trimErr(err))
}

func (s *sess) tunnel(ctx context.Context, conn net.Conn, br *bufio.Reader, req *http.Request) {
	target := req.Host
	if _, _, err := net.SplitHostPort(target); err != nil {
		target = net.JoinHostPort(target, "443")
	}
	up, err := s.dialEgress(ctx, target)
	if err != nil {
		s.failEgress(conn, err)
		return
	}
	s.net.accepted.Add(1)
	up = &countedConn{Conn: up, ns: &s.net}
	if _, err := io.WriteString(conn, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		up.Close()
		return
	}
	if n := br.Buffered(); n > 0 { // bytes the client sent before our answer
		b, _ := br.Peek(n)
		if _, err := up.Write(b); err != nil {
			up.Close()
			return
		}
	}
	session.Splice(conn, up)
}

// forwardHTTP passes one plain HTTP request on and its response back, then
// ends the connection (clients open another for the next request).
func (s *sess) forwardHTTP(ctx context.Context, conn net.Conn, req *http.Request) {
	if !req.URL.IsAbs() || req.URL.Host == "" {
		proxyReply(conn, http.StatusBadRequest, "berth: this is berth's egress proxy: send absolute URLs (http_proxy) or CONNECT (https_proxy)")
		return
	}
	if req.URL.Scheme != "http" {
		proxyReply(conn, http.StatusBadRequest, "berth: the egress proxy forwards http:// URLs; use CONNECT for "+req.URL.Scheme)
		return
	}
	target := req.URL.Host
	if _, _, err := net.SplitHostPort(target); err != nil {
		target = net.JoinHostPort(strings.Trim(target, "[]"), "80")
	}
	up, err := s.dialEgress(ctx, target)
	if err != nil {
		s.failEgress(conn, err)
		return
	}
	defer up.Close()
	s.net.accepted.Add(1)
	up = &countedConn{Conn: up, ns: &s.net}
	for _, h := range hopHeaders {
		req.Header.Del(h)
	}
	req.Close = true
	req.RequestURI = ""
	stop := context.AfterFunc(ctx, func() { up.Close(); conn.Close() })
	defer stop()
	if err := req.Write(up); err != nil {
		proxyReply(conn, http.StatusBadGateway, "berth: egress failed sending the request: "+trimErr(err))
		return
	}
	ubr := bufio.NewReaderSize(up, 32<<10)
	for {
		resp, err := http.ReadResponse(ubr, req)
		if err != nil {
			proxyReply(conn, http.StatusBadGateway, "berth: egress failed reading the response: "+trimErr(err))
			return
		}
		if resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
			writeResponse(conn, resp, req.Method) // 100 Continue and friends: the final answer follows
			continue
		}
		writeResponse(conn, resp, req.Method)
		resp.Body.Close()
		return
	}
}

// writeResponse passes a response on, ending the connection after it: its
// header in one write, its body as it arrives in large reads (each a
// multiplexer frame on the agent channel). A body of unknown length
// (chunked upstream) is delimited by the close.
func writeResponse(conn net.Conn, resp *http.Response, method string) error {
	var hdr bytes.Buffer
	fmt.Fprintf(&hdr, "HTTP/%d.%d %s\r\n", resp.ProtoMajor, resp.ProtoMinor, resp.Status)
	h := resp.Header.Clone()
	for _, k := range hopHeaders {
		h.Del(k)
	}
	informational := resp.StatusCode < 200
	if !informational {
		if resp.ContentLength >= 0 && method != http.MethodHead {
			h.Set("Content-Length", strconv.FormatInt(resp.ContentLength, 10))
		} else if resp.ContentLength < 0 {
			h.Del("Content-Length")
		}
		h.Set("Connection", "close")
	}
	h.Write(&hdr)
	hdr.WriteString("\r\n")
	if _, err := conn.Write(hdr.Bytes()); err != nil || informational || resp.Body == nil {
		return err
	}
	buf := make([]byte, session.SpliceBuffer)
	_, err := io.CopyBuffer(struct{ io.Writer }{conn}, struct{ io.Reader }{resp.Body}, buf)
	return err
}

// countedConn counts an egress connection's bytes into its session's
// figures.
type countedConn struct {
	net.Conn
	ns *netState
}

func (c *countedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.ns.rx.Add(int64(n))
	return n, err
}

func (c *countedConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.ns.tx.Add(int64(n))
	return n, err
}

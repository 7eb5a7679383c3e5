// Package egress is a session's way out: the HTTP proxy (CONNECT tunnels
// and absolute-URL requests) and the DNS responder that the guest's agent
// forwards to the host, each connection and each name checked against the
// session's policy (package session's Policy). Names are resolved here,
// never in the guest, and every address is checked before it is dialled.
package egress

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

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/engine/internal/lock"
)

// Config configures sessions' networking. Zero values take the
// defaults.
type Config struct {
	// Default is the policy of sessions created without one; "" is
	// session.DefaultNet.
	Default string
	// MaxConns bounds one session's open connections through the egress
	// proxy; 0 is DefaultMaxConns.
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

// DefaultMaxConns bounds a session's open egress connections.
const DefaultMaxConns = 256

// Limits of the egress proxy.
const (
	proxyHeaderMax   = 64 << 10
	proxyHeaderWait  = 30 * time.Second
	egressDialWait   = 10 * time.Second
	resolveWait      = 5 * time.Second
	refusalNoteEvery = 10 * time.Second
)

// Counters are one session's egress figures and the pacing of its refusal
// notes. The engine keeps one per session; the proxy updates it.
type Counters struct {
	Conns    atomic.Int64 // open now
	Refused  atomic.Int64
	Accepted atomic.Int64
	// RX and TX are bytes received from and sent to the network.
	RX, TX atomic.Int64

	// Resolved is what berth's DNS answered the guest: the NIC's flows
	// are allowed by name through it.
	Resolved Resolved

	mu         lock.Mutex // a leaf
	lastNote   time.Time
	suppressed int
}

// Session is one session as the proxy sees it.
type Session interface {
	Name() string
	// Policy is the session's policy now: it can change while the session
	// runs, and each new connection reads it.
	Policy() session.Policy
	// DialGuest connects to port on the guest's own loopback.
	DialGuest(ctx context.Context, port int) (net.Conn, error)
	// Touch counts as activity: a session in use is not put to sleep.
	Touch()
	// Note puts a line in the session's timeline (a build's progress).
	Note(msg string)
	// Counters are where its figures are kept.
	Counters() *Counters
}

// Proxy serves every session's egress.
type Proxy struct {
	cfg Config
}

// New returns a proxy with cfg, its zero fields defaulted.
func New(cfg Config) *Proxy {
	if cfg.Default == "" {
		cfg.Default = session.DefaultNet
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.HostAddr == "" {
		cfg.HostAddr = "127.0.0.1"
	}
	return &Proxy{cfg: cfg}
}

// Config is the proxy's configuration, its defaults filled in.
func (p *Proxy) Config() Config { return p.cfg }

// refusal records a refused connection: counted always, noted in the
// timeline at most once per refusalNoteEvery.
func (p *Proxy) refusal(s Session, msg, reason string) {
	s.Counters().Refused.Add(1)
	p.note(s, msg, reason)
}

// note puts msg in the timeline at most once per refusalNoteEvery, saying
// how many were held back since.
func (p *Proxy) note(s Session, msg, reason string) {
	ns := s.Counters()
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
	s.Note(note)
}

// errRefused is a connection the policy does not allow.
type errRefused struct{ msg, reason string }

func (e *errRefused) Error() string { return e.msg }

// dialEgress checks hostport against the session's policy and connects to
// an address it allows. The name is resolved here, never in the guest, and
// every address is checked before it is dialled.
func (p *Proxy) dial(ctx context.Context, s Session, hostport string) (net.Conn, error) {
	cfg := p.cfg
	pol := s.Policy()
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
		return &errRefused{msg: session.EgressRefused(net.JoinHostPort(host, ps), s.Name(), pol.String()), reason: reason}
	}
	refuseReserved := func(host string, a netip.Addr, r netip.Prefix) error {
		return &errRefused{msg: session.EgressRefusedReserved(net.JoinHostPort(host, ps), s.Name(), pol.String(), host, a, r)}
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
		sc, err := s.DialGuest(ctx, port)
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
		if forbidden(a) {
			return nil, refuse("berth's own ports are never reachable")
		}
		if !pol.AllowsAddr(a, port, false) {
			if r, ok := session.ReservedRange(a); ok {
				return nil, refuseReserved(host, a, r)
			}
			return nil, refuse("")
		}
		addrs = []netip.Addr{a}
	default:
		if !pol.AllowsName(host, port) {
			return nil, refuse("")
		}
		rctx, cancel := context.WithTimeout(ctx, resolveWait)
		found, err := p.resolve(rctx, host)
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
				if r, ok := session.ReservedRange(found[0]); ok && !forbidden(found[0]) {
					return nil, refuseReserved(host, found[0].Unmap(), r)
				}
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

// Serve serves one guest connection to the agent's proxy port as an
// HTTP proxy: CONNECT tunnels and absolute-URL requests, each checked
// against the session's policy.
func (p *Proxy) Serve(ctx context.Context, s Session, conn net.Conn) {
	defer conn.Close()
	cfg := p.cfg
	ns := s.Counters()
	if ns.Conns.Add(1) > int64(cfg.MaxConns) {
		ns.Conns.Add(-1)
		p.refusal(s, fmt.Sprintf("berth: session %s has %d egress connections open, the most allowed (net_max_conns)", s.Name(), cfg.MaxConns), "")
		proxyReply(conn, http.StatusServiceUnavailable, fmt.Sprintf("berth: session %s has too many egress connections open (net_max_conns = %d)", s.Name(), cfg.MaxConns))
		return
	}
	defer ns.Conns.Add(-1)
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
	s.Touch()
	if req.Method == http.MethodConnect {
		p.tunnel(ctx, s, conn, br, req)
		return
	}
	p.forwardHTTP(ctx, s, conn, req)
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
func (p *Proxy) fail(s Session, conn net.Conn, err error) {
	var r *errRefused
	if errors.As(err, &r) {
		p.refusal(s, r.msg, r.reason)
		proxyReply(conn, http.StatusForbidden, r.msg)
		return
	}
	proxyReply(conn, http.StatusBadGateway, "berth: egress failed: "+trimErr(err))
}

func (p *Proxy) tunnel(ctx context.Context, s Session, conn net.Conn, br *bufio.Reader, req *http.Request) {
	target := req.Host
	if _, _, err := net.SplitHostPort(target); err != nil {
		target = net.JoinHostPort(target, "443")
	}
	up, err := p.dial(ctx, s, target)
	if err != nil {
		p.fail(s, conn, err)
		return
	}
	s.Counters().Accepted.Add(1)
	up = &countedConn{Conn: up, ns: s.Counters()}
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
func (p *Proxy) forwardHTTP(ctx context.Context, s Session, conn net.Conn, req *http.Request) {
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
	up, err := p.dial(ctx, s, target)
	if err != nil {
		p.fail(s, conn, err)
		return
	}
	defer up.Close()
	s.Counters().Accepted.Add(1)
	up = &countedConn{Conn: up, ns: s.Counters()}
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
	ns *Counters
}

func (c *countedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.ns.RX.Add(int64(n))
	return n, err
}

func (c *countedConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.ns.TX.Add(int64(n))
	return n, err
}

func (p *Proxy) resolve(ctx context.Context, host string) ([]netip.Addr, error) {
	if r := p.cfg.Resolve; r != nil {
		return r(ctx, host)
	}
	return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
}

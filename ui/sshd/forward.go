package sshd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"

	"github.com/berthvm/berth/session"
)

// forwardConnectWait bounds waking a session and connecting for one
// forwarded channel.
const forwardConnectWait = 2 * time.Minute

// directTCPIP is a direct-tcpip channel's extra data (RFC 4254 §7.2).
type directTCPIP struct {
	DestAddr   string
	DestPort   uint32
	OriginAddr string
	OriginPort uint32
}

// handleDirectTCPIP serves `ssh -L LOCAL:localhost:PORT NAME@HOST`: the
// channel is joined to 127.0.0.1:PORT inside session NAME's VM over its
// agent channel, never to anything on the host. A destination other than
// localhost names the session itself (`-L 8080:NAME:8080`). The key's role
// must allow forwarding; a sleeping session is woken.
func (s *Server) handleDirectTCPIP(_ *ssh.Server, _ *gossh.ServerConn, nc gossh.NewChannel, ctx ssh.Context) {
	var d directTCPIP
	if err := gossh.Unmarshal(nc.ExtraData(), &d); err != nil {
		nc.Reject(gossh.ConnectionFailed, "berth: malformed direct-tcpip request")
		return
	}
	if !s.begin() {
		nc.Reject(gossh.ResourceShortage, "berth: the server is shutting down")
		return
	}
	defer s.handlers.Done()
	c, _ := ctx.Value(connKey{}).(*conn)
	if c == nil {
		nc.Reject(gossh.Prohibited, "berth: connection state lost")
		return
	}
	kp := c.key.Load()
	if kp == nil {
		nc.Reject(gossh.Prohibited, "berth: the connection did not authenticate with a key")
		return
	}
	ak, err := s.keys.lookup(*kp)
	if err != nil {
		nc.Reject(gossh.Prohibited, "berth: "+oneLine(err))
		return
	}
	name := forwardSession(ctx.User(), d.DestAddr)
	if d.DestPort < 1 || d.DestPort > 65535 {
		nc.Reject(gossh.ConnectionFailed, fmt.Sprintf("berth: port %d: use 1 to 65535", d.DestPort))
		return
	}
	cctx, cancel := context.WithTimeout(ctx, forwardConnectWait)
	gc, err := s.serviceFor(ak).Forward(cctx, name, int(d.DestPort))
	cancel()
	if err != nil {
		reason := gossh.ConnectionFailed
		if errors.Is(err, session.ErrPermission) {
			reason = gossh.Prohibited
		}
		s.log.Info("ssh: forward refused", "key", ak.Name(), "session", name, "port", d.DestPort, "err", err)
		nc.Reject(reason, "berth: "+oneLine(err))
		return
	}
	ch, reqs, err := nc.Accept()
	if err != nil {
		gc.Close()
		return
	}
	go gossh.DiscardRequests(reqs)
	c.busy.Add(1)
	defer c.busy.Add(-1)
	session.Splice(&channelConn{Channel: ch}, gc)
}

// forwardSession picks the session a forward goes to: the login name for
// a loopback destination, else the destination itself.
func forwardSession(user, dest string) string {
	switch strings.ToLower(strings.Trim(dest, "[]")) {
	case "", "localhost", "127.0.0.1", "::1", "0.0.0.0":
		return user
	}
	return dest
}

// channelConn is an SSH channel as a net.Conn for Splice.
type channelConn struct{ gossh.Channel }

func (c *channelConn) LocalAddr() net.Addr                { return forwardAddr{} }
func (c *channelConn) RemoteAddr() net.Addr               { return forwardAddr{} }
func (c *channelConn) SetDeadline(t time.Time) error      { return nil }
func (c *channelConn) SetReadDeadline(t time.Time) error  { return nil }
func (c *channelConn) SetWriteDeadline(t time.Time) error { return nil }

type forwardAddr struct{}

func (forwardAddr) Network() string { return "ssh" }
func (forwardAddr) String() string  { return "ssh-channel" }

// SetNet changes a session's network policy.
func (g *guard) SetNet(ctx context.Context, name, policy string) (session.Session, error) {
	return call(g, ctx, session.ActionNet, func(ctx context.Context) (session.Session, error) { return g.svc.SetNet(ctx, name, policy) })
}

// Forward connects into a session's VM.
func (g *guard) Forward(ctx context.Context, name string, port int) (net.Conn, error) {
	return call(g, ctx, session.ActionNet, func(ctx context.Context) (net.Conn, error) { return g.svc.Forward(ctx, name, port) })
}

// NetStatus reads a session's network.
func (g *guard) NetStatus(ctx context.Context, name string) (session.NetStatus, error) {
	return call(g, ctx, session.ActionRead, func(ctx context.Context) (session.NetStatus, error) { return g.svc.NetStatus(ctx, name) })
}

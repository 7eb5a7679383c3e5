package api

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/berthvm/berth/session"
)

// SetNet changes a session's network policy.
func (c *Client) SetNet(ctx context.Context, name, policy string) (session.Session, error) {
	var out session.Session
	p, err := sessionPath(name, "/net")
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, http.MethodPut, p, nil, netRequest{Policy: policy}, &out)
}

// NetStatus reports a session's network.
func (c *Client) NetStatus(ctx context.Context, name string) (session.NetStatus, error) {
	var out session.NetStatus
	p, err := sessionPath(name, "/net")
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, http.MethodGet, p, nil, nil, &out)
}

// Forward opens a connection to 127.0.0.1:port in the session's VM: one
// socket connection to the daemon, upgraded to a byte stream. ctx bounds
// the connect.
func (c *Client) Forward(ctx context.Context, name string, port int) (net.Conn, error) {
	p, err := sessionPath(name, "/forward/"+strconv.Itoa(port))
	if err != nil {
		return nil, err
	}
	req, err := c.newRequest(ctx, http.MethodGet, p, nil, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", ForwardProtocol)
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, c.transportError(ctx, err)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	fail := func(err error) (net.Conn, error) {
		stop()
		conn.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	if err := req.Write(conn); err != nil {
		return fail(c.transportError(ctx, err))
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return fail(c.transportError(ctx, err))
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer resp.Body.Close()
		if resp.StatusCode/100 == 2 {
			return fail(fmt.Errorf("daemon answered %s to a forward: %w", resp.Status, session.ErrUnavailable))
		}
		return fail(readError(resp))
	}
	if !stop() {
		return fail(ctx.Err())
	}
	return &upgradedConn{Conn: conn, r: br}, nil
}

// upgradedConn reads through the buffer that read the upgrade's answer.
type upgradedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *upgradedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CloseWrite half-closes the socket connection.
func (c *upgradedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}

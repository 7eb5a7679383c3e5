package session

import (
	"context"
	"net"
)

// Networker controls a session's network: its egress policy and
// connections forwarded into its VM.
type Networker interface {
	// SetNet changes the session's egress policy; running sessions apply
	// it to new connections at once.
	SetNet(ctx context.Context, name, policy string) (Session, error)
	// Forward opens a connection to 127.0.0.1:port inside the session's
	// VM, carried over the agent channel (it needs no network policy). A
	// sleeping session is woken. Nothing listening there is an error
	// wrapping ErrUnavailable that says so.
	Forward(ctx context.Context, name string, port int) (net.Conn, error)
	// NetStatus reports the session's policy, the TCP ports its guest
	// listens on (running sessions only) and its connections.
	NetStatus(ctx context.Context, name string) (NetStatus, error)
}

// NetStatus is a session's network as it is now.
type NetStatus struct {
	Policy string `json:"policy"`
	// Listening are the guest's listening TCP ports (empty unless running).
	Listening []ListenPort `json:"listening,omitempty"`
	// Forwarded counts open forwarded connections per guest port.
	Forwarded map[int]int `json:"forwarded,omitempty"`
	// Egress counts: connections open through the proxy now, and since the
	// daemon started those made and those refused.
	Open     int64 `json:"open"`
	Accepted int64 `json:"accepted"`
	Refused  int64 `json:"refused"`
	// Bytes received from and sent to the network through the proxy.
	ReceivedBytes int64 `json:"received_bytes"`
	SentBytes     int64 `json:"sent_bytes"`
}

// ListenPort is a TCP port a process in the guest listens on.
type ListenPort struct {
	Port int    `json:"port"`
	Addr string `json:"addr"`
}

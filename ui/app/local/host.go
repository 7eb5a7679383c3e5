package local

import (
	"context"
	"fmt"
	"net"
	"strings"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/api"
	"github.com/berthvm/berth/session/fleet/pki"
	"github.com/berthvm/berth/ui/cli"
)

// hostAddr is --host's HOST:PORT: tcp://HOST:PORT, or HOST:PORT.
func hostAddr(host string) (string, error) {
	addr := strings.TrimPrefix(host, "tcp://")
	if _, _, err := net.SplitHostPort(addr); err != nil || strings.Contains(addr, "/") {
		return "", fmt.Errorf("--host %q: want tcp://HOST:PORT, a fleet host's --listen address: %w", host, session.ErrInvalid)
	}
	return addr, nil
}

// dialHost is a client for the berth at g.Host: over mutual TLS with
// the client certificate in g.CertDir, or in plain text on loopback
// (a fleet without a CA).
func dialHost(g cli.Globals, who string) (*api.Client, error) {
	addr, err := hostAddr(g.Host)
	if err != nil {
		return nil, err
	}
	if g.CertDir == "" {
		h, _, _ := net.SplitHostPort(addr)
		if ip := net.ParseIP(h); h != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return nil, fmt.Errorf("--host %s: a host beyond loopback is reached over mutual TLS: give --cert-dir DIR or BERTH_CERT_DIR (berth fleet cert --dir CA --name NAME --out DIR makes one): %w", g.Host, session.ErrInvalid)
		}
		return api.DialTCP(addr, api.WithActor(who)), nil
	}
	cfg, err := pki.ClientConfig(g.CertDir)
	if err != nil {
		return nil, fmt.Errorf("--cert-dir: %w", err)
	}
	return api.DialTLS(addr, cfg, api.WithActor(who)), nil
}

// connectHost reaches the berth at g.Host; it starts nothing: a remote
// daemon is its host's to run.
func connectHost(ctx context.Context, g cli.Globals, who string) (*api.Client, error) {
	c, err := dialHost(g, who)
	if err != nil {
		return nil, err
	}
	if c.Reachable(ctx) {
		return c, nil
	}
	// A call says why (refused, no route, a certificate refused), naming
	// the address.
	if _, err := c.Ping(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

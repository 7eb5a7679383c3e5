package daemon

import (
	"context"
	"net"
	"net/netip"
	"strings"

	"github.com/berthvm/berth/session/engine/egress"
)

// netConfig is the Manager's network configuration from the config file
// and the daemon's options.
func netConfig(cfg Config, o Options) egress.Config {
	nc := egress.Config{Default: cfg.Net, MaxConns: cfg.NetMaxConns, Forbidden: o.Forbidden}
	if pinned := parseHosts(o.Hosts); len(pinned) > 0 {
		nc.Resolve = func(ctx context.Context, host string) ([]netip.Addr, error) {
			if a, ok := pinned[strings.ToLower(host)]; ok {
				return []netip.Addr{a}, nil
			}
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	return nc
}

// parseHosts reads "name=addr,…"; malformed pairs are skipped.
func parseHosts(s string) map[string]netip.Addr {
	out := map[string]netip.Addr{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if a, err := netip.ParseAddr(v); ok && err == nil {
			out[strings.ToLower(k)] = a
		}
	}
	return out
}

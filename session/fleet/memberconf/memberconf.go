// Package memberconf is the configuration and the flags of one embedded
// etcd member, apart from package member, which runs it: berth's own
// binary parses `berth etcd` with it and hands the member to berth-etcd,
// so it does not link etcd's server.
package memberconf

import (
	"errors"
	"flag"
	"strconv"
)

// Config is one embedded etcd member (package member runs it).
// Zero fields take the defaults said on each.
type Config struct {
	// Name is the member's name, unique in its cluster.
	Name string
	// Dir is the member's data directory.
	Dir string
	// ListenClient and ListenPeer are http://IP:PORT URLs. Plain text is
	// allowed on loopback only (TLS between members is not built yet);
	// port 0 picks a free port (tests), ClientURLs says which.
	ListenClient, ListenPeer string
	// InitialCluster is "NAME=PEER_URL,…" for a new cluster of several
	// members; default: this member alone.
	InitialCluster string
	// CA, if set, is the fleet's CA directory (berth fleet init): the
	// member gets a certificate of it (issued into Dir/tls on first start)
	// and serves clients and peers over mutual TLS only, on https URLs.
	CA string
	// Verbose passes etcd's own log (info and up) to stderr; default:
	// etcd logs nothing.
	Verbose bool
}

// Bind defines `berth etcd`'s flags on fs, filling c.
func (c *Config) Bind(fs *flag.FlagSet) {
	fs.StringVar(&c.Name, "name", "", "the member's `NAME`, unique in its cluster")
	fs.StringVar(&c.Dir, "data", "", "keep the member's data in `DIR`")
	fs.StringVar(&c.ListenClient, "listen-client", "http://127.0.0.1:2379", "serve clients on `URL` (default http://127.0.0.1:2379)")
	fs.StringVar(&c.ListenPeer, "listen-peer", "http://127.0.0.1:2380", "serve other members on `URL` (default http://127.0.0.1:2380)")
	fs.StringVar(&c.InitialCluster, "initial-cluster", "", "a new cluster's members, `N=URL,…` (default: this one alone)")
	fs.StringVar(&c.CA, "fleet-ca", "", "serve over mutual TLS with a certificate of the fleet CA in `DIR` (berth fleet init)")
	fs.BoolVar(&c.Verbose, "v", false, "etcd's own log on stderr")
}

// Check refuses a config without what it cannot default.
func (c Config) Check() error {
	if c.Name == "" || c.Dir == "" {
		return errors.New("--name and --data are needed")
	}
	return nil
}

// Args are the flags that give c to Bind again: how berth hands a parsed
// `berth etcd` to berth-etcd.
func (c Config) Args() []string {
	args := []string{"--name", c.Name, "--data", c.Dir, "--listen-client", c.ListenClient, "--listen-peer", c.ListenPeer}
	if c.InitialCluster != "" {
		args = append(args, "--initial-cluster", c.InitialCluster)
	}
	if c.CA != "" {
		args = append(args, "--fleet-ca", c.CA)
	}
	return append(args, "-v="+strconv.FormatBool(c.Verbose))
}

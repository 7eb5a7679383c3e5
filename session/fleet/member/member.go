// Package member runs one embedded etcd member for a berth fleet: what
// `berth etcd` starts for people who have no etcd yet. It checks its
// URLs and data directory before etcd sees them, so a mistake reads as
// one line, and it remembers in the data directory which member and
// cluster that directory belongs to.
package member

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/berthvm/berth/session/fleet/memberconf"
	"github.com/berthvm/berth/session/fleet/pki"
)

// Config is one member; see memberconf.Config, where it is declared so
// that berth's own binary can parse `berth etcd` without linking etcd's
// server.
type Config = memberconf.Config

// markerFile, in Dir, says which member and cluster Dir belongs to.
const markerFile = "berth-member.json"

type marker struct {
	Name           string `json:"name"`
	ClusterID      string `json:"cluster_id"`
	InitialCluster string `json:"initial_cluster"`
}

// Member is a running member.
type Member struct {
	e     *embed.Etcd
	cfg   Config
	lock  *os.File // Dir's lock, held while the member runs
	close sync.Once
}

// ParseURL checks a listen URL as Start takes it: an IP literal (etcd
// binds it), a port, nothing else; https with TLS, else http on loopback
// only. flag names it in the error ("--listen-client").
func ParseURL(flag, s string, withTLS bool) (*url.URL, error) {
	u, err := url.Parse(s)
	bad := func(why string) error {
		return fmt.Errorf("%s %q: %s: want http://IP:PORT, such as http://127.0.0.1:2379", flag, s, why)
	}
	if err != nil {
		return nil, bad("not a URL")
	}
	switch {
	case withTLS && u.Scheme != "https":
		return nil, fmt.Errorf("%s %q: with a fleet CA the scheme must be https", flag, s)
	case !withTLS && u.Scheme == "https":
		return nil, bad("https needs the fleet's CA (--fleet-ca DIR)")
	case !withTLS && u.Scheme != "http":
		return nil, bad("the scheme must be http")
	case u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "":
		return nil, bad("only a scheme, an address and a port")
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil || port == "" {
		return nil, bad("no port")
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return nil, bad("the host must be an IP address")
	}
	if !withTLS && !ip.IsLoopback() {
		return nil, bad("plain text is for loopback only: give --fleet-ca DIR and https URLs")
	}
	u.Path = ""
	return u, nil
}

// Start starts the member and waits until it serves clients (for a new
// cluster of several, until a quorum has met) or ctx ends.
func Start(ctx context.Context, c Config) (_ *Member, err error) {
	if c.Name == "" || strings.ContainsAny(c.Name, "=,") {
		return nil, fmt.Errorf("--name %q: want a name without '=' or ','", c.Name)
	}
	if c.Dir == "" {
		return nil, errors.New("--data: a data directory is needed")
	}
	withTLS := c.CA != ""
	cu, err := ParseURL("--listen-client", c.ListenClient, withTLS)
	if err != nil {
		return nil, err
	}
	pu, err := ParseURL("--listen-peer", c.ListenPeer, withTLS)
	if err != nil {
		return nil, err
	}
	initial := c.InitialCluster
	if initial == "" {
		initial = c.Name + "=" + pu.String()
	}
	if err := checkInitialCluster(initial, c.Name, pu.String(), withTLS); err != nil {
		return nil, err
	}
	old, err := checkDir(c.Dir, c.Name, c.InitialCluster)
	if err != nil {
		return nil, err
	}
	// etcd itself would wait for a running member's file locks for ever.
	lock, err := lockDir(c.Dir)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			lock.Close()
		}
	}()

	var tlsFiles pki.Files
	if withTLS {
		// Start makes Dir; the certificate goes inside it.
		if err := os.MkdirAll(c.Dir, 0o700); err != nil {
			return nil, fmt.Errorf("--data %s: %w", c.Dir, err)
		}
		out := filepath.Join(c.Dir, "tls")
		ips := []net.IP{net.ParseIP(cu.Hostname()), net.ParseIP(pu.Hostname())}
		if err := pki.Ensure(c.CA, out, c.Name, nil, ips); err != nil {
			return nil, err
		}
		if tlsFiles, err = pki.Load(out); err != nil {
			return nil, err
		}
	}

	cfg := embed.NewConfig()
	cfg.Name, cfg.Dir = c.Name, c.Dir
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = initial
	cfg.InitialClusterToken = "berth"
	// No metrics listener, no HTTP gateway: the client URL serves gRPC.
	cfg.EnableGRPCGateway = false
	if withTLS {
		ti := transport.TLSInfo{CertFile: tlsFiles.Cert, KeyFile: tlsFiles.Key, TrustedCAFile: tlsFiles.CA, ClientCertAuth: true}
		cfg.ClientTLSInfo, cfg.PeerTLSInfo = ti, ti
	}
	if c.Verbose {
		cfg.LogLevel = "info"
	} else {
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("start etcd member %s: %w (another etcd or program listens there: pick another port)", c.Name, err)
		}
		return nil, fmt.Errorf("start etcd member %s: %w", c.Name, err)
	}
	defer func() {
		if err != nil {
			e.Close()
		}
	}()
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		return nil, fmt.Errorf("etcd member %s: %w", c.Name, err)
	case <-ctx.Done():
		return nil, fmt.Errorf("etcd member %s did not become ready (a new cluster waits for a quorum of its --initial-cluster): %w", c.Name, ctx.Err())
	}
	cid := e.Server.Cluster().ID().String()
	if old != nil && old.ClusterID != "" && old.ClusterID != cid {
		return nil, fmt.Errorf("data directory %s belongs to etcd cluster %s, but the member came up in %s: use a fresh --data directory", c.Dir, old.ClusterID, cid)
	}
	if old == nil {
		b, _ := json.Marshal(marker{Name: c.Name, ClusterID: cid, InitialCluster: initial})
		if err := os.WriteFile(filepath.Join(c.Dir, markerFile), append(b, '\n'), 0o600); err != nil {
			return nil, fmt.Errorf("record the member in %s: %w", c.Dir, err)
		}
	}
	return &Member{e: e, cfg: c, lock: lock}, nil
}

// checkInitialCluster checks "NAME=URL,…" names this member at its peer
// URL.
func checkInitialCluster(s, name, peer string, withTLS bool) error {
	found := false
	for _, m := range strings.Split(s, ",") {
		n, u, ok := strings.Cut(m, "=")
		if !ok || n == "" {
			return fmt.Errorf("--initial-cluster %q: want NAME=PEER_URL,… such as a=http://127.0.0.1:2380,b=http://127.0.0.1:2382", s)
		}
		if _, err := ParseURL("--initial-cluster "+n, u, withTLS); err != nil {
			return err
		}
		if n == name {
			found = true
			if strings.TrimSuffix(u, "/") != peer {
				return fmt.Errorf("--initial-cluster names %s at %s, but --listen-peer is %s: make them the same", n, u, peer)
			}
		}
	}
	if !found {
		return fmt.Errorf("--initial-cluster %q does not name this member %q", s, name)
	}
	return nil
}

// checkDir refuses a data directory that holds another member's or
// another cluster's data, and returns its marker if it has one.
func checkDir(dir, name, initial string) (*marker, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("--data %s: %w", dir, err)
	}
	_, err := os.Stat(filepath.Join(dir, "member"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil // new: etcd makes it
	}
	b, err := os.ReadFile(filepath.Join(dir, markerFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("data directory %s holds etcd data berth did not make: use an empty --data directory", dir)
	}
	if err != nil {
		return nil, fmt.Errorf("--data %s: %w", dir, err)
	}
	var m marker
	if len(b) > 4096 || json.Unmarshal(b, &m) != nil {
		return nil, fmt.Errorf("data directory %s: %s is damaged: use a fresh --data directory", dir, markerFile)
	}
	if m.Name != name {
		return nil, fmt.Errorf("data directory %s is member %q's, not %q: give it --name %s, or use another --data directory", dir, m.Name, name, m.Name)
	}
	if initial != "" && initial != m.InitialCluster {
		return nil, fmt.Errorf("data directory %s is a member of the cluster started as %q; --initial-cluster names another: drop --initial-cluster to restart it, or use a fresh --data directory", dir, m.InitialCluster)
	}
	return &m, nil
}

// ClientURLs are the URLs clients reach the member on, ports resolved.
func (m *Member) ClientURLs() []string {
	var out []string
	for _, l := range m.e.Clients {
		out = append(out, m.scheme()+"://"+l.Addr().String())
	}
	return out
}

func (m *Member) scheme() string {
	if m.cfg.CA != "" {
		return "https"
	}
	return "http"
}

// PeerURLs are the URLs other members reach it on, ports resolved.
func (m *Member) PeerURLs() []string {
	var out []string
	for _, l := range m.e.Peers {
		out = append(out, m.scheme()+"://"+l.Addr().String())
	}
	return out
}

// Err delivers what made the member fail while it runs.
func (m *Member) Err() <-chan error { return m.e.Err() }

// Close stops the member; in-flight requests get etcd's request timeout.
// A second Close does nothing (etcd's own panics).
func (m *Member) Close() {
	m.close.Do(func() {
		m.e.Close()
		m.lock.Close() // closing the file releases its lock
	})
}

// lockDir takes dir's lock, or says which process holds it.
func lockDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, "berth-member.lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("--data %s: %w", dir, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		b, _ := io.ReadAll(io.LimitReader(f, 32))
		f.Close()
		return nil, fmt.Errorf("data directory %s is in use by another etcd member (pid %s): stop it, or use another --data directory", dir, strings.TrimSpace(string(b)))
	}
	f.Truncate(0)
	f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return f, nil
}

// Run starts the member, says in one line on out what it listens on,
// and runs until ctx ends (SIGINT, SIGTERM) or the member fails.
func Run(ctx context.Context, c Config, out io.Writer) error {
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	m, err := Start(sctx, c)
	if err != nil {
		return err
	}
	defer m.Close()
	fmt.Fprintf(out, "berth etcd member %s (pid %d): clients on %s, peers on %s, data %s\n",
		c.Name, os.Getpid(), strings.Join(m.ClientURLs(), ","), strings.Join(m.PeerURLs(), ","), c.Dir)
	select {
	case <-ctx.Done():
		return nil
	case err := <-m.Err():
		return fmt.Errorf("etcd member %s: %w", c.Name, err)
	}
}

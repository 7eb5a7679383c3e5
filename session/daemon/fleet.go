package daemon

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/fleet"
	"github.com/berthvm/berth/session/fleet/pki"
)

// fleetConfig is the config file's fleet keys with o's set fields over
// them.
func fleetConfig(file, o FleetConfig) FleetConfig {
	if o.Endpoints != "" {
		file.Endpoints = o.Endpoints
	}
	if o.HostID != "" {
		file.HostID = o.HostID
	}
	if o.Listen != "" {
		file.Listen = o.Listen
	}
	if o.TTL != 0 {
		file.TTL = o.TTL
	}
	if o.CA != "" {
		file.CA = o.CA
	}
	return file
}

// fleetMember is what joining a fleet gives the daemon.
type fleetMember struct {
	node *fleet.Node
	// ln is the API's listener for other hosts and operators (nil
	// without --listen): mutual TLS with the fleet CA, else loopback.
	ln net.Listener
	// peerTLS reaches other hosts' listeners with this host's
	// certificate (nil without a CA).
	peerTLS *tls.Config
}

// listenFleet opens the --listen address: with a fleet CA, mutual TLS
// (the host's certificate; clients must present one of the CA's);
// without, plain text, which is refused anywhere but loopback.
func listenFleet(fc FleetConfig, certDir string) (net.Listener, error) {
	host, _, err := net.SplitHostPort(fc.Listen)
	if err != nil {
		return nil, fmt.Errorf("--listen %q: want HOST:PORT, such as 127.0.0.1:7443", fc.Listen)
	}
	if fc.CA == "" {
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return nil, fmt.Errorf("--listen %s: the API is served in plain text beyond loopback only with a fleet CA: give --fleet-ca DIR (berth fleet init --dir DIR makes one), or listen on 127.0.0.1", fc.Listen)
		}
	}
	ln, err := net.Listen("tcp", fc.Listen)
	if err != nil {
		return nil, fmt.Errorf("--listen: %w", err)
	}
	if fc.CA == "" {
		return ln, nil
	}
	cfg, err := pki.ServerConfig(certDir)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("--fleet-ca: %w", err)
	}
	cfg.NextProtos = []string{"http/1.1"} // exec streams and forwards as over the socket
	return tls.NewListener(ln, cfg), nil
}

// joinFleet joins the fleet of fc as this host, its facts read from the
// Manager and the data directory at each registration and refresh, and
// opens its --listen address first, so that what it registers answers.
func joinFleet(ctx context.Context, fc FleetConfig, dataDir string, floor int64, im session.Imager, local fleet.Local, log *slog.Logger) (_ *fleetMember, err error) {
	if fc.HostID == "" {
		return nil, errors.New("--fleet needs --host-id H (or host_id in config.toml): the name of this host in the fleet")
	}
	if fc.Listen != "" {
		if _, _, err := net.SplitHostPort(fc.Listen); err != nil {
			return nil, fmt.Errorf("--listen %q: want HOST:PORT, such as 127.0.0.1:7443", fc.Listen)
		}
	}
	inst, err := instanceID(dataDir)
	if err != nil {
		return nil, err
	}
	m := &fleetMember{}
	defer func() {
		if err != nil && m.ln != nil {
			m.ln.Close()
		}
	}()
	var tlsCfg *tls.Config
	out := filepath.Join(dataDir, "fleet-tls")
	if fc.CA != "" {
		// The host's certificate, issued once into the data directory,
		// names it and the address it records.
		var dns []string
		var ips []net.IP
		if h, _, err := net.SplitHostPort(fc.Listen); err == nil && h != "" {
			if ip := net.ParseIP(h); ip != nil {
				ips = append(ips, ip)
			} else {
				dns = append(dns, h)
			}
		}
		if err := pki.Ensure(fc.CA, out, fc.HostID, dns, ips); err != nil {
			return nil, fmt.Errorf("--fleet-ca: %w", err)
		}
		if tlsCfg, err = pki.ClientConfig(out); err != nil {
			return nil, fmt.Errorf("--fleet-ca: %w", err)
		}
		m.peerTLS = tlsCfg
	}
	addr := fc.Listen
	if fc.Listen != "" {
		if m.ln, err = listenFleet(fc, out); err != nil {
			return nil, err
		}
		// A port of 0 takes one: the one taken is what others reach.
		if h, p, _ := net.SplitHostPort(fc.Listen); p == "0" {
			_, got, _ := net.SplitHostPort(m.ln.Addr().String())
			addr = net.JoinHostPort(h, got)
		}
	}
	facts := func(ctx context.Context) (fleet.Facts, error) {
		f := fleet.Facts{CPUs: runtime.NumCPU(), Floor: floor}
		var si unix.Sysinfo_t
		if err := unix.Sysinfo(&si); err == nil {
			f.MemoryMiB = int64(si.Totalram) * int64(si.Unit) >> 20
		}
		var st unix.Statfs_t
		if err := unix.Statfs(dataDir, &st); err == nil {
			f.DiskFree = int64(st.Bavail) * st.Bsize
		}
		if list, err := im.Images(ctx); err == nil {
			for _, i := range list {
				if i.Current && !slices.Contains(f.Images, i.Name) {
					f.Images = append(f.Images, i.Name)
				}
			}
		}
		return f, nil
	}
	jctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	m.node, err = fleet.Start(jctx, fleet.Config{Endpoints: fc.Endpoints, TLS: tlsCfg, Local: local, HostConfig: fleet.HostConfig{
		ID: fc.HostID, Addr: addr, Instance: inst, TTL: fc.TTL, Facts: facts, Logger: log,
	}})
	if err != nil {
		return nil, err
	}
	return m, nil
}

// instanceID is the data directory's own id, made on first use: a
// daemon restarted on the same directory is the same host and may take
// over a registration its killed predecessor left.
func instanceID(dataDir string) (string, error) {
	path := filepath.Join(dataDir, "fleet-instance")
	b, err := os.ReadFile(path)
	if err == nil {
		if id := strings.TrimSpace(string(b)); len(id) == 32 {
			return id, nil
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	var r [16]byte
	rand.Read(r[:])
	id := hex.EncodeToString(r[:])
	if err := os.WriteFile(path, []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	return id, nil
}

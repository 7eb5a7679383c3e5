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

// joinFleet joins the fleet of fc as this host, its facts read from the
// Manager and the data directory at each registration and refresh.
func joinFleet(ctx context.Context, fc FleetConfig, dataDir string, floor int64, im session.Imager, local fleet.Local, log *slog.Logger) (*fleet.Node, error) {
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
	var tlsCfg *tls.Config
	if fc.CA != "" {
		// The host's certificate, issued once into the data directory,
		// names it and the address it records.
		out := filepath.Join(dataDir, "fleet-tls")
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
	return fleet.Start(jctx, fleet.Config{Endpoints: fc.Endpoints, TLS: tlsCfg, Local: local, HostConfig: fleet.HostConfig{
		ID: fc.HostID, Addr: fc.Listen, Instance: inst, TTL: fc.TTL, Facts: facts, Logger: log,
	}})
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

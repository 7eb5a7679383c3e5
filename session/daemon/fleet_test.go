package daemon

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/session/fleet/pki"
)

func TestFleetConfig(t *testing.T) {
	for _, c := range []struct {
		name, file string
		flags      FleetConfig
		want       FleetConfig
		err        string
	}{
		{name: "none", want: FleetConfig{TTL: 10 * time.Second}},
		{name: "file", file: "fleet = \"https://127.0.0.1:2379\"\nhost_id = \"h1\"\nlisten = \"127.0.0.1:7443\"\nfleet_ttl = \"3s\"\nfleet_ca = \"/ca\"\n",
			want: FleetConfig{Endpoints: "https://127.0.0.1:2379", HostID: "h1", Listen: "127.0.0.1:7443", TTL: 3 * time.Second, CA: "/ca"}},
		{name: "ca flag", file: "fleet_ca = \"/a\"\n", flags: FleetConfig{CA: "/b"}, want: FleetConfig{CA: "/b", TTL: 10 * time.Second}},
		{name: "flags over the file", file: "fleet = \"http://127.0.0.1:2379\"\nhost_id = \"h1\"\n",
			flags: FleetConfig{HostID: "h2", TTL: 2 * time.Second},
			want:  FleetConfig{Endpoints: "http://127.0.0.1:2379", HostID: "h2", TTL: 2 * time.Second}},
		{name: "flags alone", flags: FleetConfig{Endpoints: "http://127.0.0.1:1", HostID: "x"},
			want: FleetConfig{Endpoints: "http://127.0.0.1:1", HostID: "x", TTL: 10 * time.Second}},
		{name: "short ttl", file: "fleet_ttl = \"500ms\"\n", err: "fleet_ttl"},
		{name: "bad ttl", file: "fleet_ttl = \"soon\"\n", err: "fleet_ttl"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := ParseConfig("config.toml", []byte(c.file))
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("ParseConfig: %v, want an error about %s", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := fleetConfig(cfg.Fleet, c.flags); got != c.want {
				t.Errorf("got %+v, want %+v", got, c.want)
			}
		})
	}
}

// The instance id is made once and kept: a restarted daemon is the same
// host.
func TestInstanceID(t *testing.T) {
	dir := t.TempDir()
	a, err := instanceID(dir)
	if err != nil || len(a) != 32 {
		t.Fatalf("%q, %v", a, err)
	}
	if b, err := instanceID(dir); err != nil || b != a {
		t.Errorf("second read %q, %v; want %q", b, err, a)
	}
	if c, _ := instanceID(t.TempDir()); c == a {
		t.Errorf("two data directories share the id %s", a)
	}
}

// --listen: plain text on loopback only; with a CA, mutual TLS anywhere.
func TestListenFleet(t *testing.T) {
	ca := t.TempDir() + "/ca"
	if err := pki.Init(ca, "t"); err != nil {
		t.Fatal(err)
	}
	certs := t.TempDir() + "/h"
	if err := pki.Issue(ca, certs, "h", nil, nil); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		listen, ca string
		tls        bool
		err        string
	}{
		{listen: "127.0.0.1:0"},
		{listen: "[::1]:0"},
		{listen: "localhost:0"},
		{listen: "0.0.0.0:0", err: "--fleet-ca DIR"},
		{listen: ":0", err: "--fleet-ca DIR"},
		{listen: "192.0.2.1:0", err: "--fleet-ca DIR"},
		{listen: "0.0.0.0:0", ca: ca, tls: true},
		{listen: "127.0.0.1", err: "want HOST:PORT"},
	} {
		ln, err := listenFleet(FleetConfig{Listen: c.listen, CA: c.ca}, certs)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("listen %s (CA %q): %v, want an error saying %q", c.listen, c.ca, err, c.err)
			}
			if ln != nil {
				ln.Close()
			}
			continue
		}
		if err != nil {
			if strings.Contains(err.Error(), "cannot assign") { // no IPv6 loopback here
				continue
			}
			t.Errorf("listen %s (CA %q): %v", c.listen, c.ca, err)
			continue
		}
		if _, plain := ln.(*net.TCPListener); plain == c.tls {
			t.Errorf("listen %s (CA %q): a %T, want TLS %v", c.listen, c.ca, ln, c.tls)
		}
		ln.Close()
	}
}

package daemon

import (
	"strings"
	"testing"
	"time"
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

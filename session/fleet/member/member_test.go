package member

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"
)

func TestParseURL(t *testing.T) {
	for _, c := range []struct {
		in, err string
		tls     bool
	}{
		{in: "https://10.1.2.3:2379", tls: true},
		{in: "https://127.0.0.1:0", tls: true},
		{in: "http://127.0.0.1:2379", err: "must be https", tls: true},
		{in: "http://127.0.0.1:2379", err: ""},
		{in: "http://[::1]:2379", err: ""},
		{in: "http://127.0.0.1:0", err: ""},
		{in: "https://127.0.0.1:2379", err: "fleet-ca"},
		{in: "ftp://127.0.0.1:2379", err: "scheme"},
		{in: "http://127.0.0.1", err: "no port"},
		{in: "http://localhost:2379", err: "IP address"},
		{in: "http://10.1.2.3:2379", err: "loopback only"},
		{in: "http://127.0.0.1:2379/x", err: "only a scheme"},
		{in: "http://u@127.0.0.1:2379", err: "only a scheme"},
		{in: "127.0.0.1:2379", err: "not a URL"},
		{in: "%%", err: "not a URL"},
	} {
		_, err := ParseURL("--listen-client", c.in, c.tls)
		switch {
		case c.err == "" && err != nil:
			t.Errorf("ParseURL(%q) = %v, want nil", c.in, err)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("ParseURL(%q) = %v, want an error saying %q", c.in, err, c.err)
		}
	}
}

func start(t *testing.T, c Config) (*Member, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if c.ListenClient == "" {
		c.ListenClient = "http://127.0.0.1:0"
	}
	if c.ListenPeer == "" {
		c.ListenPeer = "http://127.0.0.1:0"
	}
	m, err := Start(ctx, c)
	if err == nil {
		t.Cleanup(m.Close)
	}
	return m, err
}

// A data directory is one member's: another name, or another cluster,
// is refused before etcd starts; the same member restarts on it.
func TestDataDirBelongsToOneMember(t *testing.T) {
	dir := t.TempDir()
	m, err := start(t, Config{Name: "a", Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	for _, c := range []struct {
		name, cfg Config
		err       string
	}{
		{cfg: Config{Name: "b", Dir: dir}, err: `is member "a"'s, not "b"`},
		{cfg: Config{Name: "a", Dir: dir, InitialCluster: "a=http://127.0.0.1:0,b=http://127.0.0.1:1"}, err: "--initial-cluster names another"},
		{cfg: Config{Name: "a", Dir: dir}},
	} {
		m, err := start(t, c.cfg)
		if c.err == "" {
			if err != nil {
				t.Errorf("restart of %s on its own directory: %v", c.cfg.Name, err)
			} else {
				m.Close()
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("start %+v: %v, want an error saying %q", c.cfg, err, c.err)
		}
	}
}

// etcd data berth did not make is refused too.
func TestForeignDataDir(t *testing.T) {
	dir := t.TempDir()
	if m, err := start(t, Config{Name: "a", Dir: dir}); err != nil {
		t.Fatal(err)
	} else {
		m.Close()
	}
	if err := removeMarker(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := start(t, Config{Name: "a", Dir: dir}); err == nil || !strings.Contains(err.Error(), "berth did not make") {
		t.Errorf("start on foreign etcd data: %v", err)
	}
}

func TestPortInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, err = start(t, Config{Name: "a", Dir: t.TempDir(), ListenClient: "http://" + ln.Addr().String()})
	if err == nil || !strings.Contains(err.Error(), "pick another port") {
		t.Errorf("start on a port in use: %v", err)
	}
}

func TestInitialClusterChecked(t *testing.T) {
	for _, ic := range []string{"a", "b=http://127.0.0.1:5", "a=http://127.0.0.1:5", "a=http://10.0.0.1:5"} {
		if _, err := start(t, Config{Name: "a", Dir: t.TempDir(), ListenPeer: "http://127.0.0.1:7", InitialCluster: ic}); err == nil {
			t.Errorf("--initial-cluster %q accepted", ic)
		}
	}
}

// A data directory a running member holds is refused at once, not
// waited on.
func TestDataDirInUse(t *testing.T) {
	dir := t.TempDir()
	if _, err := start(t, Config{Name: "a", Dir: dir}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := start(t, Config{Name: "a", Dir: dir})
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "in use by another etcd member") {
			t.Errorf("second member on a directory in use: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a second member on a directory in use waited")
	}
}

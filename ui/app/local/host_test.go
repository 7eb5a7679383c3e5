package local

import (
	"errors"
	"testing"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/ui/cli"
)

func TestDialHost(t *testing.T) {
	for _, c := range []struct {
		host, certDir string
		ok            bool
	}{
		{host: "tcp://127.0.0.1:7443", ok: true},
		{host: "127.0.0.1:7443", ok: true},
		{host: "tcp://localhost:7443", ok: true},
		{host: "tcp://[::1]:7443", ok: true},
		{host: "tcp://10.0.0.5:7443"},                       // beyond loopback, no certificate
		{host: "tcp://10.0.0.5:7443", certDir: t.TempDir()}, // a directory without one
		{host: "tcp://127.0.0.1"},                           // no port
		{host: "unix:///tmp/berth.sock"},                    // not TCP
		{host: "http://127.0.0.1:7443/x"},                   // a URL
	} {
		cl, err := dialHost(cli.Globals{Host: c.host, CertDir: c.certDir}, "cli")
		if c.ok {
			if err != nil {
				t.Errorf("--host %s: %v", c.host, err)
			} else {
				cl.Close()
			}
			continue
		}
		if err == nil {
			cl.Close()
			t.Errorf("--host %s --cert-dir %q: no error", c.host, c.certDir)
		} else if c.certDir == "" && !errors.Is(err, session.ErrInvalid) {
			t.Errorf("--host %s: %v, want an invalid argument", c.host, err)
		}
	}
}

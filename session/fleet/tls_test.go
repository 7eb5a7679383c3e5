package fleet

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/berthvm/berth/session/fleet/fleettest"
	"github.com/berthvm/berth/session/fleet/pki"
)

// With a fleet CA, etcd answers only clients with a certificate of that
// CA: a host with one joins and lists; without one, with one of another
// CA, or in plain text, it gets nothing.
func TestMutualTLS(t *testing.T) {
	ca, other := filepath.Join(t.TempDir(), "ca"), filepath.Join(t.TempDir(), "other")
	for _, d := range []string{ca, other} {
		if err := pki.Init(d, "t"); err != nil {
			t.Fatal(err)
		}
	}
	eps := fleettest.EtcdTLS(t, ca)
	certOf := func(caDir, name string) *tls.Config {
		out := filepath.Join(t.TempDir(), name)
		if err := pki.Ensure(caDir, out, name, nil, nil); err != nil {
			t.Fatal(err)
		}
		c, err := pki.ClientConfig(out)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	good, err := Dial(eps[0], certOf(ca, "h1"))
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	h, err := Join(ctxT(t), good, HostConfig{ID: "h1", TTL: time.Second, Facts: func(context.Context) (Facts, error) { return big, nil }})
	if err != nil {
		t.Fatalf("join over mutual TLS: %v", err)
	}
	defer h.leaveOnce(context.Background())
	if hs, err := List(ctxT(t), good); err != nil || len(hs) != 1 {
		t.Fatalf("list over mutual TLS: %v, %v", hs, err)
	}

	// Trusts the fleet's CA but presents nothing.
	b, _ := os.ReadFile(filepath.Join(ca, pki.CACert))
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(b)
	anon := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}
	foreign := certOf(other, "intruder")
	foreign.RootCAs = pool // it trusts the server; the server must not trust it
	for name, cfg := range map[string]*tls.Config{"no certificate": anon, "another CA's certificate": foreign} {
		cli, err := Dial(eps[0], cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if _, err := List(ctx, cli); err == nil {
			t.Errorf("%s: etcd answered", name)
		}
		cancel()
		cli.Close()
	}
	if _, err := Dial("http"+eps[0][len("https"):], certOf(ca, "h2")); err == nil {
		t.Error("Dial of http URLs with a fleet CA")
	}
	if _, err := Dial(eps[0], nil); err == nil {
		t.Error("Dial of an https URL without a fleet CA")
	}
}

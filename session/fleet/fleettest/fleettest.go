// Package fleettest starts what fleet tests need: an embedded etcd member
// on loopback ports chosen at run time, in the test's temporary
// directory, stopped when the test ends.
package fleettest

import (
	"context"
	"testing"
	"time"

	"github.com/berthvm/berth/session/fleet/member"
)

// Etcd starts a one-member cluster for t and returns its client URLs.
func Etcd(t testing.TB) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := member.Start(ctx, member.Config{
		Name: "t", Dir: t.TempDir(),
		ListenClient: "http://127.0.0.1:0", ListenPeer: "http://127.0.0.1:0",
	})
	if err != nil {
		t.Fatalf("start etcd: %v", err)
	}
	t.Cleanup(m.Close)
	return m.ClientURLs()
}

// EtcdTLS starts a one-member cluster for t serving mutual TLS with a
// certificate of the fleet CA in caDir, and returns its client URLs.
func EtcdTLS(t testing.TB, caDir string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := member.Start(ctx, member.Config{
		Name: "t", Dir: t.TempDir(), CA: caDir,
		ListenClient: "https://127.0.0.1:0", ListenPeer: "https://127.0.0.1:0",
	})
	if err != nil {
		t.Fatalf("start etcd: %v", err)
	}
	t.Cleanup(m.Close)
	return m.ClientURLs()
}

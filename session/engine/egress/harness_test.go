package egress

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"

	"github.com/berthvm/berth/session"
)

// testSess is a session without a VM: enough to drive the proxy and the
// DNS responder directly, keeping the notes it is given.
type testSess struct {
	*Proxy
	name string
	pol  session.Policy
	c    Counters

	mu    sync.Mutex
	notes []string
}

func (t *testSess) Name() string           { return t.name }
func (t *testSess) Policy() session.Policy { return t.pol }
func (t *testSess) Touch()                 {}
func (t *testSess) Counters() *Counters    { return &t.c }

func (t *testSess) DialGuest(ctx context.Context, port int) (net.Conn, error) {
	return nil, fmt.Errorf("session %q has no VM: %w", t.name, session.ErrUnavailable)
}

func (t *testSess) Note(msg string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.notes = append(t.notes, msg)
}

func (t *testSess) Notes() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]string(nil), t.notes...)
}

func (t *testSess) serve(ctx context.Context, c net.Conn) { t.Proxy.Serve(ctx, t, c) }

func (t *testSess) answer(ctx context.Context, q []byte) []byte {
	return t.Proxy.AnswerDNS(ctx, t, q, UDP)
}

// newTestSess makes session "s1" with policy on a proxy of its own.
func newTestSess(tb testing.TB, policy string, cfg Config) *testSess {
	tb.Helper()
	pol, err := session.ParsePolicy(policy)
	if err != nil {
		tb.Fatal(err)
	}
	return &testSess{Proxy: New(cfg), name: "s1", pol: pol}
}

// pinned resolves the test names: pkgs.test to loopback, ten.test to a
// private address; every other name does not exist.
func pinned(ctx context.Context, host string) ([]netip.Addr, error) {
	m := map[string]string{"pkgs.test": "127.0.0.1", "ten.test": "10.0.0.1"}
	if a, ok := m[host]; ok {
		return []netip.Addr{netip.MustParseAddr(a)}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// DNS codes the tests use.
const (
	dnsTypeA      = 1
	dnsTypeAAAA   = 28
	rcodeOK       = 0
	rcodeFormErr  = 1
	rcodeNXDomain = 3
	rcodeRefused  = 5
)

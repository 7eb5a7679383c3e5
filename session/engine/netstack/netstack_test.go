package netstack

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/berthvm/berth/session/engine/egress"
)

type testPeer struct{ c egress.Counters }

func (p *testPeer) Decide(f egress.Flow) egress.Verdict                      { return egress.Verdict{Msg: "refused"} }
func (p *testPeer) Refused(v egress.Verdict)                                 {}
func (p *testPeer) AnswerDNS(ctx context.Context, q []byte, tcp bool) []byte { return nil }
func (p *testPeer) Counters() *egress.Counters                               { return &p.c }
func (p *testPeer) Touch()                                                   {}

// Serve owns what it starts: it returns when its context ends or QEMU's
// end of the socket closes or sends a broken frame, and leaves no
// goroutine behind.
func TestNetstackServeStops(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(cancel context.CancelFunc, qemu net.Conn)
		err  bool
	}{
		{"the session ends", func(cancel context.CancelFunc, qemu net.Conn) { cancel() }, false},
		{"QEMU closes", func(cancel context.CancelFunc, qemu net.Conn) { qemu.Close() }, true},
		{"a frame out of bounds", func(cancel context.CancelFunc, qemu net.Conn) { qemu.Write([]byte{0xff, 0xff, 0xff, 0xff}) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := runtime.NumGoroutine()
			ours, qemu := net.Pipe()
			defer qemu.Close()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- Serve(ctx, ours, &testPeer{}, Config{}) }()
			time.Sleep(50 * time.Millisecond)
			tc.end(cancel, qemu)
			select {
			case err := <-done:
				if (err != nil) != tc.err {
					t.Fatalf("Serve returned %v; want an error: %v", err, tc.err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Serve did not return")
			}
			deadline := time.Now().Add(2 * time.Second)
			for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if n := runtime.NumGoroutine(); n > before {
				t.Errorf("%d goroutines after Serve returned, %d before", n, before)
			}
		})
	}
}

func TestNetstackVirtual(t *testing.T) {
	for a, want := range map[string]bool{
		"10.0.2.2":  false, // the gateway: host.berth.internal
		"10.0.2.3":  true,  // berth's DNS, answered by the stack
		"10.0.2.15": true,  // the guest itself
		"10.0.2.99": true,
		"10.0.3.1":  false, // beyond: the policy decides
		"8.8.8.8":   false,
	} {
		if got := virtual(netip.MustParseAddr(a)); got != want {
			t.Errorf("virtual(%s) = %v, want %v", a, got, want)
		}
	}
}

// Up hands the running stack's Guest out and takes it back before Serve
// returns; a dial the guest does not answer ends with its context, and
// one on a stopped stack says the NIC is closed.
func TestNetstackGuestDial(t *testing.T) {
	ours, qemu := net.Pipe()
	defer qemu.Close()
	go io.Copy(io.Discard, qemu) // QEMU's end: the guest never answers
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ups := make(chan *Guest, 2)
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, ours, &testPeer{}, Config{Up: func(g *Guest) { ups <- g }}) }()
	var g *Guest
	select {
	case g = <-ups:
	case <-time.After(5 * time.Second):
		t.Fatal("Up was not called")
	}
	if g == nil {
		t.Fatal("Up(nil) before the stack ran")
	}
	dctx, dcancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer dcancel()
	if _, err := g.DialTCP(dctx, 80); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a dial nobody answers: %v, want its context's deadline", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Serve: %v", err)
	}
	if g := <-ups; g != nil {
		t.Error("Serve returned without Up(nil)")
	}
	if _, err := g.DialTCP(context.Background(), 80); !errors.Is(err, net.ErrClosed) {
		t.Errorf("a dial on a stopped stack: %v, want net.ErrClosed", err)
	}
}

package daemon

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/metrics"
)

// stuckLister answers List only once release is closed, as a frozen
// Manager would never.
type stuckLister struct {
	calls   atomic.Int32
	release chan struct{}
}

func (l *stuckLister) List(ctx context.Context) ([]session.Session, error) {
	l.calls.Add(1)
	<-l.release // a frozen Manager ignores ctx
	return []session.Session{{Name: "a", State: session.StateRunning}}, nil
}
func (l *stuckLister) Get(ctx context.Context, name string) (session.Session, error) {
	return session.Session{}, session.ErrNotFound
}
func (l *stuckLister) Host(ctx context.Context) (session.HostStatus, error) {
	return session.HostStatus{}, nil
}

// A Manager that does not answer makes /healthz answer 503 within the
// bound, with a line saying how to get the goroutines; however often it
// is polled, one call waits on the Manager; once it answers, the daemon is
// healthy again.
func TestHealthzFrozenManager(t *testing.T) {
	l := &stuckLister{release: make(chan struct{})}
	p := NewProber(l, "test", 200*time.Millisecond)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New()
	srv := &http.Server{Handler: m.Handler(func(ctx context.Context) (any, error) { return p.Check(ctx) })}
	go srv.Serve(ln)
	defer srv.Close()
	get := func() (int, string) {
		resp, err := http.Get("http://" + ln.Addr().String() + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		buf := make([]byte, 4096)
		for {
			n, err := resp.Body.Read(buf)
			b.Write(buf[:n])
			if err != nil {
				break
			}
		}
		return resp.StatusCode, b.String()
	}

	var wg sync.WaitGroup
	for range 5 {
		wg.Go(func() {
			start := time.Now()
			code, body := get()
			if code != http.StatusServiceUnavailable || !strings.Contains(body, "has not answered") || !strings.Contains(body, "kill -QUIT") {
				t.Errorf("frozen: %d %s", code, body)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("frozen: the answer took %s, bound 200ms", d)
			}
		})
	}
	wg.Wait()
	if n := l.calls.Load(); n != 1 {
		t.Errorf("%d calls wait on the frozen Manager, want 1", n)
	}
	close(l.release)
	deadline := time.Now().Add(5 * time.Second)
	for {
		code, body := get()
		if code == http.StatusOK && strings.Contains(body, `"status":"ok"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the Manager answered: %d %s", code, body)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The refusal is of the unavailable class and says what to do.
func TestFrozenError(t *testing.T) {
	err := FrozenError(7 * time.Second)
	if !errors.Is(err, session.ErrUnavailable) || !strings.Contains(err.Error(), "7s") || !strings.Contains(err.Error(), "restart berth serve") {
		t.Fatalf("%v", err)
	}
}

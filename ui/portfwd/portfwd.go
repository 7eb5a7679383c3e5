// Package portfwd listens on host loopback ports and carries each
// connection into a session's VM (session.Networker.Forward), like kubectl
// port-forward. The CLI's port-forward command and the TUI use it.
package portfwd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/berthvm/berth/session"
)

// Spec is one forward: host loopback port Local to guest port Remote.
// Local 0 picks a free port.
type Spec struct {
	Local, Remote int
}

func (s Spec) String() string { return fmt.Sprintf("%d:%d", s.Local, s.Remote) }

// ParseSpec reads [LOCAL:]REMOTE; LOCAL defaults to REMOTE, and LOCAL 0
// picks a free port.
func ParseSpec(arg string) (Spec, error) {
	l, r, two := strings.Cut(arg, ":")
	if !two {
		l, r = arg, arg
	}
	port := func(s string, zero bool) (int, error) {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || n > 65535 || (n == 0 && !zero) {
			return 0, fmt.Errorf("port forward %q: %q is not a port (1 to 65535): %w", arg, s, session.ErrInvalid)
		}
		return n, nil
	}
	rp, err := port(r, false)
	if err != nil {
		return Spec{}, err
	}
	lp, err := port(l, two)
	if err != nil {
		return Spec{}, err
	}
	return Spec{Local: lp, Remote: rp}, nil
}

// Forwarder is what a forward needs of the service.
type Forwarder interface {
	Forward(ctx context.Context, name string, port int) (net.Conn, error)
}

// Listener is one running forward.
type Listener struct {
	Spec
	Addr   string // the host address listened on
	ln     net.Listener
	active atomic.Int64
	total  atomic.Int64
}

// Active is how many connections the forward carries now; Total how many
// it has carried.
func (l *Listener) Active() int64 { return l.active.Load() }
func (l *Listener) Total() int64  { return l.total.Load() }

// Listen binds every spec on 127.0.0.1 before any is served, so a port in
// use fails the whole set with the port named.
func Listen(specs []Spec) ([]*Listener, error) {
	var out []*Listener
	for _, sp := range specs {
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(sp.Local)))
		if err != nil {
			for _, l := range out {
				l.ln.Close()
			}
			if errors.Is(err, syscall.EADDRINUSE) {
				return nil, fmt.Errorf("local port %d is already in use: pick another with LOCAL:%d: %w", sp.Local, sp.Remote, session.ErrConflict)
			}
			return nil, fmt.Errorf("listen on 127.0.0.1:%d: %w", sp.Local, err)
		}
		l := &Listener{Spec: sp, ln: ln, Addr: ln.Addr().String()}
		l.Local = ln.Addr().(*net.TCPAddr).Port
		out = append(out, l)
	}
	return out, nil
}

// Event reports what a forward did, for the caller to show.
type Event struct {
	Spec Spec
	Err  error // nil: a connection was carried and ended
}

// Serve accepts on every listener until ctx ends and carries each
// connection to the session's guest port. A connection that cannot be
// carried (nothing listens, the session is stopped) is closed and reported
// on report (may be nil); the forward stays up. Serve closes the listeners
// and returns once every connection has ended.
func Serve(ctx context.Context, svc Forwarder, name string, ls []*Listener, report func(Event)) {
	if report == nil {
		report = func(Event) {}
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, l := range ls {
		context.AfterFunc(ctx, func() { l.ln.Close() })
		wg.Go(func() {
			var conns sync.WaitGroup
			defer conns.Wait()
			for {
				c, err := l.ln.Accept()
				if err != nil {
					return
				}
				conns.Go(func() {
					l.active.Add(1)
					defer l.active.Add(-1)
					l.total.Add(1)
					gc, err := svc.Forward(ctx, name, l.Remote)
					if err != nil {
						c.Close()
						report(Event{Spec: l.Spec, Err: err})
						return
					}
					stop := context.AfterFunc(ctx, func() { c.Close(); gc.Close() })
					defer stop()
					session.Splice(c, gc)
					report(Event{Spec: l.Spec})
				})
			}
		})
	}
}

package sessiontest

import (
	"context"
	"fmt"
	"net"
	"os"
	"sort"
	"sync"
	"syscall"

	"github.com/berthvm/berth/session"
)

// Serve makes the fake guest of session name listen on port: each
// forwarded connection is handed to h, which owns it.
func (f *Fake) Serve(name string, port int, h func(net.Conn)) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, err := f.getLocked(name)
	if err != nil {
		return err
	}
	if s.listen == nil {
		s.listen = map[int]func(net.Conn){}
	}
	s.listen[port] = h
	return nil
}

// SetNet changes a session's policy.
func (f *Fake) SetNet(ctx context.Context, name, policy string) (session.Session, error) {
	if err := f.enter(ctx, "SetNet"); err != nil {
		return session.Session{}, err
	}
	p, err := session.ParsePolicy(policy)
	if err != nil {
		return session.Session{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	s, err := f.getLocked(name)
	if err != nil {
		return session.Session{}, err
	}
	switch s.info.State {
	case session.StateCreating, session.StateDeleting:
		return session.Session{}, session.CheckTransition(name, "change the network of", s.info.State)
	}
	old := s.info.Net
	s.info.Net = p.String()
	f.publishLocked(ctx, s, session.Event{Kind: session.EventState, Message: fmt.Sprintf("network policy %s (was %s)", p, old)})
	return s.info, nil
}

// Forward connects to a port the fake guest serves (see Serve); a
// sleeping session is woken.
func (f *Fake) Forward(ctx context.Context, name string, port int) (net.Conn, error) {
	if err := f.enter(ctx, "Forward"); err != nil {
		return nil, err
	}
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("port %d: use 1 to 65535: %w", port, session.ErrInvalid)
	}
	f.mu.Lock()
	s, err := f.usableLocked(ctx, name, session.ActionExec)
	if err != nil {
		f.mu.Unlock()
		return nil, err
	}
	h := s.listen[port]
	if h == nil {
		f.mu.Unlock()
		return nil, fmt.Errorf("session %s: nothing listens on port %d in the VM: %w", name, port, session.ErrUnavailable)
	}
	if s.fwd == nil {
		s.fwd = map[int]int{}
	}
	s.fwd[port]++
	f.mu.Unlock()
	client, server, err := socketPair()
	if err != nil {
		f.mu.Lock()
		s.fwd[port]--
		f.mu.Unlock()
		return nil, fmt.Errorf("forward: %v: %w", err, session.ErrUnavailable)
	}
	go h(server)
	return &fakeFwd{Conn: client, done: func() {
		f.mu.Lock()
		if s.fwd[port]--; s.fwd[port] <= 0 {
			delete(s.fwd, port)
		}
		f.mu.Unlock()
	}}, nil
}

type fakeFwd struct {
	net.Conn // a *net.UnixConn
	done     func()
	once     sync.Once
}

// CloseWrite half-closes the connection.
func (c *fakeFwd) CloseWrite() error { return c.Conn.(interface{ CloseWrite() error }).CloseWrite() }

func (c *fakeFwd) Close() error {
	c.once.Do(c.done)
	return c.Conn.Close()
}

// NetStatus reports the policy, the served ports and open forwards.
func (f *Fake) NetStatus(ctx context.Context, name string) (session.NetStatus, error) {
	s, err := f.enterSession(ctx, "NetStatus", name)
	if err != nil {
		return session.NetStatus{}, err
	}
	defer f.mu.Unlock()
	out := session.NetStatus{Policy: s.info.Net}
	if s.info.State == session.StateRunning {
		for p := range s.listen {
			out.Listening = append(out.Listening, session.ListenPort{Port: p, Addr: "127.0.0.1"})
		}
		sort.Slice(out.Listening, func(i, j int) bool { return out.Listening[i].Port < out.Listening[j].Port })
	}
	if len(s.fwd) > 0 {
		out.Forwarded = map[int]int{}
		for p, n := range s.fwd {
			out.Forwarded[p] = n
		}
	}
	return out, nil
}

// socketPair is a connected pair of unix sockets: unlike net.Pipe they
// carry half closes, as a forward does.
func socketPair() (net.Conn, net.Conn, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	conv := func(fd int) (net.Conn, error) {
		f := os.NewFile(uintptr(fd), "forward")
		defer f.Close()
		return net.FileConn(f)
	}
	a, err := conv(fds[0])
	if err != nil {
		syscall.Close(fds[1])
		return nil, nil, err
	}
	b, err := conv(fds[1])
	if err != nil {
		a.Close()
		return nil, nil, err
	}
	return a, b, nil
}

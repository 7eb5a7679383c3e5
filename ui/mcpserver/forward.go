package mcpserver

import (
	"context"
	"fmt"
	"sync"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/ui/portfwd"
)

// maxForwards bounds the ports one MCP connection forwards at once.
const maxForwards = 16

type forwardIn struct {
	Session string `json:"session,omitempty" jsonschema:"the session's name (may be left out when the server is confined to one)"`
	Port    int    `json:"port" jsonschema:"the guest port to reach, on the guest's 127.0.0.1 (1-65535)"`
	Local   int    `json:"local,omitempty" jsonschema:"the host loopback port to listen on; 0 or absent picks a free one"`
}

type forwardOut struct {
	URL    string `json:"url" jsonschema:"http://127.0.0.1:LOCAL, for a web server in the guest"`
	Local  int    `json:"local"`
	Remote int    `json:"remote"`
	Note   string `json:"note"`
}

// forwards are a connection's port forwards: they live until the
// connection ends (Serve stops them and waits).
type forwards struct {
	mu     sync.Mutex
	ctx    context.Context // ends with the connection
	stop   context.CancelFunc
	n      int
	wg     sync.WaitGroup
	closed bool
}

func newForwards() *forwards {
	ctx, stop := context.WithCancel(context.Background())
	return &forwards{ctx: ctx, stop: stop}
}

// close ends every forward and waits for their connections to end.
func (f *forwards) close() {
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
	f.stop()
	f.wg.Wait()
}

func (s *Server) forwardPort(ctx context.Context, in forwardIn) (forwardOut, error) {
	name, err := s.sessionFor(in.Session)
	if err != nil {
		return forwardOut{}, err
	}
	if in.Port < 1 || in.Port > 65535 || in.Local < 0 || in.Local > 65535 {
		return forwardOut{}, fmt.Errorf("forward %d → %d: ports are 1 to 65535 (local 0 picks one): %w", in.Local, in.Port, session.ErrInvalid)
	}
	if _, err := s.svc.Get(ctx, name); err != nil {
		return forwardOut{}, err
	}
	f := s.fwd
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return forwardOut{}, fmt.Errorf("the MCP connection is closing: %w", session.ErrUnavailable)
	}
	if f.n >= maxForwards {
		return forwardOut{}, fmt.Errorf("this connection already forwards %d ports, the most it may: %w", f.n, session.ErrConflict)
	}
	ls, err := portfwd.Listen([]portfwd.Spec{{Local: in.Local, Remote: in.Port}})
	if err != nil {
		return forwardOut{}, err
	}
	f.n++
	f.wg.Go(func() { portfwd.Serve(f.ctx, s.svc, name, ls, nil) })
	l := ls[0]
	return forwardOut{
		URL: fmt.Sprintf("http://127.0.0.1:%d", l.Local), Local: l.Local, Remote: in.Port,
		Note: fmt.Sprintf("127.0.0.1:%d on the host running this MCP server reaches 127.0.0.1:%d in session %s until this MCP connection ends", l.Local, in.Port, name),
	}, nil
}

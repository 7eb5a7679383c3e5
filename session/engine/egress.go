package engine

import (
	"context"
	"net"
	"sync/atomic"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/engine/egress"
	"github.com/berthvm/berth/session/engine/internal/lock"
)

// fwdCounts are a session's forwarded connections: how many are open (the
// idle loop does not put a session with any to sleep) and per guest port.
type fwdCounts struct {
	open  atomic.Int64
	mu    lock.Mutex // a leaf
	ports map[int]int
}

func (f *fwdCounts) add(port, n int) {
	f.open.Add(int64(n))
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ports == nil {
		f.ports = map[int]int{}
	}
	if f.ports[port] += n; f.ports[port] <= 0 {
		delete(f.ports, port)
	}
}

// serveGuest answers the streams c's guest opens (its egress proxy
// connections and DNS queries) until c ends.
func (s *sess) serveGuest(c *guest.Client) {
	peer := egressPeer{s}
	s.m.wg.Go(func() {
		c.ServeIncoming(s.m.ctx, func(ctx context.Context, in *guest.Incoming) {
			switch in.Req.Op {
			case guest.OpEgress:
				s.m.proxy.Serve(ctx, peer, in.Conn)
			case guest.OpDNS:
				tr := egress.UDP
				if in.Req.TCP {
					tr = egress.TCP
				}
				in.Reply(guest.DNSReply{Data: s.m.proxy.AnswerDNS(ctx, peer, in.Req.Data, tr)})
			default:
				in.Fail(guest.CodeBadRequest, "unknown operation "+in.Req.Op)
			}
		})
	})
}

// egressPeer is a session as the egress proxy sees it.
type egressPeer struct{ s *sess }

func (p egressPeer) Name() string               { return p.s.name }
func (p egressPeer) Policy() session.Policy     { return p.s.policy() }
func (p egressPeer) Touch()                     { p.s.touch() }
func (p egressPeer) Counters() *egress.Counters { return &p.s.egress }

func (p egressPeer) DialGuest(ctx context.Context, port int) (net.Conn, error) {
	c, err := p.s.connectedAgent()
	if err != nil {
		return nil, err
	}
	return c.DialGuest(ctx, port)
}

func (p egressPeer) Note(msg string) {
	if p.s.note != nil {
		p.s.note(msg)
		return
	}
	p.s.m.event(session.Event{Kind: session.EventNote, Name: p.s.name, Message: msg})
}

// policy returns the session's parsed policy; a record that does not
// parse (it cannot, but records come from disk) is none.
func (s *sess) policy() session.Policy {
	s.mu.Lock()
	raw := s.rec.Net
	s.mu.Unlock()
	if raw == "" {
		return session.Policy{Mode: session.NetNone}
	}
	p, err := session.ParsePolicy(raw)
	if err != nil {
		return session.Policy{Mode: session.NetNone}
	}
	return p
}

package egress

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/engine/internal/lock"
)

// Bounds of a session's record of DNS answers.
const (
	// maxResolved bounds the addresses remembered per session: a guest
	// asking for ever new names pushes out the oldest, never grows the
	// host's memory.
	maxResolved = 4096
	// maxNamesPerAddr bounds the names remembered for one address (a CDN
	// address serves many).
	maxNamesPerAddr = 8
	// resolvedKeep is how long an answer stays usable after its TTL: a
	// client may connect a while after it resolved.
	resolvedKeep = 10 * time.Minute
)

// Resolved is what berth's DNS told one session's guest: each address
// with the names it was given for. A flow from the guest's NIC to an
// address is allowed by name only if the guest learned that address from
// berth under a name the policy allows.
type Resolved struct {
	mu    lock.Mutex // a leaf
	addrs map[netip.Addr]*resolvedAddr
}

type resolvedAddr struct {
	names []string
	at    time.Time
}

// Record remembers that name resolved to addrs.
func (r *Resolved) Record(name string, addrs []netip.Addr) {
	if len(addrs) == 0 {
		return
	}
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.addrs == nil {
		r.addrs = map[netip.Addr]*resolvedAddr{}
	}
	for _, a := range addrs {
		a = a.Unmap()
		e := r.addrs[a]
		if e == nil {
			if len(r.addrs) >= maxResolved {
				r.evictLocked(now)
			}
			e = &resolvedAddr{}
			r.addrs[a] = e
		}
		e.at = now
		if i := slices.Index(e.names, name); i >= 0 {
			e.names = slices.Delete(e.names, i, i+1)
		}
		e.names = append(e.names, name)
		if len(e.names) > maxNamesPerAddr {
			e.names = e.names[len(e.names)-maxNamesPerAddr:]
		}
	}
}

// evictLocked drops the expired entries, or if none, the oldest.
func (r *Resolved) evictLocked(now time.Time) {
	var oldest netip.Addr
	var at time.Time
	for a, e := range r.addrs {
		if now.Sub(e.at) > resolvedKeep {
			delete(r.addrs, a)
			continue
		}
		if !oldest.IsValid() || e.at.Before(at) {
			oldest, at = a, e.at
		}
	}
	if len(r.addrs) >= maxResolved && oldest.IsValid() {
		delete(r.addrs, oldest)
	}
}

// Names returns the names a resolved to, most recent last.
func (r *Resolved) Names(a netip.Addr) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.addrs[a.Unmap()]
	if e == nil || time.Since(e.at) > resolvedKeep {
		return nil
	}
	return slices.Clone(e.names)
}

// Flow is one outbound connection (TCP) or datagram flow (UDP) a guest's
// NIC opens.
type Flow struct {
	UDP bool
	Dst netip.AddrPort
}

func (f Flow) proto() string {
	if f.UDP {
		return "udp"
	}
	return "tcp"
}

// Verdict is the policy's answer for a flow: allowed, with the address the
// host dials, or refused, with the message a proxy client would see and,
// for the timeline, the reason.
type Verdict struct {
	Allow  bool
	Dial   netip.AddrPort
	Msg    string
	Reason string
}

// Decide applies the session's policy to a flow from its guest's NIC.
// hostAddr is where host.berth.internal is on the guest's network: a flow
// to it goes to the host's loopback (Config.HostAddr). Other addresses
// are allowed when an IP or CIDR entry names them, or under open when
// public, or when berth's DNS gave the guest that address for a name the
// policy allows; reserved addresses only when named by IP or CIDR; berth's
// own ports never.
func (p *Proxy) Decide(s Session, hostAddr netip.Addr, f Flow) Verdict {
	cfg := p.cfg
	pol := s.Policy()
	a, port := f.Dst.Addr().Unmap(), int(f.Dst.Port())
	names := s.Counters().Resolved.Names(a)
	shown := a.String()
	if len(names) > 0 {
		shown = names[len(names)-1]
	}
	if a == hostAddr {
		shown = session.HostName
	}
	target := net.JoinHostPort(shown, strconv.Itoa(port))
	if f.UDP {
		target = "udp " + target
	}
	refuse := func(reason string) Verdict {
		return Verdict{Msg: session.EgressRefused(target, s.Name(), pol.String()), Reason: reason}
	}
	forbidden := func(a netip.Addr) bool {
		return slices.Contains(cfg.Forbidden, port) && (session.Reserved(a) || localAddr(a))
	}
	if port == 0 {
		return refuse("port 0 is not a destination")
	}
	if a == hostAddr {
		if !pol.AllowsHost(port) {
			return refuse("the host is reachable only where the policy names " + session.HostName)
		}
		ha, err := netip.ParseAddr(cfg.HostAddr)
		if err != nil {
			return refuse(fmt.Sprintf("host address %q: %v", cfg.HostAddr, err))
		}
		if forbidden(ha) {
			return refuse("berth's own ports are never reachable")
		}
		return Verdict{Allow: true, Dial: netip.AddrPortFrom(ha, uint16(port))}
	}
	if forbidden(a) {
		return refuse("berth's own ports are never reachable")
	}
	if pol.AllowsAddr(a, port, false) {
		return Verdict{Allow: true, Dial: netip.AddrPortFrom(a, uint16(port))}
	}
	for _, n := range names {
		if pol.AllowsName(n, port) && pol.AllowsAddr(a, port, true) {
			return Verdict{Allow: true, Dial: netip.AddrPortFrom(a, uint16(port))}
		}
	}
	if r, ok := session.ReservedRange(a); ok {
		return Verdict{Msg: session.EgressRefusedReserved(target, s.Name(), pol.String(), shown, a, r)}
	}
	if len(names) == 0 && pol.Mode == session.NetAllow {
		return refuse(fmt.Sprintf("%s was not given by berth's DNS for a name the policy allows, and no entry names it", a))
	}
	return refuse("")
}

// Refusal counts a refused flow and notes it in the session's timeline as
// the proxy's refusals are (at most one note per refusalNoteEvery).
func (p *Proxy) Refusal(s Session, v Verdict) { p.refusal(s, v.Msg, v.Reason) }

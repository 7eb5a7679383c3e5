package engine

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/engine/egress"
	"github.com/berthvm/berth/session/engine/netstack"
	"github.com/berthvm/berth/store"
	"github.com/berthvm/berth/vmm"
)

// A guest's NIC (Config.NIC): a session whose policy is not none boots
// with a virtio-net device whose host end berth's userspace stack serves
// (package netstack), each flow decided by the session's policy.

// wantsNIC reports whether the session's next cold boot gets a NIC: the
// engine gives NICs, the policy is not none, and the session's driver can
// start one (Cloud Hypervisor's needs root: without it, the proxy alone).
func (s *sess) wantsNIC() bool {
	if !s.m.cfg.NIC || s.policy().Mode == session.NetNone {
		return false
	}
	s.mu.Lock()
	name := s.rec.VMM
	s.mu.Unlock()
	d, err := s.m.driver(name)
	if err != nil {
		return false
	}
	ns, ok := d.(vmm.NICStarter)
	return ok && ns.StartsNIC()
}

// nicMAC is the MAC the agent of a VM restored from another's snapshot
// (a template's, a fork's source's) gives its NIC: the session's, when
// the VM has a NIC and the session a MAC of its own.
func nicMAC(vm vmm.VM, rec store.Session) string {
	if nd, ok := vm.(vmm.NICDialer); ok && nd.HasNIC() {
		return rec.NICMAC
	}
	return ""
}

// nicAddr is the guest's address on its NIC, which its MAC names.
func (s *sess) nicAddr() netip.Addr {
	s.mu.Lock()
	mac := s.rec.NICMAC
	s.mu.Unlock()
	hw, _ := net.ParseMAC(mac)
	return guest.NICAddrOf(hw).Addr()
}

// nicGateway is host.berth.internal on the guest's network.
var nicGateway = netip.MustParseAddr(guest.NICGateway)

// serveNIC serves the VM's NIC, if it has one, until ctx ends (supervise's
// lifetime) or the VM exits. A connection that fails while the VM runs
// is made again: open flows are cut, the guest's network stays.
func (s *sess) serveNIC(ctx context.Context, vm vmm.VM) {
	nd, ok := vm.(vmm.NICDialer)
	if !ok || !nd.HasNIC() {
		return
	}
	peer := nicPeer{s}
	for {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		conn, err := nd.DialNIC(dctx)
		cancel()
		if err == nil {
			// Forwards reach the guest through this stack while it runs;
			// a newer VM's stack may be up before this one says it ended.
			var cur *netstack.Guest
			up := func(g *netstack.Guest) {
				if g != nil {
					cur = g
					s.nic.Store(g)
					return
				}
				s.nic.CompareAndSwap(cur, nil)
			}
			err = netstack.Serve(ctx, conn, peer, netstack.Config{MaxFlows: s.m.proxy.Config().MaxConns, GuestAddr: s.nicAddr(), Up: up})
		}
		if errors.Is(err, fs.ErrNotExist) {
			return
		}
		// The socket ends with the VM: only a failure while it runs on is
		// worth a line in the log.
		select {
		case <-ctx.Done():
			return
		case <-vm.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
		if err != nil {
			s.m.log.Warn("guest NIC: serving it again", "session", s.name, "err", err)
		}
	}
}

// nicPeer is a session as its NIC's stack sees it: the egress proxy's
// policy, counters and timeline notes.
type nicPeer struct{ s *sess }

func (p nicPeer) Decide(f egress.Flow) egress.Verdict {
	return p.s.m.proxy.Decide(egressPeer{p.s}, nicGateway, f)
}
func (p nicPeer) Refused(v egress.Verdict)   { p.s.m.proxy.Refusal(egressPeer{p.s}, v) }
func (p nicPeer) Counters() *egress.Counters { return &p.s.egress }
func (p nicPeer) Touch()                     { p.s.touch() }

func (p nicPeer) AnswerDNS(ctx context.Context, q []byte, tcp bool) []byte {
	tr := egress.UDP
	if tcp {
		tr = egress.TCP
	}
	return p.s.m.proxy.AnswerNICDNS(ctx, egressPeer{p.s}, q, tr, nicGateway)
}

// A memory snapshot restores only into a VM with the same devices: the
// file beside it says whether its VM had a NIC.
func nicMark(snap string) string { return snap + ".nic" }

// markNIC records beside snap whether vm has a NIC.
func markNIC(vm vmm.VM, snap string) {
	if nd, ok := vm.(vmm.NICDialer); ok && nd.HasNIC() {
		os.WriteFile(nicMark(snap), nil, 0o644)
		return
	}
	os.Remove(nicMark(snap))
}

// copyNICMark carries the mark of a snapshot copied from from to to.
func copyNICMark(from, to string) {
	if snapHasNIC(from) {
		os.WriteFile(nicMark(to), nil, 0o644)
		return
	}
	os.Remove(nicMark(to))
}

func snapHasNIC(snap string) bool {
	_, err := os.Stat(nicMark(snap))
	return err == nil
}

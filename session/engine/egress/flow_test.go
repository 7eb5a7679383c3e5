package egress

import (
	"net/netip"
	"strings"
	"testing"
)

func TestEgressDecideFlow(t *testing.T) {
	hostAddr := netip.MustParseAddr("10.0.2.2")
	ap := netip.MustParseAddrPort
	for _, tc := range []struct {
		name, policy string
		resolved     map[string][]string // name → addresses berth's DNS gave
		flow         Flow
		allow        bool
		dial         string // when allowed
		want         string // in the message or reason when refused
	}{
		{name: "none refuses a public address", policy: "none", flow: Flow{Dst: ap("93.184.216.34:443")}, want: "egress to 93.184.216.34:443 is not allowed"},
		{name: "open allows a public address", policy: "open", flow: Flow{Dst: ap("93.184.216.34:443")}, allow: true, dial: "93.184.216.34:443"},
		{name: "open refuses a reserved address and says which range", policy: "open", flow: Flow{Dst: ap("192.0.2.7:80")},
			want: "192.0.2.7 is a reserved address (192.0.2.0/24); naming 192.0.2.7 or 192.0.2.0/24 in the policy allows it"},
		{name: "a reserved address named by CIDR", policy: "allow:192.0.2.0/24", flow: Flow{Dst: ap("192.0.2.7:80")}, allow: true, dial: "192.0.2.7:80"},
		{name: "a CIDR entry's port is kept", policy: "allow:192.0.2.0/24:80", flow: Flow{Dst: ap("192.0.2.7:81")}, want: "not allowed"},
		{name: "allow: an address not from berth's DNS", policy: "allow:pkgs.test", flow: Flow{Dst: ap("93.184.216.34:443")},
			want: "was not given by berth's DNS"},
		{name: "allow: an address berth's DNS gave for an allowed name", policy: "allow:pkgs.test",
			resolved: map[string][]string{"pkgs.test": {"93.184.216.34"}}, flow: Flow{Dst: ap("93.184.216.34:443")}, allow: true, dial: "93.184.216.34:443"},
		{name: "allow: the name's port is kept", policy: "allow:pkgs.test:443",
			resolved: map[string][]string{"pkgs.test": {"93.184.216.34"}}, flow: Flow{Dst: ap("93.184.216.34:22")}, want: "egress to pkgs.test:22 is not allowed"},
		{name: "allow: a name that resolved to a reserved address names it", policy: "allow:mirror.test",
			resolved: map[string][]string{"mirror.test": {"203.0.113.9"}}, flow: Flow{Dst: ap("203.0.113.9:80")},
			want: "mirror.test resolves to 203.0.113.9, a reserved address (203.0.113.0/24); naming 203.0.113.9 or 203.0.113.0/24"},
		{name: "the host where named", policy: "allow:host.berth.internal:8080", flow: Flow{Dst: ap("10.0.2.2:8080")}, allow: true, dial: "127.0.0.1:8080"},
		{name: "the host on a port not named", policy: "allow:host.berth.internal:8080", flow: Flow{Dst: ap("10.0.2.2:8081")},
			want: "the host is reachable only where the policy names host.berth.internal"},
		{name: "the host under open is not named", policy: "open", flow: Flow{Dst: ap("10.0.2.2:8080")}, want: "host.berth.internal:8080"},
		{name: "berth's own port on the host, even when named", policy: "allow:host.berth.internal", flow: Flow{Dst: ap("10.0.2.2:2222")},
			want: "berth's own ports are never reachable"},
		{name: "berth's own port on loopback named by CIDR", policy: "allow:127.0.0.0/8", flow: Flow{Dst: ap("127.0.0.1:2222")},
			want: "berth's own ports are never reachable"},
		{name: "udp to the host where named", policy: "allow:host.berth.internal:5353", flow: Flow{UDP: true, Dst: ap("10.0.2.2:5353")}, allow: true, dial: "127.0.0.1:5353"},
		{name: "udp refusal says udp", policy: "none", flow: Flow{UDP: true, Dst: ap("93.184.216.34:123")}, want: "egress to udp 93.184.216.34:123"},
		{name: "port 0", policy: "open", flow: Flow{Dst: ap("93.184.216.34:0")}, want: "port 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestSess(t, tc.policy, Config{Forbidden: []int{2222}})
			for n, as := range tc.resolved {
				var addrs []netip.Addr
				for _, a := range as {
					addrs = append(addrs, netip.MustParseAddr(a))
				}
				s.c.Resolved.Record(n, addrs)
			}
			v := s.Decide(s, hostAddr, tc.flow)
			if v.Allow != tc.allow {
				t.Fatalf("allow = %v (%s: %s), want %v", v.Allow, v.Msg, v.Reason, tc.allow)
			}
			if tc.allow {
				if v.Dial.String() != tc.dial {
					t.Errorf("dial %s, want %s", v.Dial, tc.dial)
				}
				return
			}
			if got := v.Msg + ": " + v.Reason; !strings.Contains(got, tc.want) {
				t.Errorf("refusal %q does not say %q", got, tc.want)
			}
		})
	}
}

func TestEgressResolvedBounded(t *testing.T) {
	var r Resolved
	for i := range maxResolved + 100 {
		r.Record("n.test", []netip.Addr{netip.AddrFrom4([4]byte{1, byte(i >> 16), byte(i >> 8), byte(i)})})
	}
	if n := len(r.addrs); n > maxResolved {
		t.Fatalf("%d addresses kept, bound is %d", n, maxResolved)
	}
	a := netip.MustParseAddr("8.8.8.8")
	for i := range maxNamesPerAddr + 5 {
		r.Record(strings.Repeat("x", i+1)+".test", []netip.Addr{a})
	}
	names := r.Names(a)
	if len(names) != maxNamesPerAddr || names[len(names)-1] != strings.Repeat("x", maxNamesPerAddr+5)+".test" {
		t.Fatalf("names %v: want the last %d, newest last", names, maxNamesPerAddr)
	}
}

// A name allowed by the policy whose addresses are all reserved answers
// with none, and the timeline says which address, its range, and that
// naming it allows it (a mirror resolving to TEST-NET).
func TestDNSReservedNoted(t *testing.T) {
	s := egressSess(t, "allow:ten.test", Config{})
	r := s.answer(t.Context(), dnsQuery("ten.test", dnsTypeA))
	if len(r) < 12 || r[3]&0x0f != rcodeOK || r[7] != 0 {
		t.Fatalf("reply %x: want NOERROR with no answers", r)
	}
	notes := s.Notes()
	want := "ten.test resolves to 10.0.0.1, a reserved address (10.0.0.0/8); naming 10.0.0.1 or 10.0.0.0/8 in the policy allows it"
	if len(notes) != 1 || !strings.Contains(notes[0], want) {
		t.Fatalf("notes %q, want one saying %q", notes, want)
	}
	if n := s.c.Refused.Load(); n != 0 {
		t.Errorf("%d refusals counted for an answer", n)
	}
}

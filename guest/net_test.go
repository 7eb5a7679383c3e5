package guest

import (
	"net"
	"testing"
)

func TestNICAddrOf(t *testing.T) {
	for _, tc := range []struct {
		mac, want string
	}{
		{NICMAC, "10.0.2.15/24"}, // sessions made before each NIC had its own MAC
		{"52:54:00:aa:bb:00", "10.0.2.16/24"},
		{"52:54:00:aa:bb:01", "10.0.2.17/24"},
		{"52:54:00:aa:bb:ee", "10.0.2.254/24"}, // 16+238
		{"52:54:00:aa:bb:ef", "10.0.2.16/24"},  // 239 wraps
		{"52:54:00:aa:bb:ff", "10.0.2.32/24"},
		{"", NICAddr}, // no MAC: the default
	} {
		hw, _ := net.ParseMAC(tc.mac)
		if got := NICAddrOf(hw).String(); got != tc.want {
			t.Errorf("NICAddrOf(%q) = %s, want %s", tc.mac, got, tc.want)
		}
	}
	// Never the network's own addresses, the gateway or the DNS server.
	for b := range 256 {
		a := NICAddrOf(net.HardwareAddr{0x52, 0x54, 0, 1, 2, byte(b)}).Addr()
		if last := a.As4()[3]; last < 16 || last == 255 || !NICNet.Contains(a) {
			t.Fatalf("last byte %d gives %s", b, a)
		}
	}
}

func TestNewNICMAC(t *testing.T) {
	seen := map[string]bool{}
	for range 2000 {
		src := NewNICMAC()
		hw, err := net.ParseMAC(src)
		if err != nil || hw[0] != 0x52 || hw[0]&1 != 0 || hw[0]&2 == 0 || src == NICMAC {
			t.Fatalf("NewNICMAC() = %q: want a unicast, locally administered MAC of its own (%v)", src, err)
		}
		seen[src] = true
		fork := NewNICMAC(src)
		fh, _ := net.ParseMAC(fork)
		if fork == src || NICAddrOf(fh) == NICAddrOf(hw) {
			t.Fatalf("a fork of %s (%s) got %s (%s)", src, NICAddrOf(hw), fork, NICAddrOf(fh))
		}
		// A source made before MACs were its own has NICMAC ("" in its record).
		if legacy, _ := net.ParseMAC(NewNICMAC("")); NICAddrOf(legacy).String() == NICAddr {
			t.Fatalf("a fork of a session with the default MAC got its address")
		}
	}
	if len(seen) < 1990 {
		t.Errorf("2000 MACs, %d distinct", len(seen))
	}
}

package session

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func TestParsePolicy(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		bad      string // substring of the error
	}{
		{in: "none", want: "none"},
		{in: "open", want: "open"},
		{in: "OPEN", want: "open"},
		{in: "allow:pypi.org", want: "allow:pypi.org"},
		{in: "allow:PyPI.org.,*.githubusercontent.com:443", want: "allow:pypi.org,*.githubusercontent.com:443"},
		{in: "allow:10.0.0.0/8,1.2.3.4:80,[2001:db8::1]:443,2001:db8::/32", want: "allow:10.0.0.0/8,1.2.3.4:80,[2001:db8::1]:443,2001:db8::/32"},
		{in: "allow:10.1.2.3/8", want: "allow:10.0.0.0/8"},
		{in: "allow:host.berth.internal:8080", want: "allow:host.berth.internal:8080"},
		{in: "open:10.0.0.5,host.berth.internal", want: "open:10.0.0.5,host.berth.internal"},
		{in: "allow:", bad: "at least one entry"},
		{in: "allow", bad: "at least one entry"},
		{in: "allow:*.", bad: `entry "*."`},
		{in: "allow::0", bad: `entry ":0"`},
		{in: "allow:a.com:0", bad: `port "0"`},
		{in: "allow:a.com:65536", bad: `entry "a.com:65536"`},
		{in: "allow:10.0.0.0/33", bad: `entry "10.0.0.0/33"`},
		{in: "allow:a.*.com", bad: "first label"},
		{in: "allow:1.2.3", bad: "IP address"},
		{in: "allow:a.com,,b.com", bad: "empty entry"},
		{in: "allow:-a.com", bad: "start or end"},
		{in: "allow:a.com:", bad: "missing port"},
		{in: "none:a.com", bad: "no entries"},
		{in: "open:", bad: "empty entry list"},
		{in: "closed", bad: "use none, open or allow"},
		{in: "", bad: "use none, open or allow"},
	} {
		p, err := ParsePolicy(tc.in)
		if tc.bad != "" {
			if err == nil || !strings.Contains(err.Error(), tc.bad) || !errors.Is(err, ErrInvalid) {
				t.Errorf("ParsePolicy(%q) = %v, %v; want an ErrInvalid containing %q", tc.in, p, err, tc.bad)
			}
			continue
		}
		if err != nil || p.String() != tc.want {
			t.Errorf("ParsePolicy(%q) = %q, %v; want %q", tc.in, p.String(), err, tc.want)
		}
		if again, err := ParsePolicy(p.String()); err != nil || again.String() != p.String() {
			t.Errorf("ParsePolicy(%q) does not round trip: %q, %v", p.String(), again.String(), err)
		}
	}
}

func TestPolicyChecks(t *testing.T) {
	mustP := func(s string) Policy {
		p, err := ParsePolicy(s)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	a := netip.MustParseAddr
	for _, tc := range []struct {
		policy string
		name   string // "" for an address without a name
		addr   string
		port   int
		want   bool
	}{
		{"none", "example.com", "93.184.216.34", 443, false},
		{"none", "", "93.184.216.34", 443, false},
		{"open", "example.com", "93.184.216.34", 443, true},
		{"open", "", "93.184.216.34", 80, true},
		{"open", "", "127.0.0.1", 80, false},
		{"open", "", "10.1.2.3", 80, false},
		{"open", "", "172.16.0.1", 80, false},
		{"open", "", "192.168.1.1", 80, false},
		{"open", "", "100.64.0.1", 80, false},
		{"open", "", "169.254.169.254", 80, false},
		{"open", "", "::1", 80, false},
		{"open", "", "fd00::1", 80, false},
		{"open", "", "fe80::1", 80, false},
		{"open", "", "::ffff:127.0.0.1", 80, false},
		{"open", "", "0.0.0.0", 80, false},
		{"open", "internal.example", "10.0.0.7", 443, false}, // a name resolving to 10.x
		{"open:10.0.0.7", "internal.example", "10.0.0.7", 443, true},
		{"open:10.0.0.0/8:443", "", "10.0.0.7", 80, false},
		{"allow:pypi.org", "pypi.org", "151.101.0.223", 443, true},
		{"allow:pypi.org", "PyPI.org.", "151.101.0.223", 443, true},
		{"allow:pypi.org", "files.pypi.org", "151.101.0.223", 443, false},
		{"allow:pypi.org", "evil.com", "151.101.0.223", 443, false},
		{"allow:pypi.org", "", "151.101.0.223", 443, false}, // by address: not named
		{"allow:pypi.org:443", "pypi.org", "151.101.0.223", 80, false},
		{"allow:*.githubusercontent.com", "raw.githubusercontent.com", "185.199.108.133", 443, true},
		{"allow:*.githubusercontent.com", "githubusercontent.com", "185.199.108.133", 443, false},
		{"allow:*.githubusercontent.com", "xgithubusercontent.com", "185.199.108.133", 443, false},
		{"allow:pypi.org", "pypi.org", "10.0.0.1", 443, false}, // an allowed name resolving to a private address
		{"allow:pypi.org,10.0.0.1", "pypi.org", "10.0.0.1", 443, true},
		{"allow:1.2.3.0/24", "", "1.2.3.4", 22, true},
		{"allow:1.2.3.0/24", "", "1.2.4.4", 22, false},
		{"allow:127.0.0.1:8080", "", "127.0.0.1", 8080, true},
		{"allow:127.0.0.1:8080", "", "127.0.0.1", 8081, false},
	} {
		p := mustP(tc.policy)
		got := true
		if tc.name != "" {
			got = p.AllowsName(tc.name, tc.port)
		}
		got = got && p.AllowsAddr(a(tc.addr), tc.port, tc.name != "")
		if got != tc.want {
			t.Errorf("policy %s: %s %s:%d allowed = %v, want %v", tc.policy, tc.name, tc.addr, tc.port, got, tc.want)
		}
	}
	if mustP("open").AllowsHost(80) || !mustP("allow:host.berth.internal").AllowsHost(80) ||
		mustP("allow:host.berth.internal:8080").AllowsHost(80) || !mustP("open:host.berth.internal:8080").AllowsHost(8080) {
		t.Error("host.berth.internal must be reachable only where named, on the port named")
	}
}

func TestEgressRefusedMessage(t *testing.T) {
	got := EgressRefused("evil.com:443", "s1", "allow:pypi.org")
	want := "berth: egress to evil.com:443 is not allowed for session s1 (policy: allow:pypi.org)"
	if got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

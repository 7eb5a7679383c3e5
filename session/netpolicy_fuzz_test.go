package session

import (
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

// FuzzParsePolicy parses arbitrary policy text, as it comes from a create
// request, a recipe or the config file. Property: a policy either fails
// with ErrInvalid or round-trips through its printed form (parse → String
// → parse gives the same Policy, and String is then a fixed point), with
// at most maxNetEntries entries, each well-formed: a port in 1..65535 or
// none, exactly one of domain, prefix or host, domains lower case without
// a trailing dot, prefixes masked. And the checks agree with the entries:
// what the policy names it allows.
func FuzzParsePolicy(f *testing.F) {
	for _, s := range []string{
		"none", "open", "OPEN", "allow:pypi.org", "allow:PyPI.org.,*.githubusercontent.com:443",
		"allow:10.0.0.0/8,1.2.3.4:80,[2001:db8::1]:443,2001:db8::/32", "allow:10.1.2.3/8",
		"allow:host.berth.internal:8080", "open:10.0.0.5,host.berth.internal", "allow:", "allow",
		"allow:*.", "allow::0", "allow:a.com:0", "allow:a.com:65536", "allow:10.0.0.0/33", "allow:a.*.com",
		"allow:1.2.3", "allow:a.com,,b.com", "allow:-a.com", "allow:a.com:", "none:a.com", "open:", "closed", "",
		"allow:[::ffff:1.2.3.4]:80", "allow:[fe80::1%eth0]:1", "allow:[1.2.3.0/24]:22", "allow:[a.com]", " allow : a.com ",
		"allow:::", "allow:[::]:1", "allow:0.0.0.0/0", "allow:_srv.x", "allow:x.y.", "allow:1.2.3.4.",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParsePolicy(s)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("ParsePolicy(%q): %v, not ErrInvalid", s, err)
			}
			return
		}
		if len(p.Entries) > maxNetEntries {
			t.Fatalf("%d entries", len(p.Entries))
		}
		for _, e := range p.Entries {
			checkEntry(t, s, e)
		}
		text := p.String()
		again, err := ParsePolicy(text)
		if err != nil {
			t.Fatalf("ParsePolicy(%q) = %q, which does not parse: %v", s, text, err)
		}
		if !reflect.DeepEqual(normPolicy(p), normPolicy(again)) {
			t.Fatalf("ParsePolicy(%q) = %#v; its text %q parses to %#v", s, p, text, again)
		}
		if again.String() != text {
			t.Fatalf("String is no fixed point: %q, then %q", text, again.String())
		}
		for _, e := range p.Entries {
			switch {
			case e.Host:
				if !p.AllowsHost(e.Port) {
					t.Fatalf("%q names the host on port %d but does not allow it", text, e.Port)
				}
			case e.Prefix.IsValid():
				port := max(e.Port, 1)
				if !p.AllowsAddr(e.Prefix.Addr(), port, false) {
					t.Fatalf("%q names %s but does not allow it on port %d", text, e.Prefix.Addr(), port)
				}
			default:
				name := strings.TrimPrefix(e.Domain, "*.")
				if e.Domain != name {
					name = "x." + name
				}
				if !p.AllowsName(name, e.Port) {
					t.Fatalf("%q names %s but does not allow %q on port %d", text, e.Domain, name, e.Port)
				}
			}
		}
	})
}

// normPolicy makes a nil and an empty entry list the same.
func normPolicy(p Policy) Policy {
	if len(p.Entries) == 0 {
		p.Entries = nil
	}
	return p
}

func checkEntry(t *testing.T, in string, e NetEntry) {
	t.Helper()
	kinds := 0
	if e.Host {
		kinds++
	}
	if e.Prefix.IsValid() {
		kinds++
		if e.Prefix != e.Prefix.Masked() {
			t.Fatalf("%q: prefix %s not masked", in, e.Prefix)
		}
		if e.Prefix.Addr().Zone() != "" {
			t.Fatalf("%q: zoned prefix %s", in, e.Prefix)
		}
	}
	if e.Domain != "" {
		kinds++
		if e.Domain != strings.ToLower(e.Domain) || strings.HasSuffix(e.Domain, ".") {
			t.Fatalf("%q: domain %q not canonical", in, e.Domain)
		}
		if _, err := netip.ParseAddr(e.Domain); err == nil {
			t.Fatalf("%q: the address %q became a domain", in, e.Domain)
		}
		if strings.ContainsAny(e.Domain, ":,/[] \t") {
			t.Fatalf("%q: domain %q holds a separator", in, e.Domain)
		}
	}
	if kinds != 1 {
		t.Fatalf("%q: entry %#v is %d kinds at once", in, e, kinds)
	}
	if e.Port < 0 || e.Port > 65535 {
		t.Fatalf("%q: port %d", in, e.Port)
	}
}

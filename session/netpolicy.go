package session

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// HostName is the name under which a session's guest reaches the host
// itself, when its policy names it.
const HostName = "host.berth.internal"

// DefaultNet is the network policy of new sessions unless the config file
// or create says otherwise: no egress at all.
const DefaultNet = "none"

// NetMode is a policy's base rule.
type NetMode string

const (
	NetNone  NetMode = "none"  // nothing leaves the guest
	NetOpen  NetMode = "open"  // public addresses; entries add reserved ones
	NetAllow NetMode = "allow" // only what the entries name
)

// Policy is a session's egress policy, parsed. The zero value is "none".
//
//	none
//	open[:ENTRY,…]     any public address, plus the reserved ones named
//	allow:ENTRY[,…]    only what the entries name
//
// An entry is a domain (pypi.org, *.githubusercontent.com), an IP address
// or CIDR ([…] around IPv6 when a port follows), or host.berth.internal,
// each with an optional :PORT.
type Policy struct {
	Mode    NetMode
	Entries []NetEntry
}

// NetEntry is one entry of a policy.
type NetEntry struct {
	Domain string       // lower case; "*.example.com" matches every name below example.com
	Prefix netip.Prefix // set for an IP or CIDR entry
	Host   bool         // host.berth.internal
	Port   int          // 0: every port
}

func (e NetEntry) String() string {
	var h string
	switch {
	case e.Host:
		h = HostName
	case e.Prefix.IsValid():
		if e.Prefix.IsSingleIP() {
			h = e.Prefix.Addr().String()
		} else {
			h = e.Prefix.String()
		}
		if e.Port != 0 && e.Prefix.Addr().Is6() {
			h = "[" + h + "]"
		}
	default:
		h = e.Domain
	}
	if e.Port != 0 {
		h += ":" + strconv.Itoa(e.Port)
	}
	return h
}

// String is the policy in the form ParsePolicy reads.
func (p Policy) String() string {
	mode := p.Mode
	if mode == "" {
		mode = NetNone
	}
	if len(p.Entries) == 0 {
		return string(mode)
	}
	parts := make([]string, len(p.Entries))
	for i, e := range p.Entries {
		parts[i] = e.String()
	}
	return string(mode) + ":" + strings.Join(parts, ",")
}

// maxNetEntries bounds a policy's entries.
const maxNetEntries = 256

// ParsePolicy parses a policy; errors name the entry at fault and wrap
// ErrInvalid.
func ParsePolicy(s string) (Policy, error) {
	s = strings.TrimSpace(s)
	mode, rest, hasList := strings.Cut(s, ":")
	var p Policy
	switch NetMode(strings.ToLower(mode)) {
	case NetNone:
		if hasList {
			return p, fmt.Errorf("network policy %q: none takes no entries (use allow:ENTRY,…): %w", s, ErrInvalid)
		}
		return Policy{Mode: NetNone}, nil
	case NetOpen:
		p.Mode = NetOpen
	case NetAllow:
		p.Mode = NetAllow
		if !hasList || strings.TrimSpace(rest) == "" {
			return p, fmt.Errorf("network policy %q: allow needs at least one entry (allow:pypi.org,*.github.com:443): %w", s, ErrInvalid)
		}
	default:
		return p, fmt.Errorf("network policy %q: use none, open or allow:ENTRY[,ENTRY…]: %w", s, ErrInvalid)
	}
	if !hasList {
		return p, nil
	}
	if strings.TrimSpace(rest) == "" {
		return p, fmt.Errorf("network policy %q: an empty entry list (drop the colon): %w", s, ErrInvalid)
	}
	for _, raw := range strings.Split(rest, ",") {
		e, err := parseNetEntry(strings.TrimSpace(raw))
		if err != nil {
			return Policy{}, fmt.Errorf("network policy entry %q: %v: %w", raw, err, ErrInvalid)
		}
		p.Entries = append(p.Entries, e)
		if len(p.Entries) > maxNetEntries {
			return Policy{}, fmt.Errorf("network policy: more than %d entries: %w", maxNetEntries, ErrInvalid)
		}
	}
	return p, nil
}

func parseNetEntry(s string) (NetEntry, error) {
	var e NetEntry
	if s == "" {
		return e, fmt.Errorf("empty entry")
	}
	host, port := s, ""
	switch {
	case strings.HasPrefix(s, "["):
		end := strings.Index(s, "]")
		if end < 0 {
			return e, fmt.Errorf("missing ]")
		}
		host, port = s[1:end], s[end+1:]
		if port != "" {
			if !strings.HasPrefix(port, ":") {
				return e, fmt.Errorf("unexpected %q after ]", port)
			}
			port = port[1:]
			if port == "" {
				return e, fmt.Errorf("missing port after the colon")
			}
		}
	case strings.Count(s, ":") == 1:
		host, port, _ = strings.Cut(s, ":")
		if port == "" {
			return e, fmt.Errorf("missing port after the colon")
		}
	}
	if port != "" {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 {
			return e, fmt.Errorf("port %q: use 1 to 65535", port)
		}
		e.Port = n
	}
	if host == "" {
		return e, fmt.Errorf("no host before the port")
	}
	if strings.Contains(host, "/") {
		pr, err := netip.ParsePrefix(host)
		if err != nil {
			return e, fmt.Errorf("not a CIDR: %v", err)
		}
		// Addresses are checked unmapped: an IPv4-mapped prefix is
		// kept as the IPv4 prefix it means, or it would match nothing.
		if pr.Addr().Is4In6() && pr.Bits() >= 96 {
			pr = netip.PrefixFrom(pr.Addr().Unmap(), pr.Bits()-96)
		}
		e.Prefix = pr.Masked()
		return e, nil
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if a.Zone() != "" {
			return e, fmt.Errorf("zoned addresses are not supported")
		}
		a = a.Unmap() // as Names checks them
		e.Prefix = netip.PrefixFrom(a, a.BitLen())
		return e, nil
	}
	if strings.Contains(host, ":") {
		return e, fmt.Errorf("not an IP address (put IPv6 addresses with a port in brackets: [2001:db8::1]:443)")
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if host == HostName {
		e.Host = true
		return e, nil
	}
	if err := checkDomain(host); err != nil {
		return e, err
	}
	e.Domain = host
	return e, nil
}

// checkDomain accepts a DNS name, optionally with a leading "*." wildcard.
func checkDomain(d string) error {
	name := strings.TrimPrefix(d, "*.")
	if name == "" {
		return fmt.Errorf("a wildcard needs a domain after it (*.example.com)")
	}
	if strings.Contains(name, "*") {
		return fmt.Errorf("a wildcard may only be the first label (*.example.com)")
	}
	if len(name) > 253 {
		return fmt.Errorf("domain longer than 253 characters")
	}
	labels := strings.Split(name, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 {
			return fmt.Errorf("domain label %q: 1 to 63 characters", l)
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return fmt.Errorf("domain label %q may not start or end with '-'", l)
		}
		for _, c := range l {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("domain label %q: only letters, digits, '-' and '_'", l)
			}
		}
	}
	if _, err := strconv.Atoi(labels[len(labels)-1]); err == nil {
		return fmt.Errorf("looks like an IP address but is not one")
	}
	return nil
}

func (e NetEntry) port(port int) bool { return e.Port == 0 || e.Port == port }

// matchName reports whether a domain entry covers name on port.
func (e NetEntry) matchName(name string, port int) bool {
	if e.Domain == "" || !e.port(port) {
		return false
	}
	if suffix, ok := strings.CutPrefix(e.Domain, "*."); ok {
		return strings.HasSuffix(name, "."+suffix)
	}
	return name == e.Domain
}

// AllowsName reports whether the policy lets the guest use name on port
// (port 0: on some port), before its addresses are checked: a domain entry
// covers it, or the policy is open.
func (p Policy) AllowsName(name string, port int) bool {
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	switch p.Mode {
	case NetOpen:
		return true
	case NetAllow:
		for _, e := range p.Entries {
			if e.Domain != "" && (port == 0 && e.matchName(name, e.Port) || e.matchName(name, port)) {
				return true
			}
		}
	}
	return false
}

// Names reports whether an IP or CIDR entry of the policy covers addr on
// port (0: on some port).
func (p Policy) Names(addr netip.Addr, port int) bool {
	addr = addr.Unmap()
	for _, e := range p.Entries {
		if e.Prefix.IsValid() && e.Prefix.Contains(addr) && (port == 0 || e.port(port)) {
			return true
		}
	}
	return false
}

// AllowsHost reports whether the policy names host.berth.internal on port.
func (p Policy) AllowsHost(port int) bool {
	for _, e := range p.Entries {
		if e.Host && e.port(port) {
			return true
		}
	}
	return false
}

// AllowsAddr reports whether the guest may connect to addr on port once
// the name it asked for (if any) was allowed: a reserved address only when
// an entry names it; otherwise under open any public address, under allow
// those named or reached by an allowed name (viaName).
func (p Policy) AllowsAddr(addr netip.Addr, port int, viaName bool) bool {
	if p.Names(addr, port) {
		return true
	}
	if Reserved(addr) {
		return false
	}
	switch p.Mode {
	case NetOpen:
		return true
	case NetAllow:
		return viaName
	}
	return false
}

// reservedPrefixes are never reached unless a policy names them: loopback,
// private (RFC 1918, ULA), link-local (with the cloud metadata address),
// CGNAT, this-network, multicast and the other special-purpose ranges.
var reservedPrefixes = func() []netip.Prefix {
	var out []netip.Prefix
	for _, s := range []string{
		"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
		"172.16.0.0/12", "192.0.0.0/24", "192.0.2.0/24", "192.168.0.0/16", "198.18.0.0/15",
		"198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
		"::/128", "::1/128", "64:ff9b::/96", "100::/64", "2001:db8::/32", "fc00::/7", "fe80::/10", "ff00::/8",
	} {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}()

// Reserved reports whether addr is one a guest never reaches unless its
// policy names it.
func Reserved(addr netip.Addr) bool {
	if !addr.Unmap().IsValid() {
		return true
	}
	_, ok := ReservedRange(addr)
	return ok
}

// ReservedRange returns the reserved range addr is in, if it is in one.
func ReservedRange(addr netip.Addr) (netip.Prefix, bool) {
	addr = addr.Unmap()
	for _, p := range reservedPrefixes {
		if p.Contains(addr) {
			return p, true
		}
	}
	return netip.Prefix{}, false
}

// EgressRefused is the message a guest's client sees for a refused
// connection.
func EgressRefused(hostport, name, policy string) string {
	return fmt.Sprintf("berth: egress to %s is not allowed for session %s (policy: %s)", hostport, name, policy)
}

// EgressRefusedReserved is the refusal of a connection whose host is, or
// resolved only to, a reserved address the policy does not name: it says
// which address, its range, and that naming it allows it, so a mirror
// that resolves to a private address does not read as a contradiction.
func EgressRefusedReserved(hostport, name, policy, host string, addr netip.Addr, r netip.Prefix) string {
	what := fmt.Sprintf("%s resolves to %s, a reserved address (%s)", host, addr, r)
	if host == addr.String() {
		what = fmt.Sprintf("%s is a reserved address (%s)", host, r)
	}
	return fmt.Sprintf("berth: egress to %s is not allowed for session %s: %s; naming %s or %s in the policy allows it (policy: %s)",
		hostport, name, what, addr, r, policy)
}

package engine

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/store"
)

// fuzzSess is egressSess for any testing.TB: a session runtime without a
// VM, its names resolved by resolve.
func fuzzSess(tb testing.TB, policy string, resolve func(ctx context.Context, host string) ([]netip.Addr, error)) *sess {
	tb.Helper()
	st, err := store.Open(filepath.Join(tb.TempDir(), "store"), nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { st.Close() })
	m := &Manager{cfg: Config{Net: NetConfig{Resolve: resolve}}, st: st, log: slog.New(slog.DiscardHandler), hub: newHub(), sessions: map[string]*sess{}, runs: map[string]*run{}}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	tb.Cleanup(m.cancel)
	return m.newSess(store.Session{Name: "s1", Net: policy})
}

// manyAddrs resolves every name to many addresses of both families,
// public and reserved, so an answer is as large as a policy lets it be;
// "nx." names do not exist.
func manyAddrs(ctx context.Context, host string) ([]netip.Addr, error) {
	if strings.HasPrefix(host, "nx.") {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	if strings.HasPrefix(host, "fail.") {
		return nil, &net.DNSError{Err: "server misbehaving", Name: host}
	}
	var out []netip.Addr
	for i := range 24 {
		out = append(out,
			netip.AddrFrom4([4]byte{93, 184, 0, byte(i)}),
			netip.MustParseAddr(fmt.Sprintf("2606:2800:220:1::%x", i+1)),
			netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}),
			netip.MustParseAddr(fmt.Sprintf("::ffff:1.2.3.%d", i)))
	}
	return out, nil
}

// maxUDPDNS is the most a DNS reply over UDP may hold without EDNS (RFC
// 1035 4.2.1); the responder does not speak EDNS.
const maxUDPDNS = 512

// FuzzDNSQuery sends arbitrary queries to a session's DNS responder.
// Property: a query of at least a header is always answered, and the
// answer is a well-formed DNS message (checked field by field: header,
// the question echoed exactly, answer records that parse, nothing after
// them) with the query's id, no longer than 512 bytes; its addresses are
// of the family asked for and allowed by the session's policy; names the
// policy refuses get no address.
func FuzzDNSQuery(f *testing.F) {
	f.Add(dnsQuery("pkgs.test", dnsTypeA), uint8(0))
	f.Add(dnsQuery("PKGS.test", dnsTypeAAAA), uint8(0))
	f.Add(dnsQuery("a.allowed.test", dnsTypeAAAA), uint8(1))
	f.Add(dnsQuery("nx.test", dnsTypeA), uint8(0))
	f.Add(dnsQuery("fail.test", dnsTypeA), uint8(0))
	f.Add(dnsQuery("host.berth.internal", dnsTypeA), uint8(2))
	f.Add(dnsQuery("x.test", 16), uint8(0))
	f.Add(append(dnsQuery("a.test", 1)[:14], 0xff), uint8(0))
	f.Add([]byte{1, 2, 3}, uint8(0))
	f.Add(dnsQuery(strings.Repeat("a", 63)+"."+strings.Repeat("b", 63)+"."+strings.Repeat("c", 63), dnsTypeAAAA), uint8(0))
	f.Add(dnsQuery(strings.Repeat(strings.Repeat("l", 63)+".", 8)+"test", dnsTypeA), uint8(0))
	q := dnsQuery("edns.test", dnsTypeA)
	binary.BigEndian.PutUint16(q[10:], 1) // an OPT record asking for 4096 bytes
	f.Add(append(q, 0, 0, 41, 0x10, 0, 0, 0, 0, 0, 0, 0), uint8(0))

	policies := []string{"open", "allow:*.allowed.test,pkgs.test", "none", "open:10.0.0.0/8,host.berth.internal"}
	sessions := make([]*sess, len(policies))
	var resolved atomic.Int64
	for i, p := range policies {
		sessions[i] = fuzzSess(f, p, func(ctx context.Context, host string) ([]netip.Addr, error) {
			resolved.Add(1)
			return manyAddrs(ctx, host)
		})
	}
	f.Fuzz(func(t *testing.T, q []byte, which uint8) {
		s := sessions[int(which)%len(sessions)]
		pol := s.policy()
		before := resolved.Load()
		r := s.answerDNS(context.Background(), q)
		if len(q) < 12 {
			if r != nil {
				t.Fatalf("a %d byte query answered with %x", len(q), r)
			}
			return
		}
		if r == nil {
			t.Fatalf("query %x not answered", q)
		}
		if len(r) > maxUDPDNS {
			t.Fatalf("answer of %d bytes, over the %d a UDP reply may hold", len(r), maxUDPDNS)
		}
		m, err := parseDNSReply(r)
		if err != nil {
			t.Fatalf("answer %x to %x is malformed: %v", r, q, err)
		}
		if m.id != binary.BigEndian.Uint16(q) {
			t.Fatalf("answer id %#x, query id %#x", m.id, binary.BigEndian.Uint16(q))
		}
		d, qerr := parseDNSQuery(q)
		if qerr != nil {
			if m.rcode != rcodeFormErr || m.qdcount != 0 || len(m.answers) != 0 {
				t.Fatalf("malformed query %x answered with rcode %d, %d questions, %d answers; want FORMERR alone", q, m.rcode, m.qdcount, len(m.answers))
			}
			return
		}
		if m.qdcount != 1 || string(m.question) != string(q[12:d.end]) {
			t.Fatalf("the answer's question %x is not the query's %x", m.question, q[12:d.end])
		}
		if m.opcode != d.flags>>11&0xf || m.rd != (d.flags&0x0100 != 0) {
			t.Fatalf("opcode/RD not echoed: flags %#x for query flags %#x", m.flags, d.flags)
		}
		allowed := d.opcodeQuery && d.qclass == dnsClassIN && d.name != session.HostName && pol.AllowsName(d.name, 0)
		if !allowed {
			if m.rcode != rcodeRefused || len(m.answers) != 0 {
				t.Fatalf("%q (policy %s) answered with rcode %d and %d addresses; want REFUSED", d.name, pol, m.rcode, len(m.answers))
			}
			if resolved.Load() != before {
				t.Fatalf("%q, refused by policy %s, was resolved", d.name, pol)
			}
			return
		}
		for _, a := range m.answers {
			if (d.qtype == dnsTypeA) != a.Is4() {
				t.Fatalf("type %d query answered with %s", d.qtype, a)
			}
			if !pol.AllowsAddr(a, 0, true) {
				t.Fatalf("%q answered with %s, which policy %s does not allow", d.name, a, pol)
			}
		}
		if len(m.answers) > 0 && m.rcode != rcodeOK {
			t.Fatalf("rcode %d with %d answers", m.rcode, len(m.answers))
		}
		if d.qtype == dnsTypeA && m.rcode == rcodeOK && !strings.HasPrefix(d.name, "nx.") && !strings.HasPrefix(d.name, "fail.") && len(m.answers) == 0 {
			t.Fatalf("%q (policy %s) resolves to allowed addresses, none given", d.name, pol)
		}
	})
}

// dnsReply is a parsed answer.
type dnsReply struct {
	id, flags, opcode uint16
	rd                bool
	rcode             int
	qdcount           int
	question          []byte // the question section as sent
	answers           []netip.Addr
}

// parseDNSReply parses an answer strictly, as a stub resolver would: any
// count that does not match the records present, any record that does
// not parse, and any byte after the last record is an error.
func parseDNSReply(r []byte) (dnsReply, error) {
	var m dnsReply
	if len(r) < 12 {
		return m, fmt.Errorf("%d bytes: shorter than a header", len(r))
	}
	m.id = binary.BigEndian.Uint16(r)
	m.flags = binary.BigEndian.Uint16(r[2:])
	if m.flags&0x8000 == 0 {
		return m, fmt.Errorf("QR not set")
	}
	m.opcode = m.flags >> 11 & 0xf
	m.rd = m.flags&0x0100 != 0
	m.rcode = int(m.flags & 0xf)
	qd := int(binary.BigEndian.Uint16(r[4:]))
	an := int(binary.BigEndian.Uint16(r[6:]))
	ns := binary.BigEndian.Uint16(r[8:])
	ar := binary.BigEndian.Uint16(r[10:])
	if ns != 0 || ar != 0 {
		return m, fmt.Errorf("%d authority and %d additional records", ns, ar)
	}
	if qd > 1 {
		return m, fmt.Errorf("%d questions", qd)
	}
	m.qdcount = qd
	off := 12
	if qd == 1 {
		end, err := skipName(r, off, false)
		if err != nil {
			return m, fmt.Errorf("question: %v", err)
		}
		if end+4 > len(r) {
			return m, fmt.Errorf("question cut short")
		}
		m.question = r[off : end+4]
		off = end + 4
	}
	for i := range an {
		end, err := skipName(r, off, true)
		if err != nil {
			return m, fmt.Errorf("answer %d: %v", i, err)
		}
		if end+10 > len(r) {
			return m, fmt.Errorf("answer %d cut short", i)
		}
		typ := binary.BigEndian.Uint16(r[end:])
		class := binary.BigEndian.Uint16(r[end+2:])
		n := int(binary.BigEndian.Uint16(r[end+8:]))
		data := end + 10
		if data+n > len(r) {
			return m, fmt.Errorf("answer %d: data cut short", i)
		}
		if class != dnsClassIN {
			return m, fmt.Errorf("answer %d: class %d", i, class)
		}
		switch {
		case typ == dnsTypeA && n == 4, typ == dnsTypeAAAA && n == 16:
			a, _ := netip.AddrFromSlice(r[data : data+n])
			m.answers = append(m.answers, a)
		default:
			return m, fmt.Errorf("answer %d: type %d with %d bytes of data", i, typ, n)
		}
		off = data + n
	}
	if off != len(r) {
		return m, fmt.Errorf("%d bytes after the last record", len(r)-off)
	}
	return m, nil
}

// skipName returns the offset after the name at off: labels of at most 63
// bytes, at most 255 bytes in all, and, where allowed, a final pointer to
// an earlier name.
func skipName(r []byte, off int, pointers bool) (int, error) {
	total := 0
	for {
		if off >= len(r) {
			return 0, fmt.Errorf("name runs past the end")
		}
		n := int(r[off])
		switch {
		case n == 0:
			return off + 1, nil
		case n&0xc0 == 0xc0:
			if !pointers {
				return 0, fmt.Errorf("compression pointer in a question")
			}
			if off+2 > len(r) {
				return 0, fmt.Errorf("pointer cut short")
			}
			if p := int(binary.BigEndian.Uint16(r[off:]) & 0x3fff); p >= off {
				return 0, fmt.Errorf("pointer %d forward of %d", p, off)
			}
			return off + 2, nil
		case n > 63:
			return 0, fmt.Errorf("label of %d bytes", n)
		}
		total += n + 1
		if total+1 > 255 {
			return 0, fmt.Errorf("name longer than 255 bytes")
		}
		off += n + 1
	}
}

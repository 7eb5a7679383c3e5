package egress

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/session"
)

// manyAddrs answers every name with many addresses of each kind, public and
// reserved; nx. names do not exist and fail. names fail.
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

// withOPT adds an OPT record asking for size bytes, of EDNS version v.
func withOPT(q []byte, size uint16, v byte) []byte {
	q = append([]byte(nil), q...)
	binary.BigEndian.PutUint16(q[10:], binary.BigEndian.Uint16(q[10:])+1)
	q = append(q, 0, 0, 41)
	q = binary.BigEndian.AppendUint16(q, size)
	return append(q, 0, v, 0, 0, 0, 0)
}

// queryLimit is what a reply to q over UDP may hold: 512 bytes, or what a
// well-formed query's one OPT record asks for, up to the channel's bound.
func queryLimit(q []byte) int {
	var p dnsmessage.Parser
	if _, err := p.Start(q); err != nil {
		return 512
	}
	if p.SkipAllQuestions() != nil || p.SkipAllAnswers() != nil || p.SkipAllAuthorities() != nil {
		return 512
	}
	limit := 512
	for {
		h, err := p.AdditionalHeader()
		if err != nil {
			return limit
		}
		if h.Type == dnsmessage.TypeOPT {
			limit = min(max(int(h.Class), 512), guest.MaxDNSMessage)
		}
		if p.SkipAdditional() != nil {
			return 512
		}
	}
}

// FuzzDNSQuery answers arbitrary queries as they come from a guest.
// Property: a query of 12 bytes or more gets a well-formed reply (every
// section parses) with its ID, no longer than the query's limit (512, or
// what its OPT record asks for); a query that reads as one question gets
// that question back; a name the policy does not allow is refused without
// being resolved; every address given is of the asked type and allowed by
// the policy; and fewer addresses than the policy allows (at most 16) only
// with the TC bit set.
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
	long := strings.Repeat(strings.Repeat("l", 63)+".", 3) + "test"
	f.Add(dnsQuery(long, dnsTypeAAAA), uint8(0))
	f.Add(withOPT(dnsQuery(long, dnsTypeAAAA), 4096, 0), uint8(0))
	f.Add(withOPT(dnsQuery("edns.test", dnsTypeA), 1232, 1), uint8(0))
	f.Add(withOPT(withOPT(dnsQuery("edns.test", dnsTypeA), 1232, 0), 1232, 0), uint8(0))

	policies := []string{"open", "allow:*.allowed.test,pkgs.test", "none", "open:10.0.0.0/8,host.berth.internal"}
	sessions := make([]*testSess, len(policies))
	var resolved atomic.Int64
	for i, p := range policies {
		sessions[i] = newTestSess(f, p, Config{Resolve: func(ctx context.Context, host string) ([]netip.Addr, error) {
			resolved.Add(1)
			return manyAddrs(ctx, host)
		}})
	}
	f.Fuzz(func(t *testing.T, q []byte, which uint8) {
		s := sessions[int(which)%len(sessions)]
		pol := s.Policy()
		before := resolved.Load()
		r := s.answer(context.Background(), q)
		if len(q) < 12 {
			if r != nil {
				t.Fatalf("a %d byte query answered with %x", len(q), r)
			}
			return
		}
		var m dnsmessage.Message
		if err := m.Unpack(r); err != nil {
			t.Fatalf("reply %x to %x does not parse: %v", r, q, err)
		}
		if m.Header.ID != binary.BigEndian.Uint16(q) || !m.Header.Response {
			t.Fatalf("reply %x is no answer to %x", r, q)
		}
		if limit := queryLimit(q); len(r) > limit {
			t.Fatalf("reply of %d bytes, over the query's limit of %d", len(r), limit)
		}
		var qm dnsmessage.Parser
		qh, err := qm.Start(q)
		if err != nil {
			return
		}
		qs, err := qm.AllQuestions()
		if err != nil || len(qs) != 1 {
			if m.Header.RCode != dnsmessage.RCodeFormatError || len(m.Questions) != 0 {
				t.Fatalf("query %x with %d questions (%v) answered %v with %d questions", q, len(qs), err, m.Header.RCode, len(m.Questions))
			}
			return
		}
		rcode := m.Header.RCode
		for _, a := range m.Additionals {
			if a.Header.Type == dnsmessage.TypeOPT {
				rcode = a.Header.ExtendedRCode(rcode)
			}
		}
		if rcode == 16 { // BADVERS: an OPT of a version above 0
			return
		}
		if rcode == dnsmessage.RCodeFormatError { // a later section that did not read
			if len(m.Questions) != 0 || len(m.Answers) != 0 {
				t.Fatalf("FORMERR with %d questions and %d answers", len(m.Questions), len(m.Answers))
			}
			return
		}
		if len(m.Questions) != 1 || m.Questions[0] != qs[0] {
			t.Fatalf("reply's question %v is not the query's %v", m.Questions, qs[0])
		}
		name := strings.ToLower(strings.TrimSuffix(qs[0].Name.String(), "."))
		allowed := qh.OpCode == 0 && qs[0].Class == dnsmessage.ClassINET && name != session.HostName && pol.AllowsName(name, 0)
		if !allowed {
			if rcode != dnsmessage.RCodeRefused || len(m.Answers) != 0 {
				t.Fatalf("%q (policy %s) answered %v with %d records; want REFUSED", name, pol, rcode, len(m.Answers))
			}
			if resolved.Load() != before {
				t.Fatalf("%q, refused by policy %s, was resolved", name, pol)
			}
			return
		}
		if rcode != dnsmessage.RCodeSuccess {
			if len(m.Answers) != 0 {
				t.Fatalf("%q answered %v with %d records", name, rcode, len(m.Answers))
			}
			return // NXDOMAIN or SERVFAIL
		}
		for _, a := range m.Answers {
			var addr netip.Addr
			switch b := a.Body.(type) {
			case *dnsmessage.AResource:
				addr = netip.AddrFrom4(b.A)
			case *dnsmessage.AAAAResource:
				addr = netip.AddrFrom16(b.AAAA)
			default:
				t.Fatalf("answer of type %v", a.Header.Type)
			}
			if addr.Is4() != (qs[0].Type == dnsmessage.TypeA) || !pol.AllowsAddr(addr, 0, true) {
				t.Fatalf("%q type %v answered with %s (policy %s)", name, qs[0].Type, addr, pol)
			}
		}
		if (qs[0].Type == dnsmessage.TypeA || qs[0].Type == dnsmessage.TypeAAAA) && rcode == dnsmessage.RCodeSuccess {
			want := 0
			found, _ := manyAddrs(context.Background(), name)
			for _, a := range found {
				a = a.Unmap()
				if a.Is4() == (qs[0].Type == dnsmessage.TypeA) && pol.AllowsAddr(a, 0, true) {
					want++
				}
			}
			if want = min(want, maxAnswers); len(m.Answers) < want && !m.Header.Truncated {
				t.Fatalf("%q: %d of %d addresses, without the TC bit", name, len(m.Answers), want)
			}
		}
	})
}

// Long answers are cut to whole records with the TC bit over UDP, and
// given whole to an EDNS client that asks for room or over TCP; an OPT of a
// version above 0 gets BADVERS; a query that cannot be read gets FORMERR
// with no question.
func TestDNSLimits(t *testing.T) {
	s := newTestSess(t, "open", Config{Resolve: manyAddrs})
	long := strings.Repeat(strings.Repeat("l", 63)+".", 3) + "test"
	parse := func(r []byte) dnsmessage.Message {
		t.Helper()
		var m dnsmessage.Message
		if err := m.Unpack(r); err != nil {
			t.Fatalf("reply %x: %v", r, err)
		}
		return m
	}
	ctx := context.Background()
	plain := parse(s.answer(ctx, dnsQuery(long, dnsTypeAAAA)))
	if !plain.Header.Truncated || len(plain.Answers) == 0 || len(plain.Answers) >= maxAnswers {
		t.Errorf("over UDP without EDNS: TC=%v with %d answers, want TC with some of %d", plain.Header.Truncated, len(plain.Answers), maxAnswers)
	}
	big := s.answer(ctx, withOPT(dnsQuery(long, dnsTypeAAAA), 4096, 0))
	m := parse(big)
	if m.Header.Truncated || len(m.Answers) != maxAnswers || len(big) <= 512 {
		t.Errorf("EDNS 4096: TC=%v with %d answers in %d bytes, want all %d", m.Header.Truncated, len(m.Answers), len(big), maxAnswers)
	}
	if len(m.Additionals) != 1 || m.Additionals[0].Header.Type != dnsmessage.TypeOPT {
		t.Errorf("EDNS query answered without an OPT record: %v", m.Additionals)
	}
	tcp := parse(s.AnswerDNS(ctx, s, dnsQuery(long, dnsTypeAAAA), TCP))
	if tcp.Header.Truncated || len(tcp.Answers) != maxAnswers {
		t.Errorf("over TCP: TC=%v with %d answers, want all %d", tcp.Header.Truncated, len(tcp.Answers), maxAnswers)
	}
	bv := parse(s.answer(ctx, withOPT(dnsQuery("a.test", dnsTypeA), 1232, 1)))
	if len(bv.Additionals) != 1 || bv.Additionals[0].Header.ExtendedRCode(bv.Header.RCode) != 16 || len(bv.Answers) != 0 {
		t.Errorf("EDNS version 1: %v, want BADVERS", bv)
	}
	two := withOPT(withOPT(dnsQuery("a.test", dnsTypeA), 1232, 0), 1232, 0)
	for _, bad := range [][]byte{two, append(dnsQuery("a.test", 1)[:14], 0xff), dnsQuery("a.test", 1)[:12]} {
		fe := parse(s.answer(ctx, bad))
		if fe.Header.RCode != dnsmessage.RCodeFormatError || len(fe.Questions) != 0 {
			t.Errorf("malformed %x: %v with %d questions, want FORMERR and none", bad, fe.Header.RCode, len(fe.Questions))
		}
	}
}

package egress

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"strings"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/session"
)

const (
	dnsTTL = 30
	// udpLimit is what a reply over UDP may hold without EDNS (RFC 1035
	// 4.2.1); a query with an OPT record may ask for more, up to what the
	// agent channel carries.
	udpLimit = 512
	// maxAnswers bounds the addresses given for one name.
	maxAnswers = 16
)

// Transport is how the guest's query came: over UDP its reply is bounded
// by 512 bytes or the size its OPT record asks for; over TCP by the
// channel's bound.
type Transport int

const (
	UDP Transport = iota
	TCP
)

// AnswerDNS answers a guest's query: names the policy allows get their
// addresses as the host resolves them, less those the policy would refuse;
// other names are refused. A reply that does not fit the query's limit is
// cut to whole records with the TC bit set, so the client asks again over
// TCP. A query too short to hold a header gets no reply (nil).
func (p *Proxy) AnswerDNS(ctx context.Context, s Session, q []byte, tr Transport) []byte {
	return p.answerDNS(ctx, s, q, tr, netip.Addr{})
}

// AnswerNICDNS answers a query that came through the guest's NIC, as
// AnswerDNS does, and host.berth.internal with hostAddr (its address on
// the guest's network) when the policy names the host on some port.
func (p *Proxy) AnswerNICDNS(ctx context.Context, s Session, q []byte, tr Transport, hostAddr netip.Addr) []byte {
	return p.answerDNS(ctx, s, q, tr, hostAddr)
}

func (p *Proxy) answerDNS(ctx context.Context, s Session, q []byte, tr Transport, hostAddr netip.Addr) []byte {
	if len(q) < 12 {
		return nil
	}
	var pr dnsmessage.Parser
	h, err := pr.Start(q)
	if err != nil || len(q) > guest.MaxDNSMessage || h.Response {
		return formErr(q)
	}
	qs, err := pr.AllQuestions()
	if err != nil || len(qs) != 1 {
		return formErr(q)
	}
	question := qs[0]
	limit := udpLimit
	if tr == TCP {
		limit = guest.MaxDNSMessage
	}
	edns, badVersion := false, false
	if err := pr.SkipAllAnswers(); err != nil {
		return formErr(q)
	}
	if err := pr.SkipAllAuthorities(); err != nil {
		return formErr(q)
	}
	for {
		rh, err := pr.AdditionalHeader()
		if errors.Is(err, dnsmessage.ErrSectionDone) {
			break
		}
		if err != nil {
			return formErr(q)
		}
		if rh.Type == dnsmessage.TypeOPT {
			if edns { // RFC 6891 6.1.1: more than one OPT is a format error
				return formErr(q)
			}
			edns = true
			if rh.TTL>>16&0xff != 0 { // a version above 0
				badVersion = true
			}
			if tr == UDP {
				limit = min(max(int(rh.Class), udpLimit), guest.MaxDNSMessage)
			}
		}
		if err := pr.SkipAdditional(); err != nil {
			return formErr(q)
		}
	}
	r := reply{h: h, q: question, edns: edns, limit: limit}
	if badVersion {
		r.ext = 16 // BADVERS (RFC 6891 6.1.3)
		return r.build()
	}
	if h.OpCode != 0 || question.Class != dnsmessage.ClassINET {
		r.rcode = dnsmessage.RCodeRefused
		return r.build()
	}
	name := strings.ToLower(strings.TrimSuffix(question.Name.String(), "."))
	pol := s.Policy()
	if name == session.HostName && hostAddr.IsValid() && namesHost(pol) {
		if question.Type == dnsmessage.TypeA && hostAddr.Is4() || question.Type == dnsmessage.TypeAAAA && hostAddr.Is6() {
			r.addrs = []netip.Addr{hostAddr}
		}
		return r.build()
	}
	if name == session.HostName || !pol.AllowsName(name, 0) {
		r.rcode = dnsmessage.RCodeRefused
		return r.build()
	}
	if question.Type != dnsmessage.TypeA && question.Type != dnsmessage.TypeAAAA {
		return r.build() // no such records here
	}
	rctx, cancel := context.WithTimeout(ctx, resolveWait)
	defer cancel()
	found, err := p.resolve(rctx, name)
	if err != nil {
		var de *net.DNSError
		if errors.As(err, &de) && de.IsNotFound {
			r.rcode = dnsmessage.RCodeNameError
		} else {
			r.rcode = dnsmessage.RCodeServerFailure
		}
		return r.build()
	}
	var reserved netip.Addr // the first address held back as reserved
	for _, a := range found {
		a = a.Unmap()
		if a.Is4() != (question.Type == dnsmessage.TypeA) {
			continue
		}
		if !pol.AllowsAddr(a, 0, true) {
			if !reserved.IsValid() && session.Reserved(a) {
				reserved = a
			}
			continue
		}
		if len(r.addrs) < maxAnswers {
			r.addrs = append(r.addrs, a)
		}
	}
	// What the guest learns here is what its NIC may reach by name.
	s.Counters().Resolved.Record(name, r.addrs)
	if len(r.addrs) == 0 && reserved.IsValid() {
		// The guest sees only a name without addresses: the timeline
		// says why, and what allows it.
		rng, _ := session.ReservedRange(reserved)
		p.note(s, session.EgressRefusedReserved(name, s.Name(), pol.String(), name, reserved, rng), "")
	}
	return r.build()
}

// reply is an answer being built.
type reply struct {
	h     dnsmessage.Header
	q     dnsmessage.Question
	rcode dnsmessage.RCode
	ext   dnsmessage.RCode // an extended rcode, carried in the OPT record
	edns  bool
	limit int
	addrs []netip.Addr
}

// build packs the reply, with as many addresses as fit its limit; if some
// do not, the TC bit says so.
func (r reply) build() []byte {
	for n := len(r.addrs); ; n-- {
		out, err := r.pack(r.addrs[:n], n < len(r.addrs))
		if err != nil {
			// A question that parsed always packs; should it not, the
			// header alone still answers.
			return formErr(binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint16(nil, r.h.ID), 0))
		}
		if len(out) <= r.limit || n == 0 {
			return out
		}
	}
}

func (r reply) pack(addrs []netip.Addr, truncated bool) ([]byte, error) {
	b := dnsmessage.NewBuilder(make([]byte, 0, 512), dnsmessage.Header{
		ID: r.h.ID, Response: true, OpCode: r.h.OpCode, RecursionDesired: r.h.RecursionDesired,
		RecursionAvailable: true, RCode: r.rcode, Truncated: truncated,
	})
	b.EnableCompression()
	if err := b.StartQuestions(); err != nil {
		return nil, err
	}
	if err := b.Question(r.q); err != nil {
		return nil, err
	}
	if err := b.StartAnswers(); err != nil {
		return nil, err
	}
	for _, a := range addrs {
		rh := dnsmessage.ResourceHeader{Name: r.q.Name, Class: dnsmessage.ClassINET, TTL: dnsTTL}
		var err error
		if a.Is4() {
			err = b.AResource(rh, dnsmessage.AResource{A: a.As4()})
		} else {
			err = b.AAAAResource(rh, dnsmessage.AAAAResource{AAAA: a.As16()})
		}
		if err != nil {
			return nil, err
		}
	}
	if r.edns {
		if err := b.StartAdditionals(); err != nil {
			return nil, err
		}
		var rh dnsmessage.ResourceHeader
		rh.SetEDNS0(guest.MaxDNSMessage, r.ext, false)
		if err := b.OPTResource(rh, dnsmessage.OPTResource{}); err != nil {
			return nil, err
		}
	}
	return b.Finish()
}

// formErr answers a query that could not be read: its header alone, with
// no question (it could not be read) and FORMERR.
func formErr(q []byte) []byte {
	out := make([]byte, 12)
	copy(out, q[:2])                                            // the ID
	flags := binary.BigEndian.Uint16(q[2:])&0x7900 | 0x8080 | 1 // QR, opcode, RD; RA; FORMERR
	binary.BigEndian.PutUint16(out[2:], flags)
	return out
}

// namesHost reports whether the policy names host.berth.internal on any
// port.
func namesHost(pol session.Policy) bool {
	for _, e := range pol.Entries {
		if e.Host {
			return true
		}
	}
	return false
}

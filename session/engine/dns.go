package engine

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"strings"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/session"
)

// DNS codes used by the guest's resolver.
const (
	dnsTypeA    = 1
	dnsTypeAAAA = 28
	dnsClassIN  = 1

	rcodeOK       = 0
	rcodeFormErr  = 1
	rcodeServFail = 2
	rcodeNXDomain = 3
	rcodeRefused  = 5

	dnsTTL = 30
)

// dnsQuestion is the one question of a query.
type dnsQuestion struct {
	name        string
	qtype       uint16
	qclass      uint16
	end         int // offset past the question section
	id          uint16
	flags       uint16
	opcodeQuery bool
}

var errDNSFormat = errors.New("malformed DNS query")

// parseDNSQuery reads the header and the single question of a query.
func parseDNSQuery(q []byte) (dnsQuestion, error) {
	var d dnsQuestion
	if len(q) < 12 || len(q) > guest.MaxDNSMessage {
		return d, errDNSFormat
	}
	d.id = binary.BigEndian.Uint16(q)
	d.flags = binary.BigEndian.Uint16(q[2:])
	d.opcodeQuery = d.flags&0x7800 == 0
	if d.flags&0x8000 != 0 || binary.BigEndian.Uint16(q[4:]) != 1 {
		return d, errDNSFormat
	}
	var labels []string
	off := 12
	for {
		if off >= len(q) {
			return d, errDNSFormat
		}
		n := int(q[off])
		off++
		if n == 0 {
			break
		}
		if n > 63 || off+n > len(q) { // no compression in a question
			return d, errDNSFormat
		}
		labels = append(labels, strings.ToLower(string(q[off:off+n])))
		off += n
		if off-12+1 > maxDNSName { // RFC 1035 3.1: 255 octets, the final zero included
			return d, errDNSFormat
		}
	}
	if off+4 > len(q) {
		return d, errDNSFormat
	}
	d.name = strings.Join(labels, ".")
	d.qtype = binary.BigEndian.Uint16(q[off:])
	d.qclass = binary.BigEndian.Uint16(q[off+2:])
	d.end = off + 4
	return d, nil
}

// maxDNSName bounds a name on the wire (RFC 1035 3.1).
const maxDNSName = 255

// maxDNSReply bounds an answer: the responder speaks no EDNS, so a reply
// over UDP holds at most 512 bytes (RFC 1035 4.2.1).
const maxDNSReply = 512

// dnsAnswer builds a response to q with rcode and the given addresses, as
// many of them as fit in maxDNSReply.
func dnsAnswer(q []byte, d dnsQuestion, rcode int, addrs []netip.Addr) []byte {
	size := d.end
	for i, a := range addrs {
		rr := 12 + 4 // pointer, type, class, TTL, length, then the address
		if a.Is6() {
			rr = 12 + 16
		}
		if size+rr > maxDNSReply {
			addrs = addrs[:i]
			break
		}
		size += rr
	}
	out := make([]byte, 0, size)
	out = binary.BigEndian.AppendUint16(out, d.id)
	flags := uint16(0x8000) | d.flags&0x7900 | 0x0080 | uint16(rcode) // QR, opcode, RD; RA
	out = binary.BigEndian.AppendUint16(out, flags)
	out = binary.BigEndian.AppendUint16(out, 1)
	out = binary.BigEndian.AppendUint16(out, uint16(len(addrs)))
	out = binary.BigEndian.AppendUint16(out, 0)
	out = binary.BigEndian.AppendUint16(out, 0)
	out = append(out, q[12:d.end]...)
	for _, a := range addrs {
		out = append(out, 0xc0, 12) // the name: a pointer to the question's
		t, rd := uint16(dnsTypeA), a.AsSlice()
		if a.Is6() {
			t = dnsTypeAAAA
		}
		out = binary.BigEndian.AppendUint16(out, t)
		out = binary.BigEndian.AppendUint16(out, dnsClassIN)
		out = binary.BigEndian.AppendUint32(out, dnsTTL)
		out = binary.BigEndian.AppendUint16(out, uint16(len(rd)))
		out = append(out, rd...)
	}
	return out
}

// answerDNS answers a guest's query: names the policy allows get their
// addresses as the daemon resolves them, less those the policy would
// refuse; other names are refused.
func (s *sess) answerDNS(ctx context.Context, q []byte) []byte {
	d, err := parseDNSQuery(q)
	if err != nil {
		if len(q) < 12 {
			return nil
		}
		// The header alone: no question, since it could not be read.
		r := dnsAnswer(q[:12], dnsQuestion{id: binary.BigEndian.Uint16(q), flags: binary.BigEndian.Uint16(q[2:]), end: 12}, rcodeFormErr, nil)
		binary.BigEndian.PutUint16(r[4:], 0)
		return r
	}
	if !d.opcodeQuery || d.qclass != dnsClassIN {
		return dnsAnswer(q, d, rcodeRefused, nil)
	}
	pol := s.policy()
	if d.name == session.HostName || !pol.AllowsName(d.name, 0) {
		return dnsAnswer(q, d, rcodeRefused, nil)
	}
	if d.qtype != dnsTypeA && d.qtype != dnsTypeAAAA {
		return dnsAnswer(q, d, rcodeOK, nil) // no such records here
	}
	rctx, cancel := context.WithTimeout(ctx, resolveWait)
	defer cancel()
	found, err := s.m.resolve(rctx, d.name)
	if err != nil {
		var de *net.DNSError
		if errors.As(err, &de) && de.IsNotFound {
			return dnsAnswer(q, d, rcodeNXDomain, nil)
		}
		return dnsAnswer(q, d, rcodeServFail, nil)
	}
	var out []netip.Addr
	for _, a := range found {
		a = a.Unmap()
		if a.Is4() != (d.qtype == dnsTypeA) || !pol.AllowsAddr(a, 0, true) {
			continue
		}
		if len(out) < 16 {
			out = append(out, a)
		}
	}
	return dnsAnswer(q, d, rcodeOK, out)
}

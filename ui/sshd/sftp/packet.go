package sftp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
)

// Packet types (draft-ietf-secsh-filexfer-02, section 3).
const (
	fxpInit     = 1
	fxpVersion  = 2
	fxpOpen     = 3
	fxpClose    = 4
	fxpRead     = 5
	fxpWrite    = 6
	fxpLstat    = 7
	fxpFstat    = 8
	fxpSetstat  = 9
	fxpFsetstat = 10
	fxpOpendir  = 11
	fxpReaddir  = 12
	fxpRemove   = 13
	fxpMkdir    = 14
	fxpRmdir    = 15
	fxpRealpath = 16
	fxpStat     = 17
	fxpRename   = 18
	fxpReadlink = 19
	fxpSymlink  = 20

	fxpStatus        = 101
	fxpHandle        = 102
	fxpData          = 103
	fxpName          = 104
	fxpAttrs         = 105
	fxpExtended      = 200
	fxpExtendedReply = 201
)

// Status codes (section 7).
const (
	fxOK               = 0
	fxEOF              = 1
	fxNoSuchFile       = 2
	fxPermissionDenied = 3
	fxFailure          = 4
	fxBadMessage       = 5
	fxNoConnection     = 6
	fxConnectionLost   = 7
	fxOpUnsupported    = 8
)

// Open pflags (section 6.3).
const (
	fxfRead   = 0x01
	fxfWrite  = 0x02
	fxfAppend = 0x04
	fxfCreat  = 0x08
	fxfTrunc  = 0x10
	fxfExcl   = 0x20
)

// Attribute flags (section 5).
const (
	attrSize        = 0x01
	attrUIDGID      = 0x02
	attrPermissions = 0x04
	attrACModTime   = 0x08
	attrExtended    = 0x80000000
)

// protocolVersion is the version served; clients asking for more get it.
const protocolVersion = 3

// errShort is a request body that ends too soon.
var errShort = errors.New("the packet ends before its fields do")

// decoder reads a packet's fields; the first error sticks, and every
// later read returns zero values.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(err error) {
	if d.err == nil {
		d.err = err
	}
}

func (d *decoder) u8() byte {
	if d.err != nil || len(d.b) < 1 {
		d.fail(errShort)
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) u32() uint32 {
	if d.err != nil || len(d.b) < 4 {
		d.fail(errShort)
		return 0
	}
	v := binary.BigEndian.Uint32(d.b)
	d.b = d.b[4:]
	return v
}

func (d *decoder) u64() uint64 {
	if d.err != nil || len(d.b) < 8 {
		d.fail(errShort)
		return 0
	}
	v := binary.BigEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}

// bytes returns a length-prefixed field, aliasing the packet.
func (d *decoder) bytes() []byte {
	n := d.u32()
	if d.err != nil {
		return nil
	}
	if uint64(n) > uint64(len(d.b)) {
		d.fail(errShort)
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) str() string { return string(d.bytes()) }

// wireAttrs are attributes as they travel; flags say which fields are set.
type wireAttrs struct {
	flags      uint32
	size       uint64
	uid, gid   uint32
	perm       uint32
	atime      uint32
	mtime      uint32
	extensions int // how many extended pairs were sent (their content is ignored)
}

func (d *decoder) attrs() wireAttrs {
	var a wireAttrs
	a.flags = d.u32()
	if a.flags&attrSize != 0 {
		a.size = d.u64()
	}
	if a.flags&attrUIDGID != 0 {
		a.uid, a.gid = d.u32(), d.u32()
	}
	if a.flags&attrPermissions != 0 {
		a.perm = d.u32()
	}
	if a.flags&attrACModTime != 0 {
		a.atime, a.mtime = d.u32(), d.u32()
	}
	if a.flags&attrExtended != 0 {
		n := d.u32()
		// Each pair takes at least 8 bytes: the count cannot exceed what
		// the packet holds, so a huge one fails here, not in a loop.
		if uint64(n)*8 > uint64(len(d.b)) {
			d.fail(errShort)
			return a
		}
		for range n {
			d.bytes()
			d.bytes()
		}
		a.extensions = int(n)
	}
	return a
}

// encoder builds a packet: 4 bytes of length (filled in by finish), then
// the fields.
type encoder struct{ b []byte }

func newEncoder(typ byte, size int) *encoder {
	e := &encoder{b: make([]byte, 4, 4+1+size)}
	e.b = append(e.b, typ)
	return e
}

func (e *encoder) u8(v byte)    { e.b = append(e.b, v) }
func (e *encoder) u32(v uint32) { e.b = binary.BigEndian.AppendUint32(e.b, v) }
func (e *encoder) u64(v uint64) { e.b = binary.BigEndian.AppendUint64(e.b, v) }

func (e *encoder) str(s string) {
	e.u32(uint32(len(s)))
	e.b = append(e.b, s...)
}

func (e *encoder) attrs(a wireAttrs) {
	e.u32(a.flags &^ attrExtended)
	if a.flags&attrSize != 0 {
		e.u64(a.size)
	}
	if a.flags&attrUIDGID != 0 {
		e.u32(a.uid)
		e.u32(a.gid)
	}
	if a.flags&attrPermissions != 0 {
		e.u32(a.perm)
	}
	if a.flags&attrACModTime != 0 {
		e.u32(a.atime)
		e.u32(a.mtime)
	}
}

// finish fills in the length and returns the packet.
func (e *encoder) finish() []byte {
	binary.BigEndian.PutUint32(e.b, uint32(len(e.b)-4))
	return e.b
}

// errTooLong is a packet longer than the server accepts: the stream
// cannot be trusted after it, so the connection ends.
type errTooLong struct{ n, max uint32 }

func (e errTooLong) Error() string {
	return fmt.Sprintf("sftp packet of %d bytes exceeds the limit of %d", e.n, e.max)
}

// readPacket reads one packet (its type byte and body) of at most max
// bytes. A clean end of the stream before a packet is io.EOF.
func readPacket(r io.Reader, max uint32) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("sftp packet header cut short: %w", err)
		}
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > max {
		return nil, errTooLong{n, max}
	}
	if n == 0 {
		return nil, fmt.Errorf("empty sftp packet: %w", io.ErrUnexpectedEOF)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("sftp packet cut short: %w", err)
	}
	return b, nil
}

// clampTime is t's Unix seconds as SFTP v3's uint32.
func clampTime(sec int64) uint32 {
	switch {
	case sec < 0:
		return 0
	case sec > math.MaxUint32:
		return math.MaxUint32
	}
	return uint32(sec)
}

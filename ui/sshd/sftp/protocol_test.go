package sftp

import (
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/berthvm/berth/session"
)

// A peer that breaks the protocol's framing or handshake ends the stream:
// no reply, Serve returns an error saying what broke.
func TestProtocolBreaksEndTheStream(t *testing.T) {
	header := func(n uint32) []byte { return binary.BigEndian.AppendUint32(nil, n) }
	for _, tc := range []struct {
		name     string
		init     bool     // INIT first, as a client does
		send     [][]byte // then these, written one by one
		hangUp   bool     // then the client closes its end
		wantErr  string   // in Serve's error
		wantIs   error    // or errors.Is of it
		wantNone bool     // Serve returns nil
	}{
		{name: "longer than MaxPacket", init: true, send: [][]byte{header(MaxPacket + 1)}, wantErr: "exceeds the limit"},
		{name: "length 2^32-1", init: true, send: [][]byte{header(1<<32 - 1)}, wantErr: "exceeds the limit"},
		{name: "longer than MaxPacket as the first packet", send: [][]byte{header(MaxPacket + 1)}, wantErr: "exceeds the limit"},
		{name: "request before INIT", send: [][]byte{build(fxpStat, uint32(1), "a")}, wantErr: "before INIT"},
		{name: "reply type before INIT", send: [][]byte{build(fxpVersion, uint32(3))}, wantErr: "before INIT"},
		{name: "second INIT", init: true, send: [][]byte{build(fxpInit, uint32(3))}, wantErr: "INIT again"},
		{name: "empty packet", init: true, send: [][]byte{header(0)}, wantIs: io.ErrUnexpectedEOF},
		{name: "empty packet before INIT", send: [][]byte{header(0)}, wantIs: io.ErrUnexpectedEOF},
		{name: "request without an id", init: true, send: [][]byte{build(fxpStat)}, wantErr: "without an id"},
		{name: "request with half an id", init: true, send: [][]byte{build(fxpOpen, rawBytes{0, 1})}, wantErr: "without an id"},
		{name: "header cut short", init: true, send: [][]byte{{0, 0}}, hangUp: true, wantIs: io.ErrUnexpectedEOF},
		{name: "body cut short", init: true, send: [][]byte{append(header(100), fxpStat, 0, 0, 0, 1)}, hangUp: true, wantIs: io.ErrUnexpectedEOF},
		{name: "INIT cut short", send: [][]byte{append(header(5), fxpInit)}, hangUp: true, wantIs: io.ErrUnexpectedEOF},
		{name: "clean end before INIT", hangUp: true, wantNone: true},
		{name: "clean end after INIT", init: true, hangUp: true, wantNone: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fx := newFixture(t)
			r := fx.serve(Server{}).raw()
			if tc.init {
				r.init()
			}
			for _, b := range tc.send {
				r.write(b)
			}
			if tc.hangUp {
				r.conn.Close()
			}
			err := r.wantEnd()
			switch {
			case tc.wantNone:
				if err != nil {
					t.Fatalf("Serve = %v; want nil", err)
				}
			case err == nil:
				t.Fatal("Serve = nil; want an error")
			case tc.wantErr != "" && !strings.Contains(err.Error(), tc.wantErr):
				t.Fatalf("Serve = %v; want an error saying %q", err, tc.wantErr)
			case tc.wantIs != nil && !errors.Is(err, tc.wantIs):
				t.Fatalf("Serve = %v; want errors.Is %v", err, tc.wantIs)
			}
			if tc.wantErr == "exceeds the limit" {
				var tl errTooLong
				if !errors.As(err, &tl) || tl.max != MaxPacket {
					t.Fatalf("Serve = %v; want errTooLong with max %d", err, MaxPacket)
				}
			}
		})
	}
}

// A packet of exactly MaxPacket bytes is accepted.
func TestPacketOfMaxPacketIsServed(t *testing.T) {
	fx := newFixture(t)
	r := fx.serve(Server{}).raw()
	r.init()
	h := r.open("big", fxfWrite|fxfCreat)
	// WRITE: type, id, handle, offset, data: fill the packet to its limit.
	data := strings.Repeat("x", MaxPacket-(1+4+4+len(h)+8+4))
	b := build(fxpWrite, uint32(7), h, uint64(0), data)
	if n := binary.BigEndian.Uint32(b); n != MaxPacket {
		t.Fatalf("built a packet of %d bytes; want %d", n, MaxPacket)
	}
	r.write(b)
	r.wantStatus(7, fxOK, "write of a MaxPacket packet")
	r.lastID = 7
	r.ok("close", fxpClose, h)
	fx.wantContent("big", data)
}

// Requests whose fields are cut short or out of range get BAD_MESSAGE;
// the stream goes on.
func TestMalformedRequests(t *testing.T) {
	// Each request is built after the id, given h: an open handle on
	// "f" (read and write).
	noID := func(typ byte, fields ...any) func(string) (byte, []any) {
		return func(string) (byte, []any) { return typ, fields }
	}
	withHandle := func(typ byte, fields func(h string) []any) func(string) (byte, []any) {
		return func(h string) (byte, []any) { return typ, fields(h) }
	}
	ext := func(name string, fields ...any) func(string) (byte, []any) {
		return noID(fxpExtended, append([]any{name}, fields...)...)
	}
	longStr := rawBytes{0, 0, 1, 0, 'a'} // says 256 bytes, has 1
	for _, tc := range []struct {
		name string
		req  func(h string) (byte, []any)
		want uint32
	}{
		{"open without a path", noID(fxpOpen), fxBadMessage},
		{"open with a path cut short", noID(fxpOpen, longStr), fxBadMessage},
		{"open without pflags", noID(fxpOpen, "f"), fxBadMessage},
		{"open without attrs", noID(fxpOpen, "f", uint32(fxfRead)), fxBadMessage},
		{"open with attrs cut short", noID(fxpOpen, "f", uint32(fxfRead), uint32(attrSize), rawBytes{0, 0}), fxBadMessage},
		{"open with a huge extension count", noID(fxpOpen, "f", uint32(fxfRead), uint32(attrExtended), uint32(1<<31)), fxBadMessage},
		{"open of a path with NUL", noID(fxpOpen, "f\x00g", uint32(fxfRead), wireAttrs{}), fxBadMessage},
		{"close without a handle", noID(fxpClose), fxBadMessage},
		{"close with a handle cut short", noID(fxpClose, longStr), fxBadMessage},
		{"read without a handle", noID(fxpRead), fxBadMessage},
		{"read without an offset", withHandle(fxpRead, func(h string) []any { return []any{h} }), fxBadMessage},
		{"read without a length", withHandle(fxpRead, func(h string) []any { return []any{h, uint64(0)} }), fxBadMessage},
		{"read at an offset out of range", withHandle(fxpRead, func(h string) []any { return []any{h, uint64(1 << 63), uint32(10)} }), fxBadMessage},
		{"write without data", withHandle(fxpWrite, func(h string) []any { return []any{h, uint64(0)} }), fxBadMessage},
		{"write with data cut short", withHandle(fxpWrite, func(h string) []any { return []any{h, uint64(0), longStr} }), fxBadMessage},
		{"write at an offset out of range", withHandle(fxpWrite, func(h string) []any { return []any{h, uint64(1<<63 - 2), "abc"} }), fxBadMessage},
		{"lstat without a path", noID(fxpLstat), fxBadMessage},
		{"stat without a path", noID(fxpStat), fxBadMessage},
		{"stat of a path with NUL", noID(fxpStat, "f\x00"), fxBadMessage},
		{"fstat without a handle", noID(fxpFstat), fxBadMessage},
		{"setstat without attrs", noID(fxpSetstat, "f"), fxBadMessage},
		{"setstat with attrs cut short", noID(fxpSetstat, "f", uint32(attrPermissions)), fxBadMessage},
		{"setstat with a size out of range", noID(fxpSetstat, "f", wireAttrs{flags: attrSize, size: 1<<63 + 1}), fxBadMessage},
		{"fsetstat without attrs", withHandle(fxpFsetstat, func(h string) []any { return []any{h} }), fxBadMessage},
		{"fsetstat with attrs cut short", withHandle(fxpFsetstat, func(h string) []any { return []any{h, uint32(attrACModTime), uint32(1)} }), fxBadMessage},
		{"opendir without a path", noID(fxpOpendir), fxBadMessage},
		{"readdir without a handle", noID(fxpReaddir), fxBadMessage},
		{"remove without a path", noID(fxpRemove), fxBadMessage},
		{"mkdir without attrs", noID(fxpMkdir, "d"), fxBadMessage},
		{"rmdir without a path", noID(fxpRmdir), fxBadMessage},
		{"realpath without a path", noID(fxpRealpath), fxBadMessage},
		{"realpath of a path with NUL", noID(fxpRealpath, "a\x00"), fxBadMessage},
		{"rename without a target", noID(fxpRename, "f"), fxBadMessage},
		{"readlink without a path", noID(fxpReadlink), fxBadMessage},
		{"readlink of a file", noID(fxpReadlink, "f"), fxBadMessage}, // readlink(2)'s EINVAL, as sftp-server
		{"symlink without a link path", noID(fxpSymlink, "f"), fxBadMessage},
		{"symlink without anything", noID(fxpSymlink), fxBadMessage},
		{"extended without a name", noID(fxpExtended), fxBadMessage},
		{"extended with a name cut short", noID(fxpExtended, longStr), fxBadMessage},
		{"posix-rename without a target", ext("posix-rename@openssh.com", "f"), fxBadMessage},
		{"hardlink without a target", ext("hardlink@openssh.com", "f"), fxBadMessage},
		{"statvfs without a path", ext("statvfs@openssh.com"), fxBadMessage},
		{"fstatvfs without a handle", ext("fstatvfs@openssh.com"), fxBadMessage},
		{"fsync without a handle", ext("fsync@openssh.com"), fxBadMessage},
		{"unknown request type", noID(99, "f"), fxOpUnsupported},
		{"request type of a reply", noID(fxpStatus, uint32(0)), fxOpUnsupported},
		{"unknown extension", ext("copy-data", "f"), fxOpUnsupported},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fx := newFixture(t)
			fx.file("f", "content")
			r := fx.serve(Server{}).raw()
			r.init()
			h := r.open("f", fxfRead|fxfWrite)
			typ, fields := tc.req(h)
			r.wantStatus(r.send(typ, fields...), tc.want, tc.name)
			// The stream goes on, and nothing changed.
			got := r.call(fxpRead, h, uint64(0), uint32(100))
			if got.typ != fxpData {
				t.Fatalf("read after the bad request: reply of type %d; want DATA", got.typ)
			}
			if data := got.d.str(); data != "content" {
				t.Fatalf("read after the bad request: %q; want %q", data, "content")
			}
			r.ok("close", fxpClose, h)
			fx.wantContent("f", "content")
		})
	}
}

// Unknown and stale handles are FAILURE (as OpenSSH's "invalid handle"),
// on every request that takes one.
func TestBadHandles(t *testing.T) {
	for _, tc := range []struct {
		name string
		typ  byte
		args func(h string) []any
	}{
		{"close", fxpClose, func(h string) []any { return []any{h} }},
		{"read", fxpRead, func(h string) []any { return []any{h, uint64(0), uint32(10)} }},
		{"write", fxpWrite, func(h string) []any { return []any{h, uint64(0), "x"} }},
		{"fstat", fxpFstat, func(h string) []any { return []any{h} }},
		{"fsetstat", fxpFsetstat, func(h string) []any { return []any{h, wireAttrs{flags: attrPermissions, perm: 0o600}} }},
		{"readdir", fxpReaddir, func(h string) []any { return []any{h} }},
		{"fstatvfs", fxpExtended, func(h string) []any { return []any{"fstatvfs@openssh.com", h} }},
		{"fsync", fxpExtended, func(h string) []any { return []any{"fsync@openssh.com", h} }},
	} {
		for _, hc := range []struct {
			name   string
			handle func(r *raw) string
		}{
			{"unknown", func(*raw) string { return "no-such-handle" }},
			{"empty", func(*raw) string { return "" }},
			{"closed", func(r *raw) string {
				h := r.open("f", fxfRead|fxfWrite)
				r.ok("close", fxpClose, h)
				return h
			}},
		} {
			t.Run(tc.name+"/"+hc.name, func(t *testing.T) {
				fx := newFixture(t)
				fx.file("f", "content")
				r := fx.serve(Server{}).raw()
				r.init()
				h := hc.handle(r)
				r.wantStatus(r.send(tc.typ, tc.args(h)...), fxFailure, tc.name+" of a "+hc.name+" handle")
				fx.wantContent("f", "content")
			})
		}
	}
}

// Handles are of a kind: READDIR needs a directory's, READ and WRITE a
// file's opened for them.
func TestHandleKinds(t *testing.T) {
	fx := newFixture(t)
	fx.file("f", "content")
	fx.dir("d")
	r := fx.serve(Server{}).raw()
	r.init()
	dh := r.opendir("d")
	rh := r.open("f", fxfRead)
	wh := r.open("f", fxfWrite)
	r.wantStatus(r.send(fxpReaddir, rh), fxFailure, "readdir of a file handle")
	r.wantStatus(r.send(fxpRead, dh, uint64(0), uint32(10)), fxFailure, "read of a directory handle")
	r.wantStatus(r.send(fxpWrite, dh, uint64(0), "x"), fxFailure, "write of a directory handle")
	r.wantStatus(r.send(fxpWrite, rh, uint64(0), "x"), fxPermissionDenied, "write of a handle opened to read")
	r.wantStatus(r.send(fxpRead, wh, uint64(0), uint32(10)), fxPermissionDenied, "read of a handle opened to write")
	r.wantStatus(r.send(fxpExtended, "fsync@openssh.com", dh), fxFailure, "fsync of a directory handle")
	for _, h := range []string{dh, rh, wh} {
		r.ok("close", fxpClose, h)
	}
	fx.wantContent("f", "content")
	fx.waitReleased()
}

// Serve refuses to run without the services it maps requests onto.
func TestServeNeedsFilesAndHandles(t *testing.T) {
	fx := newFixture(t)
	for _, srv := range []Server{{Handles: fx.fake}, {Files: fx.fake}} {
		err := srv.Serve(t.Context(), nopConn{})
		if !errors.Is(err, session.ErrInvalid) {
			t.Errorf("Serve without Files or Handles = %v; want ErrInvalid", err)
		}
	}
}

type nopConn struct{}

func (nopConn) Read([]byte) (int, error)    { return 0, io.EOF }
func (nopConn) Write(b []byte) (int, error) { return len(b), nil }
func (nopConn) Close() error                { return nil }

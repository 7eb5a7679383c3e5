package sftp

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"path"
	"sort"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/sessiontest"
)

// The SFTP fuzzer's input is a script of requests: each is a type byte, a
// two-byte body length and the body, which follows the request id the
// fuzzer assigns (1, 2, …). Scripts are decoded leniently: a short tail
// is one last body.

// scriptOf encodes requests (type and fields as build takes them) as a
// script, for the seeds.
func scriptOf(reqs ...[]any) []byte {
	var out []byte
	for _, r := range reqs {
		pkt := build(r[0].(byte), r[1:]...)
		body := pkt[5:] // after length and type
		out = append(out, r[0].(byte))
		out = binary.BigEndian.AppendUint16(out, uint16(len(body)))
		out = append(out, body...)
	}
	return out
}

type scriptReq struct {
	typ  byte
	body []byte
}

func parseScript(b []byte) []scriptReq {
	var out []scriptReq
	for len(b) > 0 && len(out) < 64 {
		typ := b[0]
		b = b[1:]
		n := 0
		if len(b) >= 2 {
			n = int(binary.BigEndian.Uint16(b))
			b = b[2:]
		}
		n = min(n, len(b))
		out = append(out, scriptReq{typ: typ, body: b[:n]})
		b = b[n:]
	}
	return out
}

// FuzzSFTP runs a Server on a script of requests from a hostile client,
// on a workspace with a few files. Property: every request is answered
// exactly once, in order, with its id and a reply of a type its request
// allows (the STATUS of a failure, or HANDLE, DATA, NAME, ATTRS or
// EXTENDED_REPLY where the request calls for one), each reply parses
// completely and stays within the packet limit, a STATUS carries a known
// code and UTF-8 text; a second INIT ends the stream without a reply.
// When the client leaves, Serve returns nil and every file it opened is
// released; a read-only server leaves the workspace exactly as it was.
func FuzzSFTP(f *testing.F) {
	f.Add(scriptOf(
		[]any{byte(fxpOpen), "a.txt", uint32(fxfRead), wireAttrs{}},
		[]any{byte(fxpRead), "1", uint64(0), uint32(100)},
		[]any{byte(fxpFstat), "1"},
		[]any{byte(fxpClose), "1"},
	), false)
	f.Add(scriptOf(
		[]any{byte(fxpOpen), "new.txt", uint32(fxfWrite | fxfCreat | fxfTrunc), wireAttrs{flags: attrPermissions, perm: 0o644}},
		[]any{byte(fxpWrite), "1", uint64(0), "hello"},
		[]any{byte(fxpWrite), "1", uint64(1 << 62), "x"},
		[]any{byte(fxpExtended), "fsync@openssh.com", "1"},
		[]any{byte(fxpStat), "new.txt"},
		[]any{byte(fxpClose), "1"},
	), false)
	f.Add(scriptOf(
		[]any{byte(fxpOpendir), "."},
		[]any{byte(fxpReaddir), "1"},
		[]any{byte(fxpReaddir), "1"},
		[]any{byte(fxpRealpath), "../.."},
		[]any{byte(fxpReadlink), "link"},
		[]any{byte(fxpSymlink), "/etc/passwd", "evil"},
	), true)
	f.Add(scriptOf(
		[]any{byte(fxpMkdir), "d2", wireAttrs{}},
		[]any{byte(fxpRename), "a.txt", "d2/a.txt"},
		[]any{byte(fxpExtended), "posix-rename@openssh.com", "d2/a.txt", "/etc/x"},
		[]any{byte(fxpExtended), "hardlink@openssh.com", "dir/b", "c"},
		[]any{byte(fxpExtended), "statvfs@openssh.com", "/workspace"},
		[]any{byte(fxpExtended), "limits@openssh.com"},
		[]any{byte(fxpSetstat), "dir", wireAttrs{flags: attrSize | attrACModTime | attrExtended, size: 1}},
		[]any{byte(fxpRemove), "dir/b"},
		[]any{byte(fxpRmdir), "dir"},
	), false)
	f.Add(scriptOf(
		[]any{byte(fxpLstat), "\x00"},
		[]any{byte(fxpStat), rawBytes{0xff, 0xff, 0xff, 0xff}},
		[]any{byte(fxpData), "x"},
		[]any{byte(fxpInit), uint32(3)},
	), false)
	f.Add([]byte{byte(fxpFsetstat), 0, 9, 0, 0, 0, 1, '1', 0x80, 0, 0, 0}, true)
	f.Fuzz(func(t *testing.T, script []byte, readOnly bool) {
		fuzzSFTP(t, parseScript(script), readOnly)
	})
}

func fuzzSFTP(t *testing.T, reqs []scriptReq, readOnly bool) {
	fake := sessiontest.New(sessiontest.Options{})
	defer fake.Close()
	// The fake keeps files in memory: a small disk bounds what a write
	// at a far offset allocates (a real one makes a sparse file).
	if err := fake.AddSession(session.Session{Name: testSession, State: session.StateRunning, DiskBytes: 16 << 20}); err != nil {
		t.Fatal(err)
	}
	fake.AddFile(testSession, "a.txt", []byte("hello world\n"), seedTime)
	fake.AddDir(testSession, "dir", seedTime)
	fake.AddFile(testSession, "dir/b", []byte(strings.Repeat("b", 1000)), seedTime)
	ctx := context.Background()
	fake.Symlink(ctx, testSession, "a.txt", "link")
	before := snapshot(t, fake)

	srv := Server{Files: fake, Handles: fake, Name: testSession, ReadOnly: readOnly, Now: func() time.Time { return seedTime }}
	cli, end := net.Pipe()
	served := make(chan error, 1)
	go func() {
		err := srv.Serve(ctx, end)
		end.Close()
		served <- err
	}()
	defer cli.Close()
	cli.SetDeadline(time.Now().Add(20 * time.Second))

	// Requests up to a second INIT, which ends the stream.
	reinit := false
	for i, r := range reqs {
		if r.typ == fxpInit {
			reqs, reinit = reqs[:i], true
			break
		}
	}
	replies := make(chan []byte, len(reqs)+2)
	go func() {
		defer close(replies)
		for {
			b, err := readPacket(cli, 1<<24)
			if err != nil {
				return
			}
			replies <- b
		}
	}()
	go func() {
		cli.Write(build(fxpInit, uint32(3)))
		for i, r := range reqs {
			pkt := make([]byte, 0, 9+len(r.body))
			pkt = binary.BigEndian.AppendUint32(pkt, uint32(5+len(r.body)))
			pkt = append(pkt, r.typ)
			pkt = binary.BigEndian.AppendUint32(pkt, uint32(i+1))
			pkt = append(pkt, r.body...)
			if _, err := cli.Write(pkt); err != nil {
				return
			}
		}
		if reinit {
			cli.Write(build(fxpInit, uint32(3)))
		}
	}()
	next := func(what string) []byte {
		select {
		case b, ok := <-replies:
			if !ok {
				t.Fatalf("the stream ended; want %s", what)
			}
			return b
		case <-time.After(20 * time.Second):
			t.Fatalf("no %s within 20s", what)
		}
		return nil
	}
	if b := next("VERSION"); b[0] != fxpVersion {
		t.Fatalf("INIT answered with type %d", b[0])
	}
	for i, r := range reqs {
		b := next(fmt.Sprintf("the reply to request %d (type %d)", i+1, r.typ))
		checkReply(t, uint32(i+1), r, b)
	}
	if reinit {
		for b := range replies {
			t.Fatalf("a reply of type %d after a second INIT", b[0])
		}
		if err := <-served; err == nil || !strings.Contains(err.Error(), "INIT again") {
			t.Fatalf("Serve after a second INIT = %v", err)
		}
	} else {
		cli.Close()
		select {
		case err := <-served:
			if err != nil {
				t.Fatalf("Serve after the client left = %v; want nil", err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("Serve did not return after the client left")
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for fake.OpenFiles(testSession) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d files left open after the client left", fake.OpenFiles(testSession))
		}
		time.Sleep(time.Millisecond)
	}
	if readOnly {
		if after := snapshot(t, fake); after != before {
			t.Fatalf("a read-only server changed the workspace:\n%s\nto\n%s", before, after)
		}
	}
}

// maxReply bounds a reply: a DATA of MaxData, a page of names, a status.
const maxReply = MaxPacket + 64<<10

// checkReply checks b, the reply to request id r.
func checkReply(t *testing.T, id uint32, r scriptReq, b []byte) {
	t.Helper()
	if len(b) > maxReply {
		t.Fatalf("reply of %d bytes to request %d", len(b), id)
	}
	d := &decoder{b: b[1:]}
	if got := d.u32(); got != id || d.err != nil {
		t.Fatalf("reply of type %d answers request %d; want %d", b[0], got, id)
	}
	allowed := map[byte][]byte{
		fxpOpen: {fxpHandle}, fxpOpendir: {fxpHandle},
		fxpRead:  {fxpData},
		fxpLstat: {fxpAttrs}, fxpStat: {fxpAttrs}, fxpFstat: {fxpAttrs},
		fxpReaddir: {fxpName}, fxpRealpath: {fxpName}, fxpReadlink: {fxpName},
		fxpExtended: {fxpExtendedReply},
	}[r.typ]
	typ := b[0]
	if typ != fxpStatus && bytes.IndexByte(allowed, typ) < 0 {
		t.Fatalf("request %d of type %d answered with type %d", id, r.typ, typ)
	}
	switch typ {
	case fxpStatus:
		code, msg, lang := d.u32(), d.bytes(), d.str()
		if code > fxOpUnsupported {
			t.Fatalf("status code %d", code)
		}
		if !utf8.Valid(msg) || lang != "en" {
			t.Fatalf("status text %q (language %q)", msg, lang)
		}
		if code == fxOK && len(allowed) > 0 && r.typ != fxpExtended {
			t.Fatalf("request of type %d answered OK without its %d reply", r.typ, allowed[0])
		}
		if r.typ != fxpRead && r.typ != fxpReaddir && code == fxEOF {
			t.Fatalf("EOF to a request of type %d", r.typ)
		}
	case fxpHandle:
		if h := d.str(); h == "" || len(h) > 256 {
			t.Fatalf("handle %q", h)
		}
	case fxpData:
		if n := len(d.bytes()); n > MaxData {
			t.Fatalf("DATA of %d bytes", n)
		}
	case fxpAttrs:
		d.attrs()
	case fxpName:
		n := d.u32()
		if n == 0 || n > ReaddirPage || (r.typ != fxpReaddir && n != 1) {
			t.Fatalf("NAME with %d names to request type %d", n, r.typ)
		}
		for range n {
			name, long := d.str(), d.str()
			d.attrs()
			if name == "" || long == "" {
				t.Fatalf("NAME with an empty name")
			}
			// REALPATH resolves lexically, outside the workspace too
			// (every use of such a path is refused).
			if r.typ == fxpRealpath && (!path.IsAbs(name) || path.Clean(name) != name) {
				t.Fatalf("REALPATH gives %q, not an absolute clean path", name)
			}
		}
	case fxpExtendedReply:
		d.b = d.b[len(d.b):] // statvfs or limits: fixed fields
	}
	if d.err != nil {
		t.Fatalf("reply of type %d malformed: %v", typ, d.err)
	}
	if len(d.b) != 0 {
		t.Fatalf("reply of type %d has %d bytes after its fields", typ, len(d.b))
	}
}

// snapshot describes the workspace tree: every path, its mode, size,
// time and content or link.
func snapshot(t *testing.T, fake *sessiontest.Fake) string {
	t.Helper()
	ctx := context.Background()
	var lines []string
	var walk func(p string)
	walk = func(p string) {
		ents, err := fake.ListDir(ctx, testSession, p)
		if err != nil {
			t.Fatalf("list %s: %v", p, err)
		}
		for _, e := range ents {
			q := path.Join(p, e.Name)
			line := fmt.Sprintf("%s %v %d %d %q", q, e.Mode, e.Size, e.ModTime.UnixNano(), e.Link)
			if e.Mode.IsRegular() {
				rc, err := fake.ReadFile(ctx, testSession, q)
				if err == nil {
					b, _ := io.ReadAll(rc)
					rc.Close()
					line += fmt.Sprintf(" %q", b)
				}
			}
			lines = append(lines, line)
			if e.IsDir() {
				walk(q)
			}
		}
	}
	walk(".")
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

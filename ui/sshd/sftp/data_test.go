package sftp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"testing"

	pkgsftp "github.com/pkg/sftp"
)

// Open handles are bounded per stream: further OPENs and OPENDIRs fail
// (without reaching the service) until one is closed.
func TestHandleLimit(t *testing.T) {
	for _, tc := range []struct {
		max  int // Server.MaxHandles
		want int // the limit in force
	}{
		{max: 1, want: 1},
		{max: 3, want: 3},
		{max: 0, want: DefaultMaxHandles},
	} {
		t.Run(fmt.Sprint(tc.max), func(t *testing.T) {
			fx := newFixture(t)
			fx.file("f", "content")
			fx.dir("d")
			r := fx.serve(Server{MaxHandles: tc.max}).raw()
			r.init()
			var handles []string
			for i := range tc.want {
				if i%2 == 1 {
					handles = append(handles, r.opendir("d"))
				} else {
					handles = append(handles, r.open("f", fxfRead))
				}
			}
			r.wantStatus(r.send(fxpOpen, "f", uint32(fxfRead), wireAttrs{}), fxFailure, "open past the limit")
			r.wantStatus(r.send(fxpOpen, "new", uint32(fxfWrite|fxfCreat|fxfTrunc), wireAttrs{}), fxFailure, "create past the limit")
			r.wantStatus(r.send(fxpOpendir, "d"), fxFailure, "opendir past the limit")
			fx.wantMissing("new")
			if got, want := fx.fake.Calls("Open"), (tc.want+1)/2; got != want {
				t.Fatalf("the service saw %d opens; want %d (refused ones never reach it)", got, want)
			}

			// limits@openssh.com says how many may be open.
			lim := r.call(fxpExtended, "limits@openssh.com")
			lim.d.u64()
			lim.d.u64()
			lim.d.u64()
			if n := lim.d.u64(); n != uint64(tc.want) {
				t.Fatalf("limits@openssh.com reports %d open handles; want %d", n, tc.want)
			}

			// Closing one frees its place, once.
			r.ok("close", fxpClose, handles[0])
			h := r.open("f", fxfRead)
			r.wantStatus(r.send(fxpOpendir, "d"), fxFailure, "opendir past the limit again")
			r.ok("close", fxpClose, h)
			h = r.opendir("d")
			r.ok("close", fxpClose, h)
			for _, h := range handles[1:] {
				r.ok("close", fxpClose, h)
			}
			fx.waitReleased()
		})
	}
}

// READ returns at most MaxData bytes, whatever the client asks for;
// EOF status at or past the end; an empty request at an offset inside
// the file gets empty DATA.
func TestReadIsBounded(t *testing.T) {
	data := make([]byte, MaxData+1000)
	for i := range data {
		data[i] = byte(i * 7)
	}
	for _, tc := range []struct {
		name    string
		off     uint64
		n       uint32
		want    []byte // nil: EOF
		wantEOF bool
	}{
		{name: "asks for 1 MiB", off: 0, n: 1 << 20, want: data[:MaxData]},
		{name: "asks for 4 GiB", off: 0, n: 1<<32 - 1, want: data[:MaxData]},
		{name: "asks for MaxData+1", off: 10, n: MaxData + 1, want: data[10 : 10+MaxData]},
		{name: "asks for MaxData", off: 0, n: MaxData, want: data[:MaxData]},
		{name: "asks past the end", off: MaxData, n: 1 << 20, want: data[MaxData:]},
		{name: "asks for nothing", off: 5, n: 0, want: []byte{}},
		{name: "at the end", off: uint64(len(data)), n: 10, wantEOF: true},
		{name: "past the end", off: 1 << 40, n: 10, wantEOF: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fx := newFixture(t)
			fx.file("f", string(data))
			r := fx.serve(Server{}).raw()
			r.init()
			h := r.open("f", fxfRead)
			rep := r.call(fxpRead, h, tc.off, tc.n)
			if tc.wantEOF {
				code, _ := r.statusOfReply(rep)
				if code != fxEOF {
					t.Fatalf("status %s; want EOF", codeName(code))
				}
				return
			}
			if rep.typ != fxpData {
				t.Fatalf("reply of type %d; want DATA", rep.typ)
			}
			got := rep.d.bytes()
			if rep.d.err != nil || len(rep.d.b) != 0 {
				t.Fatalf("DATA malformed: %v (%d bytes after the data)", rep.d.err, len(rep.d.b))
			}
			if !bytes.Equal(got, tc.want) {
				t.Fatalf("read %d bytes; want %d (the first %d bytes at %d)", len(got), len(tc.want), len(tc.want), tc.off)
			}
		})
	}
}

// Pipelined WRITEs, answered in any order, land as a file written in
// request order would: disjoint ranges in any order, overlapping ones
// the later request last, appends one after another; CLOSE is answered
// after every WRITE before it.
func TestPipelinedWrites(t *testing.T) {
	const chunk = 4 << 10
	rng := rand.New(rand.NewPCG(1, 2))
	random := make([]byte, 64*chunk)
	for i := range random {
		random[i] = byte(rng.Uint32())
	}
	type write struct {
		off  uint64
		data string
	}
	shuffled := func() []write {
		var ws []write
		for _, i := range rand.New(rand.NewPCG(3, 4)).Perm(len(random) / chunk) {
			ws = append(ws, write{uint64(i * chunk), string(random[i*chunk : (i+1)*chunk])})
		}
		return ws
	}
	for _, tc := range []struct {
		name     string
		existing string // "" for none
		pflags   uint32
		writes   []write
		want     string
	}{
		{name: "disjoint, shuffled", pflags: fxfWrite | fxfCreat | fxfTrunc, writes: shuffled(), want: string(random)},
		{name: "overlapping", pflags: fxfWrite | fxfCreat | fxfTrunc,
			writes: []write{{0, "AAAAAAAA"}, {2, "BBBB"}, {3, "CC"}, {6, "DDDD"}, {0, "E"}}, want: "EABCCBDDDD"},
		{name: "with a gap", pflags: fxfWrite | fxfCreat | fxfTrunc,
			writes: []write{{6, "tail"}, {0, "head"}}, want: "head\x00\x00tail"},
		{name: "in place, over old content", existing: "0123456789", pflags: fxfWrite,
			writes: []write{{8, "xy"}, {0, "ab"}, {4, "cd"}}, want: "ab23cd67xy"},
		{name: "appending", existing: "old;", pflags: fxfWrite | fxfAppend,
			writes: []write{{0, "one;"}, {100, "two;"}, {0, "three;"}}, want: "old;one;two;three;"},
	} {
		for _, inflight := range []int{0, 1, 4} {
			t.Run(fmt.Sprintf("%s/inflight=%d", tc.name, inflight), func(t *testing.T) {
				fx := newFixture(t)
				if tc.existing != "" {
					fx.file("f", tc.existing)
				}
				r := fx.serve(Server{MaxInflight: inflight}).raw()
				r.init()
				h := r.open("f", tc.pflags)
				pending := map[uint32]bool{}
				for _, w := range tc.writes {
					pending[r.send(fxpWrite, h, w.off, w.data)] = true
				}
				closeID := r.send(fxpClose, h)
				for len(pending) > 0 {
					rep := r.recv()
					if !pending[rep.id] {
						t.Fatalf("reply to request %d while %d writes are unanswered", rep.id, len(pending))
					}
					if code, msg := r.statusOfReply(rep); code != fxOK {
						t.Fatalf("write %d: status %s (%q)", rep.id, codeName(code), msg)
					}
					delete(pending, rep.id)
				}
				r.wantStatus(closeID, fxOK, "close after the writes")
				fx.wantContent("f", tc.want)
				fx.waitReleased()
			})
		}
	}
}

// github.com/pkg/sftp's client, with concurrent writes and reads out of
// order, moves a file larger than a packet both ways intact.
func TestClientRoundTrip(t *testing.T) {
	data := make([]byte, 3*MaxData+12345)
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	for _, opts := range [][]pkgsftp.ClientOption{
		{pkgsftp.UseConcurrentWrites(true), pkgsftp.UseConcurrentReads(true)},
		{pkgsftp.UseConcurrentWrites(false), pkgsftp.UseConcurrentReads(false), pkgsftp.MaxPacket(8 << 10)},
	} {
		fx := newFixture(t)
		c := fx.serve(Server{}).client(opts...)
		f, err := c.Create("up.bin")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.ReadFrom(bytes.NewReader(data)); err != nil {
			t.Fatalf("upload: %v", err)
		}
		if err := f.Close(); err != nil {
			t.Fatalf("close after upload: %v", err)
		}
		fx.wantContent("up.bin", string(data))

		f, err = c.Open("up.bin")
		if err != nil {
			t.Fatal(err)
		}
		var got bytes.Buffer
		if _, err := f.WriteTo(&got); err != nil {
			t.Fatalf("download: %v", err)
		}
		f.Close()
		if !bytes.Equal(got.Bytes(), data) {
			t.Fatalf("downloaded %d bytes, not the %d uploaded", got.Len(), len(data))
		}
		fx.waitReleased()
	}
}

// An upload opened to create and truncate is staged: under its name the
// old content stays until CLOSE (for this stream's STAT, the upload is
// what it sees); a stream that ends without CLOSE, or whose CLOSE fails,
// leaves the old content (or nothing), and no file open. Writes in
// place land as they are made.
func TestStagedUploads(t *testing.T) {
	const old, upload = "old content", "the new content, longer"
	for _, tc := range []struct {
		name     string
		existing bool
		pflags   uint32
		fsync    bool
		end      string // "close", "hangup" (the client goes away), "cancel" (Serve's ctx ends), "close fails"
		want     string // "" for nothing under the name
	}{
		{name: "closed", existing: true, pflags: fxfWrite | fxfCreat | fxfTrunc, end: "close", want: upload},
		{name: "closed, new", pflags: fxfWrite | fxfCreat | fxfTrunc, end: "close", want: upload},
		{name: "read-write, closed", existing: true, pflags: fxfRead | fxfWrite | fxfCreat | fxfTrunc, end: "close", want: upload},
		{name: "client goes away", existing: true, pflags: fxfWrite | fxfCreat | fxfTrunc, end: "hangup", want: old},
		{name: "client goes away after fsync", existing: true, pflags: fxfWrite | fxfCreat | fxfTrunc, fsync: true, end: "hangup", want: old},
		{name: "client goes away, new", pflags: fxfWrite | fxfCreat | fxfTrunc, end: "hangup"},
		{name: "serve cancelled", existing: true, pflags: fxfWrite | fxfCreat | fxfTrunc, end: "cancel", want: old},
		{name: "serve cancelled, new", pflags: fxfWrite | fxfCreat | fxfTrunc, end: "cancel"},
		{name: "close fails", existing: true, pflags: fxfWrite | fxfCreat | fxfTrunc, end: "close fails", want: old},
		{name: "close fails, new", pflags: fxfWrite | fxfCreat | fxfTrunc, end: "close fails"},
		// Not staged: written in place, so what was written is there
		// whatever the end.
		{name: "in place, client goes away", existing: true, pflags: fxfWrite, end: "hangup", want: upload},
		{name: "truncated in place, client goes away", existing: true, pflags: fxfWrite | fxfTrunc, end: "hangup", want: upload},
		{name: "exclusive create, client goes away", pflags: fxfWrite | fxfCreat | fxfExcl, end: "hangup", want: upload},
		{name: "in place, serve cancelled", existing: true, pflags: fxfWrite, end: "cancel", want: upload},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fx := newFixture(t)
			if tc.existing {
				fx.file("f", old)
			}
			st := fx.serve(Server{})
			r := st.raw()
			r.init()
			h := r.open("f", tc.pflags)
			r.ok("write", fxpWrite, h, uint64(0), upload)
			if tc.fsync {
				r.ok("fsync", fxpExtended, "fsync@openssh.com", h)
			}
			staged := tc.pflags&(fxfCreat|fxfTrunc|fxfExcl) == fxfCreat|fxfTrunc
			if staged {
				// Invisible under its name: to the service's other
				// clients and to another stream.
				if tc.existing {
					fx.wantContent("f", old)
				} else {
					fx.wantMissing("f")
				}
				other := fx.serve(Server{}).raw()
				other.init()
				want := uint64(len(old))
				if rep := other.call(fxpStat, "f"); !tc.existing {
					if code, _ := other.statusOfReply(rep); code != fxNoSuchFile {
						t.Fatalf("another stream stats the new upload: %s; want NO_SUCH_FILE", codeName(code))
					}
				} else if a := other.attrsOf(rep, "stat from another stream"); a.size != want {
					t.Fatalf("another stream stats %d bytes; want the old %d", a.size, want)
				}
				// This stream sees its upload.
				if a := r.attrsOf(r.call(fxpStat, "f"), "stat of the upload"); a.size != uint64(len(upload)) {
					t.Fatalf("the uploading stream stats %d bytes; want its %d", a.size, len(upload))
				}
			}
			switch tc.end {
			case "close":
				r.ok("close", fxpClose, h)
			case "close fails":
				fx.fake.FailNext("File.Close", fmt.Errorf("injected: %w", io.ErrShortWrite))
				r.wantStatus(r.send(fxpClose, h), fxFailure, "close that fails")
			case "hangup":
				st.conn.Close()
				if err := st.wait(); err != nil {
					t.Fatalf("Serve = %v after the client went away; want nil", err)
				}
			case "cancel":
				st.cancel()
				if err := st.wait(); !errors.Is(err, context.Canceled) {
					t.Fatalf("Serve = %v after its ctx ended; want context.Canceled", err)
				}
			}
			fx.waitReleased()
			if tc.want == "" {
				fx.wantMissing("f")
			} else {
				fx.wantContent("f", tc.want)
			}
		})
	}
}

// Two uploads of one name on one stream: each lands at its CLOSE, the
// last one closed last; this stream's STAT sees the latest opened.
func TestStagedUploadsOfOneName(t *testing.T) {
	fx := newFixture(t)
	fx.file("f", "old")
	r := fx.serve(Server{}).raw()
	r.init()
	h1 := r.open("f", fxfWrite|fxfCreat|fxfTrunc)
	h2 := r.open("f", fxfWrite|fxfCreat|fxfTrunc)
	r.ok("write 1", fxpWrite, h1, uint64(0), "first")
	r.ok("write 2", fxpWrite, h2, uint64(0), "second!")
	if a := r.attrsOf(r.call(fxpStat, "f"), "stat"); a.size != 7 {
		t.Fatalf("stat sees %d bytes; want the latest upload's 7", a.size)
	}
	r.ok("close 2", fxpClose, h2)
	fx.wantContent("f", "second!")
	r.ok("close 1", fxpClose, h1)
	fx.wantContent("f", "first")
	fx.waitReleased()
}

// A staged upload removed before its CLOSE never lands.
func TestStagedUploadRemoved(t *testing.T) {
	for _, existing := range []bool{false, true} {
		t.Run(fmt.Sprint("existing=", existing), func(t *testing.T) {
			fx := newFixture(t)
			if existing {
				fx.file("f", "old")
			}
			r := fx.serve(Server{}).raw()
			r.init()
			h := r.open("f", fxfWrite|fxfCreat|fxfTrunc)
			r.ok("write", fxpWrite, h, uint64(0), "new")
			r.ok("remove", fxpRemove, "f")
			r.ok("close", fxpClose, h)
			fx.wantMissing("f")
			fx.waitReleased()
		})
	}
}

// Pipelined READs and WRITEs of one file run in request order: a READ
// sees the WRITEs sent before it and none sent after it.
func TestPipelinedReadsSeeEarlierWrites(t *testing.T) {
	for _, inflight := range []int{0, 1, 4} {
		t.Run(fmt.Sprint("inflight=", inflight), func(t *testing.T) {
			fx := newFixture(t)
			fx.file("f", "0000000000")
			r := fx.serve(Server{MaxInflight: inflight}).raw()
			r.init()
			w := r.open("f", fxfWrite)
			rd := r.open("f", fxfRead) // another handle: the order is the file's
			want := map[uint32]string{}
			writes := map[uint32]bool{}
			content := []byte("0000000000")
			for i := range 10 {
				b := string(rune('a' + i))
				writes[r.send(fxpWrite, w, uint64(i), b)] = true
				content[i] = b[0]
				want[r.send(fxpRead, rd, uint64(0), uint32(10))] = string(content)
			}
			for range len(want) + len(writes) {
				rep := r.recv()
				if writes[rep.id] {
					if code, msg := r.statusOfReply(rep); code != fxOK {
						t.Fatalf("write %d: %s (%q)", rep.id, codeName(code), msg)
					}
					continue
				}
				if rep.typ != fxpData {
					t.Fatalf("read %d: reply of type %d; want DATA", rep.id, rep.typ)
				}
				if got := rep.d.str(); got != want[rep.id] {
					t.Fatalf("read %d saw %q; want %q (the writes before it, none after)", rep.id, got, want[rep.id])
				}
			}
			r.ok("close", fxpClose, w)
			r.ok("close", fxpClose, rd)
		})
	}
}

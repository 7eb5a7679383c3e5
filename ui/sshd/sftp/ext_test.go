package sftp

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	pkgsftp "github.com/pkg/sftp"
)

// VERSION offers version 3 and the OpenSSH extensions served, with
// OpenSSH's versions of them.
func TestVersionExtensions(t *testing.T) {
	fx := newFixture(t)
	r := fx.serve(Server{}).raw()
	got := r.init()
	want := map[string]string{
		"posix-rename@openssh.com": "1",
		"statvfs@openssh.com":      "2",
		"fstatvfs@openssh.com":     "2",
		"hardlink@openssh.com":     "1",
		"fsync@openssh.com":        "1",
		"limits@openssh.com":       "1",
	}
	if !maps.Equal(got, want) {
		t.Fatalf("VERSION offers %v; want %v", got, want)
	}
	c := fx.serve(Server{}).client()
	for name := range want {
		if _, ok := c.HasExtension(name); !ok {
			t.Errorf("github.com/pkg/sftp does not see %s offered", name)
		}
	}
}

// limits@openssh.com reports the packet, read and write bounds and the
// handle limit.
func TestLimits(t *testing.T) {
	for _, max := range []int{0, 7} {
		fx := newFixture(t)
		r := fx.serve(Server{MaxHandles: max}).raw()
		r.init()
		rep := r.call(fxpExtended, "limits@openssh.com")
		if rep.typ != fxpExtendedReply {
			t.Fatalf("limits: reply of type %d; want EXTENDED_REPLY", rep.typ)
		}
		got := []uint64{rep.d.u64(), rep.d.u64(), rep.d.u64(), rep.d.u64()}
		if rep.d.err != nil || len(rep.d.b) != 0 {
			t.Fatalf("limits: reply malformed: %v, %d bytes left", rep.d.err, len(rep.d.b))
		}
		want := []uint64{MaxPacket, MaxData, MaxData, uint64(max)}
		if max == 0 {
			want[3] = DefaultMaxHandles
		}
		if !slices.Equal(got, want) {
			t.Fatalf("limits (packet, read, write, open handles) = %v; want %v", got, want)
		}
	}
}

// statvfs@openssh.com and fstatvfs@openssh.com report the workspace
// volume's figures, in OpenSSH's order.
func TestStatvfs(t *testing.T) {
	fx := newFixture(t)
	fx.file("f", "content")
	fx.dir("d")
	want, err := fx.fake.Statfs(context.Background(), testSession, "/workspace")
	if err != nil {
		t.Fatal(err)
	}
	wantFields := []uint64{want.BlockSize, want.FragmentSize, want.Blocks, want.BlocksFree, want.BlocksAvail,
		want.Files, want.FilesFree, want.FilesAvail, want.FSID, want.Flags, want.NameMax}
	r := fx.serve(Server{}).raw()
	r.init()
	fh := r.open("f", fxfRead)
	dh := r.opendir("d")
	for _, tc := range []struct {
		name string
		args []any
	}{
		{"statvfs of the workspace", []any{"statvfs@openssh.com", "/workspace"}},
		{"statvfs of a file", []any{"statvfs@openssh.com", "f"}},
		{"fstatvfs of a file", []any{"fstatvfs@openssh.com", fh}},
		{"fstatvfs of a directory", []any{"fstatvfs@openssh.com", dh}},
	} {
		rep := r.call(fxpExtended, tc.args...)
		if rep.typ != fxpExtendedReply {
			code, msg := r.statusOfReply(rep)
			t.Fatalf("%s: status %s (%q); want EXTENDED_REPLY", tc.name, codeName(code), msg)
		}
		var got []uint64
		for range 11 {
			got = append(got, rep.d.u64())
		}
		if rep.d.err != nil || len(rep.d.b) != 0 {
			t.Fatalf("%s: reply malformed: %v, %d bytes left", tc.name, rep.d.err, len(rep.d.b))
		}
		if !slices.Equal(got, wantFields) {
			t.Fatalf("%s = %v; want %v", tc.name, got, wantFields)
		}
	}
	r.wantStatus(r.send(fxpExtended, "statvfs@openssh.com", "missing"), fxNoSuchFile, "statvfs of a missing path")

	c := fx.serve(Server{}).client()
	vfs, err := c.StatVFS("/workspace")
	if err != nil {
		t.Fatalf("StatVFS: %v", err)
	}
	if vfs.Bsize != want.BlockSize || vfs.Blocks != want.Blocks || vfs.Bfree != want.BlocksFree || vfs.Namemax != want.NameMax {
		t.Fatalf("StatVFS = %+v; want the service's %+v", vfs, want)
	}
}

// fsync@openssh.com syncs the handle's file.
func TestFsync(t *testing.T) {
	fx := newFixture(t)
	fx.file("f", "old")
	c := fx.serve(Server{}).client()
	for i, open := range []func() (*pkgsftp.File, error){
		func() (*pkgsftp.File, error) { return c.OpenFile("f", 0x2 /* os.O_RDWR */) },
		func() (*pkgsftp.File, error) { return c.Create("f") },
	} {
		f, err := open()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write([]byte("new")); err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatalf("Sync: %v", err)
		}
		if got := fx.fake.Calls("File.Sync"); got != i+1 {
			t.Fatalf("the service saw %d syncs; want %d", got, i+1)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	fx.wantContent("f", "new")

	// The service's failure is the reply's.
	r := fx.serve(Server{}).raw()
	r.init()
	h := r.open("f", fxfWrite)
	fx.fake.FailNext("File.Sync", fmt.Errorf("injected: %w", context.DeadlineExceeded))
	r.wantStatus(r.send(fxpExtended, "fsync@openssh.com", h), fxFailure, "fsync that fails")
	r.ok("fsync", fxpExtended, "fsync@openssh.com", h)
	r.ok("close", fxpClose, h)
}

// hardlink@openssh.com links a second name to a file; it never replaces.
func TestHardlink(t *testing.T) {
	for _, tc := range []struct {
		name     string
		from, to string
		want     uint32
	}{
		{"new name", "f", "g", fxOK},
		{"into a directory", "f", "d/g", fxOK},
		{"absolute paths", "/workspace/f", "/workspace/g", fxOK},
		{"existing name", "f", "other", fxFailure},
		{"missing source", "missing", "g", fxNoSuchFile},
		{"missing directory", "f", "nodir/g", fxNoSuchFile},
		{"a directory", "d", "g", fxPermissionDenied}, // link(2)'s EPERM
	} {
		t.Run(tc.name, func(t *testing.T) {
			fx := newFixture(t)
			fx.file("f", "content")
			fx.file("other", "other content")
			fx.dir("d")
			r := fx.serve(Server{}).raw()
			r.init()
			r.wantStatus(r.send(fxpExtended, "hardlink@openssh.com", tc.from, tc.to), tc.want, "hardlink")
			fx.wantContent("f", "content")
			fx.wantContent("other", "other content")
			if tc.want != fxOK {
				return
			}
			fx.wantContent(tc.to, "content")
			// One file under two names: a write through one shows
			// through the other.
			h := r.open(tc.to, fxfWrite)
			r.ok("write", fxpWrite, h, uint64(0), "CON")
			r.ok("close", fxpClose, h)
			fx.wantContent("f", "CONtent")
		})
	}

	fx := newFixture(t)
	fx.file("f", "content")
	if err := fx.serve(Server{}).client().Link("f", "g"); err != nil {
		t.Fatalf("Link: %v", err)
	}
	fx.wantContent("g", "content")
}

// posix-rename@openssh.com replaces an existing target; RENAME does not
// (as OpenSSH's sftp-server refuses it).
func TestRenames(t *testing.T) {
	for _, tc := range []struct {
		name     string
		ext      bool // posix-rename
		from, to string
		want     uint32
		wantTo   string // the content under to afterwards, when OK
	}{
		{"rename to a new name", false, "f", "g", fxOK, "f content"},
		{"rename over a file", false, "f", "other", fxFailure, ""},
		{"rename over itself", false, "f", "f", fxFailure, ""},
		{"rename of a missing file", false, "missing", "g", fxNoSuchFile, ""},
		{"posix-rename to a new name", true, "f", "g", fxOK, "f content"},
		{"posix-rename over a file", true, "f", "other", fxOK, "f content"},
		{"posix-rename into a directory", true, "f", "d/f", fxOK, "f content"},
		{"posix-rename of a missing file", true, "missing", "g", fxNoSuchFile, ""},
		{"posix-rename over a directory", true, "f", "d", fxFailure, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fx := newFixture(t)
			fx.file("f", "f content")
			fx.file("other", "other content")
			fx.dir("d")
			r := fx.serve(Server{}).raw()
			r.init()
			if tc.ext {
				r.wantStatus(r.send(fxpExtended, "posix-rename@openssh.com", tc.from, tc.to), tc.want, tc.name)
			} else {
				r.wantStatus(r.send(fxpRename, tc.from, tc.to), tc.want, tc.name)
			}
			if tc.want != fxOK {
				fx.wantContent("f", "f content")
				fx.wantContent("other", "other content")
				return
			}
			fx.wantMissing(tc.from)
			fx.wantContent(tc.to, tc.wantTo)
		})
	}

	fx := newFixture(t)
	fx.file("f", "f content")
	fx.file("other", "other content")
	c := fx.serve(Server{}).client()
	if err := c.Rename("f", "other"); err == nil {
		t.Fatal("Rename over a file succeeded; want it refused")
	}
	if err := c.PosixRename("f", "other"); err != nil {
		t.Fatalf("PosixRename: %v", err)
	}
	fx.wantMissing("f")
	fx.wantContent("other", "f content")
}

// READDIR hands a listing out in pages of at most ReaddirPage entries,
// every entry once, then EOF (and EOF again).
func TestReaddirPages(t *testing.T) {
	for _, n := range []int{0, 1, ReaddirPage - 1, ReaddirPage, ReaddirPage + 1, 2*ReaddirPage + 50} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			fx := newFixture(t)
			fx.dir("d")
			var want []string
			for i := range n {
				name := fmt.Sprintf("file-%04d", i)
				fx.file("d/"+name, name)
				want = append(want, name)
			}
			r := fx.serve(Server{Now: func() time.Time { return seedTime }}).raw()
			r.init()
			h := r.opendir("d")
			var got []string
			pages := 0
			for {
				rep := r.call(fxpReaddir, h)
				if rep.typ == fxpStatus {
					if code, msg := r.statusOfReply(rep); code != fxEOF {
						t.Fatalf("readdir: status %s (%q); want NAME or EOF", codeName(code), msg)
					}
					break
				}
				if rep.typ != fxpName {
					t.Fatalf("readdir: reply of type %d; want NAME", rep.typ)
				}
				count := rep.d.u32()
				if count == 0 || count > ReaddirPage {
					t.Fatalf("a page of %d entries; want 1 to %d", count, ReaddirPage)
				}
				for range count {
					name, long := rep.d.str(), rep.d.str()
					a := rep.d.attrs()
					if a.size != uint64(len(name)) || a.perm&sIFMT != sIFREG {
						t.Fatalf("entry %s: size %d, mode %o; want a regular file of %d bytes", name, a.size, a.perm, len(name))
					}
					if wantLong := "-rw-r--r--    1 ?        ?               9 Nov 14 22:13 " + name; long != wantLong {
						t.Fatalf("entry %s: long name %q; want %q", name, long, wantLong)
					}
					got = append(got, name)
				}
				if rep.d.err != nil || len(rep.d.b) != 0 {
					t.Fatalf("NAME malformed: %v, %d bytes left", rep.d.err, len(rep.d.b))
				}
				if pages++; pages > n+1 {
					t.Fatal("readdir never ends")
				}
			}
			if wantPages := (n + ReaddirPage - 1) / ReaddirPage; pages != wantPages {
				t.Fatalf("%d pages; want %d", pages, wantPages)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("listed %d entries %v; want %d", len(got), clip(fmt.Sprint(got)), len(want))
			}
			r.wantStatus(r.send(fxpReaddir, h), fxEOF, "readdir after EOF")
			r.ok("close", fxpClose, h)

			ents, err := fx.serve(Server{}).client().ReadDir("d")
			if err != nil || len(ents) != n {
				t.Fatalf("ReadDir: %d entries, %v; want %d", len(ents), err, n)
			}
		})
	}
}

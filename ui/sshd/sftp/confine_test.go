package sftp

import (
	"context"
	"errors"
	"io/fs"
	"maps"
	"slices"
	"testing"
)

// pathRequests are the requests that take a path, as (type, fields)
// given the path p: every one must confine p to /workspace.
func pathRequests(p string) []struct {
	name   string
	typ    byte
	fields []any
} {
	return []struct {
		name   string
		typ    byte
		fields []any
	}{
		{"open", fxpOpen, []any{p, uint32(fxfRead), wireAttrs{}}},
		{"open to create", fxpOpen, []any{p, uint32(fxfWrite | fxfCreat | fxfTrunc), wireAttrs{}}},
		{"opendir", fxpOpendir, []any{p}},
		{"stat", fxpStat, []any{p}},
		{"lstat", fxpLstat, []any{p}},
		{"setstat", fxpSetstat, []any{p, wireAttrs{flags: attrPermissions, perm: 0o777}}},
		{"remove", fxpRemove, []any{p}},
		{"mkdir", fxpMkdir, []any{p, wireAttrs{}}},
		{"rmdir", fxpRmdir, []any{p}},
		{"readlink", fxpReadlink, []any{p}},
		{"rename from", fxpRename, []any{p, "new"}},
		{"rename to", fxpRename, []any{"f", p}},
		{"symlink at", fxpSymlink, []any{"f", p}},
		{"posix-rename from", fxpExtended, []any{"posix-rename@openssh.com", p, "new"}},
		{"posix-rename to", fxpExtended, []any{"posix-rename@openssh.com", "f", p}},
		{"hardlink from", fxpExtended, []any{"hardlink@openssh.com", p, "new"}},
		{"hardlink to", fxpExtended, []any{"hardlink@openssh.com", "f", p}},
		{"statvfs", fxpExtended, []any{"statvfs@openssh.com", p}},
	}
}

// snapshot is the workspace's tree: every path with its mode and
// content, to see that refused requests changed nothing.
func (fx *fixture) snapshot() []string {
	fx.t.Helper()
	ctx := context.Background()
	var out []string
	var walk func(dir string)
	walk = func(dir string) {
		ents, err := fx.fake.ListDir(ctx, testSession, dir)
		if err != nil {
			fx.t.Fatal(err)
		}
		for _, e := range ents {
			p := dir + "/" + e.Name
			line := p + " " + e.Mode.String() + " " + e.Link
			switch {
			case e.IsDir():
				walk(p)
			case e.Mode&fs.ModeSymlink == 0:
				c, err := fx.content(p)
				if err != nil {
					fx.t.Fatal(err)
				}
				line += " " + c
			}
			out = append(out, line)
		}
	}
	walk("/workspace")
	return out
}

// Paths that lead out of /workspace, lexically or through a symlink,
// are refused with PERMISSION_DENIED, as a chroot refuses them, and
// change nothing.
func TestPathsOutsideTheWorkspace(t *testing.T) {
	paths := []string{
		"..", "../etc/passwd", "a/../../etc", "/", "/etc/passwd", "/workspace/..", "/workspace/../etc",
		"/workspacex", "/workspacex/f", "/work", "//etc",
		// Through symlinks that lead out (see below).
		"out", "out/passwd", "up/out", "up/out/passwd",
	}
	// The requests that follow a final symlink.
	following := []string{"open", "open to create", "opendir", "stat", "setstat", "statvfs"}
	for _, p := range paths {
		for _, req := range pathRequests(p) {
			t.Run(p+"/"+req.name, func(t *testing.T) {
				fx := newFixture(t)
				fx.file("f", "content")
				r := fx.serve(Server{}).raw()
				r.init()
				// A symlink that leads out: "up" is the workspace
				// itself, so "up/out" → "../etc" is lexically inside
				// (/workspace/etc), but out of it once followed.
				r.ok("symlink up", fxpSymlink, ".", "up")
				r.ok("symlink up/out", fxpSymlink, "../etc", "up/out")
				before := fx.snapshot()
				rep := r.call(req.typ, req.fields...)
				if (p == "out" || p == "up/out") && !slices.Contains(following, req.name) {
					// The symlink itself is inside: a request that does
					// not follow it may act on it (lstat, readlink,
					// remove, rename, link it) or find it there.
					return
				}
				if code, _ := r.statusOfReply(rep); code != fxPermissionDenied {
					t.Fatalf("%s %s: status %s; want PERMISSION_DENIED", req.name, p, codeName(code))
				}
				if after := fx.snapshot(); !slices.Equal(before, after) {
					t.Fatalf("%s %s was refused but changed the workspace:\nbefore %q\nafter  %q", req.name, p, before, after)
				}
			})
		}
	}
}

// SYMLINK refuses targets that lead out of /workspace, lexically.
func TestSymlinkTargets(t *testing.T) {
	for _, tc := range []struct {
		link, target string
		want         uint32
	}{
		{"l", "f", fxOK},
		{"l", "./d/../f", fxOK},
		{"d/l", "../f", fxOK},
		{"l", "/workspace/f", fxOK},
		{"l", "missing", fxOK}, // dangling, but inside
		{"l", "..", fxPermissionDenied},
		{"l", "../etc/passwd", fxPermissionDenied},
		{"d/l", "../../etc", fxPermissionDenied},
		{"l", "/etc/passwd", fxPermissionDenied},
		{"l", "/", fxPermissionDenied},
		{"l", "/workspacex", fxPermissionDenied},
		{"l", "d/../../x", fxPermissionDenied},
		{"l", "", fxNoSuchFile},
		{"f", "d", fxFailure}, // exists
	} {
		t.Run(tc.link+"→"+tc.target, func(t *testing.T) {
			fx := newFixture(t)
			fx.file("f", "content")
			fx.dir("d")
			r := fx.serve(Server{}).raw()
			r.init()
			before := fx.snapshot()
			r.wantStatus(r.send(fxpSymlink, tc.target, tc.link), tc.want, "symlink")
			if tc.want != fxOK {
				if after := fx.snapshot(); !slices.Equal(before, after) {
					t.Fatalf("refused symlink changed the workspace:\nbefore %q\nafter  %q", before, after)
				}
				return
			}
			rep := r.call(fxpReadlink, tc.link)
			if rep.typ != fxpName || rep.d.u32() != 1 || rep.d.str() != tc.target {
				t.Fatalf("readlink %s: type %d; want NAME with %q", tc.link, rep.typ, tc.target)
			}
		})
	}
}

// Symlinks inside the workspace are followed where a path is used.
func TestSymlinksInside(t *testing.T) {
	fx := newFixture(t)
	fx.file("d/f", "content")
	r := fx.serve(Server{}).raw()
	r.init()
	r.ok("symlink", fxpSymlink, "d", "link")
	r.ok("symlink", fxpSymlink, "link/f", "flink")
	h := r.open("flink", fxfRead)
	rep := r.call(fxpRead, h, uint64(0), uint32(100))
	if rep.typ != fxpData || rep.d.str() != "content" {
		t.Fatalf("read through a symlink: type %d; want DATA %q", rep.typ, "content")
	}
	r.ok("close", fxpClose, h)
	if a := r.attrsOf(r.call(fxpStat, "flink"), "stat"); a.perm&sIFMT != sIFREG || a.size != 7 {
		t.Fatalf("stat of a symlink: mode %o size %d; want the file's", a.perm, a.size)
	}
	if a := r.attrsOf(r.call(fxpLstat, "flink"), "lstat"); a.perm&sIFMT != sIFLNK {
		t.Fatalf("lstat of a symlink: mode %o; want a symlink", a.perm)
	}
	h = r.opendir("link")
	r.ok("close", fxpClose, h)
}

// REALPATH resolves lexically from /workspace; paths outside resolve
// too (so "cd .." says where it went), though every use of them is
// refused.
func TestRealpath(t *testing.T) {
	fx := newFixture(t)
	r := fx.serve(Server{}).raw()
	r.init()
	for in, want := range map[string]string{
		"": "/workspace", ".": "/workspace", "a/b/../c": "/workspace/a/c", "/workspace/x/": "/workspace/x",
		"..": "/", "../..": "/", "/etc/../tmp": "/tmp",
	} {
		rep := r.call(fxpRealpath, in)
		if rep.typ != fxpName || rep.d.u32() != 1 {
			t.Fatalf("realpath %q: reply of type %d; want NAME of one", in, rep.typ)
		}
		if got := rep.d.str(); got != want {
			t.Errorf("realpath %q = %q; want %q", in, got, want)
		}
	}
}

// ReadOnly (the viewer role) refuses every request that would change the
// workspace with PERMISSION_DENIED, before it reaches the service; what
// only reads is served.
func TestReadOnly(t *testing.T) {
	fx := newFixture(t)
	fx.file("f", "content")
	fx.file("d/g", "g content")
	fx.dir("empty")
	setup := fx.serve(Server{}).raw()
	setup.init()
	setup.ok("symlink", fxpSymlink, "f", "link")
	before := fx.snapshot()
	calls := func() map[string]int {
		m := map[string]int{}
		for _, method := range []string{"Setstat", "Remove", "Mkdir", "Rmdir", "Rename", "Symlink", "Link", "WriteFile",
			"File.WriteAt", "File.Setstat", "File.Sync", "Open"} {
			m[method] = fx.fake.Calls(method)
		}
		return m
	}
	callsBefore := calls()

	r := fx.serve(Server{ReadOnly: true}).raw()
	r.init()
	rh := r.open("f", fxfRead)
	dh := r.opendir("d")
	for _, tc := range []struct {
		name   string
		typ    byte
		fields []any
	}{
		{"open to write", fxpOpen, []any{"f", uint32(fxfWrite), wireAttrs{}}},
		{"open to read and write", fxpOpen, []any{"f", uint32(fxfRead | fxfWrite), wireAttrs{}}},
		{"open to append", fxpOpen, []any{"f", uint32(fxfAppend), wireAttrs{}}},
		{"open to create", fxpOpen, []any{"new", uint32(fxfRead | fxfCreat), wireAttrs{}}},
		{"open to truncate", fxpOpen, []any{"f", uint32(fxfRead | fxfTrunc), wireAttrs{}}},
		{"open exclusively", fxpOpen, []any{"new", uint32(fxfWrite | fxfCreat | fxfExcl), wireAttrs{}}},
		{"open to upload", fxpOpen, []any{"f", uint32(fxfWrite | fxfCreat | fxfTrunc), wireAttrs{}}},
		{"write", fxpWrite, []any{rh, uint64(0), "x"}},
		{"setstat", fxpSetstat, []any{"f", wireAttrs{flags: attrPermissions, perm: 0o600}}},
		{"setstat of a size", fxpSetstat, []any{"f", wireAttrs{flags: attrSize, size: 0}}},
		{"fsetstat", fxpFsetstat, []any{rh, wireAttrs{flags: attrACModTime, atime: 1, mtime: 1}}},
		{"fsetstat of a directory", fxpFsetstat, []any{dh, wireAttrs{flags: attrPermissions, perm: 0o700}}},
		{"remove", fxpRemove, []any{"f"}},
		{"remove of a symlink", fxpRemove, []any{"link"}},
		{"mkdir", fxpMkdir, []any{"newdir", wireAttrs{}}},
		{"rmdir", fxpRmdir, []any{"empty"}},
		{"rename", fxpRename, []any{"f", "new"}},
		{"symlink", fxpSymlink, []any{"f", "link2"}},
		{"posix-rename", fxpExtended, []any{"posix-rename@openssh.com", "f", "d/g"}},
		{"hardlink", fxpExtended, []any{"hardlink@openssh.com", "f", "new"}},
		{"fsync", fxpExtended, []any{"fsync@openssh.com", rh}},
	} {
		r.wantStatus(r.send(tc.typ, tc.fields...), fxPermissionDenied, "read-only "+tc.name)
	}
	callsAfter := calls()
	callsAfter["Open"] -= 1 // the read-only open above
	if !maps.Equal(callsBefore, callsAfter) {
		t.Errorf("refused requests reached the service: calls before %v, after %v", callsBefore, callsAfter)
	}
	if after := fx.snapshot(); !slices.Equal(before, after) {
		t.Fatalf("a read-only stream changed the workspace:\nbefore %q\nafter  %q", before, after)
	}

	// What only reads is served.
	rep := r.call(fxpRead, rh, uint64(0), uint32(100))
	if rep.typ != fxpData || rep.d.str() != "content" {
		t.Fatalf("read-only read: type %d; want DATA %q", rep.typ, "content")
	}
	r.attrsOf(r.call(fxpStat, "f"), "read-only stat")
	r.attrsOf(r.call(fxpLstat, "link"), "read-only lstat")
	r.attrsOf(r.call(fxpFstat, rh), "read-only fstat")
	if rep := r.call(fxpReaddir, dh); rep.typ != fxpName {
		t.Fatalf("read-only readdir: type %d; want NAME", rep.typ)
	}
	if rep := r.call(fxpReadlink, "link"); rep.typ != fxpName {
		t.Fatalf("read-only readlink: type %d; want NAME", rep.typ)
	}
	if rep := r.call(fxpRealpath, "."); rep.typ != fxpName {
		t.Fatalf("read-only realpath: type %d; want NAME", rep.typ)
	}
	for _, args := range [][]any{{"statvfs@openssh.com", "f"}, {"fstatvfs@openssh.com", rh}, {"limits@openssh.com"}} {
		if rep := r.call(fxpExtended, args...); rep.typ != fxpExtendedReply {
			t.Fatalf("read-only %s: type %d; want EXTENDED_REPLY", args[0], rep.typ)
		}
	}
	r.ok("close", fxpClose, rh)
	r.ok("close", fxpClose, dh)

	// github.com/pkg/sftp's client sees the refusals as permission errors.
	c := fx.serve(Server{ReadOnly: true}).client()
	if _, err := c.Create("new"); !errors.Is(err, fs.ErrPermission) {
		t.Errorf("read-only Create = %v; want a permission error", err)
	}
	if err := c.Remove("f"); !errors.Is(err, fs.ErrPermission) {
		t.Errorf("read-only Remove = %v; want a permission error", err)
	}
	if after := fx.snapshot(); !slices.Equal(before, after) {
		t.Fatalf("a read-only stream changed the workspace:\nbefore %q\nafter  %q", before, after)
	}
	fx.waitReleased()
}

// The requests that change the workspace, inside it: what they do and
// the status they fail with, as OpenSSH's sftp-server answers.
func TestChanges(t *testing.T) {
	for _, tc := range []struct {
		name   string
		typ    byte
		fields []any
		want   uint32
		check  func(fx *fixture)
	}{
		{"remove a file", fxpRemove, []any{"f"}, fxOK, func(fx *fixture) { fx.wantMissing("f") }},
		{"remove a symlink, not its target", fxpRemove, []any{"link"}, fxOK, func(fx *fixture) {
			fx.wantMissing("link")
			fx.wantContent("f", "content")
		}},
		{"remove a directory", fxpRemove, []any{"d"}, fxFailure, func(fx *fixture) { fx.wantContent("d/g", "g") }},
		{"remove a missing file", fxpRemove, []any{"missing"}, fxNoSuchFile, nil},
		{"mkdir", fxpMkdir, []any{"new", wireAttrs{}}, fxOK, func(fx *fixture) { fx.wantMode("new", fs.ModeDir|0o755) }},
		{"mkdir with a mode, less the umask", fxpMkdir, []any{"new", wireAttrs{flags: attrPermissions, perm: 0o777}}, fxOK, func(fx *fixture) { fx.wantMode("new", fs.ModeDir|0o755) }},
		{"mkdir with a private mode", fxpMkdir, []any{"new", wireAttrs{flags: attrPermissions, perm: 0o700}}, fxOK, func(fx *fixture) { fx.wantMode("new", fs.ModeDir|0o700) }},
		{"mkdir of an existing directory", fxpMkdir, []any{"d", wireAttrs{}}, fxFailure, nil},
		{"mkdir of an existing file", fxpMkdir, []any{"f", wireAttrs{}}, fxFailure, func(fx *fixture) { fx.wantContent("f", "content") }},
		{"mkdir in a missing directory", fxpMkdir, []any{"missing/new", wireAttrs{}}, fxNoSuchFile, func(fx *fixture) { fx.wantMissing("missing") }},
		{"mkdir in a file", fxpMkdir, []any{"f/new", wireAttrs{}}, fxNoSuchFile, func(fx *fixture) { fx.wantContent("f", "content") }},
		{"rmdir", fxpRmdir, []any{"empty"}, fxOK, func(fx *fixture) { fx.wantMissing("empty") }},
		{"rmdir of a directory not empty", fxpRmdir, []any{"d"}, fxFailure, func(fx *fixture) { fx.wantContent("d/g", "g") }},
		{"rmdir of a file", fxpRmdir, []any{"f"}, fxNoSuchFile, func(fx *fixture) { fx.wantContent("f", "content") }}, // ENOTDIR
		{"rmdir of the workspace", fxpRmdir, []any{"/workspace"}, fxFailure, nil},
		{"setstat of a mode", fxpSetstat, []any{"f", wireAttrs{flags: attrPermissions, perm: 0o100600}}, fxOK, func(fx *fixture) { fx.wantMode("f", 0o600) }},
		{"setstat of a mode through a symlink", fxpSetstat, []any{"link", wireAttrs{flags: attrPermissions, perm: 0o4755}}, fxOK, func(fx *fixture) { fx.wantMode("f", fs.ModeSetuid|0o755) }},
		{"setstat of a size (truncate)", fxpSetstat, []any{"f", wireAttrs{flags: attrSize, size: 3}}, fxOK, func(fx *fixture) { fx.wantContent("f", "con") }},
		{"setstat of a size (extend)", fxpSetstat, []any{"f", wireAttrs{flags: attrSize, size: 9}}, fxOK, func(fx *fixture) { fx.wantContent("f", "content\x00\x00") }},
		{"setstat of nothing", fxpSetstat, []any{"f", wireAttrs{}}, fxOK, func(fx *fixture) { fx.wantContent("f", "content") }},
		{"setstat of a missing file", fxpSetstat, []any{"missing", wireAttrs{flags: attrPermissions, perm: 0o600}}, fxNoSuchFile, nil},
		{"setstat of a directory's size", fxpSetstat, []any{"d", wireAttrs{flags: attrSize, size: 0}}, fxFailure, nil}, // EISDIR
	} {
		t.Run(tc.name, func(t *testing.T) {
			fx := newFixture(t)
			fx.file("f", "content")
			fx.file("d/g", "g")
			fx.dir("empty")
			r := fx.serve(Server{}).raw()
			r.init()
			r.ok("symlink", fxpSymlink, "f", "link")
			r.wantStatus(r.send(tc.typ, tc.fields...), tc.want, tc.name)
			if tc.check != nil {
				tc.check(fx)
			}
		})
	}
}

// wantMode fails the test unless p (not followed) has mode m.
func (fx *fixture) wantMode(p string, m fs.FileMode) {
	fx.t.Helper()
	fi, err := fx.fake.Stat(context.Background(), testSession, p)
	if err != nil {
		fx.t.Fatal(err)
	}
	if fi.Mode != m {
		fx.t.Fatalf("%s has mode %v; want %v", p, fi.Mode, m)
	}
}

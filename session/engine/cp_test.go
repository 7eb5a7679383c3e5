package engine_test

import (
	"archive/tar"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// treeSums describes a local tree: every entry's type, mode and content
// hash (or link target), by relative path.
func treeSums(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, p)
		fi, _ := os.Lstat(p)
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			out[rel] = "link " + l
		case fi.IsDir():
			out[rel] = fmt.Sprintf("dir %o", fi.Mode().Perm())
		default:
			b, _ := os.ReadFile(p)
			out[rel] = fmt.Sprintf("file %o %x %d", fi.Mode().Perm(), sha256.Sum256(b), fi.ModTime().Unix())
		}
		return nil
	})
	return out
}

// berth cp round-trips a tree, modes, empty directories and inner
// symlinks included, and refuses symlinks that lead out of it.
func TestCopyTree(t *testing.T) {
	e := newEnv(t)
	e.StartDaemon()
	e.OK("create", "cp", "--disk", "128M")
	src := filepath.Join(t.TempDir(), "proj")
	os.MkdirAll(filepath.Join(src, "bin"), 0o755)
	os.MkdirAll(filepath.Join(src, "empty"), 0o700)
	os.MkdirAll(filepath.Join(src, "deep", "er"), 0o750)
	big := make([]byte, 5<<20)
	rand.Read(big)
	os.WriteFile(filepath.Join(src, "deep", "er", "big.bin"), big, 0o600)
	os.WriteFile(filepath.Join(src, "bin", "run"), []byte("#!/bin/sh\necho run\n"), 0o755)
	os.WriteFile(filepath.Join(src, "README"), []byte("hello\n"), 0o644)
	os.Symlink("../README", filepath.Join(src, "bin", "readme"))
	want := treeSums(t, src)

	out := e.OK("cp", src, "cp:proj")
	if !strings.Contains(out, "durably") {
		t.Errorf("cp in said %q", out)
	}
	if got := e.OK("exec", "cp", "--", "sh", "-c", "ls -l proj/bin/readme | sed 's/.*-> //'; stat -c %a proj/empty proj/bin/run; cat proj/bin/readme"); got != "../README\n700\n755\nhello\n" {
		t.Errorf("in the guest: %q", got)
	}
	back := filepath.Join(t.TempDir(), "back")
	e.OK("cp", "cp:proj", back)
	got := treeSums(t, back)
	for k, v := range want {
		if k == "." {
			continue
		}
		if got[k] != v {
			t.Errorf("%s: came back as %q, went in as %q", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d entries came back, %d went in", len(got), len(want))
	}
	// Into an existing directory, and one file to a new name.
	e.OK("cp", filepath.Join(src, "README"), "cp:proj/empty")
	e.OK("cp", "cp:proj/README", filepath.Join(back, "README.copy"))
	if b, _ := os.ReadFile(filepath.Join(back, "README.copy")); string(b) != "hello\n" {
		t.Errorf("one file out: %q", b)
	}
	if r := e.OK("cat", "cp", "proj/empty/README"); r != "hello\n" {
		t.Errorf("one file into a directory: %q", r)
	}

	// Escaping symlinks: refused both ways, nothing half-copied.
	evil := filepath.Join(t.TempDir(), "evil")
	os.MkdirAll(evil, 0o755)
	os.WriteFile(filepath.Join(evil, "a"), []byte("a"), 0o644)
	os.Symlink("/etc/passwd", filepath.Join(evil, "passwd"))
	e.Fails("points out of the tree", "cp", evil, "cp:evil")
	e.OK("exec", "cp", "--", "sh", "-c", "mkdir -p out && ln -s ../../etc out/etc")
	o := filepath.Join(t.TempDir(), "o")
	e.Fails("points out of the tree", "cp", "cp:out", o)
	if _, err := os.Lstat(o); err == nil {
		t.Errorf("a refused copy out left %s", o)
	}
	e.Fails("outside /workspace", "cp", src, "cp:../x")
	// A refused copy leaves nothing under the name it was going to (the
	// agent refusing mid-stream too), so the same copy, once the link is
	// gone, lands in evil, not evil/evil.
	var tb strings.Builder
	tw := tar.NewWriter(&tb)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "a", Mode: 0o644, Size: 1})
	tw.Write([]byte("a"))
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "passwd", Linkname: "/etc/passwd"})
	tw.Close()
	if r := e.RunIn(tb.String(), "cp", "-", "cp:evil2"); r.Code == 0 || !strings.Contains(r.Stderr, "points out of the tree") {
		t.Errorf("a tar with an escaping symlink: exit %d, %q", r.Code, r.Stderr)
	}
	if got := e.OK("exec", "cp", "--", "sh", "-c", "ls -a"); strings.Contains(got, "evil") {
		t.Errorf("refused copies left in /workspace:\n%s", got)
	}
	os.Remove(filepath.Join(evil, "passwd"))
	if out := e.OK("cp", evil, "cp:evil"); !strings.Contains(out, "to cp:evil, durably") {
		t.Errorf("the retry said %q", out)
	}
	if got := e.OK("cat", "cp", "evil/a"); got != "a" {
		t.Errorf("the retry: evil/a = %q", got)
	}

	// A full workspace: the copy fails saying so, and no file is left
	// half-written under its final name.
	e.OK("create", "small", "--disk", "24M")
	full := filepath.Join(t.TempDir(), "full")
	os.MkdirAll(full, 0o755)
	for i := 0; i < 3; i++ {
		b := make([]byte, 12<<20)
		rand.Read(b)
		os.WriteFile(filepath.Join(full, fmt.Sprintf("f%d", i)), b, 0o644)
	}
	e.Fails("is full", "cp", full, "small:full")
	out = e.OK("exec", "small", "--", "sh", "-c", "ls -a full; for f in full/f*; do [ -f \"$f\" ] && stat -c '%n %s' \"$f\"; done; true")
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[1] != fmt.Sprint(12<<20) {
			t.Errorf("a partial file under its final name: %s", l)
		}
	}
	e.OK("delete", "small", "--yes")
	e.OK("delete", "cp", "--yes")
}

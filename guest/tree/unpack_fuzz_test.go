package tree

import (
	"archive/tar"
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzUnpack feeds Unpack archives as a hostile peer would send them (the
// CLI unpacks what the guest packed; the agent what the host sent), into
// a new directory (built under a stage) and into an existing one, with
// and without Options.Sync. Properties: nothing is made outside the
// destination, no symlink made points out of it or is absolute, a failed
// copy into a new directory leaves nothing, and a successful one leaves
// no temporary file.
func FuzzUnpack(f *testing.F) {
	seed := func(hs ...*tar.Header) []byte {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		for _, h := range hs {
			tw.WriteHeader(h)
			if h.Typeflag == tar.TypeReg {
				tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
			}
		}
		tw.Close()
		return b.Bytes()
	}
	reg := func(name string, size int64) *tar.Header {
		return &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: size}
	}
	f.Add(seed(reg("a", 3), &tar.Header{Typeflag: tar.TypeDir, Name: "d/", Mode: 0o755}, reg("d/b", 10)), uint8(0))
	f.Add(seed(reg("x", 1), reg("x", 2)), uint8(1))
	f.Add(seed(&tar.Header{Typeflag: tar.TypeSymlink, Name: "l", Linkname: "../../etc"}), uint8(2))
	f.Add(seed(reg("../up", 1)), uint8(3))
	f.Add(seed(reg("/abs", 1)), uint8(0))
	f.Add(seed(&tar.Header{Typeflag: tar.TypeDir, Name: "a/", Mode: 0o755}, reg("a", 1)), uint8(1))
	f.Add(seed(&tar.Header{Typeflag: tar.TypeSymlink, Name: "s", Linkname: "d"}, &tar.Header{Typeflag: tar.TypeDir, Name: "d/", Mode: 0o755}, reg("s/f", 1)), uint8(2))
	f.Add(seed(reg("f", 100))[:600], uint8(3))
	if b, err := os.ReadFile("testdata/sparse.tar"); err == nil {
		f.Add(b, uint8(0))
	}
	f.Fuzz(func(t *testing.T, archive []byte, how uint8) {
		if len(archive) > 1<<20 {
			return
		}
		top := fuzzDir(t)
		parent := filepath.Join(top, "p")
		os.MkdirAll(parent, 0o755)
		existing := how&1 != 0
		if existing {
			os.MkdirAll(filepath.Join(parent, "dest"), 0o755)
		}
		root, err := os.OpenRoot(parent)
		if err != nil {
			t.Fatal(err)
		}
		defer root.Close()
		var o Options
		if how&2 != 0 {
			o.Sync = func() error { return nil }
		}
		_, err = Unpack(root, "dest", bytes.NewReader(archive), o)

		// Nothing beside the destination, nothing above the parent.
		if ents, _ := os.ReadDir(top); len(ents) != 1 {
			t.Fatalf("made outside the parent: %v", ents)
		}
		ents, _ := os.ReadDir(parent)
		for _, e := range ents {
			if e.Name() != "dest" {
				t.Fatalf("made beside the destination: %s (err %v)", e.Name(), err)
			}
		}
		if err != nil && !existing && len(ents) != 0 {
			t.Fatalf("a failed copy into a new directory left it (%v)", err)
		}
		dest := filepath.Join(parent, "dest")
		filepath.WalkDir(dest, func(p string, d fs.DirEntry, werr error) error {
			if werr != nil {
				return nil
			}
			rel, _ := filepath.Rel(dest, p)
			if d.Type()&fs.ModeSymlink != 0 {
				target, _ := os.Readlink(p)
				if !LinkInside(filepath.ToSlash(rel), target) {
					t.Fatalf("symlink %s → %s points out of the copy", rel, target)
				}
			}
			if err == nil && strings.Contains(d.Name(), ".berth-") {
				t.Fatalf("temporary left after a successful copy: %s", rel)
			}
			return nil
		})
	})
}

// fuzzDir is a temporary directory in memory where there is one: the
// path without Options.Sync fsyncs every file and directory, which on a
// disk other work keeps busy costs the fuzzer most of its time.
func fuzzDir(t *testing.T) string {
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		if d, err := os.MkdirTemp("/dev/shm", "berth-fuzz-unpack-"); err == nil {
			t.Cleanup(func() { os.RemoveAll(d) })
			return d
		}
	}
	return t.TempDir()
}

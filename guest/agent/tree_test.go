package agent

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/guest"
)

func tarOf(t *testing.T, entries ...*tar.Header) *bytes.Buffer {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, h := range entries {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write(bytes.Repeat([]byte{'x'}, int(h.Size)))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return &b
}

func TestTreeRoundTrip(t *testing.T) {
	dir := t.TempDir()
	_, c := connect(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mtime := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	in := tarOf(t,
		&tar.Header{Typeflag: tar.TypeDir, Name: "sub/", Mode: 0o750, ModTime: mtime},
		&tar.Header{Typeflag: tar.TypeDir, Name: "sub/empty/", Mode: 0o700, ModTime: mtime},
		&tar.Header{Typeflag: tar.TypeReg, Name: "sub/run.sh", Mode: 0o755, Size: 300000, ModTime: mtime},
		&tar.Header{Typeflag: tar.TypeReg, Name: "top.txt", Mode: 0o640, Size: 5, ModTime: mtime},
		&tar.Header{Typeflag: tar.TypeSymlink, Name: "sub/link", Linkname: "../top.txt", ModTime: mtime},
	)
	res, err := c.Unpack(ctx, "copy", in)
	if err != nil {
		t.Fatal(err)
	}
	if res.Files != 2 || res.Dirs != 2 || res.Symlinks != 1 || res.Bytes != 300005 {
		t.Errorf("unpack result = %+v", res)
	}
	fi, err := os.Stat(filepath.Join(dir, "copy/sub/run.sh"))
	if err != nil || fi.Mode().Perm() != 0o755 || fi.Size() != 300000 || !fi.ModTime().Equal(mtime) {
		t.Errorf("run.sh = %v, %v", fi, err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "copy/sub/empty")); err != nil || fi.Mode().Perm() != 0o700 || !fi.ModTime().Equal(mtime) {
		t.Errorf("empty dir = %v, %v", fi, err)
	}
	if l, err := os.Readlink(filepath.Join(dir, "copy/sub/link")); err != nil || l != "../top.txt" {
		t.Errorf("link = %q, %v", l, err)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "copy/*/.*berth-*")); len(m) > 0 {
		t.Errorf("temporary files left: %v", m)
	}

	r, err := c.Pack(ctx, "copy")
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(r)
	got := map[string]*tar.Header{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got[h.Name] = h
	}
	out, err := r.Result()
	r.Close()
	if err != nil || out.Files != 2 || out.Dirs != 2 || out.Symlinks != 1 {
		t.Errorf("pack result = %+v, %v", out, err)
	}
	for name, want := range map[string]int64{"sub/": 0o750, "sub/empty/": 0o700, "sub/run.sh": 0o755, "top.txt": 0o640} {
		if h := got[name]; h == nil || h.Mode != want || !h.ModTime.Equal(mtime) {
			t.Errorf("packed %s = %+v, want mode %o", name, h, want)
		}
	}
	if h := got["sub/link"]; h == nil || h.Linkname != "../top.txt" {
		t.Errorf("packed link = %+v", h)
	}
}

func TestTreeRefusesEscapes(t *testing.T) {
	dir := t.TempDir()
	_, c := connect(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name string
		h    *tar.Header
	}{
		{"dotdot", &tar.Header{Typeflag: tar.TypeReg, Name: "../evil", Size: 1}},
		{"absolute", &tar.Header{Typeflag: tar.TypeReg, Name: "/etc/evil", Size: 1}},
		{"link out", &tar.Header{Typeflag: tar.TypeSymlink, Name: "l", Linkname: "../../etc/passwd"}},
		{"absolute link", &tar.Header{Typeflag: tar.TypeSymlink, Name: "l", Linkname: "/etc/passwd"}},
		{"device", &tar.Header{Typeflag: tar.TypeChar, Name: "null"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Unpack(ctx, "in", tarOf(t, tc.h))
			if err == nil {
				t.Fatal("unpack succeeded")
			}
			if tc.name != "device" && !errors.Is(err, guest.ErrEscape) {
				t.Errorf("err = %v, want ErrEscape", err)
			}
			// Nothing under the name, so a retry lands where this would have.
			waitGone(t, dir, "in")
		})
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(dir), "evil")); err == nil {
		t.Error("a file was written outside the workspace")
	}
	// A symlink out of the tree stops a pack too, and one out of the
	// workspace is never followed.
	os.MkdirAll(filepath.Join(dir, "t"), 0o755)
	os.Symlink("/etc", filepath.Join(dir, "t", "etc"))
	r, err := c.Pack(ctx, "t")
	if err == nil {
		_, err = io.Copy(io.Discard, r)
		r.Close()
	}
	if !errors.Is(err, guest.ErrEscape) {
		t.Errorf("pack of a tree with an escaping symlink: %v", err)
	}
	if _, err := c.Pack(ctx, "../"); !errors.Is(err, guest.ErrEscape) {
		t.Errorf("pack ..: %v", err)
	}
}

// An unpack cut off mid-file leaves no file under its final name.
func TestTreeInterruptedUnpack(t *testing.T) {
	dir := t.TempDir()
	_, c := connect(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	full := tarOf(t,
		&tar.Header{Typeflag: tar.TypeReg, Name: "done.txt", Mode: 0o644, Size: 10},
		&tar.Header{Typeflag: tar.TypeReg, Name: "big.bin", Mode: 0o644, Size: 2 << 20},
	)
	cut := io.MultiReader(bytes.NewReader(full.Bytes()[:1<<20]), errReader{})
	if _, err := c.Unpack(ctx, "in", cut); err == nil {
		t.Fatal("interrupted unpack succeeded")
	}
	if _, err := os.Stat(filepath.Join(dir, "in", "big.bin")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("big.bin exists after an interrupted copy: %v", err)
	}
	// "in" did not exist: the copy leaves nothing, temporaries included.
	waitGone(t, dir, "in")
}

// waitGone waits for a failed copy into dir/name (which did not exist) to
// leave nothing under the name or beside it: the agent cleans up as its
// side of the copy ends, which may be just after the client's.
func waitGone(t *testing.T, dir, name string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		ents, _ := os.ReadDir(dir)
		var names []string
		for _, e := range ents {
			if e.Name() == name || strings.HasPrefix(e.Name(), "."+name+".berth-") {
				names = append(names, e.Name())
			}
		}
		if len(names) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a failed copy into %s, the workspace holds %s", name, strings.Join(names, ", "))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("source failed") }

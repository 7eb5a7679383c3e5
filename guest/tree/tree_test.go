package tree

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLinkInside(t *testing.T) {
	for _, c := range []struct {
		entry, target string
		want          bool
	}{
		{"a/link", "b", true},
		{"a/link", "../b", true},
		{"a/b/link", "../../c", true},
		{"a/link", "../../c", false},
		{"link", "..", false},
		{"link", ".", true},
		{"link", "/etc/passwd", false},
		{"link", "", false},
		{"a/link", "x/../../../y", false},
		{"link", "a\x00b", false},
	} {
		if got := LinkInside(c.entry, c.target); got != c.want {
			t.Errorf("LinkInside(%q, %q) = %v, want %v", c.entry, c.target, got, c.want)
		}
	}
}

func TestEntryPath(t *testing.T) {
	for _, c := range []struct {
		name, want string
		escape     bool
	}{
		{"a/b", "a/b", false},
		{"./a//b/", "a/b", false},
		{".", ".", false},
		{"a/../b", "b", false},
		{"../a", "", true},
		{"a/../../b", "", true},
		{"/etc/passwd", "", true},
		{"a\x00", "", true},
	} {
		got, err := entryPath(c.name)
		if c.escape != errors.Is(err, ErrEscape) || (!c.escape && got != c.want) {
			t.Errorf("entryPath(%q) = %q, %v; want %q escape=%v", c.name, got, err, c.want, c.escape)
		}
	}
}

// tarOf builds a tar of entries: a name ending in / is a directory, one
// with "->" a symlink, anything else a file holding its own name.
func tarOf(t *testing.T, names ...string) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, n := range names {
		h := &tar.Header{Name: n, Mode: 0o644, Typeflag: tar.TypeReg, Size: int64(len(n))}
		switch {
		case strings.HasSuffix(n, "/"):
			h.Typeflag, h.Mode, h.Size = tar.TypeDir, 0o755, 0
		case strings.Contains(n, " -> "):
			name, target, _ := strings.Cut(n, " -> ")
			h.Name, h.Typeflag, h.Linkname, h.Size = name, tar.TypeSymlink, target, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			io.WriteString(tw, n)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// brokenReader yields data, then fails: a copy cut off mid-stream.
type brokenReader struct{ r io.Reader }

func (b brokenReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err == io.EOF {
		return n, errors.New("connection lost")
	}
	return n, err
}

// listTree lists every path under dir, for what a copy left behind.
func listTree(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		if rel, _ := filepath.Rel(dir, p); rel != "." {
			out = append(out, rel)
		}
		return nil
	})
	return out
}

// A refused or interrupted copy into a directory that does not exist
// leaves nothing under its name (nor a temporary beside it), so the retry
// lands where the first try would have; into an existing directory, what
// came before the refusal stays, as before.
func TestUnpackAllOrNothing(t *testing.T) {
	good := tarOf(t, "a.txt", "sub/", "sub/b.txt", "sub/up -> ../a.txt")
	refused := tarOf(t, "a.txt", "sub/", "sub/b.txt", "sub/passwd -> /etc/passwd", "z.txt")
	cut := good[:len(good)-1500] // a stream that ends before the tar does
	for _, sync := range []bool{false, true} {
		for _, c := range []struct {
			name     string
			existing []string // made before the copy
			dest     string
			in       io.Reader
			left     []string // what is there after the failed copy
		}{
			{"refused, new dir", nil, "t2", bytes.NewReader(refused), nil},
			{"refused, new parents", nil, "x/y/t2", bytes.NewReader(refused), nil},
			{"refused, parent exists", []string{"x"}, "x/t2", bytes.NewReader(refused), []string{"x"}},
			{"cut off, new dir", nil, "t2", brokenReader{bytes.NewReader(cut)}, nil},
			{"refused, existing dir", []string{"t2"}, "t2", bytes.NewReader(refused), []string{"t2", "t2/a.txt", "t2/sub", "t2/sub/b.txt"}},
		} {
			t.Run(fmt.Sprintf("%s, sync %v", c.name, sync), func(t *testing.T) {
				dir := t.TempDir()
				for _, d := range c.existing {
					os.MkdirAll(filepath.Join(dir, d), 0o755)
				}
				root, err := os.OpenRoot(dir)
				if err != nil {
					t.Fatal(err)
				}
				defer root.Close()
				var o Options
				if sync {
					o.Sync = func() error { return nil }
				}
				if _, err := Unpack(root, c.dest, c.in, o); err == nil {
					t.Fatal("the copy succeeded")
				}
				left := c.left
				if sync && c.existing != nil && c.dest == c.existing[0] {
					// Syncing, files wait for their batch's sync to be
					// renamed into place: none of them was.
					left = []string{"t2", "t2/sub"}
				}
				if got := listTree(t, dir); strings.Join(got, " ") != strings.Join(left, " ") {
					t.Errorf("after the failed copy: %q, want %q", got, left)
				}
				// The retry means what the first try meant.
				if _, err := Unpack(root, c.dest, bytes.NewReader(good), o); err != nil {
					t.Fatal(err)
				}
				for f, want := range map[string]string{"a.txt": "a.txt", "sub/b.txt": "sub/b.txt", "sub/up": "a.txt"} {
					if b, err := os.ReadFile(filepath.Join(dir, c.dest, f)); err != nil || string(b) != want {
						t.Errorf("after the retry, %s/%s = %q, %v; want %q", c.dest, f, b, err, want)
					}
				}
				if m, _ := filepath.Glob(filepath.Join(dir, "*", ".*berth-*")); len(m) > 0 {
					t.Errorf("temporaries left: %v", m)
				}
			})
		}
	}
}

// A sparse entry (testdata/sparse.tar: 10 KB holding a 1 GiB file that is
// one hole, made by Python's tarfile) is refused before anything is
// written: its zeros are not in the stream, so a hostile peer's few bytes
// would fill the disk.
func TestUnpackRefusesSparse(t *testing.T) {
	b, err := os.ReadFile("testdata/sparse.tar")
	if err != nil {
		t.Fatal(err)
	}
	for _, sync := range []bool{false, true} {
		dir := t.TempDir()
		root, err := os.OpenRoot(dir)
		if err != nil {
			t.Fatal(err)
		}
		var o Options
		if sync {
			o.Sync = func() error { return nil }
		}
		_, err = Unpack(root, "t", bytes.NewReader(b), o)
		root.Close()
		if err == nil || !strings.Contains(err.Error(), "sparse") {
			t.Errorf("sync %v: unpacking a sparse entry: %v, want a refusal", sync, err)
		}
		if got := listTree(t, dir); len(got) != 0 {
			t.Errorf("sync %v: left %q", sync, got)
		}
	}
}

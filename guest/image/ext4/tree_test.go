package ext4

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// mkfs makes an ext4 image of dir as the workspace's mkfs does (with
// -d: nothing mounted), of size bytes.
func mkfsDir(t testing.TB, dir string, size int64, extra ...string) string {
	t.Helper()
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("mkfs.ext4 not found (Debian's e2fsprogs; make deps installs it)")
	}
	img := filepath.Join(t.TempDir(), "ws.img")
	if err := os.WriteFile(img, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, size); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"-q", "-F", "-O", "metadata_csum_seed", "-d", dir}, extra...)
	if out, err := exec.Command("mkfs.ext4", append(args, img)...).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	return img
}

func openImage(t testing.TB, img string) *FS {
	t.Helper()
	f, err := os.Open(img)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	fi, _ := f.Stat()
	x, err := Open(f, fi.Size())
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// TestLookupWalk makes a tree with every kind of entry the reader meets (a
// large directory in an htree, a file of many extents with holes, short
// and long symlinks, modes), images it, and reads it all back.
func TestLookupWalk(t *testing.T) {
	src := t.TempDir()
	w := func(p string, b []byte, mode os.FileMode) {
		full := filepath.Join(src, p)
		os.MkdirAll(filepath.Dir(full), 0o755)
		if err := os.WriteFile(full, b, mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(full, mode)
	}
	w("hello.txt", []byte("hello\n"), 0o644)
	w("bin/run.sh", []byte("#!/bin/sh\n"), 0o755)
	w("deep/a/b/c/d/e/f.txt", []byte("deep\n"), 0o600)
	big := make([]byte, 3<<20)
	rand.Read(big)
	w("big.bin", big, 0o644)
	for i := range 2000 {
		w(fmt.Sprintf("many/file-%04d", i), []byte(fmt.Sprint(i)), 0o644)
	}
	// A sparse file of 40 data ranges: more extents than the inode holds,
	// so an extent tree of depth 1.
	sp, err := os.Create(filepath.Join(src, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		sp.WriteAt([]byte(fmt.Sprintf("range %d", i)), int64(i)*1<<20)
	}
	sp.Truncate(41 << 20)
	sp.Close()
	os.Symlink("hello.txt", filepath.Join(src, "short"))
	long := strings.Repeat("x/", 60) + "target"
	os.Symlink(long, filepath.Join(src, "long"))
	img := mkfsDir(t, src, 128<<20)
	x := openImage(t, img)

	// Every path and its kind, as the source tree has them.
	want := map[string]string{}
	filepath.Walk(src, func(p string, fi os.FileInfo, err error) error {
		rel, _ := filepath.Rel(src, p)
		if rel != "." {
			want[rel] = describe(fi.Mode(), fi.Size())
		}
		return nil
	})
	root, err := x.Lookup("")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	err = x.Walk("", root, func(rel string, in *Inode) error {
		if rel == "lost+found" || strings.HasPrefix(rel, "lost+found/") {
			return nil
		}
		got[rel] = describe(in.FileMode(), in.Size)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for p, w := range want {
		if strings.HasSuffix(w, "dir") {
			w = strings.Split(w, " ")[0] + " dir"
		}
		g := got[p]
		if strings.HasSuffix(g, "dir") {
			g = strings.Split(g, " ")[0] + " dir"
		}
		if g != w {
			t.Errorf("%s: got %q, want %q", p, g, w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d entries, want %d", len(got), len(want))
	}
	read := func(p string) []byte {
		in, err := x.Lookup(p)
		if err != nil {
			t.Fatal(err)
		}
		b, err := x.ReadFile(in, 64<<20)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		return b
	}
	if b := read("big.bin"); !bytes.Equal(b, big) {
		t.Error("big.bin differs")
	}
	spWant, _ := os.ReadFile(filepath.Join(src, "sparse"))
	if b := read("sparse"); !bytes.Equal(b, spWant) {
		t.Error("sparse differs")
	}
	if b := read("deep/a/b/c/d/e/f.txt"); string(b) != "deep\n" {
		t.Errorf("deep file %q", b)
	}
	if b := read("many/file-1999"); string(b) != "1999" {
		t.Errorf("many/file-1999 %q", b)
	}
	for p, target := range map[string]string{"short": "hello.txt", "long": long} {
		in, err := x.Lookup(p)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := x.Readlink(in); err != nil || got != target {
			t.Errorf("readlink %s = %q, %v", p, got, err)
		}
	}
	// Identity and times as the kernel's stat has them (mkfs -d keeps the
	// source's mtime).
	in, _ := x.Lookup("hello.txt")
	fi, _ := os.Stat(filepath.Join(src, "hello.txt"))
	if in.Mtime.Unix() != fi.ModTime().Unix() {
		t.Errorf("mtime %v, want %v", in.Mtime, fi.ModTime())
	}
	if _, err := x.Lookup("nope/x"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing: %v", err)
	}
	if _, err := x.Lookup("short/x"); !errors.Is(err, ErrSymlinkOnPath) {
		t.Errorf("through a symlink: %v", err)
	}
}

func describe(m fs.FileMode, size int64) string {
	switch {
	case m.IsDir():
		return fmt.Sprintf("%v dir", m.Perm())
	case m.Type() == fs.ModeSymlink:
		return "symlink"
	}
	return fmt.Sprintf("%v %d", m, size)
}

// TestLiveIdentity checks the reader's inode numbers and generations
// against the kernel's, on an image the kernel wrote: the identity a diff
// pairs renames by. It needs root to mount the image.
func TestLiveIdentity(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount an image")
	}
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "f"), []byte("x"), 0o644)
	img := mkfsDir(t, src, 16<<20)
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		t.Skipf("cannot loop-mount here: %v: %s", err, out)
	}
	os.WriteFile(filepath.Join(mnt, "g"), []byte("y"), 0o644)
	var st syscall.Stat_t
	syscall.Lstat(filepath.Join(mnt, "g"), &st)
	gen := generation(t, filepath.Join(mnt, "g"))
	// A copy taken while mounted and not frozen is refused: its journal
	// may hold what the metadata in place lacks.
	live := filepath.Join(t.TempDir(), "live.img")
	exec.Command("sync").Run()
	if out, err := exec.Command("cp", "--sparse=always", img, live).CombinedOutput(); err != nil {
		exec.Command("umount", mnt).Run()
		t.Fatalf("cp: %v: %s", err, out)
	}
	if lf, err := os.Open(live); err == nil {
		fi, _ := lf.Stat()
		if _, err := Open(lf, fi.Size()); err == nil || !strings.Contains(err.Error(), "needs_recovery") {
			t.Errorf("a mounted filesystem's copy: %v, want needs_recovery refused", err)
		}
		lf.Close()
	}
	frozen := filepath.Join(t.TempDir(), "frozen.img")
	if out, err := exec.Command("fsfreeze", "-f", mnt).CombinedOutput(); err != nil {
		exec.Command("umount", mnt).Run()
		t.Fatalf("fsfreeze: %v: %s", err, out)
	}
	out, err := exec.Command("cp", "--sparse=always", img, frozen).CombinedOutput()
	exec.Command("fsfreeze", "-u", mnt).Run()
	if err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
		t.Fatalf("umount: %v: %s", err, out)
	}
	// A copy taken while mounted and frozen, as a checkpoint of a running
	// session is, opens: the freeze wrote the journal back.
	fz := openImage(t, frozen)
	if in, err := fz.Lookup("g"); err != nil {
		t.Errorf("frozen copy: %v", err)
	} else if b, err := fz.ReadFile(in, 10); err != nil || string(b) != "y" {
		t.Errorf("frozen copy: g holds %q, %v", b, err)
	}
	x := openImage(t, img)
	in, err := x.Lookup("g")
	if err != nil {
		t.Fatal(err)
	}
	if uint64(in.Ino) != st.Ino || in.Gen != gen {
		t.Errorf("inode %d gen %d, kernel says %d gen %d", in.Ino, in.Gen, st.Ino, gen)
	}
	if in.Ctime.UnixNano() != st.Ctim.Nano() {
		t.Errorf("ctime %d, kernel says %d", in.Ctime.UnixNano(), st.Ctim.Nano())
	}
}

func generation(t *testing.T, p string) uint32 {
	out, err := exec.Command("lsattr", "-v", p).Output()
	if err != nil {
		t.Skipf("lsattr: %v", err)
	}
	var gen uint32
	fmt.Sscan(strings.Fields(string(out))[0], &gen)
	return gen
}

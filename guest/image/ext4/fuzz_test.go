package ext4

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// FuzzRead reads every inode, directory, link, attribute and file of a
// corrupted image: whatever the bytes, an error or a tree, never a
// panic, a hang or an allocation past the image's size. The seed is a
// small image of every kind of entry, made with mkfs.ext4 -d.
func FuzzRead(f *testing.F) {
	if _, err := exec.LookPath("mkfs.ext4"); err == nil {
		src := f.TempDir()
		os.MkdirAll(filepath.Join(src, "d/e"), 0o755)
		os.WriteFile(filepath.Join(src, "d/file"), bytes.Repeat([]byte("data"), 3000), 0o644)
		os.Symlink("d/file", filepath.Join(src, "fast"))
		os.Symlink(string(bytes.Repeat([]byte("x/"), 50)), filepath.Join(src, "slow"))
		img := filepath.Join(f.TempDir(), "fs.img")
		fh, _ := os.Create(img)
		fh.Truncate(1 << 20)
		fh.Close()
		if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-b", "1024", "-N", "32", "-d", src, "-O", "^has_journal,^resize_inode", img).CombinedOutput(); err != nil {
			f.Fatalf("mkfs.ext4: %v: %s", err, out)
		}
		b, _ := os.ReadFile(img)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fs, err := Open(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			return
		}
		seen := map[uint32]bool{}
		var walk func(ino uint32, depth int)
		walk = func(ino uint32, depth int) {
			// Bounded here: a file's holes read as zeros for as long as
			// its size says, which the reader bounds by the image's size.
			if seen[ino] || depth > 16 || len(seen) > 256 {
				return
			}
			seen[ino] = true
			in, err := fs.Inode(ino)
			if err != nil {
				return
			}
			fs.Xattrs(in)
			switch in.Type() {
			case ModeDir:
				ents, err := fs.ReadDir(in, 1024)
				if err != nil {
					return
				}
				for _, e := range ents {
					walk(e.Ino, depth+1)
				}
			case ModeSym:
				fs.Readlink(in)
			case ModeFile:
				if r, err := fs.Open(in); err == nil {
					io.Copy(io.Discard, io.LimitReader(r, 1<<20))
				}
			}
		}
		walk(RootIno, 0)
		// The path API a diff uses: a lookup through the tree, a bounded
		// walk, whole-file reads under a limit.
		for _, p := range []string{"d/file", "d/e", "fast/x", "slow", "d/../d"} {
			if in, err := fs.Lookup(p); err == nil && in.Type() == ModeFile {
				fs.ReadFile(in, 1<<20)
			}
		}
		if root, err := fs.Inode(RootIno); err == nil {
			n := 0
			fs.Walk("", root, func(rel string, in *Inode) error {
				if n++; n > 256 {
					return io.EOF
				}
				in.FileMode()
				return nil
			})
		}
	})
}

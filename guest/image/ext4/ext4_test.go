package ext4

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// hostTree lists a directory on the host as lines a tree read from an
// image must match: type, mode, owner, size, content hash, link target,
// device numbers, extended attributes, hard link groups.
func hostTree(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	first := map[uint64]string{}
	filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." {
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		line := fmt.Sprintf("%s %o %d:%d", rel, st.Mode, st.Uid, st.Gid)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			if prev, ok := first[st.Ino]; ok {
				out = append(out, line+" link="+prev)
				return nil
			}
			if st.Nlink > 1 {
				first[st.Ino] = rel
			}
			b, _ := os.ReadFile(p)
			line += fmt.Sprintf(" size=%d sha=%x", len(b), sha256.Sum256(b))
		case unix.S_IFLNK:
			l, _ := os.Readlink(p)
			line += " -> " + l
		case unix.S_IFCHR, unix.S_IFBLK:
			line += fmt.Sprintf(" dev=%d,%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
		}
		buf := make([]byte, 64<<10)
		n, _ := unix.Llistxattr(p, buf)
		names := strings.Split(strings.TrimRight(string(buf[:n]), "\x00"), "\x00")
		sort.Strings(names)
		for _, name := range names {
			if name == "" {
				continue
			}
			v := make([]byte, 64<<10)
			k, err := unix.Lgetxattr(p, name, v)
			if err != nil {
				t.Fatal(err)
			}
			line += fmt.Sprintf(" %s=%x", name, v[:k])
		}
		out = append(out, line)
		return nil
	})
	return out
}

// imageTree lists the tree under dir of an image as hostTree does.
func imageTree(t *testing.T, fs *FS, dir *Inode) []string {
	t.Helper()
	var out []string
	first := map[uint32]string{}
	var walk func(in *Inode, rel string)
	walk = func(in *Inode, rel string) {
		ents, err := fs.ReadDir(in, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		sort.Slice(ents, func(i, j int) bool { return ents[i].Name < ents[j].Name })
		for _, e := range ents {
			if rel == "" && e.Name == "lost+found" {
				continue
			}
			p := filepath.Join(rel, e.Name)
			c, err := fs.Inode(e.Ino)
			if err != nil {
				t.Fatal(err)
			}
			line := fmt.Sprintf("%s %o %d:%d", p, c.Mode, c.UID, c.GID)
			switch c.Type() {
			case ModeFile:
				if prev, ok := first[c.Ino]; ok {
					out = append(out, line+" link="+prev)
					continue
				}
				if c.Links > 1 {
					first[c.Ino] = p
				}
				r, err := fs.Open(c)
				if err != nil {
					t.Fatal(err)
				}
				h := sha256.New()
				n, err := io.Copy(h, r)
				if err != nil {
					t.Fatal(err)
				}
				line += fmt.Sprintf(" size=%d sha=%x", n, h.Sum(nil))
			case ModeSym:
				l, err := fs.Readlink(c)
				if err != nil {
					t.Fatal(err)
				}
				line += " -> " + l
			case ModeChar, ModeBlock:
				line += fmt.Sprintf(" dev=%d,%d", c.Major, c.Minor)
			}
			xs, err := fs.Xattrs(c)
			if err != nil {
				t.Fatal(err)
			}
			sort.Slice(xs, func(i, j int) bool { return xs[i].Name < xs[j].Name })
			for _, x := range xs {
				line += fmt.Sprintf(" %s=%x", x.Name, x.Value)
			}
			out = append(out, line)
			if c.Type() == ModeDir {
				walk(c, p)
			}
		}
	}
	walk(dir, "")
	return out
}

// aclXattr is a POSIX ACL in the xattr form: user::rw-, user:1000:r--,
// group::r--, mask::r--, other::---.
func aclXattr() []byte {
	le := binary.LittleEndian
	b := le.AppendUint32(nil, 2)
	for _, e := range [][3]uint32{{0x01, 6, 0xFFFFFFFF}, {0x02, 4, 1000}, {0x04, 4, 0xFFFFFFFF}, {0x10, 4, 0xFFFFFFFF}, {0x20, 0, 0xFFFFFFFF}} {
		b = le.AppendUint16(b, uint16(e[0]))
		b = le.AppendUint16(b, uint16(e[1]))
		b = le.AppendUint32(b, e[2])
	}
	return b
}

// makeTree writes every kind of thing a layer holds.
func makeTree(t *testing.T, root string) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "etc/deep/er/still"), 0o755))
	must(os.WriteFile(filepath.Join(root, "etc/hosts"), []byte("127.0.0.1 localhost\n"), 0o644))
	must(os.WriteFile(filepath.Join(root, "empty"), nil, 0o600))
	big := make([]byte, 3<<20+123)
	for i := range big {
		big[i] = byte(i * 7 / 13)
	}
	must(os.WriteFile(filepath.Join(root, "big"), big, 0o755))
	must(os.Chmod(filepath.Join(root, "big"), 0o4755))
	f, err := os.Create(filepath.Join(root, "sparse"))
	must(err)
	f.WriteAt([]byte("start"), 0)
	f.WriteAt([]byte("end"), 40<<20)
	f.Close()
	// Islands of data between holes: more extents than the inode holds,
	// so the tree has an index level.
	f, err = os.Create(filepath.Join(root, "holey"))
	must(err)
	for i := range 20 {
		f.WriteAt(bytes.Repeat([]byte{byte('a' + i)}, 5000), int64(i)*64<<10)
	}
	f.Close()
	must(os.Symlink("hosts", filepath.Join(root, "etc/fast")))
	must(os.Symlink(strings.Repeat("long/", 40)+"target", filepath.Join(root, "etc/slow")))
	must(os.Link(filepath.Join(root, "etc/hosts"), filepath.Join(root, "hardlink")))
	must(unix.Mknod(filepath.Join(root, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	must(unix.Mknod(filepath.Join(root, "whiteout"), unix.S_IFCHR, 0))
	must(unix.Mknod(filepath.Join(root, "bigdev"), unix.S_IFBLK|0o660, int(unix.Mkdev(259, 70000))))
	must(unix.Mkfifo(filepath.Join(root, "fifo"), 0o640))
	must(os.Chown(filepath.Join(root, "etc/deep"), 100000, 70000))
	must(os.Lchown(filepath.Join(root, "etc/fast"), 5, 6))
	must(unix.Lsetxattr(filepath.Join(root, "etc/hosts"), "user.note", []byte("kept"), 0))
	must(unix.Lsetxattr(filepath.Join(root, "etc/deep"), "trusted.overlay.opaque", []byte("y"), 0))
	must(unix.Lsetxattr(filepath.Join(root, "big"), "security.capability", []byte{1, 0, 0, 2, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, 0))
	must(unix.Lsetxattr(filepath.Join(root, "etc/deep/er"), "user.big", bytes.Repeat([]byte("x"), 900), 0))
	must(unix.Lsetxattr(filepath.Join(root, "empty"), "system.posix_acl_access", aclXattr(), 0))
	// Enough names that the directory spans blocks (an htree).
	many := filepath.Join(root, "many")
	must(os.Mkdir(many, 0o755))
	for i := 0; i < 600; i++ {
		must(os.WriteFile(filepath.Join(many, fmt.Sprintf("file-with-a-longish-name-%04d", i)), []byte{byte(i)}, 0o644))
	}
}

// TestReadTree makes an image of a tree with mkfs.ext4 -d, with 1 KiB
// blocks and 4 KiB ones, and reads it back whole.
func TestReadTree(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the tree has devices, owners and trusted attributes")
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("no mkfs.ext4 (Debian's e2fsprogs)")
	}
	src := t.TempDir()
	makeTree(t, src)
	want := hostTree(t, src)
	for _, bs := range []string{"1024", "4096"} {
		t.Run(bs, func(t *testing.T) {
			img := filepath.Join(t.TempDir(), "fs.img")
			f, _ := os.Create(img)
			f.Truncate(128 << 20)
			f.Close()
			if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-b", bs, "-d", src, "-O", "^has_journal", img).CombinedOutput(); err != nil {
				t.Fatalf("mkfs.ext4: %v: %s", err, out)
			}
			f, err := os.Open(img)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			fi, _ := f.Stat()
			fs, err := Open(f, fi.Size())
			if err != nil {
				t.Fatal(err)
			}
			root, err := fs.Inode(RootIno)
			if err != nil {
				t.Fatal(err)
			}
			got := imageTree(t, fs, root)
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Errorf("tree read from the image differs:\ngot:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		})
	}
}

// TestRefused: what is not an ext4 image, or one using a feature this
// package does not read, is refused by name.
func TestRefused(t *testing.T) {
	if _, err := Open(bytes.NewReader(make([]byte, 8192)), 8192); err == nil || !strings.Contains(err.Error(), "not an ext2/3/4") {
		t.Errorf("zeros: %v", err)
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("no mkfs.ext4 (Debian's e2fsprogs)")
	}
	img := filepath.Join(t.TempDir(), "fs.img")
	f, _ := os.Create(img)
	f.Truncate(32 << 20)
	f.Close()
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-O", "inline_data", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	b, _ := os.ReadFile(img)
	if _, err := Open(bytes.NewReader(b), int64(len(b))); err == nil || !strings.Contains(err.Error(), "inline_data") {
		t.Errorf("inline_data: %v", err)
	}
	// Truncated: the superblock says more blocks than there are.
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	b, _ = os.ReadFile(img)
	if _, err := Open(bytes.NewReader(b[:1<<20]), 1<<20); err == nil || !strings.Contains(err.Error(), "truncated") {
		t.Errorf("truncated: %v", err)
	}
}

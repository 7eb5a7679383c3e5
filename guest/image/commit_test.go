package image

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// systemDisk makes an ext4 image of tree as a session's system disk is
// made (a journal, metadata_csum_seed), nothing mounted.
func systemDisk(t *testing.T, tree string) string {
	t.Helper()
	for _, tool := range []string{"mkfs.ext4", "debugfs", "e2fsck", "tune2fs"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not found (Debian's e2fsprogs)", tool)
		}
	}
	file := filepath.Join(t.TempDir(), "system.img")
	out, err := exec.Command("mkfs.ext4", "-q", "-F", "-d", tree, "-L", "berth-system", "-U", NewUUID(),
		"-O", "^resize_inode,metadata_csum_seed", "-E", "lazy_itable_init=1,lazy_journal_init=1", "-m", "0", file, "256M").CombinedOutput()
	if err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	return file
}

func writeFile(t *testing.T, p string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// marked is n bytes of noise holding marker, so a test can tell whether
// the file's data is still anywhere in an image.
func marked(marker string, n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	copy(b[n/2:], marker)
	return b
}

// paths lists an image's tree as "/path" for each entry, "/path/" for a
// directory.
func paths(t *testing.T, file string) []string {
	t.Helper()
	tr, err := walkExt4(context.Background(), file, defaultWalkLimits)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for i := 1; i < len(tr.nodes); i++ {
		p := tr.path(i)
		if tr.nodes[i].isDir() {
			p += "/"
		}
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// A system disk sealed as a layer: what a new machine must not inherit is
// gone from its tree and from its file's bytes, the rest is as it was,
// with a layer's label, the UUID asked for and no journal.
func TestSealCommit(t *testing.T) {
	tree := t.TempDir()
	u := func(p string) string { return filepath.Join(tree, "upper", p) }
	writeFile(t, u("etc/machine-id"), []byte("0123456789abcdef0123456789abcdef\n"))
	writeFile(t, u("etc/hostname"), []byte("s1\n"))
	writeFile(t, u("etc/ssh/ssh_host_ed25519_key"), marked("SECRET-HOST-KEY", 8192))
	writeFile(t, u("etc/ssh/ssh_host_ed25519_key.pub"), []byte("ssh-ed25519 AAAA\n"))
	writeFile(t, u("etc/ssh/sshd_config"), []byte("PermitRootLogin no\n"))
	writeFile(t, u("etc/motd"), []byte("kept\n"))
	writeFile(t, u("var/cache/apt/pkgcache.bin"), marked("APT-PKGCACHE", 64<<10))
	writeFile(t, u("var/cache/apt/archives/tool_1.0_amd64.deb"), marked("DOWNLOADED-DEB", 256<<10))
	os.MkdirAll(u("var/cache/apt/archives/partial"), 0o755)
	writeFile(t, u("var/lib/apt/lists/deb.debian.org_dists_bookworm_InRelease"), []byte("lists stay\n"))
	writeFile(t, u("tmp/a/b/scratch"), marked("TMP-SCRATCH", 32<<10))
	writeFile(t, u("var/tmp/shared"), []byte("linked from /root too\n"))
	if err := os.Link(u("var/tmp/shared"), u("root/shared")); err != nil {
		os.MkdirAll(u("root"), 0o700)
		if err := os.Link(u("var/tmp/shared"), u("root/shared")); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, u("usr/lib/big/data.bin"), marked("KEPT-DATA", 2<<20))
	writeFile(t, u("usr/lib/big/more/x"), make([]byte, 4096))
	writeFile(t, u("root/we\nird \"name\""), []byte("odd names are data\n"))
	writeFile(t, filepath.Join(tree, "work", "index", "stale"), marked("WORK-FILE", 4096))
	os.MkdirAll(filepath.Join(tree, "work", "work"), 0o755)
	whiteout := os.Geteuid() == 0
	if whiteout {
		if err := syscall.Mknod(u("etc/gone"), syscall.S_IFCHR|0o644, 0); err != nil {
			t.Fatal(err)
		}
	}
	file := systemDisk(t, tree)

	uuid := NewUUID()
	rep, err := SealCommit(t.Context(), file, uuid)
	if err != nil {
		t.Fatal(err)
	}
	got := paths(t, file)
	want := []string{
		"/lost+found/", "/upper/",
		"/upper/etc/", "/upper/etc/motd", "/upper/etc/ssh/", "/upper/etc/ssh/sshd_config",
		"/upper/root/", "/upper/root/shared", "/upper/root/we\nird \"name\"",
		"/upper/tmp/", "/upper/usr/", "/upper/usr/lib/", "/upper/usr/lib/big/", "/upper/usr/lib/big/data.bin",
		"/upper/usr/lib/big/more/", "/upper/usr/lib/big/more/x",
		"/upper/var/", "/upper/var/cache/", "/upper/var/cache/apt/", "/upper/var/cache/apt/archives/", "/upper/var/cache/apt/archives/partial/",
		"/upper/var/lib/", "/upper/var/lib/apt/", "/upper/var/lib/apt/lists/", "/upper/var/lib/apt/lists/deb.debian.org_dists_bookworm_InRelease",
		"/upper/var/tmp/", "/upper/var/tmp/shared",
	}
	if whiteout {
		want = append(want, "/upper/etc/gone")
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("the sealed layer holds\n%q\nwant\n%q", got, want)
	}
	img, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, gone := range []string{"SECRET-HOST-KEY", "APT-PKGCACHE", "DOWNLOADED-DEB", "TMP-SCRATCH", "WORK-FILE"} {
		if bytes.Contains(img, []byte(gone)) {
			t.Errorf("the layer's file still holds the bytes of %s", gone)
		}
	}
	if !bytes.Contains(img, []byte("KEPT-DATA")) {
		t.Error("the layer's file lost a file it keeps")
	}
	out, err := exec.Command("dumpe2fs", "-h", file).CombinedOutput()
	if err != nil {
		t.Fatalf("dumpe2fs: %v: %s", err, out)
	}
	for _, want := range []string{"Filesystem volume name:   berth-layer", "Filesystem UUID:          " + uuid, "Filesystem state:         clean"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("dumpe2fs does not say %q:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "has_journal") {
		t.Errorf("the layer keeps a journal:\n%s", out)
	}

	if rep.Top[0].Path != "/usr/lib/big" || rep.Top[0].Files != 2 || rep.Top[0].Bytes != 2<<20+4096 {
		t.Errorf("top path %+v, want /usr/lib/big with 2 files of %d bytes", rep.Top[0], 2<<20+4096)
	}
	wantLeft := map[string]int{"machine id": 1, "hostname": 1, "SSH host keys": 2, "/tmp and /var/tmp": 1, "apt's caches": 2, outsideRoot: 1}
	for _, l := range rep.LeftOut {
		if wantLeft[l.Path] != l.Files {
			t.Errorf("left out %q: %d files, want %d", l.Path, l.Files, wantLeft[l.Path])
		}
		delete(wantLeft, l.Path)
	}
	if len(wantLeft) > 0 {
		t.Errorf("the report does not say it left out %v: %+v", wantLeft, rep.LeftOut)
	}
	// Kept: motd, sshd_config, shared (once), the odd name, data.bin, x,
	// InRelease.
	if rep.Files != 7 || (whiteout && rep.Deleted != 1) {
		t.Errorf("report: %d files, %d deleted; want 7 and a whiteout", rep.Files, rep.Deleted)
	}
}

// A crashed session's disk has a journal to replay and may need repair:
// sealing it does both, and a disk that is not ext4 is refused in one
// line.
func TestSealCommitRefusesGarbage(t *testing.T) {
	if _, err := exec.LookPath("e2fsck"); err != nil {
		t.Skip("no e2fsck")
	}
	file := filepath.Join(t.TempDir(), "junk.img")
	os.WriteFile(file, marked("not a filesystem", 1<<20), 0o644)
	_, err := SealCommit(t.Context(), file, NewUUID())
	if err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "e2fsck could not repair") {
		t.Errorf("SealCommit of junk = %v, want one line saying e2fsck could not repair it", err)
	}
}

// debugfs output is parsed by its separators: names with newlines,
// slashes' absence and the echoed commands are told apart, and whatever
// does not fit the format is an error, not a guess.
func TestParseListings(t *testing.T) {
	type ent struct {
		dir  uint32
		name string
		ino  uint32
		dirp bool
		size int64
	}
	for _, tt := range []struct {
		name string
		in   string
		want []ent
		err  string
	}{
		{name: "two directories",
			in: "debugfs: ls -p <2>\n/2/040755/0/0/.//\n/2/040755/0/0/..//\n/12/040755/0/0/upper//\n/13/100644/0/0/f/42/\n\n" +
				"debugfs: ls -p <12>\n/12/040755/0/0/.//\n/2/040755/0/0/..//\n/0/000000/0/0/cleared/0/\n/14/020644/0/0/wh/0/\n\n",
			want: []ent{{2, "upper", 12, true, 0}, {2, "f", 13, false, 42}, {12, "wh", 14, false, 0}}},
		{name: "a name with newlines and a fake echo",
			in:   "debugfs: ls -p <2>\n/15/100644/0/0/a\ndebugfs: ls -p <9>\nb/7/\n\n",
			want: []ent{{2, "a\ndebugfs: ls -p <9>\nb", 15, false, 7}}},
		{name: "an entry before any command", in: "/15/100644/0/0/a/7/\n", err: "unexpected debugfs entry"},
		{name: "truncated", in: "debugfs: ls -p <2>\n/15/100644/0/0/a", err: "unexpected EOF"},
		{name: "a name too long", in: "debugfs: ls -p <2>\n/15/100644/0/0/" + strings.Repeat("n", 2000) + "/1/\n", err: "over 1024 bytes"},
		{name: "garbage", in: "debugfs: ls -p <2>\nx\n", err: "unexpected debugfs output"},
		{name: "a bad mode", in: "debugfs: ls -p <2>\n/15/9/0/0/a/1/\n", err: "unexpected debugfs entry"},
		{name: "a negative size", in: "debugfs: ls -p <2>\n/15/100644/0/0/a/-1/\n", err: "size"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var got []ent
			err := parseListings(bufio.NewReader(strings.NewReader(tt.in)), func(dir uint32, n extNode) error {
				got = append(got, ent{dir, n.name, n.ino, n.isDir(), n.size})
				return nil
			})
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Errorf("parseListings = %v, want an error saying %q", err, tt.err)
				}
				return
			}
			if err != nil || !slices.Equal(got, tt.want) {
				t.Errorf("parseListings = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

// A walk is bounded: too many entries or too deep a tree is an error.
func TestWalkExt4Bounds(t *testing.T) {
	tree := t.TempDir()
	deep := filepath.Join(tree, "upper", "a", "b", "c", "d")
	writeFile(t, filepath.Join(deep, "f"), []byte("x"))
	file := systemDisk(t, tree)
	if _, err := walkExt4(t.Context(), file, walkLimits{entries: 100, depth: 3}); err == nil || !strings.Contains(err.Error(), "deep") {
		t.Errorf("walk 3 levels deep = %v, want too deep", err)
	}
	if _, err := walkExt4(t.Context(), file, walkLimits{entries: 4, depth: 100}); err == nil || !strings.Contains(err.Error(), "more than 4 paths") {
		t.Errorf("walk of 4 entries = %v, want too many", err)
	}
	if _, err := sealCommit(t.Context(), file, NewUUID(), walkLimits{entries: 4, depth: 100}); err == nil || !strings.Contains(err.Error(), "more than 4 paths") {
		t.Errorf("seal with a walk of 4 entries = %v, want too many", err)
	}
}

// topPath groups files three levels deep.
func TestTopPath(t *testing.T) {
	for in, want := range map[string]string{
		"/usr/lib/python3/dist-packages/x.py": "/usr/lib/python3",
		"/usr/lib/x":                          "/usr/lib",
		"/etc/motd":                           "/etc",
		"/f":                                  "/",
	} {
		if got := topPath(in); got != want {
			t.Errorf("topPath(%q) = %q, want %q", in, got, want)
		}
	}
	if got := printablePath("/a\nb\x00"); got != `/a\nb\x00` {
		t.Errorf("printablePath = %q", got)
	}
}

package engine_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/berthvm/berth/guest/image"
	"github.com/berthvm/berth/guest/image/ext4"
	"github.com/berthvm/berth/vmm/vmmtest"
)

// podman runs Debian's podman and buildah in a store of the test's own
// (vfs: no overlay mounts to leave behind), offline.
type podman struct {
	t    *testing.T
	opts []string
}

func newPodman(t *testing.T) *podman {
	t.Helper()
	for _, tool := range []string{"podman", "buildah"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not found: install Debian's podman and buildah (make deps does)", tool)
		}
	}
	dir := t.TempDir()
	p := &podman{t: t, opts: []string{"--root", filepath.Join(dir, "root"), "--runroot", filepath.Join(dir, "run"), "--storage-driver", "vfs"}}
	t.Cleanup(func() {
		// vfs layers hold files podman made; its own rm takes them.
		exec.Command("podman", append(p.opts, "system", "reset", "--force")...).Run()
	})
	return p
}

func (p *podman) run(tool string, args ...string) string {
	p.t.Helper()
	all := append(slices.Clone(p.opts), args...)
	if tool == "podman" {
		all = append([]string{"--cgroup-manager", "cgroupfs", "--events-backend", "file"}, all...)
	}
	out, err := exec.Command(tool, all...).CombinedOutput()
	if err != nil {
		p.t.Fatalf("%s %s: %v\n%s", tool, strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// inspect returns an image's id and its layers' diff ids.
func (p *podman) inspect(ref string) (string, []string) {
	p.t.Helper()
	var out []struct {
		ID     string `json:"Id"`
		RootFS struct {
			Layers []string `json:"Layers"`
		} `json:"RootFS"`
	}
	if err := json.Unmarshal([]byte(p.run("podman", "image", "inspect", ref)), &out); err != nil || len(out) != 1 {
		p.t.Fatalf("podman image inspect %s: %v", ref, err)
	}
	return out[0].ID, out[0].RootFS.Layers
}

// load loads an archive and returns the name podman gave it.
func (p *podman) load(file string) string {
	p.t.Helper()
	out := p.run("podman", "load", "-i", file)
	for _, l := range strings.Split(out, "\n") {
		if _, name, ok := strings.Cut(l, "Loaded image"); ok {
			_, name, _ = strings.Cut(name, ": ")
			return strings.TrimSpace(strings.Split(name, ",")[0])
		}
	}
	p.t.Fatalf("podman load -i %s said no image:\n%s", file, out)
	return ""
}

// buildahImage makes a two-layer busybox image with buildah (FROM
// scratch, ADD, commit, then another ADD over it) and saves it with
// podman save, as a docker archive.
func buildahImage(t *testing.T, p *podman, busybox, dir string) string {
	t.Helper()
	ctx := filepath.Join(dir, "ctx")
	for _, d := range []string{"bin", "etc", "root", "tmp"} {
		os.MkdirAll(filepath.Join(ctx, d), 0o755)
	}
	os.WriteFile(filepath.Join(ctx, "bin", "busybox"), []byte(busybox), 0o755)
	for _, app := range []string{"sh", "cat", "echo", "ls", "env"} {
		os.Symlink("busybox", filepath.Join(ctx, "bin", app))
	}
	os.WriteFile(filepath.Join(ctx, "etc", "passwd"), []byte("root:x:0:0:root:/root:/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(ctx, "etc", "group"), []byte("root:x:0:\n"), 0o644)
	c := p.run("buildah", "from", "scratch")
	p.run("buildah", "add", c, ctx, "/")
	p.run("buildah", "config", "--env", "PATH=/bin", "--env", "GREETING=from buildah", c)
	p.run("buildah", "commit", "--rm", c, "localhost/bbbase:1")
	top := filepath.Join(dir, "motd")
	os.WriteFile(top, []byte("second layer\n"), 0o644)
	c = p.run("buildah", "from", "localhost/bbbase:1")
	p.run("buildah", "add", c, top, "/etc/motd")
	p.run("buildah", "commit", "--rm", c, "localhost/bb:1")
	archive := filepath.Join(dir, "bb.tar")
	p.run("podman", "save", "-o", archive, "localhost/bb:1")
	return archive
}

// TestExportEndToEnd: berth and podman trade images both ways, offline.
// A podman save archive (made with buildah) imports and runs a command
// in a berth VM (one boot); berth image export of it loads with podman
// load as the same image (its id and layers); exported twice, or to
// standard output, the same bytes; exported, imported back and exported
// again, the same digests. debian, whose layer berth made, exports too,
// loads with podman, and imports back to the exact tree. Bad input is
// refused in one line and leaves nothing at the output path.
func TestExportEndToEnd(t *testing.T) {
	bb := staticBusybox(t)
	p := newPodman(t)
	deb := vmmtest.Debian(t)

	e, data := newImageEnv(t, false, deb)
	images := filepath.Join(data, "images")
	work := t.TempDir()
	archive := buildahImage(t, p, string(bb), work)
	origID, origLayers := p.inspect("localhost/bb:1")
	if len(origLayers) != 2 {
		t.Fatalf("buildah made %d layers, want 2", len(origLayers))
	}

	e.Subtest(t, "a podman save archive imports and runs", func(t *testing.T) {
		out := e.OK("image", "import", archive, "--name", "pbb")
		if !strings.Contains(out, "layer 2 of 2") || !strings.Contains(out, "docker-archive:"+archive) {
			t.Errorf("import output:\n%s", out)
		}
		e.OK("create", "s1", "--image", "pbb", "--memory", "256M", "--disk", "64M")
		if got := e.OK("exec", "s1", "--", "sh", "-c", `cat /etc/motd; echo "$GREETING"`); got != "second layer\nfrom buildah\n" {
			t.Errorf("exec in the imported image printed %q", got)
		}
		e.OK("delete", "s1", "--yes")
	})

	out1 := filepath.Join(work, "pbb-1.tar")
	e.Subtest(t, "the export loads with podman load", func(t *testing.T) {
		out := e.OK("image", "export", "pbb", "-o", out1)
		for _, want := range []string{"layer 2 of 2", "as imported", "wrote " + out1} {
			if !strings.Contains(out, want) {
				t.Errorf("export output does not say %q:\n%s", want, out)
			}
		}
		name := p.load(out1)
		id, layers := p.inspect(name)
		if id != origID || !slices.Equal(layers, origLayers) {
			t.Errorf("podman load of the export: %s %v; podman's own image was %s %v", id, layers, origID, origLayers)
		}
	})

	e.Subtest(t, "the same bytes every time", func(t *testing.T) {
		out2 := filepath.Join(work, "pbb-2.tar")
		e.OK("image", "export", "pbb", "-o", out2)
		stdout := e.OK("image", "export", "pbb", "-o", "-")
		b1, _ := os.ReadFile(out1)
		b2, _ := os.ReadFile(out2)
		if !bytes.Equal(b1, b2) || stdout != string(b1) {
			t.Errorf("exports differ: %d, %d and %d bytes (to standard output)", len(b1), len(b2), len(stdout))
		}
	})

	e.Subtest(t, "export → import gives the same digests", func(t *testing.T) {
		e.OK("image", "import", out1, "--name", "pbb2")
		a, _ := image.Load(images, "pbb")
		b, _ := image.Load(images, "pbb2")
		if !slices.Equal(layerKeys(a), layerKeys(b)) || !slices.Equal(blobKeys(a), blobKeys(b)) {
			t.Errorf("pbb2 (imported from pbb's export) has layers %v blobs %v; pbb has %v %v", layerKeys(b), blobKeys(b), layerKeys(a), blobKeys(a))
		}
		out3 := filepath.Join(work, "pbb2.tar")
		e.OK("image", "export", "pbb2", "-o", out3)
		id, layers := p.inspect(p.load(out3))
		if id != origID || !slices.Equal(layers, origLayers) {
			t.Errorf("export of the re-import: %s %v, want %s %v", id, layers, origID, origLayers)
		}
	})

	e.Subtest(t, "debian exports, loads with podman, imports to the exact tree", func(t *testing.T) {
		file := filepath.Join(work, "debian.tar")
		out := e.OK("image", "export", "debian", "-o", file)
		if !strings.Contains(out, "made from its berth layer") {
			t.Errorf("debian's export does not say its layers were made from berth's:\n%s", out)
		}
		_, layers := p.inspect(p.load(file))
		if len(layers) != len(deb.Layers) {
			t.Errorf("podman sees %d layers in debian's export, berth has %d", len(layers), len(deb.Layers))
		}
		e.OK("image", "import", file, "--name", "debcopy")
		cp, err := image.Load(images, "debcopy")
		if err != nil || len(cp.Layers) != len(deb.Layers) {
			t.Fatalf("debcopy: %+v, %v", cp, err)
		}
		for i := range deb.Layers {
			want, got := ext4Tree(t, deb.Layers[i].Path), ext4Tree(t, cp.Layers[i].Path)
			if !slices.Equal(got, want) {
				t.Errorf("layer %d: the re-imported tree differs from debian's (%d and %d paths):\n%s", i+1, len(got), len(want), firstDiffs(got, want, 10))
			}
		}
		// Exported again (now from kept blobs), the same bytes.
		again := filepath.Join(work, "debcopy.tar")
		e.OK("image", "export", "debcopy", "-o", again)
		if sha(t, again) == "" || manifestOf(t, again) != manifestOf(t, file) {
			t.Errorf("debian's export imported and exported again has another manifest")
		}
	})

	e.Subtest(t, "bad input", func(t *testing.T) {
		bad := filepath.Join(work, "bad")
		os.MkdirAll(bad, 0o755)
		e.Fails("does not exist", "image", "export", "nosuch", "-o", filepath.Join(bad, "x.tar"))
		e.Fails("initramfs", "image", "export", "mini", "-o", filepath.Join(bad, "mini.tar"))
		e.Fails("cannot write", "image", "export", "pbb", "-o", filepath.Join(bad, "no", "dir", "x.tar"))
		os.Chmod(bad, 0o555)
		defer os.Chmod(bad, 0o755)
		if os.Geteuid() != 0 { // root writes anywhere: the missing directory above stands for it
			e.Fails("cannot write", "image", "export", "pbb", "-o", filepath.Join(bad, "x.tar"))
		}
		if ents, _ := os.ReadDir(bad); len(ents) != 0 {
			t.Errorf("refused exports left %v behind", ents)
		}
	})
}

func layerKeys(im image.Image) []string {
	var out []string
	for _, l := range im.Layers {
		out = append(out, l.Hash)
	}
	return out
}

func blobKeys(im image.Image) []string {
	var out []string
	for _, l := range im.Layers {
		for _, b := range l.Blobs {
			out = append(out, b.Digest)
		}
	}
	return out
}

func sha(t *testing.T, file string) string {
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	io.Copy(h, f)
	return fmt.Sprintf("%x", h.Sum(nil))
}

// manifestOf is the manifest digest an exported layout's index names.
func manifestOf(t *testing.T, file string) string {
	t.Helper()
	out, err := exec.Command("tar", "-xOf", file, "index.json").Output()
	if err != nil {
		t.Fatalf("index.json of %s: %v", file, err)
	}
	var ix struct {
		Manifests []struct {
			Digest string `json:"digest"`
		} `json:"manifests"`
	}
	if json.Unmarshal(out, &ix) != nil || len(ix.Manifests) != 1 {
		t.Fatalf("index.json of %s: %s", file, out)
	}
	return ix.Manifests[0].Digest
}

// ext4Tree lists the tree of a berth layer (its upper/), read with
// guest/image/ext4: every path's type, mode, owner, mtime (seconds),
// size and content hash, link target, device, extended attributes, and
// which paths are one inode.
func ext4Tree(t *testing.T, layer string) []string {
	t.Helper()
	f, err := os.Open(layer)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, _ := f.Stat()
	fs, err := ext4.Open(f, fi.Size())
	if err != nil {
		t.Fatal(err)
	}
	root, err := fs.Inode(ext4.RootIno)
	if err != nil {
		t.Fatal(err)
	}
	var upper *ext4.Inode
	ents, _ := fs.ReadDir(root, 1<<20)
	for _, e := range ents {
		if e.Name == "upper" {
			upper, _ = fs.Inode(e.Ino)
		}
	}
	if upper == nil {
		t.Fatalf("%s has no upper/", layer)
	}
	var out []string
	first := map[uint32]string{}
	var walk func(in *ext4.Inode, p string)
	walk = func(in *ext4.Inode, p string) {
		ents, err := fs.ReadDir(in, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		sort.Slice(ents, func(i, j int) bool { return ents[i].Name < ents[j].Name })
		for _, e := range ents {
			c, err := fs.Inode(e.Ino)
			if err != nil {
				t.Fatal(err)
			}
			name := p + "/" + e.Name
			line := fmt.Sprintf("%s %o %d:%d %d", name, c.Mode, c.UID, c.GID, c.Mtime.Unix())
			switch c.Type() {
			case ext4.ModeFile:
				if prev, ok := first[c.Ino]; ok {
					line += " =" + prev
					break
				}
				if c.Links > 1 {
					first[c.Ino] = name
				}
				r, err := fs.Open(c)
				if err != nil {
					t.Fatal(err)
				}
				h := sha256.New()
				n, _ := io.Copy(h, r)
				line += fmt.Sprintf(" %d %x", n, h.Sum(nil)[:8])
			case ext4.ModeSym:
				l, _ := fs.Readlink(c)
				line += " -> " + l
			case ext4.ModeChar, ext4.ModeBlock:
				line += fmt.Sprintf(" %d,%d", c.Major, c.Minor)
			}
			xs, _ := fs.Xattrs(c)
			sort.Slice(xs, func(i, j int) bool { return xs[i].Name < xs[j].Name })
			for _, x := range xs {
				line += fmt.Sprintf(" %s=%x", x.Name, x.Value)
			}
			out = append(out, line)
			if c.Type() == ext4.ModeDir {
				walk(c, name)
			}
		}
	}
	walk(upper, "")
	return out
}

func firstDiffs(got, want []string, n int) string {
	g, w := map[string]bool{}, map[string]bool{}
	for _, l := range got {
		g[l] = true
	}
	for _, l := range want {
		w[l] = true
	}
	var b strings.Builder
	for _, l := range want {
		if !g[l] && n > 0 {
			fmt.Fprintf(&b, "  missing: %s\n", l)
			n--
		}
	}
	for _, l := range got {
		if !w[l] && n > 0 {
			fmt.Fprintf(&b, "  extra:   %s\n", l)
			n--
		}
	}
	return b.String()
}

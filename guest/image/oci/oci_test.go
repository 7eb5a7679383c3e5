package oci

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/berthvm/berth/guest/image"
)

const (
	passwd    = "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1001::/home/app:/bin/sh\n"
	groupFile = "root:x:0:\napp:x:1001:\nstaff:x:50:\n"
	capVal    = "\x01\x00\x00\x02\x00\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("importing keeps owners and device nodes: needs root")
	}
	for _, tool := range []string{"mkfs.ext4", "debugfs"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not found (Debian's e2fsprogs)", tool)
		}
	}
}

// The three layers of the round-trip image: a base, a layer that
// deletes a file and writes through a symlink and into directories it
// does not name, and one that makes a directory opaque.
func layer1(t testing.TB) []byte {
	return layerTar(t,
		dir("./", 0o755),
		dir("etc/", 0o755), file("etc/passwd", 0o644, passwd), file("etc/group", 0o644, groupFile),
		dir("bin/", 0o755), file("bin/busybox", 0o755, "BB"), sym("bin/sh", "busybox"), hard("bin/hl", "bin/busybox"),
		dir("usr/", 0o755), dir("usr/lib/", 0o755), file("usr/lib/libc.so", 0o644, "libc"),
		sym("lib", "usr/lib"),
		dir("tmp/", 0o1777),
		dir("old/", 0o755), file("old/a", 0o644, "a"), file("old/b", 0o644, "b"), dir("old/sub/", 0o755), file("old/sub/deep", 0o644, "deep"),
		file("doomed", 0o644, "x"),
		dir("dev/", 0o755), ent{name: "dev/null", typ: tar.TypeChar, mode: 0o666, major: 1, minor: 3}, ent{name: "dev/fifo", typ: tar.TypeFifo, mode: 0o644},
		dir("home/", 0o755), owned(dir("home/app/", 0o750), 1000, 1001),
		dir("sbin/", 0o755), withXattr(file("sbin/ping", 0o755, "ping"), "security.capability", capVal, "user.note", "hi"),
		withXattr(dir("opt/", 0o700), "user.dir", "d"),
	)
}

func layer2(t testing.TB) []byte {
	return layerTar(t,
		wh(".wh.doomed"),
		file("lib/extra.so", 0o644, "extra"),
		file("usr/local/bin/tool", 0o755, "tool"),
		file("tmp/x", 0o600, "tmpx"),
		owned(file("etc/motd", 0o600, "hello"), 1000, 1001),
		file("bin/su", 0o4755, "su"),
		file("opt/x", 0o644, "optx"),
		owned(file("home/app/.profile", 0o644, "prof"), 1000, 1001),
	)
}

func layer3(t testing.TB) []byte {
	return layerTar(t,
		dir("old/", 0o755), wh("old/.wh..wh..opq"), file("old/c", 0o644, "c"),
		file("bin/busybox", 0o755, "BB2"),
		hard("bin/hl2", "usr/lib/libc.so"),
		wh("dev/.wh.fifo"),
		sym("tmp/x", "/etc/motd"),
	)
}

// wantTree is the image the three layers make.
func wantTree() []string {
	h := hashOf
	lines := []string{
		"/ d 0755 0:0",
		"/bin d 0755 0:0",
		"/bin/busybox f 0755 0:0 " + h("BB2"),
		"/bin/hl f 0755 0:0 " + h("BB"),
		"/bin/hl2 f 0644 0:0 " + h("libc"),
		"/bin/sh l 0777 0:0 -> busybox",
		"/bin/su f 4755 0:0 " + h("su"),
		"/dev d 0755 0:0",
		"/dev/null c 0666 0:0 01:03",
		"/etc d 0755 0:0",
		"/etc/group f 0644 0:0 " + h(groupFile),
		"/etc/motd f 0600 1000:1001 " + h("hello"),
		"/etc/passwd f 0644 0:0 " + h(passwd),
		"/home d 0755 0:0",
		"/home/app d 0750 1000:1001",
		"/home/app/.profile f 0644 1000:1001 " + h("prof"),
		"/lib l 0777 0:0 -> usr/lib",
		"/old d 0755 0:0",
		"/old/c f 0644 0:0 " + h("c"),
		`/opt d 0700 0:0 user.dir="d"`,
		"/opt/x f 0644 0:0 " + h("optx"),
		`/sbin d 0755 0:0`,
		`/sbin/ping f 0755 0:0 ` + h("ping") + ` security.capability=01 00 00 02 00 20 00 00 00 00 00 00 00 00 00 00 00 00 00 00,user.note="hi"`,
		"/tmp d 1777 0:0",
		"/tmp/x l 0777 0:0 -> /etc/motd",
		"/usr d 0755 0:0",
		"/usr/lib d 0755 0:0",
		"/usr/lib/extra.so f 0644 0:0 " + h("extra"),
		"/usr/lib/libc.so f 0644 0:0 " + h("libc"),
		"/usr/local d 0755 0:0",
		"/usr/local/bin d 0755 0:0",
		"/usr/local/bin/tool f 0755 0:0 " + h("tool"),
	}
	slices.Sort(lines)
	return lines
}

// testOptions imports into a fresh images directory, collecting
// progress.
type progressLog struct {
	mu    sync.Mutex
	lines []image.Progress
}

func (p *progressLog) report(pr image.Progress) {
	p.mu.Lock()
	p.lines = append(p.lines, pr)
	p.mu.Unlock()
}

func (p *progressLog) phases() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := map[string]int{}
	for _, l := range p.lines {
		m[l.Phase]++
	}
	return m
}

func options(images, src string) (Options, *progressLog) {
	log := &progressLog{}
	return Options{Name: "app", Source: src, ImagesDir: images, Report: log.report}, log
}

func read(t *testing.T, o Options) *Layers {
	t.Helper()
	l, err := Read(t.Context(), o)
	if err != nil {
		t.Fatalf("import %s: %v", o.Source, err)
	}
	t.Cleanup(l.Release)
	return l
}

func threeLayers(t testing.TB, gz bool) imageSpec {
	return imageSpec{layers: [][]byte{layer1(t), layer2(t), layer3(t)}, gzip: gz, user: "app", env: []string{"PATH=/usr/local/bin:/bin", "APP=1"}}
}

// TestRoundTrip imports the three-layer image from every kind of
// source and with every way of stacking its layers, and reads the exact
// tree back out of the ext4 layers.
func TestRoundTrip(t *testing.T) {
	needRoot(t)
	want := wantTree()
	cases := []struct {
		name      string
		maxLayers int
		source    func(t *testing.T, dir string) (string, *bytes.Reader)
		kind      string
	}{
		{"layout dir, plain layers", 0, func(t *testing.T, dir string) (string, *bytes.Reader) {
			return writeLayout(t, filepath.Join(dir, "layout"), threeLayers(t, false).image(t)), nil
		}, kindLayout},
		{"layout dir, gzip layers, two berth layers", 2, func(t *testing.T, dir string) (string, *bytes.Reader) {
			return writeLayout(t, filepath.Join(dir, "layout"), threeLayers(t, true).image(t)), nil
		}, kindLayout},
		{"oci archive, one berth layer", 1, func(t *testing.T, dir string) (string, *bytes.Reader) {
			l := writeLayout(t, filepath.Join(dir, "layout"), threeLayers(t, true).image(t))
			return tarDir(t, l, filepath.Join(dir, "app.tar")), nil
		}, kindOCIArchive},
		{"docker archive", 0, func(t *testing.T, dir string) (string, *bytes.Reader) {
			s := threeLayers(t, true)
			s.docker = true
			return writeDocker(t, filepath.Join(dir, "app.tar"), s.image(t)), nil
		}, kindDockerArchive},
		{"docker archive on standard input", 0, func(t *testing.T, dir string) (string, *bytes.Reader) {
			s := threeLayers(t, true)
			s.docker = true
			b, _ := os.ReadFile(writeDocker(t, filepath.Join(dir, "app.tar"), s.image(t)))
			return "-", bytes.NewReader(b)
		}, kindDockerArchive},
		{"gzip'd docker archive on standard input", 0, func(t *testing.T, dir string) (string, *bytes.Reader) {
			s := threeLayers(t, false)
			s.docker = true
			b, _ := os.ReadFile(writeDocker(t, filepath.Join(dir, "app.tar"), s.image(t)))
			return "-", bytes.NewReader(gzipBytes(b))
		}, kindDockerArchive},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			src, stdin := c.source(t, dir)
			o, log := options(filepath.Join(dir, "images"), src)
			o.MaxLayers = c.maxLayers
			if stdin != nil {
				o.Stdin = stdin
			}
			l := read(t, o)
			if got := mergedTree(t, l.Image); !slices.Equal(got, want) {
				t.Errorf("tree differs:\n%s", diffLines(got, want))
			}
			wantLayers := 3
			if c.maxLayers > 0 {
				wantLayers = c.maxLayers
			}
			if len(l.Image.Layers) != wantLayers {
				t.Errorf("%d berth layers, want %d", len(l.Image.Layers), wantLayers)
			}
			if !strings.HasPrefix(l.Image.Source, c.kind+":") {
				t.Errorf("source %q, want kind %s", l.Image.Source, c.kind)
			}
			if _, _, err := parseDigest(l.Image.SourceDigest); err != nil {
				t.Errorf("source digest %q: %v", l.Image.SourceDigest, err)
			}
			cfg := l.Image.Config
			if cfg == nil || cfg.User != "app" || cfg.UID != 1000 || cfg.GID != 1001 || cfg.Home != "/home/app" ||
				!slices.Equal(cfg.Env, []string{"PATH=/usr/local/bin:/bin", "APP=1"}) || cfg.WorkingDir != "/workspace/app" {
				t.Errorf("config = %+v", cfg)
			}
			ph := log.phases()
			if ph["verify"] == 0 || ph["unpack"] == 0 || ph["image"] != wantLayers {
				t.Errorf("progress phases %v", ph)
			}
			if names := finalNames(t, o.ImagesDir); len(names) != 2*wantLayers {
				t.Errorf("images directory holds %v, want only the %d layers and their metadata", names, wantLayers)
			}
		})
	}
}

// TestLayerForm checks the berth layers themselves: overlayfs's
// whiteouts and opaque directories, a hard link within a layer kept as
// one inode, implicit parents made as the layers below have them.
func TestLayerForm(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	o, _ := options(filepath.Join(dir, "images"), writeLayout(t, filepath.Join(dir, "layout"), threeLayers(t, false).image(t)))
	l := read(t, o)
	l1, l2, l3 := readLayer(t, l.Image.Layers[0].Path), readLayer(t, l.Image.Layers[1].Path), readLayer(t, l.Image.Layers[2].Path)
	if l1["/bin/hl"].ino != l1["/bin/busybox"].ino {
		t.Errorf("hard link bin/hl is inode %s, bin/busybox %s: want one inode", l1["/bin/hl"].ino, l1["/bin/busybox"].ino)
	}
	if l1["/dev/fifo"].kind != 'p' || l1["/dev/null"].dev != "01:03" {
		t.Errorf("devices: fifo %+v null %+v", l1["/dev/fifo"], l1["/dev/null"])
	}
	if l2["/doomed"].kind != 'w' {
		t.Errorf("layer 2 /doomed = %+v, want a whiteout", l2["/doomed"])
	}
	if e := l2["/tmp"]; e.mode != 0o1777 {
		t.Errorf("layer 2 /tmp (named only by tmp/x) has mode %o, want the 1777 of the layer below", e.mode)
	}
	if e := l2["/opt"]; e.mode != 0o700 || e.xattr["user.dir"] == "" {
		t.Errorf("layer 2 /opt = %+v, want the layer below's mode and xattr", e)
	}
	if _, ok := l2["/lib"]; ok {
		t.Errorf("layer 2 made /lib, which is a symlink below: %+v", l2["/lib"])
	}
	if l3["/old"].xattr[opaqueXattr] == "" {
		t.Errorf("layer 3 /old = %+v, want opaque", l3["/old"])
	}
	if l3["/dev/fifo"].kind != 'w' {
		t.Errorf("layer 3 /dev/fifo = %+v, want a whiteout", l3["/dev/fifo"])
	}
}

// TestReuse imports an image, then another sharing its layers with one
// more on top: the shared layers come from the cache (nothing of them
// read or written again), and the new one is applied over the cached
// ones as over fresh ones.
func TestReuse(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	images := filepath.Join(dir, "images")
	first := threeLayers(t, true)
	o, _ := options(images, writeLayout(t, filepath.Join(dir, "a"), first.image(t)))
	a := read(t, o)
	a.Release()

	// The same image again: everything cached.
	o, log := options(images, o.Source)
	again := read(t, o)
	if again.Reused != 3 || log.phases()["verify"] != 0 || log.phases()["image"] != 0 {
		t.Errorf("re-import reused %d layers, progress %v: want 3, nothing verified or written", again.Reused, log.phases())
	}
	if again.Image.Config.UID != 1000 {
		t.Errorf("re-import resolved user %+v", again.Image.Config)
	}
	again.Release()

	second := first
	second.layers = append(slices.Clone(first.layers), layerTar(t, file("lib/more.so", 0o644, "more"), file("tmp/y", 0o644, "y"), wh("opt/.wh.x")))
	o, log = options(images, writeLayout(t, filepath.Join(dir, "b"), second.image(t)))
	o.Name = "app2"
	b := read(t, o)
	if b.Reused != 3 || log.phases()["image"] != 1 {
		t.Errorf("reused %d layers and wrote %d, want 3 and 1", b.Reused, log.phases()["image"])
	}
	for i := range 3 {
		if b.Image.Layers[i].Path != a.Image.Layers[i].Path {
			t.Errorf("layer %d is %s, want the cached %s", i, b.Image.Layers[i].Path, a.Image.Layers[i].Path)
		}
	}
	want := slices.DeleteFunc(wantTree(), func(l string) bool { return strings.HasPrefix(l, "/opt/x ") })
	want = append(want, "/usr/lib/more.so f 0644 0:0 "+hashOf("more"), "/tmp/y f 0644 0:0 "+hashOf("y"))
	slices.Sort(want)
	if got := mergedTree(t, b.Image); !slices.Equal(got, want) {
		t.Errorf("tree differs:\n%s", diffLines(got, want))
	}
	top := readLayer(t, b.Image.Layers[3].Path)
	if top["/tmp"].mode != 0o1777 || top["/opt"].xattr["user.dir"] == "" {
		t.Errorf("the new layer's implicit parents: /tmp %+v /opt %+v: want them as the cached layers have them", top["/tmp"], top["/opt"])
	}
}

// TestRootFS imports plain root filesystem tarballs, gzip'd or not.
func TestRootFS(t *testing.T) {
	needRoot(t)
	base := layer1(t)
	for _, c := range []struct {
		name string
		b    []byte
	}{{"tar", base}, {"tar.gz", gzipBytes(base)}} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			src := filepath.Join(dir, "root."+c.name)
			os.WriteFile(src, c.b, 0o644)
			o, _ := options(filepath.Join(dir, "images"), src)
			l := read(t, o)
			if !strings.HasPrefix(l.Image.Source, kindRootFS+":") || l.Image.SourceDigest != sha256Digest(c.b) || l.Image.Config != nil {
				t.Errorf("image %+v", l.Image)
			}
			tree := mergedTree(t, l.Image)
			if !slices.Contains(tree, "/bin/busybox f 0755 0:0 "+hashOf("BB")) || !slices.Contains(tree, "/doomed f 0644 0:0 "+hashOf("x")) {
				t.Errorf("tree: %v", tree)
			}
		})
	}
}

// TestImport commits an imported image as berth images are, where a
// guest kernel can be had (it is downloaded once into the cache).
func TestImport(t *testing.T) {
	needRoot(t)
	cache := os.Getenv("BERTH_TEST_CACHE")
	agent := os.Getenv("BERTH_TEST_AGENT")
	if cache == "" || agent == "" {
		t.Skip("set BERTH_TEST_CACHE (a kernel cache) and BERTH_TEST_AGENT (berth-agent) to commit an import")
	}
	dir := t.TempDir()
	o, _ := options(filepath.Join(dir, "images"), writeLayout(t, filepath.Join(dir, "layout"), threeLayers(t, true).image(t)))
	o.CacheDir, o.Agent = cache, agent
	im, err := Import(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	back, err := image.Load(o.ImagesDir, "app")
	if err != nil || back.SourceDigest != im.SourceDigest || back.Config == nil || back.Config.UID != 1000 || len(back.Layers) != 3 {
		t.Fatalf("loaded %+v, %v", back, err)
	}
	// Again: the same build.
	again, err := Import(context.Background(), o)
	if err != nil || again.Digest != im.Digest {
		t.Fatalf("re-import: %+v, %v; want build %s again", again, err, im.Digest)
	}
	// Another source under the name is another build of it; the
	// layers it shares stay linked.
	o.Source = writeLayout(t, filepath.Join(dir, "layout2"), imageSpec{layers: [][]byte{layer1(t)}, user: "app"}.image(t))
	other, err := Import(context.Background(), o)
	if err != nil || other.Digest == im.Digest || len(other.Layers) != 1 || other.Layers[0].Hash != im.Layers[0].Hash {
		t.Fatalf("import of another image as app: %+v, %v", other, err)
	}
	// Builds on one agent and kernel share one initramfs, linked from
	// the layer cache, and the kernel where the caches share a
	// filesystem; it goes with the last image linking it.
	a, errA := os.Stat(im.Initramfs)
	b, errB := os.Stat(other.Initramfs)
	if errA != nil || errB != nil || !os.SameFile(a, b) {
		t.Errorf("two builds on one agent and kernel do not share their initramfs: %v %v", errA, errB)
	}
	// Kept a while after the last image linking it is removed, for the
	// next import or commit.
	if err := image.Remove(o.ImagesDir, "app"); err != nil {
		t.Fatal(err)
	}
	if m, _ := filepath.Glob(filepath.Join(image.LayerCacheDir(o.ImagesDir), "*.initrd")); len(m) != 1 {
		t.Errorf("removing the image dropped its shared initramfs at once: %v", m)
	}
}

// Within one berth layer, a directory whited out and then named only
// implicitly by a later layer comes back empty of what was below, as a
// directory entry would; across berth layers the same.
func TestWhiteoutThenImplicitParent(t *testing.T) {
	needRoot(t)
	spec := imageSpec{layers: [][]byte{
		layerTar(t, dir("d/", 0o755), file("d/old", 0o644, "old"), hard("d/link", "d/old"), sym("s", "d/old")),
		layerTar(t, wh(".wh.d"), hard("h", "s")),
		layerTar(t, file("d/new", 0o644, "new")),
	}}
	want := []string{
		"/ d 0755 0:0",
		"/d d 0755 0:0",
		"/d/new f 0644 0:0 " + hashOf("new"),
		"/h l 0777 0:0 -> d/old",
		"/s l 0777 0:0 -> d/old",
	}
	for _, max := range []int{1, 2, 3} {
		dir := t.TempDir()
		o, _ := options(filepath.Join(dir, "images"), writeLayout(t, filepath.Join(dir, "layout"), spec.image(t)))
		o.MaxLayers = max
		l := read(t, o)
		if got := mergedTree(t, l.Image); !slices.Equal(got, want) {
			t.Errorf("%d berth layers: tree differs:\n%s", max, diffLines(got, want))
		}
	}
}

// Names berth builds itself, and invalid ones, are refused before the
// source is read.
func TestImportNames(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"mini", "debian", "Bad_Name", ""} {
		o, _ := options(filepath.Join(dir, "images"), filepath.Join(dir, "nowhere.tar"))
		o.Name = name
		if _, err := Import(t.Context(), o); err == nil || strings.Contains(err.Error(), "nowhere") {
			t.Errorf("import as %q: %v, want refused before reading the source", name, err)
		}
	}
}

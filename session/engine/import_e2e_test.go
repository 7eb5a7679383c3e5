package engine_test

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/berthvm/berth/session"
)

// TestImportEndToEnd imports a busybox image, built here offline as a
// docker save archive, through the real daemon from standard input, and
// boots a session of it (one VM): its Env and WorkingDir reach commands,
// its second layer's whiteout hides the first's file, and image rm is
// refused while the session uses it. A truncated archive fails with one
// line and leaves nothing behind.
func TestImportEndToEnd(t *testing.T) {
	bb := staticBusybox(t)
	img, archive := busyboxImage(t, bb)
	id, err := img.ConfigName() // a docker archive's image id
	if err != nil {
		t.Fatal(err)
	}

	// No templates: one boot is all the test pays.
	e, data := newImageEnv(t, false)
	images := filepath.Join(data, "images")

	e.Subtest(t, "truncated archive", func(t *testing.T) {
		cut := archive[:len(archive)*2/3]
		r := e.RunIn(string(cut), "image", "import", "-", "--name", "bad")
		if r.Code == 0 || strings.Count(strings.TrimSpace(r.Stderr), "\n") != 0 || !strings.Contains(r.Stderr, "truncated") {
			t.Errorf("import of a truncated archive: exit %d, stderr %q; want one line saying it is truncated", r.Code, r.Stderr)
		}
		file := filepath.Join(t.TempDir(), "cut.tar")
		os.WriteFile(file, cut, 0o644)
		e.Fails("truncated", "image", "import", file, "--name", "bad")
		e.Fails("--name NAME is required", "image", "import", file)
		if strings.Contains(e.OK("image", "ls"), "bad") {
			t.Error("image ls lists the failed import")
		}
		leftovers(t, images)
	})

	e.Subtest(t, "import from standard input", func(t *testing.T) {
		start := time.Now()
		r := e.RunIn(string(archive), "image", "import", "-", "--name", "bb")
		if r.Code != 0 {
			t.Fatalf("image import: exit %d: %s%s\ndaemon log:\n%s", r.Code, r.Stdout, r.Stderr, e.DaemonLog())
		}
		t.Logf("import took %s:\n%s", time.Since(start), r.Stdout)
		for _, want := range []string{"layer 1 of 2", "layer 2 of 2", "imported docker-archive:-", "as image bb", "commands start in /workspace/src"} {
			if !strings.Contains(r.Stdout, want) {
				t.Errorf("the import's output does not say %q:\n%s", want, r.Stdout)
			}
		}
		var list []session.ImageInfo
		if err := json.Unmarshal([]byte(e.OK("image", "ls", "--json")), &list); err != nil {
			t.Fatal(err)
		}
		var got *session.ImageInfo
		for i := range list {
			if list[i].Name == "bb" {
				got = &list[i]
			}
		}
		if got == nil || got.Source != "docker-archive:-" || got.SourceDigest != id.String() || !got.RootFS || got.Layers != 2 ||
			got.Config == nil || got.Config.WorkingDir != "/workspace/src" {
			t.Errorf("image ls --json: %+v; want bb from docker-archive:- with digest %s, 2 layers", got, id)
		}
		if ls := e.OK("image", "ls"); !strings.Contains(ls, "docker-archive:- "+id.String()[:len("sha256:")+12]) {
			t.Errorf("image ls does not show the source and its digest:\n%s", ls)
		}
	})

	e.OK("create", "s1", "--image", "bb", "--memory", "256M", "--disk", "64M")
	e.Subtest(t, "the image's config applied", func(t *testing.T) {
		out := e.OK("exec", "s1", "--", "sh", "-c", `echo "$GREETING"; pwd; cat /etc/motd; test -e /etc/gone || echo whiteout applied`)
		if want := "hello from the image\n/workspace/src\nfrom layer 2\nwhiteout applied\n"; out != want {
			t.Errorf("exec printed %q, want %q", out, want)
		}
		env := e.OK("exec", "s1", "--env", "MODE=mine", "--", "env")
		for _, want := range []string{"GREETING=hello from the image", "PATH=/bin", "MODE=mine"} {
			if !strings.Contains(env, want+"\n") {
				t.Errorf("env does not have %s:\n%s", want, env)
			}
		}
		if out := e.OK("exec", "s1", "--env", "GREETING=mine", "--", "sh", "-c", `echo "$GREETING"`); out != "mine\n" {
			t.Errorf("a command's own variable: %q, want it over the image's", out)
		}
	})
	e.Subtest(t, "image rm refused while used", func(t *testing.T) {
		e.Fails("used by s1", "image", "rm", "bb")
	})
	e.Subtest(t, "a recipe on the imported image", func(t *testing.T) {
		dir := t.TempDir()
		recipe := filepath.Join(dir, "bb-plus.toml")
		os.WriteFile(filepath.Join(dir, "note"), []byte("a file of the recipe\n"), 0o644)
		os.WriteFile(recipe, []byte(`name = "bb-plus"
base = "image:bb"
files = { "note" = "/etc/note" }
run = ["echo \"built with $GREETING\" > /etc/berth-recipe"]
`), 0o644)
		bad := filepath.Join(dir, "bad.toml")
		os.WriteFile(bad, []byte("name = \"bad\"\nbase = \"image:nosuch\"\nrun = [\"true\"]\n"), 0o644)
		e.Fails(`base image "nosuch"`, "image", "build", "--recipe", bad)
		out := e.OK("image", "build", "--recipe", recipe)
		if !strings.Contains(out, "on image bb") {
			t.Errorf("the build does not say what it built on:\n%s", out)
		}
		e.OK("create", "s2", "--image", "bb-plus", "--memory", "256M", "--disk", "64M")
		// The setup step saw the base's Env; the session has the base's
		// layers (its whiteout too) and the recipe's.
		got := e.OK("exec", "s2", "--", "sh", "-c", `cat /etc/berth-recipe /etc/note /etc/motd; test -e /etc/gone || echo whiteout kept; pwd`)
		if want := "built with hello from the image\na file of the recipe\nfrom layer 2\nwhiteout kept\n/workspace/src\n"; got != want {
			t.Errorf("a session of the recipe's image printed %q, want %q", got, want)
		}
		if out := e.OK("exec", "s1", "--", "sh", "-c", "test -e /etc/berth-recipe && echo changed || echo untouched"); out != "untouched\n" {
			t.Errorf("the base image's session sees the recipe's layer: %q", out)
		}
		e.OK("delete", "s2", "--yes")
		e.OK("image", "rm", "bb-plus")
	})
	e.Subtest(t, "a second import reuses the layers", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "bb.tar")
		os.WriteFile(file, archive, 0o644)
		out := e.OK("image", "import", file, "--name", "bb")
		if !strings.Contains(out, "2 reused") || !strings.Contains(out, "docker-archive:"+file) {
			t.Errorf("a second import of the same image:\n%s\nwant its 2 layers reused, from %s", out, file)
		}
	})
	e.OK("delete", "s1", "--yes")
	e.OK("image", "rm", "bb")
	leftovers(t, images)
}

// leftovers fails for what an import leaves when it is gone: work
// directories, stages, an image directory, layers no image links.
func leftovers(t *testing.T, images string) {
	t.Helper()
	for _, pat := range []string{".import-*", ".layers/.oci-*", "bad", "bb"} {
		if m, _ := filepath.Glob(filepath.Join(images, pat)); len(m) > 0 {
			t.Errorf("left behind: %v", m)
		}
	}
	layers, _ := filepath.Glob(filepath.Join(images, ".layers", "*.img"))
	for _, l := range layers {
		var n uint64
		if fi, err := os.Stat(l); err == nil {
			n = statNlink(fi)
		}
		if n < 2 {
			t.Errorf("left behind: layer %s, which no image links", l)
		}
	}
}

// busyboxImage is a two-layer image of busybox-static, as a docker save
// archive: the first layer busybox, its links and /etc, the second a
// file more and a whiteout of one of the first's.
func busyboxImage(t *testing.T, busybox []byte) (v1.Image, []byte) {
	t.Helper()
	base := []tarEnt{
		{name: "bin/", typ: tar.TypeDir, mode: 0o755},
		{name: "bin/busybox", typ: tar.TypeReg, mode: 0o755, body: busybox},
		{name: "etc/", typ: tar.TypeDir, mode: 0o755},
		{name: "etc/passwd", typ: tar.TypeReg, mode: 0o644, body: []byte("root:x:0:0:root:/root:/bin/sh\n")},
		{name: "etc/group", typ: tar.TypeReg, mode: 0o644, body: []byte("root:x:0:\n")},
		{name: "etc/gone", typ: tar.TypeReg, mode: 0o644, body: []byte("deleted by layer 2\n")},
		{name: "root/", typ: tar.TypeDir, mode: 0o700},
		{name: "tmp/", typ: tar.TypeDir, mode: 0o1777},
	}
	for _, app := range []string{"sh", "env", "echo", "pwd", "cat", "ls", "test", "id"} {
		base = append(base, tarEnt{name: "bin/" + app, typ: tar.TypeSymlink, mode: 0o777, link: "busybox"})
	}
	top := []tarEnt{
		{name: "etc/", typ: tar.TypeDir, mode: 0o755},
		{name: "etc/motd", typ: tar.TypeReg, mode: 0o644, body: []byte("from layer 2\n")},
		{name: "etc/.wh.gone", typ: tar.TypeReg, mode: 0o644},
	}
	img, err := mutate.AppendLayers(empty.Image,
		static.NewLayer(tarOf(t, base), types.DockerUncompressedLayer), static.NewLayer(tarOf(t, top), types.DockerUncompressedLayer))
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Env = []string{"PATH=/bin", "GREETING=hello from the image"}
	cf.Config.WorkingDir = "/workspace/src"
	cf.Config.Cmd = []string{"/bin/sh"}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag("example.com/busybox:1")
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := tarball.Write(tag, img, &b); err != nil {
		t.Fatal(err)
	}
	return img, b.Bytes()
}

type tarEnt struct {
	name     string
	typ      byte
	mode     int64
	body     []byte
	link     string
	uid, gid int
}

func tarOf(t *testing.T, ents []tarEnt) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.link, Size: int64(len(e.body)),
			Uid: e.uid, Gid: e.gid, ModTime: time.Unix(1700000000, 0), Format: tar.FormatPAX}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write(e.body)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func statNlink(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Nlink)
	}
	return 0
}

package engine_test

import (
	"archive/tar"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// TestMuslImageWithoutShell imports an Alpine-style image — a program
// linked against musl, its dynamic loader, and no shell at all — and runs
// it in a session: the agent stays PID 1 whatever libc the image has, and
// what needs a shell fails in one line instead of hanging.
func TestMuslImageWithoutShell(t *testing.T) {
	needImports(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "hello.c")
	os.WriteFile(src, []byte("#include <stdio.h>\nint main(void){puts(\"hello from musl\");return 0;}\n"), 0o644)
	bin := filepath.Join(dir, "hello")
	if out, err := exec.Command("musl-gcc", "-O2", "-o", bin, src).CombinedOutput(); err != nil {
		t.Skipf("no musl toolchain (Debian's musl-tools, which make deps installs): %v %s", err, out)
	}
	hello, _ := os.ReadFile(bin)
	// The loader musl-gcc links against: an Alpine image has it as
	// /lib/ld-musl-x86_64.so.1 too.
	loader, err := os.ReadFile("/lib/ld-musl-x86_64.so.1")
	if err != nil {
		t.Skipf("no musl loader: %v", err)
	}
	ents := []tarEnt{
		{name: "bin/", typ: tar.TypeDir, mode: 0o755},
		{name: "bin/hello", typ: tar.TypeReg, mode: 0o755, body: hello},
		{name: "lib/", typ: tar.TypeDir, mode: 0o755},
		{name: "lib/ld-musl-x86_64.so.1", typ: tar.TypeReg, mode: 0o755, body: loader},
		{name: "etc/", typ: tar.TypeDir, mode: 0o755},
		{name: "etc/passwd", typ: tar.TypeReg, mode: 0o644, body: []byte("root:x:0:0:root:/root:/bin/sh\n")},
		{name: "etc/group", typ: tar.TypeReg, mode: 0o644, body: []byte("root:x:0:\n")},
	}
	img, err := mutate.AppendLayers(empty.Image, static.NewLayer(tarOf(t, ents), types.DockerUncompressedLayer))
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Env = []string{"PATH=/bin"}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag("example.com/musl:1")
	var archive bytes.Buffer
	if err := tarball.Write(tag, img, &archive); err != nil {
		t.Fatal(err)
	}

	e, _ := newImageEnv(t, false)
	if r := e.RunIn(archive.String(), "image", "import", "-", "--name", "muslapp"); r.Code != 0 {
		t.Fatalf("image import: exit %d: %s%s", r.Code, r.Stdout, r.Stderr)
	}
	e.OK("create", "m1", "--image", "muslapp", "--memory", "256M", "--disk", "64M")
	if out := e.OK("exec", "m1", "--", "hello"); out != "hello from musl\n" {
		t.Errorf("the musl program printed %q", out)
	}
	for _, args := range [][]string{{"exec", "m1", "--", "sh", "-c", "true"}, {"shell", "m1"}} {
		r := e.Run(args...)
		if r.Code == 0 || strings.Count(strings.TrimSpace(r.Stderr), "\n") != 0 || !strings.Contains(r.Stderr, "sh") {
			t.Errorf("berth %s in an image without a shell: exit %d, stderr %q; want one line naming the missing shell", strings.Join(args, " "), r.Code, r.Stderr)
		}
	}
	// Still answering after the refusals.
	if out := e.OK("exec", "m1", "--", "/bin/hello"); out != "hello from musl\n" {
		t.Errorf("after the refusals: %q", out)
	}
	e.OK("delete", "m1", "--yes")
}

package engine

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/berthvm/berth/guest/image"
	"github.com/berthvm/berth/session"
)

func TestImageExecDefaults(t *testing.T) {
	for _, tt := range []struct {
		name string
		c    *image.Config
		want execDefaults
	}{
		{"none", nil, execDefaults{}},
		{"env", &image.Config{Env: []string{"PATH=/bin", "A=b=c", "EMPTY=", "bad", "=x"}},
			execDefaults{Env: map[string]string{"PATH": "/bin", "A": "b=c", "EMPTY": ""}}},
		{"workdir under /workspace", &image.Config{WorkingDir: "/workspace/app/"}, execDefaults{Cwd: "/workspace/app"}},
		{"workdir /workspace", &image.Config{WorkingDir: "/workspace"}, execDefaults{Cwd: "/workspace"}},
		{"workdir elsewhere", &image.Config{WorkingDir: "/app"}, execDefaults{}},
		{"workdir escaping", &image.Config{WorkingDir: "/workspace/../etc"}, execDefaults{}},
		{"workdir lookalike", &image.Config{WorkingDir: "/workspaces"}, execDefaults{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := imageExecDefaults(tt.c); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("imageExecDefaults(%+v) = %+v, want %+v", tt.c, got, tt.want)
			}
		})
	}
}

// The image's Env is under the command's own; its directory applies
// only when the command names none.
func TestWithImageDefaults(t *testing.T) {
	d := execDefaults{Env: map[string]string{"PATH": "/bin", "MODE": "image"}, Cwd: "/workspace/app"}
	got := withImageDefaults(session.ExecRequest{Argv: []string{"env"}, Env: map[string]string{"MODE": "mine"}}, d)
	if want := map[string]string{"PATH": "/bin", "MODE": "mine"}; !reflect.DeepEqual(got.Env, want) || got.Cwd != "/workspace/app" {
		t.Errorf("withImageDefaults = env %v cwd %q, want %v in /workspace/app", got.Env, got.Cwd, want)
	}
	if d.Env["MODE"] != "image" {
		t.Error("withImageDefaults changed the image's defaults")
	}
	if got := withImageDefaults(session.ExecRequest{Cwd: "/workspace/x"}, d); got.Cwd != "/workspace/x" {
		t.Errorf("a command's own directory became %q", got.Cwd)
	}
	if got := withImageDefaults(session.ExecRequest{}, execDefaults{}); got.Env != nil || got.Cwd != "" {
		t.Errorf("no defaults gave %+v", got)
	}
}

// What an import is refused for before anything is read, each with its
// class; and an imported build lists its source, digest and config.
func TestImportImageRefusals(t *testing.T) {
	m := newImageManager(t)
	ctx := t.Context()
	writeBuild(t, m, image.Image{Name: "tools", Digest: "t1", Source: "/recipes/tools.toml"}, true)
	tar := filepath.Join(t.TempDir(), "app.tar")
	os.WriteFile(tar, []byte("not read"), 0o644)
	for _, tt := range []struct {
		name  string
		req   session.ImportRequest
		class error
		want  string
	}{
		{"no name", session.ImportRequest{Source: tar}, session.ErrInvalid, "name is missing"},
		{"bad name", session.ImportRequest{Name: "App!", Source: tar}, session.ErrInvalid, "invalid image name"},
		{"no source", session.ImportRequest{Name: "app"}, session.ErrInvalid, "source is missing"},
		{"stdin without a stream", session.ImportRequest{Name: "app", Source: "-"}, session.ErrInvalid, "no stream"},
		{"relative", session.ImportRequest{Name: "app", Source: "app.tar"}, session.ErrInvalid, "relative"},
		{"missing", session.ImportRequest{Name: "app", Source: "/nonexistent/app.tar"}, session.ErrNotFound, "/nonexistent/app.tar cannot be read"},
		{"shipped name", session.ImportRequest{Name: "debian", Source: tar}, session.ErrExists, "berth's own"},
		{"a recipe's name", session.ImportRequest{Name: "tools", Source: tar}, session.ErrExists, "berth image rm tools"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := m.ImportImage(ctx, tt.req, nil, nil)
			if !errors.Is(err, tt.class) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("ImportImage = %v, want %v saying %q", err, tt.class, tt.want)
			}
		})
	}
	ents, _ := os.ReadDir(m.cfg.Images.Dir)
	for _, e := range ents {
		if e.Name() != "tools" && e.Name() != ".locks" {
			t.Errorf("a refused import left %s in the images directory", e.Name())
		}
	}

	writeBuild(t, m, image.Image{Name: "app", Digest: "a1", Source: "docker-archive:/srv/app.tar", SourceDigest: "sha256:0123",
		Layers: []image.Layer{{File: "layer-0.img", UUID: "u"}},
		Config: &image.Config{Env: []string{"A=1"}, User: "app", WorkingDir: "/workspace/src", UID: 1000, Home: "/home/app"}}, true)
	list, err := m.Images(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range list {
		if i.Name != "app" {
			continue
		}
		want := &session.ImageConfig{Env: []string{"A=1"}, User: "app", WorkingDir: "/workspace/src"}
		if i.Source != "docker-archive:/srv/app.tar" || i.SourceDigest != "sha256:0123" || !reflect.DeepEqual(i.Config, want) {
			b, _ := json.Marshal(i)
			t.Errorf("Images lists the import as %s", b)
		}
		return
	}
	t.Errorf("Images does not list the import: %+v", list)
}

// A session of an image whose config has Env and a WorkingDir under
// /workspace: the directory is made at create, commands start there with
// the image's variables under their own, and the record names only the
// caller's variables.
func TestImageConfigAppliedToCommands(t *testing.T) {
	m := newAgentManager(t, 0)
	ctx := t.Context()
	images := m.cfg.Images.Dir
	bdir := filepath.Join(images, "app", "a1")
	if err := os.MkdirAll(bdir, 0o755); err != nil {
		t.Fatal(err)
	}
	man, _ := json.Marshal(image.Image{Name: "app", Digest: "a1", Source: "rootfs:/srv/app.tar", SourceDigest: "sha256:aa",
		Config: &image.Config{Env: []string{"GREETING=from the image", "MODE=image", "PATH=/usr/bin:/bin"}, WorkingDir: "/workspace/src"}})
	for f, b := range map[string][]byte{"manifest.json": man, "vmlinuz": nil, "initramfs.cpio.gz": nil} {
		if err := os.WriteFile(filepath.Join(bdir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(images, "app", "current"), []byte("a1\n"), 0o644)
	if _, err := m.Create(ctx, session.CreateOptions{Name: "a", Image: "app"}); err != nil {
		t.Fatal(err)
	}
	p, err := m.Exec(ctx, "a", session.ExecRequest{Argv: []string{"/bin/sh", "-c", `echo "$GREETING|$MODE|$(pwd)"`}, Env: map[string]string{"MODE": "mine"}})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	for c := range p.Output() {
		out.Write(c.Data)
	}
	x, err := p.Wait(ctx)
	if err != nil || x.ExitCode == nil || *x.ExitCode != 0 {
		t.Fatalf("exec: %+v, %v", x, err)
	}
	got := strings.TrimSpace(out.String())
	if want := "from the image|mine|"; !strings.HasPrefix(got, want) || !strings.HasSuffix(got, "/src") {
		t.Errorf("the command printed %q, want %q and a directory ending in /src", got, want)
	}
	if x.Cwd != "/workspace/src" || !reflect.DeepEqual(x.EnvNames, []string{"MODE"}) {
		t.Errorf("recorded cwd %q, env names %v; want /workspace/src and [MODE]", x.Cwd, x.EnvNames)
	}
}

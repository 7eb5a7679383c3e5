package image

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeRecipe(t *testing.T, body string) string {
	t.Helper()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "hello.sh"), []byte("#!/bin/sh\necho hi\n"), 0o755)
	os.MkdirAll(filepath.Join(dir, "conf", "sub"), 0o750)
	os.WriteFile(filepath.Join(dir, "conf", "sub", "a.conf"), []byte("a=1\n"), 0o640)
	os.Symlink("sub/a.conf", filepath.Join(dir, "conf", "link"))
	p := filepath.Join(dir, "recipe.toml")
	os.WriteFile(p, []byte(body), 0o644)
	return p
}

func TestRecipeImageBase(t *testing.T) {
	tests := []struct {
		base, name string
		image      bool
	}{{"debian", "", false}, {"debian-minimal", "", false}, {"image:app", "app", true}}
	for _, tt := range tests {
		r := &Recipe{Name: "x", Base: tt.base}
		p, err := r.plan()
		if name, ok := r.imageBase(); name != tt.name || ok != tt.image || err != nil || p.base != tt.name {
			t.Errorf("base %q: imageBase %q %v, plan base %q (%v); want %q", tt.base, name, ok, p.base, err, tt.name)
		}
	}
}

func TestParseRecipe(t *testing.T) {
	for _, c := range []struct {
		name, body, err string
	}{
		{"ok", `name = "tools"
base = "debian"
packages = ["jq", "g++"]
files = { "hello.sh" = "/usr/local/bin/hello", "conf" = "/etc/tool" }
run = ["echo ok"]
step_timeout = "2m"
system_disk = "1G"`, ""},
		{"unknown key", "name = \"x\"\nbase = \"debian\"\npakages = [\"jq\"]\n", `unknown key "pakages"`},
		{"no name", "base = \"debian\"\n", "name is missing"},
		{"bad name", "name = \"Big_Name\"\nbase = \"debian\"\n", `invalid image name "Big_Name"`},
		{"mini", "name = \"mini\"\nbase = \"debian\"\n", `"mini" is berth's initramfs image`},
		{"no base", "name = \"x\"\n", "base is missing"},
		{"bad base", "name = \"x\"\nbase = \"alpine\"\n", `base "alpine": use debian`},
		{"bad package", "name = \"x\"\nbase = \"debian\"\npackages = [\"rm -rf\"]\n", `"rm -rf" is not a Debian package name`},
		{"image base", "name = \"x\"\nbase = \"image:app\"\nrun = [\"apk add jq\"]\n", ""},
		{"image base, bad name", "name = \"x\"\nbase = \"image:App\"\n", `base "image:App": invalid image name "App"`},
		{"image base, empty", "name = \"x\"\nbase = \"image:\"\n", `base "image:": invalid image name ""`},
		{"image base, mini", "name = \"x\"\nbase = \"image:mini\"\n", "mini has no root filesystem"},
		{"image base, itself", "name = \"x\"\nbase = \"image:x\"\n", "cannot be built on itself"},
		{"image base, packages", "name = \"x\"\nbase = \"image:app\"\npackages = [\"jq\"]\n", `run = ["apk add jq"]`},
		{"missing file", "name = \"x\"\nbase = \"debian\"\nfiles = { \"nope\" = \"/x\" }\n", `files: "nope"`},
		{"relative target", "name = \"x\"\nbase = \"debian\"\nfiles = { \"hello.sh\" = \"usr/x\" }\n", "must be absolute"},
		{"into workspace", "name = \"x\"\nbase = \"debian\"\nfiles = { \"hello.sh\" = \"/workspace/x\" }\n", "/workspace is the session's volume"},
		{"empty step", "name = \"x\"\nbase = \"debian\"\nrun = [\" \"]\n", "step 1 is empty"},
		{"bad timeout", "name = \"x\"\nbase = \"debian\"\nstep_timeout = \"0s\"\n", `step_timeout "0s"`},
		{"bad disk", "name = \"x\"\nbase = \"debian\"\nsystem_disk = \"10\"\n", `system_disk "10"`},
		{"fractional disk", "name = \"x\"\nbase = \"debian\"\nsystem_disk = \"1.5G\"\n", ""}, // as create --disk reads it
		{"disk of bytes", "name = \"x\"\nbase = \"debian\"\nsystem_disk = \"1.5\"\n", `system_disk "1.5": 1.5 is not a whole number of bytes`},
		{"not toml", "name = \n", "recipe.toml"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseRecipe(writeRecipe(t, c.body))
			switch {
			case c.err == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
				t.Fatalf("error %v, want one mentioning %q", err, c.err)
			}
		})
	}
}

func TestPlanLayers(t *testing.T) {
	r, err := ParseRecipe(writeRecipe(t, `name = "tools"
base = "debian"
files = { "hello.sh" = "/usr/local/bin/hello", "conf" = "/etc/tool" }
run = ["echo ok"]`))
	if err != nil {
		t.Fatal(err)
	}
	p, err := r.plan()
	if err != nil {
		t.Fatal(err)
	}
	deb, _ := ShippedRecipe("debian")
	dp, _ := deb.plan()
	if p.rootHash() != dp.rootHash() {
		t.Error("a recipe adding only files and steps to debian does not share debian's root layer")
	}
	if !p.setup() || dp.setup() {
		t.Errorf("setup layers: recipe %v, debian %v", p.setup(), dp.setup())
	}
	h1, _ := p.stepsHash(p.rootHash())
	os.WriteFile(filepath.Join(r.Dir, "hello.sh"), []byte("changed"), 0o755)
	h2, _ := p.stepsHash(p.rootHash())
	if h1 == h2 {
		t.Error("changing a file's content does not change the setup layer's hash")
	}
	p.net = "allow:pypi.org"
	if h3, _ := p.stepsHash(p.rootHash()); h3 == h2 {
		t.Error("the steps' network policy does not change the setup layer's hash")
	}
	p.net = ""

	b, err := filesTar(p.files)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*tar.Header{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got[h.Name] = h
	}
	for name, mode := range map[string]int64{"usr/local/bin/hello": 0o755, "etc/tool/": 0o750, "etc/tool/sub/a.conf": 0o640} {
		if h := got[name]; h == nil || h.Mode != mode {
			t.Errorf("files tar entry %s = %+v, want mode %o", name, h, mode)
		}
	}
	if h := got["etc/tool/link"]; h == nil || h.Linkname != "sub/a.conf" {
		t.Errorf("files tar symlink = %+v", h)
	}
}

func TestAptProgress(t *testing.T) {
	var got []Progress
	tr := &aptTracker{report: func(p Progress) { got = append(got, p) }}
	for _, l := range []string{
		"I: running apt-get update...",
		"0 upgraded, 2 newly installed, 0 to remove and 0 not upgraded.",
		"Need to get 1,234 kB of archives.",
		"Get:1 http://deb.debian.org/debian bookworm/main amd64 jq amd64 1.6-2.1 [135 kB]",
		"Get:2 http://deb.debian.org/debian bookworm/main amd64 libjq1 amd64 1.6-2.1 [1,099 kB]",
		"Unpacking jq (1.6-2.1) ...",
		"E: Unable to locate package nosuch",
		"I: something after",
	} {
		tr.line(l)
	}
	last := got[len(got)-1]
	if last.Phase != "unpack" || last.Done != 1 || last.Total != 2 {
		t.Errorf("last progress %+v", last)
	}
	var dl Progress
	for _, p := range got {
		if p.Phase == "download" {
			dl = p
		}
	}
	if dl.Done != 2 || dl.Bytes != 1234000 || dl.TotalBytes != 1234000 {
		t.Errorf("download progress %+v", dl)
	}
	if e := tr.aptError(); e != "Unable to locate package nosuch" {
		t.Errorf("apt error %q", e)
	}
}

package image

import (
	"math/big"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// FuzzRecipe parses arbitrary recipe files. Property: a recipe either
// fails, or every value it holds is within bounds: a valid image name
// that is not mini, a known base, Debian package names, image paths
// absolute, not / and not under /workspace, host paths that exist
// (relative ones inside the recipe's directory), non-blank steps, a step
// timeout of at least a second, and a system disk of at least 64 MiB
// that is exactly the size written (no overflow); its build plan then
// holds sorted, unique packages and the same bounds.
func FuzzRecipe(f *testing.F) {
	for _, s := range []string{
		"name = \"tools\"\nbase = \"debian\"\npackages = [\"jq\", \"g++\"]\nfiles = { \"hello.sh\" = \"/usr/local/bin/hello\", \"conf\" = \"/etc/tool\" }\nrun = [\"echo ok\"]\nstep_timeout = \"2m\"\nsystem_disk = \"1G\"",
		"name = \"x\"\nbase = \"debian-minimal\"\n",
		"name = \"x\"\nbase = \"image:app\"\nrun = [\"true\"]\n",
		"name = \"x\"\nbase = \"debian\"\nsystem_disk = \"16777217T\"\n",
		"name = \"x\"\nbase = \"debian\"\nsystem_disk = \"64m\"\nstep_timeout = \"1s\"\n",
		"name = \"x\"\nbase = \"debian\"\nfiles = { \"../../etc/passwd\" = \"/x\" }\n",
		"name = \"x\"\nbase = \"debian\"\nfiles = { \"hello.sh\" = \"/workspace/../etc/x\" }\n",
		"name = \"x\"\nbase = \"debian\"\nfiles = { \"hello.sh\" = \"//\" }\n",
		"name = \"x\"\nbase = \"debian\"\nrun = [\"\\t\"]\n",
		"name = \"x\"\nbase = \"debian\"\nnet = \"allow:pypi.org\"\npackages = [\"a\", \"a\", \"b0+\"]\n",
		"name = \"mini\"\nbase = \"debian\"\n",
		"[files]\n\"hello.sh\" = \"/a\"\n",
		"name = 1\n",
		"",
	} {
		f.Add(s)
	}
	dir := f.TempDir()
	os.WriteFile(filepath.Join(dir, "hello.sh"), []byte("#!/bin/sh\n"), 0o755)
	os.MkdirAll(filepath.Join(dir, "conf", "sub"), 0o755)
	f.Fuzz(func(t *testing.T, text string) {
		for _, d := range []string{"", dir} {
			r, err := parseRecipe("fuzz.toml", d, []byte(text))
			if err != nil {
				if r != nil {
					t.Fatalf("an error with a recipe: %v", err)
				}
				continue
			}
			checkRecipe(t, r, text)
		}
	})
}

func checkRecipe(t *testing.T, r *Recipe, text string) {
	t.Helper()
	if ValidateName(r.Name) != nil || r.Name == "mini" {
		t.Fatalf("%q: name %q", text, r.Name)
	}
	if base, ok := strings.CutPrefix(r.Base, "image:"); ok {
		if ValidateName(base) != nil || base == "mini" || base == r.Name || len(r.Packages) > 0 {
			t.Fatalf("%q: image base %q accepted", text, r.Base)
		}
	} else if r.Base != "debian" && r.Base != "debian-minimal" {
		t.Fatalf("%q: base %q", text, r.Base)
	}
	for _, p := range r.Packages {
		if !packageRE.MatchString(p) {
			t.Fatalf("%q: package %q", text, p)
		}
	}
	for src, dst := range r.Files {
		c := path.Clean(dst)
		if src == "" || !path.IsAbs(dst) || c == "/" || c == "/workspace" || strings.HasPrefix(c, "/workspace/") || strings.Contains(dst, "\x00") {
			t.Fatalf("%q: files %q → %q", text, src, dst)
		}
		if r.Dir != "" {
			if _, err := os.Lstat(r.hostPath(src)); err != nil {
				t.Fatalf("%q: host file %q accepted: %v", text, src, err)
			}
		}
	}
	for _, s := range r.Run {
		if strings.TrimSpace(s) == "" {
			t.Fatalf("%q: a blank step", text)
		}
	}
	if r.Timeout() < time.Second {
		t.Fatalf("%q: step timeout %v", text, r.Timeout())
	}
	size := r.systemBytes()
	if size < 64<<20 {
		t.Fatalf("%q: system disk of %d bytes", text, size)
	}
	if r.SystemDisk != "" {
		if want := bigSize(r.SystemDisk); want == nil || want.Cmp(big.NewInt(size)) != 0 {
			t.Fatalf("%q: system_disk %q is %d bytes, written %v", text, r.SystemDisk, size, want)
		}
	}
	p, err := r.plan()
	if err != nil {
		t.Fatalf("%q: a valid recipe without a plan: %v", text, err)
	}
	if !slices.IsSorted(p.packages) || len(slices.Compact(slices.Clone(p.packages))) != len(p.packages) {
		t.Fatalf("%q: plan packages %q", text, p.packages)
	}
	for _, pk := range r.Packages {
		if !slices.Contains(p.packages, pk) {
			t.Fatalf("%q: package %q missing from the plan", text, pk)
		}
	}
	if p.system != size || p.timeout != r.Timeout() || len(p.files) != len(r.Files) {
		t.Fatalf("%q: plan %+v differs from the recipe", text, p)
	}
}

// bigSize is a size as written (a decimal number and a K, M, G or T
// suffix), computed without overflow.
func bigSize(s string) *big.Int {
	// The size grammar of create --disk (session.ParseSize), computed
	// exactly: a decimal number, an optional K, M, G or T, an optional
	// B or iB.
	m := regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)(?:i?b)?$`).FindStringSubmatch(strings.ToLower(strings.TrimSpace(s)))
	if m == nil {
		return nil
	}
	v, ok := new(big.Rat).SetString(m[1])
	if !ok {
		return nil
	}
	shift := map[string]uint{"": 0, "k": 10, "m": 20, "g": 30, "t": 40}[m[2]]
	v.Mul(v, new(big.Rat).SetInt(new(big.Int).Lsh(big.NewInt(1), shift)))
	if !v.IsInt() {
		return nil
	}
	return v.Num()
}

package oci

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// rawLayer is a layer blob written as it is, whatever it holds.
type rawLayer struct {
	mt     string // default tar
	blob   []byte
	diffID string // default: the blob's digest
	digest string // in the manifest; default the blob's
	size   int64  // in the manifest; default the blob's
}

// rawImage writes an OCI layout by hand, so a test can make it wrong
// in any one way.
type rawImage struct {
	layers   []rawLayer
	arch     string
	user     string
	platform *Platform // on the index's descriptor
}

func writeJSON(t testing.TB, dir string, v any) (Descriptor, []byte) {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	d := Descriptor{Digest: sha256Digest(b), Size: int64(len(b))}
	writeBlob(t, dir, d.Digest, b)
	return d, b
}

func writeBlob(t testing.TB, dir, digest string, b []byte) {
	p := filepath.Join(dir, blobPath(digest))
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func (r rawImage) write(t testing.TB, dir string) string {
	t.Helper()
	os.MkdirAll(dir, 0o755)
	os.WriteFile(filepath.Join(dir, "oci-layout"), []byte(`{"imageLayoutVersion":"1.0.0"}`), 0o644)
	arch := r.arch
	if arch == "" {
		arch = "amd64"
	}
	cfg := map[string]any{"architecture": arch, "os": "linux", "config": map[string]any{"User": r.user}}
	var diffIDs []string
	var layers []Descriptor
	for _, l := range r.layers {
		digest := sha256Digest(l.blob)
		writeBlob(t, dir, digest, l.blob)
		d := Descriptor{MediaType: l.mt, Digest: digest, Size: int64(len(l.blob))}
		if d.MediaType == "" {
			d.MediaType = mtOCILayer
		}
		if l.digest != "" {
			d.Digest = l.digest
			writeBlob(t, dir, l.digest, l.blob)
		}
		if l.size != 0 {
			d.Size = l.size
		}
		diff := l.diffID
		if diff == "" {
			diff = digest
		}
		diffIDs = append(diffIDs, diff)
		layers = append(layers, d)
	}
	if layers == nil {
		layers = []Descriptor{}
	}
	if diffIDs == nil {
		diffIDs = []string{}
	}
	cfg["rootfs"] = map[string]any{"type": "layers", "diff_ids": diffIDs}
	cd, _ := writeJSON(t, dir, cfg)
	cd.MediaType = mtOCIConfig
	md, _ := writeJSON(t, dir, manifest{SchemaVersion: 2, MediaType: mtOCIManifest, Config: cd, Layers: layers})
	md.MediaType = mtOCIManifest
	md.Platform = r.platform
	b, _ := json.Marshal(index{SchemaVersion: 2, MediaType: mtOCIIndex, Manifests: []Descriptor{md}})
	os.WriteFile(filepath.Join(dir, "index.json"), b, 0o644)
	return dir
}

func tarLayers(t testing.TB, layers ...[]byte) []rawLayer {
	var out []rawLayer
	for _, l := range layers {
		out = append(out, rawLayer{blob: l})
	}
	return out
}

// Every bad input is refused in one line naming its cause, leaves
// nothing under a final name, and writes nothing outside the images
// directory: a canary directory beside it, which the layers try to
// reach, stays as it was.
func TestBadInput(t *testing.T) {
	needRoot(t)
	const out = "../../../../../../../../canary" // from the stage, past the images directory
	big := strings.Repeat("x", 2<<20)
	base := layerTar(t, dir("etc/", 0o755), file("etc/passwd", 0o644, passwd))
	cases := []struct {
		name string
		img  rawImage
		free int64 // bytes FreeSpace reports; 0: the real ones
		want string
	}{
		{"truncated tar", rawImage{layers: []rawLayer{{blob: layerTar(t, file("f", 0o644, big))[:1<<20]}}}, 0, "truncated"},
		{"truncated gzip", rawImage{layers: []rawLayer{{mt: mtOCILayerGzip, blob: gzipBytes(base)[:40], diffID: sha256Digest(base)}}}, 0, "truncated"},
		{"not gzip", rawImage{layers: []rawLayer{{mt: mtOCILayerGzip, blob: base, diffID: sha256Digest(base)}}}, 0, "gzip"},
		{"digest mismatch", rawImage{layers: []rawLayer{{blob: base, digest: sha256Digest([]byte("other"))}}}, 0, "does not match its digest"},
		{"diff id mismatch", rawImage{layers: []rawLayer{{blob: base, diffID: sha256Digest([]byte("other"))}}}, 0, "image config says"},
		{"size mismatch", rawImage{layers: []rawLayer{{blob: base, size: 99}}}, 0, "the manifest says 99"},
		{"path with ..", rawImage{layers: tarLayers(t, layerTar(t, file("a/../"+out+"/x", 0o644, "x")))}, 0, `".." component`},
		{"whiteout with ..", rawImage{layers: tarLayers(t, base, layerTar(t, wh(out+"/.wh.file")))}, 0, `".." component`},
		{"whiteout through an escaping symlink", rawImage{layers: tarLayers(t, layerTar(t, sym("up", out+"/..")), layerTar(t, wh("up/canary/.wh.file")))}, 0, "outside the image's root"},
		{"hard link with ..", rawImage{layers: tarLayers(t, layerTar(t, hard("x", out+"/file")))}, 0, `".." component`},
		{"hard link through an escaping symlink", rawImage{layers: tarLayers(t, layerTar(t, sym("up", out+"/.."), hard("x", "up/canary/file")))}, 0, "outside the image's root"},
		{"hard link to a missing file", rawImage{layers: tarLayers(t, layerTar(t, hard("x", "nowhere")))}, 0, "does not have"},
		{"symlink chain escaping", rawImage{layers: tarLayers(t, layerTar(t, dir("c/", 0o755), sym("b", "c/../../../.."), sym("a", "b"), file("a/canary/file", 0o644, "pwned")))}, 0, "outside the image's root"},
		{"absolute symlink climbing out", rawImage{layers: tarLayers(t, layerTar(t, sym("abs", "/.."), file("abs/canary/file", 0o644, "pwned")))}, 0, "outside the image's root"},
		{"symlink loop", rawImage{layers: tarLayers(t, layerTar(t, sym("a", "b"), sym("b", "a"), file("a/x", 0o644, "x")))}, 0, "too many levels of symlinks"},
		{"file as a directory", rawImage{layers: tarLayers(t, layerTar(t, file("f", 0o644, "f"), file("f/x", 0o644, "x")))}, 0, "not a directory"},
		{"empty whiteout", rawImage{layers: tarLayers(t, layerTar(t, wh("etc/.wh.")))}, 0, "names no file"},
		{"no layers", rawImage{}, 0, "no layers"},
		{"all layers empty", rawImage{layers: tarLayers(t, make([]byte, 1024))}, 0, "all empty"},
		{"other architecture", rawImage{layers: tarLayers(t, base), arch: "arm64"}, 0, "linux/arm64"},
		{"other platform in the index", rawImage{layers: tarLayers(t, base), platform: &Platform{OS: "linux", Architecture: "arm", Variant: "v7"}}, 0, "only linux/arm/v7"},
		{"unknown media type", rawImage{layers: []rawLayer{{mt: "application/vnd.example.layer.v1.squashfs", blob: base}}}, 0, `"application/vnd.example.layer.v1.squashfs"`},
		{"user missing", rawImage{layers: tarLayers(t, base), user: "nobody"}, 0, `user "nobody"`},
		{"layer bigger than the free space", rawImage{layers: []rawLayer{{mt: mtOCILayerGzip, blob: gzipBytes(layerTar(t, file("big", 0o644, big)))}}}, reserve + 1<<20, "unpacks to more than the data filesystem"},
		{"blobs bigger than the free space", rawImage{layers: tarLayers(t, layerTar(t, file("big", 0o644, big)))}, reserve + 1<<20, "keeps its layers' blobs (2.1 MB, for export)"},
		{"image bigger than the free space", rawImage{layers: tarLayers(t, layerTar(t, file("big", 0o644, big)))}, reserve + 3<<20, "MB free: nothing was written"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			top := t.TempDir()
			canary := filepath.Join(top, "canary")
			os.MkdirAll(canary, 0o755)
			os.WriteFile(filepath.Join(canary, "file"), []byte("canary"), 0o644)
			before := snapshot(t, canary)
			src := c.img.write(t, filepath.Join(top, "src"))
			images := filepath.Join(top, "images")
			o, _ := options(images, src)
			if c.free > 0 {
				o.FreeSpace = func(string) (int64, error) { return c.free, nil }
			}
			l, err := Read(t.Context(), o)
			if err == nil {
				l.Release()
				t.Fatalf("imported %+v, want it refused", l.Image)
			}
			msg := err.Error()
			t.Log(msg)
			if !strings.Contains(msg, c.want) || strings.Contains(msg, "\n") {
				t.Errorf("error %q, want one line naming %q", msg, c.want)
			}
			if after := snapshot(t, canary); after != before {
				t.Errorf("the canary beside the images directory changed:\n%s\nwas:\n%s", after, before)
			}
			ents, _ := os.ReadDir(top)
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			if !slices.Equal(names, []string{"canary", "images", "src"}) {
				t.Errorf("the test directory holds %v", names)
			}
			if left := finalNames(t, images); len(left) > 0 {
				t.Errorf("left under final names: %v", left)
			}
		})
	}
}

// A symlink that stays inside the image is followed as the guest would:
// an absolute one from the image's root.
func TestSymlinkInside(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	img := rawImage{layers: tarLayers(t,
		layerTar(t, dir0("etc/"), sym("e", "/etc"), sym("up", "etc/.."), file("e/a", 0o644, "a")),
		layerTar(t, file("up/etc/b", 0o644, "b"), file("e/c", 0o644, "c")),
	)}
	o, _ := options(filepath.Join(dir, "images"), img.write(t, filepath.Join(dir, "src")))
	l := read(t, o)
	tree := mergedTree(t, l.Image)
	for _, want := range []string{"/etc/a f 0644 0:0 " + hashOf("a"), "/etc/b f 0644 0:0 " + hashOf("b"), "/etc/c f 0644 0:0 " + hashOf("c")} {
		if !slices.Contains(tree, want) {
			t.Errorf("tree lacks %q: %v", want, tree)
		}
	}
}

func dir0(name string) ent { return dir(name, 0o755) }

package oci

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/berthvm/berth/guest/image"
)

// exportTo plans and writes an export of im into file, checking the
// plan's size is what was written.
func exportTo(t *testing.T, im image.Image, images, file string) *Export {
	t.Helper()
	log := &progressLog{}
	e, err := PlanExport(t.Context(), ExportOptions{Image: im, ImagesDir: images, Report: log.report})
	if err != nil {
		t.Fatalf("plan the export of %s: %v", im.Name, err)
	}
	defer e.Close()
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := e.WriteTo(t.Context(), f); err != nil {
		t.Fatalf("export %s: %v", im.Name, err)
	}
	if fi, _ := f.Stat(); fi.Size() != e.Size {
		t.Errorf("export wrote %d bytes, planned %d", fi.Size(), e.Size)
	}
	if log.phases()["export"] == 0 {
		t.Errorf("the export reported no progress: %v", log.phases())
	}
	return e
}

// stripBlobs is im as a build that kept no blobs: every layer is
// written from its ext4 image.
func stripBlobs(im image.Image, keepConfig bool) image.Image {
	im.Layers = slices.Clone(im.Layers)
	for i := range im.Layers {
		im.Layers[i].Blobs = nil
	}
	im.ManifestBlob = ""
	if !keepConfig {
		im.ConfigBlob, im.Config = "", nil
	}
	return im
}

func blobDigestsOf(im image.Image) []string {
	var out []string
	for _, l := range im.Layers {
		for _, b := range l.Blobs {
			out = append(out, b.Digest+" "+b.DiffID)
		}
	}
	return out
}

func layerHashes(im image.Image) []string {
	var out []string
	for _, l := range im.Layers {
		out = append(out, l.Hash)
	}
	return out
}

// TestExportRoundTrip: an imported image exports as it came (the same
// manifest, so the same digests), whether its layers were merged or
// not; exported twice it is the same bytes; the export imports back to
// the same berth layers (the same ChainIDs) and the exact tree.
func TestExportRoundTrip(t *testing.T) {
	needRoot(t)
	for _, maxLayers := range []int{0, 2} {
		t.Run(map[int]string{0: "a berth layer per layer", 2: "merged layers"}[maxLayers], func(t *testing.T) {
			dir := t.TempDir()
			o, _ := options(filepath.Join(dir, "images"), writeLayout(t, filepath.Join(dir, "layout"), threeLayers(t, true).image(t)))
			o.MaxLayers = maxLayers
			orig := read(t, o).Image
			if n := len(blobDigestsOf(orig)); n != 3 {
				t.Fatalf("the import kept %d layer blobs, want 3", n)
			}
			if left := blobTemps(o.ImagesDir); len(left) > 0 {
				t.Errorf("the import left blobs being kept: %v", left)
			}
			out1, out2 := filepath.Join(dir, "out1.tar"), filepath.Join(dir, "out2.tar")
			e := exportTo(t, orig, o.ImagesDir, out1)
			exportTo(t, orig, o.ImagesDir, out2)
			b1, _ := os.ReadFile(out1)
			b2, _ := os.ReadFile(out2)
			if !bytes.Equal(b1, b2) {
				t.Error("two exports of the same image differ")
			}
			if e.Manifest != orig.SourceDigest {
				t.Errorf("exported manifest %s, the source's was %s: the image's digests changed", e.Manifest, orig.SourceDigest)
			}
			if len(e.Layers) != 3 || slices.ContainsFunc(e.Layers, func(l ExportLayer) bool { return l.Made }) {
				t.Errorf("exported layers %+v, want the 3 imported blobs", e.Layers)
			}
			o2, _ := options(filepath.Join(dir, "images2"), out1)
			o2.MaxLayers = maxLayers
			back := read(t, o2).Image
			if !slices.Equal(layerHashes(back), layerHashes(orig)) || !slices.Equal(blobDigestsOf(back), blobDigestsOf(orig)) || back.SourceDigest != orig.SourceDigest {
				t.Errorf("export → import: layers %v blobs %v digest %s; the original import had %v %v %s",
					layerHashes(back), blobDigestsOf(back), back.SourceDigest, layerHashes(orig), blobDigestsOf(orig), orig.SourceDigest)
			}
			if got := mergedTree(t, back); !slices.Equal(got, wantTree()) {
				t.Errorf("tree differs:\n%s", diffLines(got, wantTree()))
			}
		})
	}
}

// TestExportMadeLayers: layers berth made (no blobs kept, as debian's)
// are written from their ext4 images: whiteouts and opaque directories
// become .wh. entries again, and the export imports to the exact tree,
// with or without a config of the image's own; exported twice, the same
// bytes; its import exported again, the same bytes once more.
func TestExportMadeLayers(t *testing.T) {
	needRoot(t)
	for _, c := range []struct {
		name       string
		maxLayers  int
		keepConfig bool
	}{{"three layers, no config", 0, false}, {"merged layers, the imported config", 2, true}, {"one layer", 1, false}} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			o, _ := options(filepath.Join(dir, "images"), writeLayout(t, filepath.Join(dir, "layout"), threeLayers(t, false).image(t)))
			o.MaxLayers = c.maxLayers
			made := stripBlobs(read(t, o).Image, c.keepConfig)
			out1, out2 := filepath.Join(dir, "out1.tar"), filepath.Join(dir, "out2.tar")
			e := exportTo(t, made, o.ImagesDir, out1)
			exportTo(t, made, o.ImagesDir, out2)
			b1, _ := os.ReadFile(out1)
			b2, _ := os.ReadFile(out2)
			if !bytes.Equal(b1, b2) {
				t.Error("two exports of the same layers differ")
			}
			if len(e.Layers) != len(made.Layers) || slices.ContainsFunc(e.Layers, func(l ExportLayer) bool { return !l.Made }) {
				t.Errorf("exported layers %+v, want %d made from ext4", e.Layers, len(made.Layers))
			}
			for _, l := range e.Layers {
				if l.Digest != l.DiffID || l.MediaType != mtOCILayer {
					t.Errorf("made layer %+v: want a plain tar", l)
				}
			}
			o2, _ := options(filepath.Join(dir, "images2"), out1)
			o2.MaxLayers = c.maxLayers
			back := read(t, o2).Image
			if got := mergedTree(t, back); !slices.Equal(got, wantTree()) {
				t.Errorf("tree differs:\n%s", diffLines(got, wantTree()))
			}
			if c.keepConfig != (back.Config != nil && back.Config.User == "app") {
				t.Errorf("config %+v after the round trip", back.Config)
			}
			// The re-import keeps the made layers as blobs: exported
			// again, the same bytes.
			out3 := filepath.Join(dir, "out3.tar")
			exportTo(t, back, o2.ImagesDir, out3)
			if b3, _ := os.ReadFile(out3); !bytes.Equal(b1, b3) {
				t.Error("export → import → export changed the bytes")
			}
		})
	}
}

// TestExportRefused: an image without layers (mini) is refused in one
// line saying why; a layer that is not a berth layer too.
func TestExportRefused(t *testing.T) {
	_, err := PlanExport(context.Background(), ExportOptions{Image: image.Image{Name: "mini"}})
	if err == nil || !strings.Contains(err.Error(), "initramfs") || strings.Contains(err.Error(), "\n") {
		t.Errorf("export of mini: %v, want one line saying its root is the initramfs", err)
	}
	bogus := filepath.Join(t.TempDir(), "layer.img")
	os.WriteFile(bogus, bytes.Repeat([]byte{0}, 8192), 0o644)
	_, err = PlanExport(context.Background(), ExportOptions{Image: image.Image{Name: "x", Layers: []image.Layer{{Path: bogus}}}})
	if err == nil || !strings.Contains(err.Error(), "not an ext2/3/4") {
		t.Errorf("export of a layer that is no filesystem: %v", err)
	}
}

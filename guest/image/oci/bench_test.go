package oci

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/berthvm/berth/guest/image"
)

// benchLayers makes n layers of about size bytes each, of files that
// compress as programs do (about 3:1).
func benchLayers(b testing.TB, n int, size int) [][]byte {
	rng := rand.New(rand.NewPCG(1, 2))
	words := make([][]byte, 256)
	for i := range words {
		w := make([]byte, 4+rng.IntN(12))
		for j := range w {
			w[j] = byte(rng.IntN(256))
		}
		words[i] = w
	}
	var layers [][]byte
	for l := range n {
		ents := []ent{dir(fmt.Sprintf("l%d/", l), 0o755)}
		for f := 0; f*64<<10 < size; f++ {
			body := make([]byte, 0, 64<<10)
			for len(body) < 64<<10 {
				body = append(body, words[rng.IntN(len(words))]...)
			}
			ents = append(ents, file(fmt.Sprintf("l%d/f%d", l, f), 0o644, string(body[:64<<10])))
		}
		layers = append(layers, layerTar(b, ents...))
	}
	return layers
}

// BenchmarkImport imports a five-layer image (BERTH_BENCH_MB, default
// 100 MB unpacked) and compares it with unpacking the same layers with
// tar and making each an ext4 layer by hand: the ratio is what the
// import's checks cost (issue 27 asks at most 1.3). A re-import, all
// layers cached, is timed too.
func BenchmarkImport(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	mb := 100
	if s := os.Getenv("BERTH_BENCH_MB"); s != "" {
		mb, _ = strconv.Atoi(s)
	}
	layers := benchLayers(b, 5, mb<<20/5)
	dir := b.TempDir()
	src := writeLayout(b, filepath.Join(dir, "layout"), imageSpec{layers: layers, gzip: true}.image(b))
	gz := make([]string, len(layers))
	for i, l := range layers {
		gz[i] = filepath.Join(dir, fmt.Sprintf("layer%d.tar.gz", i))
		os.WriteFile(gz[i], gzipBytes(l), 0o644)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		// By hand: tar -x, then mkfs.ext4 -d, each layer.
		start := time.Now()
		for j, f := range gz {
			tree := filepath.Join(dir, fmt.Sprintf("hand%d-%d", i, j))
			os.MkdirAll(filepath.Join(tree, "upper"), 0o755)
			if out, err := exec.Command("tar", "-xzf", f, "-C", filepath.Join(tree, "upper")).CombinedOutput(); err != nil {
				b.Fatalf("tar: %v: %s", err, out)
			}
			if _, err := image.MakeLayer(b.Context(), tree, tree+".img", image.NewUUID()); err != nil {
				b.Fatal(err)
			}
			os.RemoveAll(tree)
			os.Remove(tree + ".img")
		}
		hand := time.Since(start)

		images := filepath.Join(dir, fmt.Sprintf("images%d", i))
		start = time.Now()
		l, err := Read(b.Context(), Options{Name: "bench", Source: src, ImagesDir: images})
		if err != nil {
			b.Fatal(err)
		}
		l.Release()
		imp := time.Since(start)
		start = time.Now()
		l, err = Read(b.Context(), Options{Name: "bench", Source: src, ImagesDir: images})
		if err != nil {
			b.Fatal(err)
		}
		l.Release()
		again := time.Since(start)
		os.RemoveAll(images)
		b.ReportMetric(imp.Seconds(), "import-s")
		b.ReportMetric(hand.Seconds(), "by-hand-s")
		b.ReportMetric(imp.Seconds()/hand.Seconds(), "ratio")
		b.ReportMetric(again.Seconds(), "reimport-s")
	}
}

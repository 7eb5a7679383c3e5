package oci

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// FuzzParseJSON feeds one input to every parser of a source's JSON.
// Property: nothing panics, and whatever is accepted keeps the bounds
// and checks the importer relies on.
func FuzzParseJSON(f *testing.F) {
	f.Add([]byte(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:` + strings.Repeat("a", 64) + `","size":7,"platform":{"architecture":"amd64","os":"linux"}}]}`))
	f.Add([]byte(`{"schemaVersion":2,"config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:` + strings.Repeat("b", 64) + `","size":2},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:` + strings.Repeat("c", 64) + `","size":3}]}`))
	f.Add([]byte(`{"architecture":"amd64","os":"linux","config":{"Env":["A=1"],"User":"app:app","WorkingDir":"/w"},"rootfs":{"type":"layers","diff_ids":["sha256:` + strings.Repeat("d", 64) + `"]}}`))
	f.Add([]byte(`[{"Config":"x.json","RepoTags":["app:1"],"Layers":["a/layer.tar"]}]`))
	f.Add([]byte(`{"schemaVersion":2,"layers":[]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > maxJSON {
			return
		}
		if ix, err := parseIndex(b); err == nil {
			if len(ix.Manifests) > maxIndexSize {
				t.Fatalf("index of %d entries accepted", len(ix.Manifests))
			}
			for _, d := range ix.Manifests {
				if _, _, err := parseDigest(d.Digest); err != nil || d.Size < 0 {
					t.Fatalf("descriptor %+v accepted", d)
				}
			}
		}
		if m, err := parseManifest(b); err == nil {
			if len(m.Layers) == 0 || len(m.Layers) > maxLayers {
				t.Fatalf("manifest of %d layers accepted", len(m.Layers))
			}
			for _, l := range m.Layers {
				if _, err := layerCompression(l.MediaType); err != nil {
					t.Fatalf("layer media type %q accepted", l.MediaType)
				}
				if blobPath(l.Digest) != path2(l.Digest) {
					t.Fatalf("digest %q makes blob path %q", l.Digest, blobPath(l.Digest))
				}
			}
		}
		if c, err := parseConfig(b, -1); err == nil {
			if c.OS != "linux" || c.Architecture != "amd64" || len(c.RootFS.DiffIDs) == 0 {
				t.Fatalf("config %+v accepted", c)
			}
			for _, e := range c.Config.Env {
				if !strings.Contains(e, "=") || strings.ContainsRune(e, 0) {
					t.Fatalf("env %q accepted", e)
				}
			}
		}
		if ms, err := parseDockerManifest(b); err == nil {
			for _, m := range ms {
				if len(m.Layers) == 0 || len(m.Layers) > maxLayers {
					t.Fatalf("docker manifest of %d layers accepted", len(m.Layers))
				}
			}
		}
	})
}

// path2 is what a checked digest's blob path must be: two plain
// components under blobs/.
func path2(d string) string {
	alg, h, _ := strings.Cut(d, ":")
	if strings.ContainsAny(alg+h, "/.") {
		return ""
	}
	return "blobs/" + alg + "/" + h
}

// FuzzParseEntry checks the one function every tar entry's path goes
// through. Property: an accepted path has no "..", no empty or "."
// component, nothing over the length limits, and a whiteout names a
// file.
func FuzzParseEntry(f *testing.F) {
	for _, s := range []struct {
		name, link string
		typ        byte
	}{
		{"etc/passwd", "", tar.TypeReg}, {"./bin/", "", tar.TypeDir}, {"/abs/x", "", tar.TypeReg},
		{"a/../b", "", tar.TypeReg}, {"x/.wh.y", "", tar.TypeReg}, {"x/.wh..wh..opq", "", tar.TypeReg},
		{".wh..wh.plnk/1", "", tar.TypeReg}, {"h", "../etc/passwd", tar.TypeLink}, {"s", "/", tar.TypeSymlink},
		{"x/.wh.", "", tar.TypeReg}, {"d", "", tar.TypeChar}, {"", "", tar.TypeReg},
	} {
		f.Add(s.name, s.link, s.typ, int64(0o644))
	}
	f.Fuzz(func(t *testing.T, name, link string, typ byte, mode int64) {
		e, err := parseEntry(&tar.Header{Name: name, Linkname: link, Typeflag: typ, Mode: mode, Size: 0})
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %q is not one line", err)
			}
			return
		}
		check := func(parts []string) {
			n := 0
			for _, p := range parts {
				if p == "" || p == "." || p == ".." || strings.ContainsAny(p, "/\x00") || len(p) > maxName {
					t.Fatalf("%q: component %q accepted", name, p)
				}
				n += len(p) + 1
			}
			if n > maxPath+1 {
				t.Fatalf("%q: path of %d accepted", name, n)
			}
		}
		check(e.parts)
		check(e.link)
		if e.op == opWhiteout && len(e.parts) == 0 {
			t.Fatalf("%q: whiteout of the root accepted", name)
		}
		if e.op == opWrite && len(e.parts) == 0 && e.kind != kindDir {
			t.Fatalf("%q: root replaced by kind %q", name, e.kind)
		}
		if e.kind == kindHardlink && len(e.link) == 0 {
			t.Fatalf("%q: hard link to the root accepted", name)
		}
	})
}

// FuzzApplyLayer applies arbitrary bytes as a layer over a small base.
// Properties: nothing is written outside the stage (a canary beside it
// stays as it was); the view and the stage agree (every path the view
// holds is in the stage, of its kind); and the layer's index, replayed
// over the base, gives the view the application gave.
func FuzzApplyLayer(f *testing.F) {
	if os.Geteuid() != 0 {
		f.Skip("applying layers keeps owners and device nodes: needs root")
	}
	f.Add(layerTar(f, file("etc/x", 0o644, "x"), wh("etc/.wh.passwd"), sym("l", "etc"), file("l/y", 0o600, "y")))
	f.Add(layerTar(f, dir("d/", 0o755), wh("d/.wh..wh..opq"), file("d/a", 0o644, "a"), hard("d/b", "d/a")))
	f.Add(layerTar(f, sym("up", "../../.."), file("up/canary/x", 0o644, "x")))
	f.Add(layerTar(f, wh(".wh..wh..opq"), dir("etc/", 0o700), file("etc/z", 0o644, "z")))
	f.Add(layerTar(f, file("etc", 0o644, "now a file"), dir("etc/", 0o755), ent{name: "dev/c", typ: tar.TypeChar, mode: 0o600, major: 4, minor: 1}))
	f.Add(layerTar(f, hard("h", "etc/passwd"), wh("etc/.wh.passwd"), sym("etc/passwd", "/h")))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 1<<20 {
			return
		}
		top := t.TempDir()
		canary := filepath.Join(top, "canary")
		os.MkdirAll(filepath.Join(canary, "sub"), 0o755)
		os.WriteFile(filepath.Join(canary, "file"), []byte("canary"), 0o644)
		before := snapshot(t, canary)

		// The base, as an index replayed (as a cached layer is).
		v := newView(10000)
		base := []indexEntry{{Path: "", Kind: "d", Mode: 0o755}, {Path: "etc", Kind: "d", Mode: 0o755}, {Path: "etc/passwd", Kind: "f", Mode: 0o644, Size: 5},
			{Path: "bin", Kind: "l", Link: "usr/bin"}, {Path: "usr", Kind: "d", Mode: 0o755}, {Path: "usr/bin", Kind: "d", Mode: 0o755}, {Path: "tmp", Kind: "d", Mode: 0o1777}}
		if err := replayIndex(bytes.NewReader(indexBytes(t, base)), v, 0); err != nil {
			t.Fatal(err)
		}
		upper := filepath.Join(top, "stage", "tree", "upper")
		os.MkdirAll(upper, 0o755)
		st, err := openStage(upper)
		if err != nil {
			t.Fatal(err)
		}
		defer st.close()
		a := newApplier(v, st, 1)
		a.lower = func(ctx context.Context, group int, real []string, dst io.Writer) error {
			_, err := dst.Write([]byte("lower"))
			return err
		}
		l := &layerRef{n: 1, of: 1, size: int64(len(b)), comp: uncompressed,
			open: func() (io.ReadCloser, int64, error) { return io.NopCloser(bytes.NewReader(b)), int64(len(b)), nil }}
		s, err := openLayer(l, 4<<20)
		if err != nil {
			t.Fatal(err)
		}
		err = a.apply(t.Context(), s, func(int64) {})
		s.Close()
		if after := snapshot(t, canary); after != before {
			t.Fatalf("the canary changed:\n%s", after)
		}
		if ents, _ := os.ReadDir(filepath.Join(top, "stage", "tree")); len(ents) != 1 {
			t.Fatalf("the stage's parent holds %d entries", len(ents))
		}
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %q is not one line", err)
			}
			return
		}
		if err := a.endGroup(); err != nil {
			t.Fatal(err)
		}
		agree(t, v.root, nil, upper, 1)
		idx := filepath.Join(top, "index.gz")
		if _, err := writeIndex(upper, idx); err != nil {
			t.Fatal(err)
		}
		again := newView(10000)
		replayIndex(bytes.NewReader(indexBytes(t, base)), again, 0)
		ib, _ := os.ReadFile(idx)
		if err := replayIndex(bytes.NewReader(ib), again, 1); err != nil {
			t.Fatal(err)
		}
		if got, want := dumpView(again.root, ""), dumpView(v.root, ""); !slices.Equal(got, want) {
			t.Fatalf("replayed index gives\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	})
}

func indexBytes(t testing.TB, es []indexEntry) []byte {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	for _, e := range es {
		j, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(zw, "%s\n", j)
	}
	zw.Close()
	return b.Bytes()
}

// agree checks that every node the view says this group holds is in
// the stage as that kind.
func agree(t *testing.T, n *node, real []string, upper string, group int) {
	for _, k := range n.sortedKids() {
		c := n.kids[k]
		p := append(real[:len(real):len(real)], k)
		if c.group == group {
			var st unix.Stat_t
			if err := unix.Lstat(filepath.Join(upper, filepath.Join(p...)), &st); err != nil {
				t.Fatalf("the view holds %q (%c), the stage does not: %v", strings.Join(p, "/"), c.kind, err)
			}
			kinds := map[uint32]byte{unix.S_IFDIR: kindDir, unix.S_IFREG: kindFile, unix.S_IFLNK: kindSymlink, unix.S_IFCHR: kindChar, unix.S_IFBLK: kindBlock, unix.S_IFIFO: kindFifo}
			if got := kinds[st.Mode&unix.S_IFMT]; got != c.kind {
				t.Fatalf("the view holds %q as %c, the stage as %c", strings.Join(p, "/"), c.kind, got)
			}
		}
		if c.kind == kindDir {
			agree(t, c, p, upper, group)
		}
	}
}

// dumpView lists a view's paths with kind, mode, owner and target.
func dumpView(n *node, p string) []string {
	out := []string{fmt.Sprintf("%s %c %o %d:%d %s", p, n.kind, n.mode, n.uid, n.gid, n.link)}
	for _, k := range n.sortedKids() {
		out = append(out, dumpView(n.kids[k], p+"/"+k)...)
	}
	return out
}

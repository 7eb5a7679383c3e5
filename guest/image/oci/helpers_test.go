package oci

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/guest/image"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Test images are made here, offline: layer tars written entry by
// entry, made into images and written as OCI layouts and docker
// archives with go-containerregistry. What an import makes is read back
// from its ext4 layers with debugfs, nothing mounted.

// ent is one entry of a test layer.
type ent struct {
	name         string
	typ          byte
	mode         int64
	uid, gid     int
	body         string
	link         string
	major, minor int64
	xattr        map[string]string
}

func dir(name string, mode int64) ent { return ent{name: name, typ: tar.TypeDir, mode: mode} }
func file(name string, mode int64, body string) ent {
	return ent{name: name, typ: tar.TypeReg, mode: mode, body: body}
}
func sym(name, target string) ent {
	return ent{name: name, typ: tar.TypeSymlink, mode: 0o777, link: target}
}
func hard(name, target string) ent {
	return ent{name: name, typ: tar.TypeLink, mode: 0o644, link: target}
}
func wh(name string) ent { return ent{name: name, typ: tar.TypeReg, mode: 0o644} }
func owned(e ent, uid, gid int) ent {
	e.uid, e.gid = uid, gid
	return e
}
func withXattr(e ent, kv ...string) ent {
	e.xattr = map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		e.xattr[kv[i]] = kv[i+1]
	}
	return e
}

// layerTar writes a layer's tar.
func layerTar(t testing.TB, ents ...ent) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Uid: e.uid, Gid: e.gid, Linkname: e.link,
			Devmajor: e.major, Devminor: e.minor, ModTime: time.Unix(1700000000, 0), Format: tar.FormatPAX}
		if e.typ == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if len(e.xattr) > 0 {
			h.PAXRecords = map[string]string{}
			for k, v := range e.xattr {
				h.PAXRecords["SCHILY.xattr."+k] = v
			}
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			tw.Write([]byte(e.body))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func gzipBytes(b []byte) []byte {
	var out bytes.Buffer
	zw := gzip.NewWriter(&out)
	zw.Write(b)
	zw.Close()
	return out.Bytes()
}

// imageSpec is a test image.
type imageSpec struct {
	layers [][]byte // uncompressed tars
	gzip   bool     // gzip'd layers (else plain tar layers)
	arch   string   // default amd64
	user   string
	env    []string
	docker bool // docker media types
}

func (s imageSpec) image(t testing.TB) v1.Image {
	t.Helper()
	var ls []v1.Layer
	for _, b := range s.layers {
		if s.gzip {
			b := b
			mt := types.OCILayer
			if s.docker {
				mt = types.DockerLayer
			}
			l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }, tarball.WithMediaType(mt))
			if err != nil {
				t.Fatal(err)
			}
			ls = append(ls, l)
		} else {
			ls = append(ls, static.NewLayer(b, types.OCIUncompressedLayer))
		}
	}
	img, err := mutate.AppendLayers(empty.Image, ls...)
	if err != nil {
		t.Fatal(err)
	}
	if !s.docker {
		img = mutate.MediaType(img, types.OCIManifestSchema1)
		img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	if s.arch != "" {
		cf.Architecture = s.arch
	}
	cf.Config.User = s.user
	cf.Config.Env = s.env
	cf.Config.WorkingDir = "/workspace/app"
	cf.Config.Cmd = []string{"/bin/sh"}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

// writeLayout writes an OCI layout directory holding img.
func writeLayout(t testing.TB, dir string, imgs ...v1.Image) string {
	t.Helper()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	for i, img := range imgs {
		if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{annotRefName: fmt.Sprintf("app:%d", i+1)})); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// writeDocker writes a docker save archive (go-containerregistry's
// legacy layout: manifest.json, config and layers by digest).
func writeDocker(t testing.TB, file string, img v1.Image) string {
	t.Helper()
	tag, err := name.NewTag("example.com/app:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(file, tag, img); err != nil {
		t.Fatal(err)
	}
	return file
}

// tarDir tars a directory (an OCI archive from a layout).
func tarDir(t testing.TB, dir, file string) string {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, _ := d.Info()
		h, _ := tar.FileInfoHeader(fi, "")
		h.Name = filepath.ToSlash(rel)
		if d.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if d.Type().IsRegular() {
			b, _ := os.ReadFile(p)
			tw.Write(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	tw.Close()
	if err := os.WriteFile(file, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

// fsEntry is one path of an ext4 layer read back.
type fsEntry struct {
	kind     byte // d f l c b p; 'w' for a whiteout
	mode     uint32
	uid, gid int
	ino      string
	content  string
	link     string
	dev      string
	xattr    map[string]string
}

// debugfs runs a debugfs script on a layer image.
func debugfs(t testing.TB, img string, cmds []string) string {
	t.Helper()
	script := filepath.Join(t.TempDir(), "cmds")
	os.WriteFile(script, []byte(strings.Join(cmds, "\n")+"\n"), 0o644)
	out, err := exec.Command("debugfs", "-f", script, img).Output()
	if err != nil {
		t.Fatalf("debugfs %s: %v", img, err)
	}
	return string(out)
}

// sections splits debugfs -f output by the command echoed before each.
func sections(out string) map[string]string {
	m := map[string]string{}
	var cur string
	var b strings.Builder
	for _, l := range strings.SplitAfter(out, "\n") {
		if c, ok := strings.CutPrefix(l, "debugfs: "); ok {
			if cur != "" {
				m[cur] = b.String()
			}
			cur, b = strings.TrimSpace(c), strings.Builder{}
			continue
		}
		b.WriteString(l)
	}
	if cur != "" {
		m[cur] = b.String()
	}
	return m
}

// readLayer reads a layer's tree under /upper: kinds, modes, owners,
// inodes, contents, symlink targets, device numbers, xattrs.
func readLayer(t testing.TB, img string) map[string]fsEntry {
	t.Helper()
	tree := map[string]fsEntry{}
	tree[""] = fsEntry{kind: 'd'} // its attributes come with its "." entry
	queue := []string{""}
	for len(queue) > 0 {
		var cmds []string
		for _, d := range queue {
			cmds = append(cmds, "ls -p /upper"+d)
		}
		secs := sections(debugfs(t, img, cmds))
		var next []string
		for _, d := range queue {
			for _, l := range strings.Split(secs["ls -p /upper"+d], "\n") {
				f := strings.Split(l, "/")
				if len(f) < 7 {
					continue
				}
				nm := f[5]
				var mode uint32
				fmt.Sscanf(f[2], "%o", &mode)
				var uid, gid int
				fmt.Sscanf(f[3], "%d", &uid)
				fmt.Sscanf(f[4], "%d", &gid)
				if nm == "." {
					e := tree[d]
					e.mode, e.uid, e.gid, e.ino = mode&0o7777, uid, gid, f[1]
					tree[d] = e
					continue
				}
				if nm == ".." {
					continue
				}
				p := d + "/" + nm
				e := fsEntry{mode: mode & 0o7777, uid: uid, gid: gid, ino: f[1]}
				switch mode & 0o170000 {
				case 0o040000:
					e.kind = 'd'
					next = append(next, p)
				case 0o100000:
					e.kind = 'f'
				case 0o120000:
					e.kind = 'l'
				case 0o020000:
					e.kind = 'c'
				case 0o060000:
					e.kind = 'b'
				case 0o010000:
					e.kind = 'p'
				}
				tree[p] = e
			}
		}
		queue = next
	}
	// Targets, device numbers and xattrs.
	var cmds []string
	for p, e := range tree {
		cmds = append(cmds, "ea_list /upper"+p)
		if e.kind == 'l' || e.kind == 'c' || e.kind == 'b' {
			cmds = append(cmds, "stat /upper"+p)
		}
	}
	secs := sections(debugfs(t, img, cmds))
	for p, e := range tree {
		if x := secs["ea_list /upper"+p]; strings.Contains(x, "Extended attributes:") {
			e.xattr = map[string]string{}
			for _, l := range strings.Split(x, "\n")[1:] {
				k, v, ok := strings.Cut(strings.TrimSpace(l), " = ")
				if ok {
					k, _, _ = strings.Cut(k, " (")
					e.xattr[k] = strings.TrimSpace(v)
				}
			}
		}
		s := secs["stat /upper"+p]
		if _, l, ok := strings.Cut(s, "Fast link dest: "); ok {
			e.link, _ = strings.CutPrefix(strings.TrimSpace(strings.Split(l, "\n")[0]), `"`)
			e.link = strings.TrimSuffix(e.link, `"`)
		}
		if _, l, ok := strings.Cut(s, "Device major/minor number: "); ok {
			e.dev = strings.Fields(l)[0]
		}
		if e.kind == 'c' && e.dev == "00:00" {
			e.kind = 'w'
		}
		tree[p] = e
	}
	// Contents.
	out := t.TempDir()
	debugfs(t, img, []string{"rdump /upper " + out})
	for p, e := range tree {
		if e.kind == 'f' {
			b, err := os.ReadFile(filepath.Join(out, "upper", p))
			if err != nil {
				t.Fatalf("read %s of %s: %v", p, img, err)
			}
			e.content = string(b)
			tree[p] = e
		}
	}
	return tree
}

// merge stacks layers read back as overlayfs does: whiteouts remove,
// opaque directories hide what is below, a directory over a directory
// merges, anything else replaces.
func merge(layers ...map[string]fsEntry) map[string]fsEntry {
	out := map[string]fsEntry{}
	removeUnder := func(p string) {
		for q := range out {
			if strings.HasPrefix(q, p+"/") {
				delete(out, q)
			}
		}
	}
	for i, l := range layers {
		paths := make([]string, 0, len(l))
		for p := range l {
			paths = append(paths, p)
		}
		sort.Slice(paths, func(a, b int) bool {
			return strings.Count(paths[a], "/") < strings.Count(paths[b], "/") ||
				strings.Count(paths[a], "/") == strings.Count(paths[b], "/") && paths[a] < paths[b]
		})
		for _, p := range paths {
			e := l[p]
			e.ino = fmt.Sprintf("%d:%s", i, e.ino)
			old, had := out[p]
			switch {
			case e.kind == 'w':
				delete(out, p)
				removeUnder(p)
				continue
			case e.kind == 'd' && e.xattr["trusted.overlay.opaque"] != "":
				removeUnder(p)
			case e.kind == 'd' && had && old.kind == 'd':
			default:
				removeUnder(p)
			}
			if e.xattr != nil {
				delete(e.xattr, "trusted.overlay.opaque")
				if len(e.xattr) == 0 {
					e.xattr = nil
				}
			}
			out[p] = e
		}
	}
	return out
}

// treeLines is a tree as sorted lines: path, kind, mode, owner, then
// content hash, symlink target, device number and xattrs.
func treeLines(tree map[string]fsEntry) []string {
	var lines []string
	for p, e := range tree {
		if p == "" {
			p = "/"
		}
		l := fmt.Sprintf("%s %c %04o %d:%d", p, e.kind, e.mode, e.uid, e.gid)
		switch e.kind {
		case 'f':
			h := sha256.Sum256([]byte(e.content))
			l += " " + hex.EncodeToString(h[:])[:12]
		case 'l':
			l += " -> " + e.link
		case 'c', 'b':
			l += " " + e.dev
		}
		var xs []string
		for k, v := range e.xattr {
			xs = append(xs, k+"="+v)
		}
		sort.Strings(xs)
		if len(xs) > 0 {
			l += " " + strings.Join(xs, ",")
		}
		lines = append(lines, l)
	}
	sort.Strings(lines)
	return lines
}

// mergedTree reads an import's layers and stacks them.
func mergedTree(t testing.TB, im image.Image) []string {
	t.Helper()
	var ls []map[string]fsEntry
	for _, l := range im.Layers {
		ls = append(ls, readLayer(t, l.Path))
	}
	return treeLines(merge(ls...))
}

func hashOf(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])[:12]
}

// diffLines shows what two manifests differ in.
func diffLines(got, want []string) string {
	g, w := map[string]bool{}, map[string]bool{}
	for _, l := range got {
		g[l] = true
	}
	for _, l := range want {
		w[l] = true
	}
	var b strings.Builder
	for _, l := range want {
		if !g[l] {
			fmt.Fprintf(&b, "  missing: %s\n", l)
		}
	}
	for _, l := range got {
		if !w[l] {
			fmt.Fprintf(&b, "  extra:   %s\n", l)
		}
	}
	return b.String()
}

// snapshot lists a directory tree (names, sizes, modes), to tell it
// was not touched.
func snapshot(t testing.TB, dir string) string {
	t.Helper()
	var b strings.Builder
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			fmt.Fprintf(&b, "error %v\n", err)
			return nil
		}
		fi, _ := d.Info()
		fmt.Fprintf(&b, "%s %v %d\n", p, fi.Mode(), fi.Size())
		return nil
	})
	return b.String()
}

// finalNames lists what an images directory holds under final names:
// image directories and cached layers (not locks, not dot directories).
func finalNames(t testing.TB, images string) []string {
	t.Helper()
	var out []string
	ents, _ := os.ReadDir(images)
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".") {
			out = append(out, e.Name())
		}
		if strings.HasPrefix(e.Name(), ".import-") {
			out = append(out, e.Name())
		}
	}
	layers, _ := os.ReadDir(filepath.Join(images, ".layers"))
	for _, e := range layers {
		if !strings.HasSuffix(e.Name(), ".lock") {
			out = append(out, ".layers/"+e.Name())
		}
	}
	out = append(out, blobTemps(images)...)
	sort.Strings(out)
	return out
}

// blobTemps lists blobs being kept that an import left in the blob
// cache: none, whether it succeeded or failed.
func blobTemps(images string) []string {
	var out []string
	ents, _ := os.ReadDir(image.BlobCacheDir(images))
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".tmp-") {
			out = append(out, ".blobs/"+e.Name())
		}
	}
	return out
}

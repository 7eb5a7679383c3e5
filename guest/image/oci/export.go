package oci

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/berthvm/berth/guest/image"
	"github.com/berthvm/berth/guest/image/ext4"
)

// Export writes an image as an OCI image layout in a tar (what `podman
// load`, `skopeo copy oci-archive:` and berth's own import read). Each
// berth layer is written as the blobs it was imported from, byte for
// byte, when the build keeps them; a layer berth made (debian's, a
// recipe's, a commit's) is written from its ext4 image as a plain tar,
// as docker save and podman save write theirs. Either way the bytes are
// the same every time, so the digests are: an export imported elsewhere
// and exported again is the same image, and an exported import has the
// digests its source had.
//
// An export is planned first (PlanExport): what the tarball holds and
// its exact size, before a byte of it is written, so the caller can see
// whether it fits where it goes. A layer berth made is read once then to
// learn its digest (a tar entry's name, blobs/sha256/<digest>, comes
// before its bytes), and the digest kept in the build for next time.

// ExportOptions configure an export.
type ExportOptions struct {
	// Image is the build to export (image.Load or LoadDigest).
	Image image.Image
	// ImagesDir is <data>/images: the blob cache is there, for a build
	// whose directory lacks a blob.
	ImagesDir string
	// RefName names the image in the layout's index; default
	// "localhost/<name>:latest".
	RefName string
	// Report receives progress; nil discards it.
	Report func(image.Progress)
	// MaxFiles bounds the paths of one layer berth made. Default
	// DefaultMaxFiles.
	MaxFiles int
}

// exportFormat changes whenever the tar written for a berth-made layer
// does: a digest kept for an older format is not used.
const exportFormat = "1"

// digestCacheDir is where a build keeps the digests of its made layers.
const digestCacheDir = "export"

// fixedTime is every time in the outer tar: its bytes depend on nothing
// but the image.
var fixedTime = time.Unix(0, 0).UTC()

// Export is a planned export: its layout's files and sizes.
type Export struct {
	// Manifest is the digest of the image's OCI manifest in the layout.
	Manifest string
	// Size is the tarball's size in bytes, exactly.
	Size int64
	// Layers are the image's OCI layers, bottom first.
	Layers []ExportLayer

	files  []outFile
	opened []io.Closer
	report func(image.Progress)
}

// ExportLayer is one layer of an export.
type ExportLayer struct {
	Digest, DiffID, MediaType string
	Size                      int64
	// Offset is where its bytes start in the tarball.
	Offset int64
	// Made: written from a berth layer, not kept from an import.
	Made bool
}

// outFile is one file of the layout: bytes in memory, a kept blob, or a
// layer written from its ext4 image.
type outFile struct {
	name   string
	size   int64
	dir    bool
	data   []byte
	blob   *os.File
	layer  *extLayer
	digest string
	layerN int // its index in Layers, or -1
}

// PlanExport plans the export of o.Image: every file it reads is opened
// (so removing the image meanwhile does not cut it short) and every
// layer's digest known. Close releases it.
func PlanExport(ctx context.Context, o ExportOptions) (_ *Export, err error) {
	im := o.Image
	if o.Report == nil {
		o.Report = func(image.Progress) {}
	}
	if o.MaxFiles <= 0 {
		o.MaxFiles = DefaultMaxFiles
	}
	if o.RefName == "" {
		o.RefName = "localhost/" + im.Name + ":latest"
	}
	if !im.RootFS() {
		return nil, fmt.Errorf("image %s has no root filesystem layers: its root is berth's initramfs (the agent and busybox), not a container image, so there is nothing to export", im.Name)
	}
	e := &Export{report: o.Report}
	defer func() {
		if err != nil {
			e.Close()
		}
	}()
	var blobs []outFile
	seen := map[string]bool{}
	for i, l := range im.Layers {
		kept, err := e.keptBlobs(o, l)
		if err != nil {
			return nil, err
		}
		if kept != nil {
			for _, k := range kept {
				e.Layers = append(e.Layers, ExportLayer{Digest: k.b.Digest, DiffID: k.b.DiffID, MediaType: k.b.MediaType, Size: k.b.Size})
				if !seen[k.b.Digest] {
					seen[k.b.Digest] = true
					blobs = append(blobs, outFile{size: k.b.Size, blob: k.f, digest: k.b.Digest, layerN: len(e.Layers) - 1})
				}
			}
			continue
		}
		lt, digest, size, err := e.madeLayer(ctx, o, i, l)
		if err != nil {
			return nil, err
		}
		e.Layers = append(e.Layers, ExportLayer{Digest: digest, DiffID: digest, MediaType: mtOCILayer, Size: size, Made: true})
		if !seen[digest] {
			seen[digest] = true
			blobs = append(blobs, outFile{size: size, layer: lt, digest: digest, layerN: len(e.Layers) - 1})
		}
	}
	configJSON, manifestJSON, err := e.configAndManifest(o)
	if err != nil {
		return nil, err
	}
	configDigest, manifestDigest := sha256Digest(configJSON), sha256Digest(manifestJSON)
	e.Manifest = manifestDigest
	ix, _ := json.Marshal(index{SchemaVersion: 2, MediaType: mtOCIIndex, Manifests: []Descriptor{{
		MediaType: mtOCIManifest, Digest: manifestDigest, Size: int64(len(manifestJSON)),
		Annotations: map[string]string{annotRefName: o.RefName},
	}}})
	layoutJSON := []byte(`{"imageLayoutVersion":"1.0.0"}`)
	e.files = []outFile{
		{name: "oci-layout", data: layoutJSON, size: int64(len(layoutJSON)), layerN: -1},
		{name: "index.json", data: ix, size: int64(len(ix)), layerN: -1},
		{name: "blobs/", dir: true, layerN: -1},
		{name: "blobs/sha256/", dir: true, layerN: -1},
	}
	if slices.ContainsFunc(blobs, func(f outFile) bool { alg, _, _ := parseDigest(f.digest); return alg == "sha512" }) {
		e.files = append(e.files, outFile{name: "blobs/sha512/", dir: true, layerN: -1})
	}
	e.files = append(e.files,
		outFile{name: blobPath(manifestDigest), data: manifestJSON, size: int64(len(manifestJSON)), digest: manifestDigest, layerN: -1},
		outFile{name: blobPath(configDigest), data: configJSON, size: int64(len(configJSON)), digest: configDigest, layerN: -1})
	for _, f := range blobs {
		f.name = blobPath(f.digest)
		e.files = append(e.files, f)
	}
	// Offsets: each file is its header (as the tar writer writes it)
	// and its bytes padded to 512.
	var off int64
	for _, f := range e.files {
		hdr, err := outHeaderSize(f)
		if err != nil {
			return nil, err
		}
		off += hdr
		if f.layerN >= 0 {
			for i := range e.Layers {
				if e.Layers[i].Digest == f.digest {
					e.Layers[i].Offset = off
				}
			}
		}
		off += (f.size + 511) &^ 511
	}
	e.Size = off + 1024 // the tar's end: two zero blocks
	return e, nil
}

// Close releases the files an export holds open.
func (e *Export) Close() {
	for _, c := range e.opened {
		c.Close()
	}
	e.opened = nil
}

// outHeader is the tar header of a layout file.
func outHeader(f outFile) *tar.Header {
	if f.dir {
		return &tar.Header{Name: f.name, Typeflag: tar.TypeDir, Mode: 0o755, ModTime: fixedTime, Format: tar.FormatPAX}
	}
	return &tar.Header{Name: f.name, Typeflag: tar.TypeReg, Mode: 0o644, Size: f.size, ModTime: fixedTime, Format: tar.FormatPAX}
}

// outHeaderSize is how many bytes the tar writer writes for f's header.
func outHeaderSize(f outFile) (int64, error) {
	var b bytes.Buffer
	if err := tar.NewWriter(&b).WriteHeader(outHeader(f)); err != nil {
		return 0, fmt.Errorf("layout file %s: %w", f.name, err)
	}
	return int64(b.Len()), nil
}

type keptBlob struct {
	b image.Blob
	f *os.File
}

// keptBlobs opens the blobs berth layer l was imported from, or returns
// nil when it has none or one is missing (a build from before blobs
// were kept): the layer is then written from its ext4 image.
func (e *Export) keptBlobs(o ExportOptions, l image.Layer) ([]keptBlob, error) {
	if len(l.Blobs) == 0 {
		return nil, nil
	}
	var out []keptBlob
	for _, b := range l.Blobs {
		f := openBlob(o, b.Digest, b.Size)
		if f == nil {
			for _, k := range out {
				k.f.Close()
			}
			return nil, nil
		}
		out = append(out, keptBlob{b, f})
	}
	for _, k := range out {
		e.opened = append(e.opened, k.f)
	}
	return out, nil
}

// openBlob opens a kept blob of size bytes (size < 0: any): the
// build's link, else the cache's.
func openBlob(o ExportOptions, digest string, size int64) *os.File {
	var paths []string
	if o.Image.Dir != "" {
		if p, err := o.Image.BlobPath(digest); err == nil {
			paths = append(paths, p)
		}
	}
	if p, ok := image.CachedBlob(o.ImagesDir, digest, size); ok {
		paths = append(paths, p)
	}
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() && (size < 0 || fi.Size() == size) {
			return f
		}
		f.Close()
	}
	return nil
}

// madeDigest is what a build keeps of a made layer's tar.
type madeDigest struct {
	Format string `json:"format"`
	Digest string `json:"digest"`
	Size   int64  `json:"size"`
}

// madeLayer opens berth layer i (l) for writing as a tar and learns its
// digest and size: from the build's cache of them, else by writing it
// once through a hash.
func (e *Export) madeLayer(ctx context.Context, o ExportOptions, i int, l image.Layer) (*extLayer, string, int64, error) {
	n := len(o.Image.Layers)
	label := fmt.Sprintf("berth layer %d of %d (%s)", i+1, n, filepath.Base(l.Path))
	f, err := os.Open(l.Path)
	if err != nil {
		return nil, "", 0, fmt.Errorf("%s: %w", label, err)
	}
	e.opened = append(e.opened, f)
	fi, err := f.Stat()
	if err != nil {
		return nil, "", 0, err
	}
	fs, err := ext4.Open(f, fi.Size())
	if err != nil {
		return nil, "", 0, fmt.Errorf("%s: %w", label, err)
	}
	lt, err := openExtLayer(fs, label, extLimits{files: o.MaxFiles, dirs: o.MaxFiles, bytes: max(sparseFactor*fi.Size(), 1<<30)})
	if err != nil {
		return nil, "", 0, err
	}
	cache := ""
	if o.Image.Dir != "" && l.Hash != "" && plainName(l.Hash) {
		cache = filepath.Join(o.Image.Dir, digestCacheDir, l.Hash+".json")
		if b, err := os.ReadFile(cache); err == nil {
			var m madeDigest
			if json.Unmarshal(b, &m) == nil && m.Format == exportFormat {
				if _, _, err := parseDigest(m.Digest); err == nil && m.Size > 0 {
					return lt, m.Digest, m.Size, nil
				}
			}
		}
	}
	o.Report(image.Progress{Phase: "digest", Done: i + 1, Total: n, Line: label + ": reading it once to learn its digest (made by berth, not imported)"})
	h := sha256.New()
	cw := &countWriter{w: h}
	err = lt.write(ctx, cw, func(b int64) {
		o.Report(image.Progress{Phase: "digest", Done: i + 1, Total: n, Bytes: b, Line: label})
	})
	if err != nil {
		return nil, "", 0, err
	}
	if lt.skipped > 0 {
		o.Report(image.Progress{Phase: "digest", Line: fmt.Sprintf("%s: %d socket(s) left out (a tar cannot hold one), the first %s", label, lt.skipped, clip(lt.skipOne))})
	}
	digest := "sha256:" + hex.EncodeToString(h.Sum(nil))
	if cache != "" {
		// Kept for the next export; a build directory berth cannot
		// write to only costs that export the same read.
		b, _ := json.Marshal(madeDigest{Format: exportFormat, Digest: digest, Size: cw.n})
		if os.MkdirAll(filepath.Dir(cache), 0o755) == nil {
			if tmp, err := os.CreateTemp(filepath.Dir(cache), ".tmp-"); err == nil {
				_, werr := tmp.Write(b)
				if tmp.Close() != nil || werr != nil || os.Rename(tmp.Name(), cache) != nil {
					os.Remove(tmp.Name())
				}
			}
		}
	}
	lt.skipped = 0
	return lt, digest, cw.n, nil
}

// plainName reports whether a layer hash is a plain file name.
func plainName(s string) bool {
	return s != "" && len(s) <= 128 && !bytes.ContainsAny([]byte(s), "/.\x00")
}

// exportConfig is the config an export writes when the image has none
// of its own (debian, a recipe's): what a container runtime needs.
type exportConfig struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Config       struct {
		Env        []string `json:"Env,omitempty"`
		User       string   `json:"User,omitempty"`
		WorkingDir string   `json:"WorkingDir,omitempty"`
		Entrypoint []string `json:"Entrypoint,omitempty"`
		Cmd        []string `json:"Cmd,omitempty"`
	} `json:"config"`
	RootFS rootFS `json:"rootfs"`
}

type rootFS struct {
	Type    string   `json:"type"`
	DiffIDs []string `json:"diff_ids"`
}

// configAndManifest gives the layout's config and manifest: those the
// image was imported with when its layers are still the ones they name,
// else the kept config with the layers' diff ids (its history, which
// names layers by position, dropped), else a config made of what berth
// knows of the image.
func (e *Export) configAndManifest(o ExportOptions) (config, manifest []byte, err error) {
	im := o.Image
	var diffIDs []string
	var layers []Descriptor
	for _, l := range e.Layers {
		diffIDs = append(diffIDs, l.DiffID)
		layers = append(layers, Descriptor{MediaType: l.MediaType, Digest: l.Digest, Size: l.Size})
	}
	if im.ConfigBlob != "" {
		config = readKept(o, im.ConfigBlob)
	}
	if config != nil {
		if c, err := parseConfig(config, -1); err != nil || !slices.Equal(c.RootFS.DiffIDs, diffIDs) {
			var m map[string]json.RawMessage
			if err := json.Unmarshal(config, &m); err != nil {
				return nil, nil, fmt.Errorf("the image's kept config: %w", err)
			}
			m["rootfs"], _ = json.Marshal(rootFS{Type: "layers", DiffIDs: diffIDs})
			delete(m, "history")
			config, _ = json.Marshal(m)
		} else if im.ManifestBlob != "" {
			// The config is as imported: so may the manifest be.
			if mb := readKept(o, im.ManifestBlob); mb != nil {
				if m, err := parseManifest(mb); err == nil && m.Config.Digest == im.ConfigBlob &&
					slices.EqualFunc(m.Layers, layers, func(a, b Descriptor) bool { return a.Digest == b.Digest && a.Size == b.Size }) {
					return config, mb, nil
				}
			}
		}
	} else {
		var c exportConfig
		c.Architecture, c.OS = "amd64", "linux"
		if ic := im.Config; ic != nil {
			c.Config.Env, c.Config.User, c.Config.WorkingDir, c.Config.Entrypoint, c.Config.Cmd = ic.Env, ic.User, ic.WorkingDir, ic.Entrypoint, ic.Cmd
		} else {
			c.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
		}
		c.RootFS = rootFS{Type: "layers", DiffIDs: diffIDs}
		config, _ = json.Marshal(c)
	}
	manifest, _ = json.Marshal(manifestOut{
		SchemaVersion: 2, MediaType: mtOCIManifest,
		Config: Descriptor{MediaType: mtOCIConfig, Digest: sha256Digest(config), Size: int64(len(config))},
		Layers: layers,
	})
	return config, manifest, nil
}

// manifestOut is the manifest an export writes.
type manifestOut struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Config        Descriptor   `json:"config"`
	Layers        []Descriptor `json:"layers"`
}

// readKept reads a kept config or manifest, checked against its digest;
// nil when it is not there whole.
func readKept(o ExportOptions, digest string) []byte {
	f := openBlob(o, digest, -1)
	if f == nil {
		return nil
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxJSON+1))
	if err != nil || len(b) > maxJSON || sha256Digest(b) != digest {
		return nil
	}
	return b
}

// WriteTo writes the tarball to w: exactly e.Size bytes, unless it
// fails. Kept blobs are checked against their digests as they are
// copied, made layers against the digests planned.
func (e *Export) WriteTo(ctx context.Context, w io.Writer) error {
	cw := &countWriter{w: w}
	tw := tar.NewWriter(cw)
	buf := make([]byte, 1<<20)
	n := len(e.Layers)
	for _, f := range e.files {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := tw.WriteHeader(outHeader(f)); err != nil {
			return err
		}
		var label string
		var done, total int
		if f.layerN >= 0 {
			l := e.Layers[f.layerN]
			done, total = f.layerN+1, n
			label = fmt.Sprintf("layer %d of %d (%s, %s)", done, total, short(l.Digest), map[bool]string{true: "made from its berth layer", false: "as imported"}[l.Made])
		}
		start := cw.n
		progress := func() {
			if label != "" {
				e.report(image.Progress{Phase: "export", Done: done, Total: total, Bytes: cw.n - start, TotalBytes: f.size, Line: label})
			}
		}
		progress()
		var err error
		switch {
		case f.dir:
		case f.data != nil:
			_, err = tw.Write(f.data)
		case f.blob != nil:
			err = copyChecked(ctx, tw, f, buf, progress)
		case f.layer != nil:
			h := sha256.New()
			err = f.layer.write(ctx, io.MultiWriter(tw, h), func(int64) { progress() })
			if err == nil && "sha256:"+hex.EncodeToString(h.Sum(nil)) != f.digest {
				err = fmt.Errorf("%s changed since its digest was taken (%s): export again", f.layer.label, short(f.digest))
			}
		}
		if err != nil {
			if errors.Is(err, tar.ErrWriteTooLong) && f.layer != nil {
				err = fmt.Errorf("%s changed since its size was taken: export again", f.layer.label)
			}
			return err
		}
		progress()
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if cw.n != e.Size {
		return fmt.Errorf("wrote %d bytes, planned %d: internal error", cw.n, e.Size)
	}
	return nil
}

// copyChecked copies a kept blob, checking its digest.
func copyChecked(ctx context.Context, w io.Writer, f outFile, buf []byte, progress func()) error {
	if _, err := f.blob.Seek(0, io.SeekStart); err != nil {
		return err
	}
	h := newHash(f.digest)
	r := io.TeeReader(io.LimitReader(f.blob, f.size), h)
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		k, rerr := r.Read(buf)
		if k > 0 {
			if _, err := w.Write(buf[:k]); err != nil {
				return err
			}
			n += int64(k)
			progress()
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return rerr
		}
	}
	if n != f.size || sum(h, f.digest) != f.digest {
		return fmt.Errorf("the kept blob %s is corrupt (it no longer matches its digest): import the image again", short(f.digest))
	}
	return nil
}

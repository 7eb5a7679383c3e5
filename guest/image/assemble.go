package image

import (
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// What other image makers (guest/image/oci's importer) use of the
// builder's machinery: the image lock, the shared layer cache, mkfs
// without mounting, and committing an image whose layers are made
// elsewhere. They keep the builder's rules: one maker of a name at a
// time, a cached layer made once and held until linked, a build
// appearing whole.

// LockImage takes the lock a build of name holds, waiting (and saying so
// once through report) while another process builds it. The returned
// func releases it.
func LockImage(ctx context.Context, imagesDir, name string, report func(Progress)) (func(), error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(imagesDir, 0o755); err != nil {
		return nil, err
	}
	return lockFile(ctx, nameLock(imagesDir, name), func() {
		if report != nil {
			report(Progress{Phase: "wait", Line: waitingFor(filepath.Join(imagesDir, name))})
		}
	})
}

// LayerCacheDir is where cached layers live, and where a layer is made
// before it is stored (StoreLayer renames it in).
func LayerCacheDir(imagesDir string) string { return filepath.Join(imagesDir, layerCache) }

// HoldLayer locks the cached layer hash until release: while one maker
// makes it, the others wait for it; once made, pruning leaves it until
// the image that uses it is committed. Take several in one fixed order
// (bottom layer first) so two makers never wait on each other.
func HoldLayer(ctx context.Context, imagesDir, hash string, report func(Progress)) (release func(), err error) {
	if err := checkHash(hash); err != nil {
		return nil, err
	}
	cache := LayerCacheDir(imagesDir)
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return nil, err
	}
	return lockFile(ctx, filepath.Join(cache, hash+".lock"), func() {
		if report != nil {
			report(Progress{Phase: "wait", Line: waitingFor("layer " + hash + " in " + cache)})
		}
	})
}

// CachedLayer returns the cached layer hash when it is there whole.
// File is empty: the image that links it names it.
func CachedLayer(imagesDir, hash string) (Layer, bool) {
	if checkHash(hash) != nil {
		return Layer{}, false
	}
	c, ok := (&builder{o: Options{ImagesDir: imagesDir}}).cached(hash)
	if !ok {
		return Layer{}, false
	}
	return c.layer(""), true
}

// StoreLayer moves a finished layer file (made in LayerCacheDir, with
// MakeLayer) into the cache as hash. The caller holds it (HoldLayer).
func StoreLayer(imagesDir, file, hash, uuid string) (Layer, error) {
	if err := checkHash(hash); err != nil {
		return Layer{}, err
	}
	c, err := (&builder{o: Options{ImagesDir: imagesDir}}).store(file, hash, uuid, 0)
	if err != nil {
		return Layer{}, fmt.Errorf("store layer %s: %w", hash, err)
	}
	return c.layer(""), nil
}

// checkHash keeps a layer hash a plain file name.
func checkHash(hash string) error {
	if hash == "" || len(hash) > 128 || strings.ContainsAny(hash, "/.\x00") {
		return fmt.Errorf("bad layer hash %q", hash)
	}
	return nil
}

// MakeLayer writes dir's tree into a new read-only ext4 image at file
// with mkfs.ext4 -d, mounting nothing. The guest mounts the layer and
// stacks dir/upper, so the tree goes under upper/ in dir; whatever else
// dir holds stays beside it, out of the guest's root. It returns the
// file's apparent size.
func MakeLayer(ctx context.Context, dir, file, uuid string) (int64, error) {
	return makeLayer(ctx, dir, file, uuid)
}

// NewUUID returns a random (version 4) UUID, as layers are labelled.
func NewUUID() string { return newUUID() }

// Assemble commits a root filesystem image whose layers are already in
// the layer cache (an import's): it adds the kernel and initramfs every
// such image has, links the layers in (im.Layers, bottom first, by
// Hash) and makes the build current. im gives Name, Source,
// SourceDigest and Config; the digest is computed. The caller holds the
// image's lock (LockImage) and its layers' (HoldLayer). It reports
// whether it built anything: an identical build is reused.
//
// A name built otherwise (a recipe, a shipped image) is refused: remove
// it first. An import replaces an earlier import's build as current.
func Assemble(ctx context.Context, o Options, im Image) (Image, bool, error) {
	if o.Report == nil {
		w := o.Progress
		if w == nil {
			w = io.Discard
		}
		o.Report = func(p Progress) { fmt.Fprintln(w, p.String()) }
	}
	if err := ValidateName(im.Name); err != nil {
		return Image{}, false, err
	}
	if Shipped(im.Name) {
		return Image{}, false, fmt.Errorf("image %q is berth's own: choose another name: %w", im.Name, fs.ErrExist)
	}
	if len(im.Layers) == 0 {
		return Image{}, false, errors.New("an image with no layers has nothing to boot")
	}
	// An import replaces an import (a new version of the image, from
	// wherever), a commit a commit; a name built otherwise is not taken
	// over.
	if cur, err := Load(o.ImagesDir, im.Name); err == nil && !replaces(im, cur) {
		return Image{}, false, fmt.Errorf("image %q already exists, built from %s: remove it first (berth image rm %s) or choose another name: %w",
			im.Name, cur.Source, im.Name, fs.ErrExist)
	}
	b := &builder{o: o, start: time.Now()}
	var paths []string
	for i, l := range im.Layers {
		c, ok := b.cached(l.Hash)
		if !ok {
			return Image{}, false, fmt.Errorf("layer %s is not in the layer cache %s: import the image again", l.Hash, LayerCacheDir(o.ImagesDir))
		}
		blobs := l.Blobs
		im.Layers[i] = c.layer(fmt.Sprintf("layer-%d.img", i))
		im.Layers[i].Blobs = blobs
		paths = append(paths, c.path)
	}
	agent, k, mods, err := b.inputs(ctx, rootModules())
	if err != nil {
		return Image{}, false, err
	}
	h := sha256.New()
	fmt.Fprintf(h, "builder %s\nassembled %s\nkernel %s\nmodules %s\nsource %s %s\n", builderVersion, im.Name, k.Package, strings.Join(mods, " "), im.Source, im.SourceDigest)
	if im.Parent != "" {
		fmt.Fprintf(h, "parent %s\nlabel %q\n", im.Parent, im.Label)
	}
	for _, l := range im.Layers {
		fmt.Fprintf(h, "layer %s\n", l.Hash)
		for _, b := range l.Blobs {
			fmt.Fprintf(h, "blob %s %s\n", b.Digest, b.MediaType)
		}
	}
	// A build that keeps its source's blobs is not one that does not.
	fmt.Fprintf(h, "config %s\nmanifest %s\n", im.ConfigBlob, im.ManifestBlob)
	cfg, _ := json.Marshal(im.Config)
	h.Write(cfg)
	h.Write(agent)
	im.Digest = hex.EncodeToString(h.Sum(nil))[:16]
	if cur, ok := b.upToDate(im.Name, im.Digest, k); ok {
		return cur, false, nil
	}
	if b.shared, err = sharedInitramfs(o.ImagesDir, k, mods, agent); err != nil {
		return Image{}, false, err
	}
	im.KernelVersion, im.Modules = k.Version, moduleOrder(mods)
	im, err = b.commit(im, k, nil, paths)
	if err != nil {
		return Image{}, false, err
	}
	return im, true, nil
}

// initrdSuffix ends the names of shared initramfs files in the layer
// cache; initrdKeep is how long one no image links is kept.
const (
	initrdSuffix = ".initrd"
	initrdKeep   = time.Hour
)

// sharedInitramfs returns the initramfs of an assembled image: a file in
// the layer cache keyed by what goes into it (kernel, modules, agent),
// made the first time, so that imports and commits on the same agent and
// kernel share one instead of each compressing and storing its own. The
// images link it; pruning drops it when none does.
func sharedInitramfs(imagesDir string, k Kernel, mods []string, agent []byte) (*sharedBoot, error) {
	h := sha256.New()
	fmt.Fprintf(h, "initramfs %s\nkernel %s\nmodules %s\n", builderVersion, k.Package, strings.Join(mods, " "))
	h.Write(agent)
	cache := LayerCacheDir(imagesDir)
	sb := &sharedBoot{
		initrd: filepath.Join(cache, hex.EncodeToString(h.Sum(nil))[:16]+initrdSuffix),
		make: func() ([]byte, error) {
			raw, _, err := initramfs(k, mods, agent, gzip.DefaultCompression, nil)
			return raw, err
		},
	}
	if _, err := os.Stat(sb.initrd); err == nil {
		return sb, nil
	}
	raw, err := sb.make()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return nil, err
	}
	tmp, err := writeTemp(cache, raw)
	if err != nil {
		return nil, err
	}
	if err := syncFile(tmp); err != nil {
		os.Remove(tmp)
		return nil, err
	}
	// Made whole aside, then renamed: another maker's identical file may
	// win, which is as good.
	if err := os.Rename(tmp, sb.initrd); err != nil {
		os.Remove(tmp)
		return nil, err
	}
	return sb, nil
}

// moduleOrder is the load order an initramfs of mods lists: their file
// names, in order (as initramfs writes them).
func moduleOrder(mods []string) []string {
	out := make([]string, len(mods))
	for i, m := range mods {
		out[i] = filepath.Base(m)
	}
	return out
}

// replaces reports whether im may become the current build of a name
// whose current build is cur: a build from the same source, an import
// over an import, a commit over a commit.
func replaces(im, cur Image) bool {
	switch {
	case cur.Source == im.Source:
		return true
	case cur.Committed() || im.Committed():
		return cur.Committed() && im.Committed()
	}
	return cur.SourceDigest != "" && im.SourceDigest != ""
}

// DropLayer removes the cached layer hash unless an image links it: what
// a failed import made goes with it. The caller holds it (HoldLayer).
func DropLayer(imagesDir, hash string) {
	if checkHash(hash) != nil {
		return
	}
	p := filepath.Join(LayerCacheDir(imagesDir), hash+".img")
	var st syscall.Stat_t
	if syscall.Stat(p, &st) == nil && st.Nlink > 1 {
		return
	}
	os.Remove(p)
	os.Remove(strings.TrimSuffix(p, ".img") + ".json")
}

// Package oci imports container images as berth images: OCI image
// layouts (a directory or a tar), docker and podman save archives, and
// plain root filesystem tarballs. Every blob is checked against its
// digest while it is read; each layer is applied, with its whiteouts,
// owners, modes, extended attributes, links and device nodes, into a
// stage no entry can lead out of, in overlayfs's form; and each becomes
// a read-only ext4 layer made with mkfs.ext4 -d, nothing mounted, in the
// layer cache every image shares, keyed by the layers it is made of so
// an image sharing them reuses it.
//
// On disk, as for built images: the layers in <images>/.layers/<hash>.img,
// the image in <images>/<name>/<digest>/ (manifest.json, which records
// the source, its digest and the image config, the kernel, the
// initramfs, and the layers linked in). The blobs the image came as (its
// layers as they were, its config, an OCI manifest) are kept by digest
// in <images>/.blobs/ and linked into the build's blobs/, so that Export
// writes the image back out with the digests it had; layers berth made
// itself are exported from their ext4 images (see extlayer.go).
package oci

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/berthvm/berth/guest/image"
	"github.com/berthvm/berth/guest/users"
	"golang.org/x/sys/unix"
)

// Options configure an import. Zero values mean the defaults given.
type Options struct {
	// Name is the image to make.
	Name string
	// Source is a path (an OCI layout directory, an image archive, a
	// root filesystem tarball, or a pipe), or "-" for Stdin.
	Source string
	Stdin  io.Reader
	// Ref names the image to import from a source holding several: a
	// tag ("1"), a name and tag ("app:1") or a whole reference.
	Ref string

	ImagesDir string // <data>/images
	CacheDir  string // the kernel package cache
	Agent     string // the static berth-agent binary
	// Report receives progress; nil discards it.
	Report func(image.Progress)

	// MaxLayers bounds the berth layers one image stacks (each is a
	// disk of the VM, and the VMM takes vmm.MaxLayers): when the image
	// has more layers, its top ones are merged into one. Default 4,
	// which leaves room for committed layers on top.
	MaxLayers int
	// MaxSourceBytes bounds what a stream (standard input, a compressed
	// archive) is copied aside as. Default 64 GiB.
	MaxSourceBytes int64
	// MaxFiles bounds the image's paths. Default 4 Mi.
	MaxFiles int
	// FreeSpace returns the bytes free for the images directory; the
	// default asks statfs(2).
	FreeSpace func(dir string) (int64, error)
}

// Defaults.
const (
	DefaultMaxLayers      = 4
	DefaultMaxSourceBytes = 64 << 30
	DefaultMaxFiles       = 4 << 20
)

// reserve is what an import leaves free on the data filesystem.
const reserve = 64 << 20

// formatVersion changes whenever the layers this package writes do, so
// old cached layers are not reused for new imports.
const formatVersion = "1"

// emptyLayer is the diff id of the empty tar docker writes for a step
// that changes no file: such a layer is not stacked.
const emptyLayer = "sha256:5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef"

func (o *Options) defaults() {
	if o.MaxLayers <= 0 {
		o.MaxLayers = DefaultMaxLayers
	}
	if o.MaxSourceBytes <= 0 {
		o.MaxSourceBytes = DefaultMaxSourceBytes
	}
	if o.MaxFiles <= 0 {
		o.MaxFiles = DefaultMaxFiles
	}
	if o.FreeSpace == nil {
		o.FreeSpace = statfsFree
	}
	if o.Report == nil {
		o.Report = func(image.Progress) {}
	}
}

func statfsFree(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("free space of %s: %w", dir, err)
	}
	return int64(st.Bavail) * st.Bsize, nil
}

// Import reads the image at o.Source and commits it as o.Name: its
// layers made (or found cached), a kernel and initramfs added as for
// every berth image, the build made current. A name built from another
// source is refused.
func Import(ctx context.Context, o Options) (image.Image, error) {
	o.defaults()
	if err := checkName(o); err != nil {
		return image.Image{}, err
	}
	unlock, err := image.LockImage(ctx, o.ImagesDir, o.Name, o.Report)
	if err != nil {
		return image.Image{}, err
	}
	defer unlock()
	l, err := Read(ctx, o)
	if err != nil {
		return image.Image{}, err
	}
	im, _, err := image.Assemble(ctx, image.Options{ImagesDir: o.ImagesDir, CacheDir: o.CacheDir, Agent: o.Agent, Report: o.Report}, l.Image)
	if err != nil {
		l.Discard()
		return image.Image{}, err
	}
	l.Release()
	o.Report(image.Progress{Phase: "done", Line: fmt.Sprintf("imported %s (%s) as image %s: %d layer(s), %d reused, %s on disk: %s",
		im.Source, short(im.SourceDigest), im.Name, len(im.Layers), l.Reused, gb(im.DiskBytes()), im.Dir)})
	return im, nil
}

// checkName refuses a name that is not one berth may import as before
// reading anything.
func checkName(o Options) error {
	if err := image.ValidateName(o.Name); err != nil {
		return err
	}
	if image.Shipped(o.Name) {
		return fmt.Errorf("image %q is berth's own: import under another name: %w", o.Name, fs.ErrExist)
	}
	if cur, err := image.Load(o.ImagesDir, o.Name); err == nil && cur.SourceDigest == "" {
		return fmt.Errorf("image %q already exists, built from %s: remove it first (berth image rm %s) or choose another name: %w",
			o.Name, cur.Source, o.Name, fs.ErrExist)
	}
	return nil
}

// Layers is an image read from its source, its layers in the layer
// cache, not yet committed as an image.
type Layers struct {
	// Image has Name, Source, SourceDigest, Config and Layers (each
	// with Hash, UUID, Size and its Path in the cache); image.Assemble
	// commits it.
	Image image.Image
	// Reused counts the layers found cached.
	Reused    int
	imagesDir string
	made      []string // hashes of the layers this import made
	release   []func()
}

// Discard removes the layers this import made, unless an image links
// them, and releases them all: a failed import leaves nothing behind.
func (l *Layers) Discard() {
	if l.release != nil {
		for _, h := range l.made {
			image.DropLayer(l.imagesDir, h)
		}
	}
	l.Release()
}

// Release lets go of the layers: pruning may take them from then on,
// unless an image links them.
func (l *Layers) Release() {
	for i := len(l.release) - 1; i >= 0; i-- {
		l.release[i]()
	}
	l.release = nil
}

// group is one berth layer: one or more of the image's layers.
type group struct {
	layers []*layerRef
	key    string
	cached bool
	layer  image.Layer
	// unpacked is what scanning found the layers unpack to.
	unpacked, content int64
	// done closes once the layer is in the cache (or failed to be).
	done chan struct{}
}

type reader struct {
	o    Options
	work string
	mu   sync.Mutex // serializes o.Report: layers are verified, and sealed, concurrently
	v    *view      // the image's tree, as the layers applied so far make it

	pendingMu sync.Mutex    // guards pending: layers are verified concurrently
	pending   []pendingBlob // kept blobs not yet in the cache (settleBlobs)
}

func (r *reader) report(p image.Progress) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.o.Report(p)
}

func (r *reader) free() (int64, error) { return r.o.FreeSpace(r.o.ImagesDir) }

// Read reads the image at o.Source and makes the layers the cache
// lacks, holding them all until Release. It does not take the image's
// lock (Import does).
func Read(ctx context.Context, o Options) (_ *Layers, err error) {
	o.defaults()
	if err := image.ValidateName(o.Name); err != nil {
		return nil, err
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("importing an image needs root: its layers keep owners, device nodes and overlayfs's trusted attributes (run the berth daemon as root)")
	}
	if err := os.MkdirAll(o.ImagesDir, 0o755); err != nil {
		return nil, err
	}
	// The source's stream and unpacked archives stay in here, which is
	// removed whatever happens: nothing under a final name.
	work, err := os.MkdirTemp(o.ImagesDir, ".import-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	r := &reader{o: o, work: work}
	defer r.dropBlobs() // none are left once settled
	o.Report(image.Progress{Phase: "resolve", Line: "reading " + sourceLabel(o.Source)})
	src, err := openSource(ctx, o.Source, o.Stdin, work, o.MaxSourceBytes, r.free)
	if err != nil {
		return nil, err
	}
	defer src.close()
	var p *plan
	switch src.kind {
	case kindLayout, kindOCIArchive:
		p, err = resolveOCI(src.files, o.Ref)
	case kindDockerArchive, kindDockerDir:
		p, err = resolveDocker(src.files, o.Ref)
	default:
		p, err = resolveRootFS(src.rootfs)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", sourceLabel(o.Source), err)
	}
	// The blobs are kept as the layers are read: room for them first.
	if err := r.checkBlobSpace(p); err != nil {
		return nil, err
	}
	if src.kind == kindRootFS {
		// Its digests are what it hashes to: scan it first.
		l := p.layers[0]
		sc, err := r.scan(ctx, l)
		if err != nil {
			return nil, err
		}
		l.diffID, p.digest = sc.diffID, sc.digest
	}
	groups, err := r.group(p)
	if err != nil {
		return nil, err
	}
	out := &Layers{imagesDir: o.ImagesDir}
	defer func() {
		if err != nil {
			out.Discard()
		}
	}()
	for _, g := range groups {
		release, err := image.HoldLayer(ctx, o.ImagesDir, g.key, o.Report)
		if err != nil {
			return nil, err
		}
		out.release = append(out.release, release)
		if l, ok := image.CachedLayer(o.ImagesDir, g.key); ok {
			g.cached, g.layer = true, l
			out.Reused++
		}
	}
	// Every layer to unpack is read once before anything is written:
	// digests, sizes and paths checked, what it unpacks to measured.
	if src.kind == kindRootFS {
		if g := groups[0]; !g.cached {
			g.unpacked, g.content = p.layers[0].unpacked, p.layers[0].content
		}
	} else if err := r.scanAll(ctx, groups); err != nil {
		return nil, err
	}
	if err := r.checkSpace(groups); err != nil {
		return nil, err
	}
	if err := r.build(ctx, groups, out); err != nil {
		return nil, err
	}
	if err := r.keepBlobs(ctx, p, groups); err != nil {
		return nil, err
	}
	if err := r.settleBlobs(); err != nil {
		return nil, err
	}
	v := r.v
	im := image.Image{Name: o.Name, Source: src.kind + ":" + sourcePath(o.Source), SourceDigest: p.digest}
	if p.configJSON != nil {
		if im.ConfigBlob, err = r.keepJSON(p.configJSON); err != nil {
			return nil, err
		}
	}
	if p.manifestJSON != nil {
		if im.ManifestBlob, err = r.keepJSON(p.manifestJSON); err != nil {
			return nil, err
		}
	}
	if p.config != nil {
		c := p.config.Config
		im.Config = &image.Config{Env: c.Env, User: c.User, WorkingDir: c.WorkingDir, Entrypoint: c.Entrypoint, Cmd: c.Cmd}
		if err := r.resolveUser(ctx, im.Config, v, groups); err != nil {
			return nil, err
		}
	}
	for _, g := range groups {
		im.Layers = append(im.Layers, g.layer)
	}
	out.Image = im
	return out, nil
}

// sourceLabel names a source in messages.
func sourceLabel(src string) string {
	if src == "-" {
		return "standard input"
	}
	return src
}

func sourcePath(src string) string {
	if src == "-" {
		return "-"
	}
	if abs, err := filepath.Abs(src); err == nil {
		return abs
	}
	return src
}

// group makes the berth layers of a plan: one per image layer, empty
// ones left out, the top ones merged when there are more than
// MaxLayers. Each is keyed by the chain of layers up to its top and
// where it starts, as what a layer holds in overlayfs's form depends
// on the layers below (a path through a symlink, a directory it names
// only implicitly).
func (r *reader) group(p *plan) ([]*group, error) {
	diffIDs := make([]string, len(p.layers))
	for i, l := range p.layers {
		diffIDs[i] = l.diffID
	}
	chains := chainIDs(diffIDs)
	var keep []int
	for i, l := range p.layers {
		if l.diffID != emptyLayer {
			keep = append(keep, i)
		}
	}
	if len(keep) == 0 {
		return nil, errors.New("the image's layers are all empty: there is nothing to boot")
	}
	var groups []*group
	for k, i := range keep {
		if len(groups) == r.o.MaxLayers {
			// Over the budget: the rest joins the top group.
			g := groups[len(groups)-1]
			g.layers = append(g.layers, p.layers[i])
			continue
		}
		if k == r.o.MaxLayers-1 && len(keep) > r.o.MaxLayers {
			r.o.Report(image.Progress{Phase: "resolve", Line: fmt.Sprintf("the image has %d layers: its top %d are merged into one berth layer (at most %d are stacked)",
				len(keep), len(keep)-k, r.o.MaxLayers)})
		}
		groups = append(groups, &group{layers: []*layerRef{p.layers[i]}, done: make(chan struct{})})
	}
	for _, g := range groups {
		first, last := g.layers[0].n-1, g.layers[len(g.layers)-1].n-1
		below := ""
		if first > 0 {
			below = chains[first-1]
		}
		h := sha256.Sum256([]byte("berth oci layer " + formatVersion + "\n" + below + "\n" + chains[last] + "\n"))
		g.key = "oci-" + hex.EncodeToString(h[:])[:40]
	}
	return groups, nil
}

// scanAll scans the layers to unpack, two at a time (scanning is
// decompressing and hashing: CPU-bound), and returns the first failure
// in layer order.
func (r *reader) scanAll(ctx context.Context, groups []*group) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var jobs []*layerRef
	for _, g := range groups {
		if !g.cached {
			jobs = append(jobs, g.layers...)
		}
	}
	errs := make([]error, len(jobs))
	sem := make(chan struct{}, 2)
	var wg sync.WaitGroup
	for i, l := range jobs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			if ctx.Err() != nil {
				errs[i] = ctx.Err()
				return
			}
			if _, errs[i] = r.scan(ctx, l); errs[i] != nil {
				cancel()
			}
		})
	}
	wg.Wait()
	var first error
	for _, err := range errs {
		if err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
		if first == nil {
			first = err
		}
	}
	if first != nil {
		return first
	}
	for _, g := range groups {
		for _, l := range g.layers {
			g.unpacked += l.unpacked
			g.content += l.content
		}
	}
	return nil
}

// build makes the view and the layers the cache lacks, in order: a
// group is applied while the one below is sealed (made an ext4 layer).
func (r *reader) build(ctx context.Context, groups []*group, out *Layers) (err error) {
	r.v = newView(r.o.MaxFiles)
	var pending chan error // the seal in flight
	var pendingKey string
	wait := func() error {
		if pending == nil {
			return nil
		}
		err := <-pending
		pending = nil
		if err == nil {
			out.made = append(out.made, pendingKey)
		}
		return err
	}
	defer func() {
		if werr := wait(); err == nil {
			err = werr
		}
	}()
	for gi, g := range groups {
		if g.cached {
			close(g.done)
			if err := r.replay(ctx, g, gi, r.v); err != nil {
				return err
			}
			continue
		}
		seal, err := r.make(ctx, groups, gi, r.v)
		if err != nil {
			close(g.done)
			return err
		}
		if err := wait(); err != nil {
			seal() // removes the stage; the layer made goes with the import
			out.made = append(out.made, g.key)
			return err
		}
		ch := make(chan error, 1)
		pending, pendingKey = ch, g.key
		go func() { ch <- seal() }()
	}
	return nil
}

// scanned is what reading a layer once found.
type scanned struct {
	diffID, digest string
	// unpacked is the tar's size; content what its files take on disk.
	unpacked, content int64
}

// scan reads a layer without writing anything: every entry checked,
// the blob's digest and size and the diff id verified, its size
// measured, bounded by the free space.
func (r *reader) scan(ctx context.Context, l *layerRef) (scanned, error) {
	free, err := r.free()
	if err != nil {
		return scanned{}, err
	}
	limit := max(free-reserve, 1)
	k, err := r.keeper(l)
	if err != nil {
		return scanned{}, err
	}
	s, err := openLayerKeep(l, limit, k.writer())
	if err != nil {
		k.abort()
		return scanned{}, err
	}
	defer s.Close()
	kept := false
	defer func() {
		if !kept {
			k.abort()
		}
	}()
	var sc scanned
	total := int64(0)
	if l.comp == uncompressed {
		total = l.size
	}
	for i := 0; ; i++ {
		if i%256 == 0 {
			if err := ctx.Err(); err != nil {
				return scanned{}, err
			}
			r.report(image.Progress{Phase: "verify", Done: l.n, Total: l.of, Bytes: s.plain.n, TotalBytes: total, Line: l.String()})
		}
		h, err := s.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return scanned{}, r.tooBig(err, l, free)
		}
		if _, err := parseEntry(h); err != nil {
			return scanned{}, fmt.Errorf("%s: %w", l, err)
		}
		sc.content += (h.Size+4095)&^4095 + 256
	}
	if sc.diffID, err = s.finish(); err != nil {
		return scanned{}, r.tooBig(err, l, free)
	}
	sc.unpacked = s.plain.n
	sc.digest = sum(s.packed.h, "sha256:")
	if l.digest != "" {
		sc.digest = l.digest
	}
	if err := k.done(l, sc.digest, sc.diffID); err != nil {
		return scanned{}, err
	}
	kept = true
	l.unpacked, l.content = sc.unpacked, sc.content
	r.report(image.Progress{Phase: "verify", Done: l.n, Total: l.of, Bytes: sc.unpacked, TotalBytes: sc.unpacked, Line: l.String() + " verified"})
	return sc, nil
}

// tooBig says a layer larger than the free space is, with the figures.
func (r *reader) tooBig(err error, l *layerRef, free int64) error {
	var big errTooBig
	if !errors.As(err, &big) {
		return err
	}
	return fmt.Errorf("%s unpacks to more than the data filesystem (%s) can take: %s free, %s of it kept free; nothing was written: free some space or use a data directory with more",
		l, r.o.ImagesDir, gb(free), gb(reserve))
}

// checkSpace refuses an import the data filesystem cannot hold: each
// layer is staged as files, then written into its ext4 image, then the
// files go.
func (r *reader) checkSpace(groups []*group) error {
	// A layer is staged while the one below is still being written,
	// so two stages can be there at once.
	var sum, peak, prev int64
	for _, g := range groups {
		if g.cached {
			prev = 0
			continue
		}
		sum += g.content + g.content/10
		peak = max(peak, prev+g.content)
		prev = g.content
	}
	if sum == 0 {
		return nil
	}
	need := sum + peak + reserve
	free, err := r.free()
	if err != nil {
		return err
	}
	if need > free {
		return fmt.Errorf("importing %s needs %s (%s of layers, staged once more while each ext4 layer is written) and the data filesystem (%s) has %s free: nothing was written; free some space or use a data directory with more",
			r.o.Name, gb(need), gb(sum), r.o.ImagesDir, gb(free))
	}
	return nil
}

// replay brings a cached layer into the view from the index it holds.
func (r *reader) replay(ctx context.Context, g *group, gi int, v *view) error {
	r.report(image.Progress{Phase: "unpack", Done: g.layers[len(g.layers)-1].n, Total: g.layers[0].of, Line: fmt.Sprintf("%s is cached (%s)", g.layers[0], g.key)})
	f, err := os.CreateTemp(r.work, "index-")
	if err != nil {
		return err
	}
	defer f.Close()
	if err := readLayerFile(ctx, g.layer.Path, "/"+indexFile, f, 1<<30); err != nil {
		return fmt.Errorf("cached layer %s: %w (remove it to import again)", g.layer.Path, err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	if err := replayIndex(f, v, gi); err != nil {
		return fmt.Errorf("cached layer %s: %w (remove it to import again)", g.layer.Path, err)
	}
	return nil
}

// make applies a group's layers into a stage and checks their digests.
// It returns what seals the stage: its index written, the ext4 layer
// made of it and stored in the cache, the stage removed. Sealing runs
// while the next group is applied; done closes when it has.
func (r *reader) make(ctx context.Context, groups []*group, gi int, v *view) (seal func() error, err error) {
	g := groups[gi]
	cache := image.LayerCacheDir(r.o.ImagesDir)
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return nil, err
	}
	// 0700: the stage holds the image's devices and setuid files.
	work, err := os.MkdirTemp(cache, ".oci-")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(work)
		}
	}()
	tree := filepath.Join(work, "tree")
	upper := filepath.Join(tree, "upper")
	if err := os.Mkdir(tree, 0o755); err != nil {
		return nil, err
	}
	if err := os.Mkdir(upper, 0o755); err != nil {
		return nil, err
	}
	st, err := openStage(upper)
	if err != nil {
		return nil, err
	}
	defer st.close()
	root := v.lookup(nil)
	if err := setMetaFd(st.root, meta{mode: root.mode, uid: root.uid, gid: root.gid, xattr: root.xattr}, nil); err != nil {
		return nil, fmt.Errorf("stage %s: %w", upper, err)
	}
	a := newApplier(v, st, gi)
	a.lower = func(ctx context.Context, group int, real []string, dst io.Writer) error {
		lg := groups[group]
		select {
		case <-lg.done:
		case <-ctx.Done():
			return ctx.Err()
		}
		if lg.layer.Path == "" {
			return errors.New("the layer below was not made")
		}
		return readLayerFile(ctx, lg.layer.Path, "/upper/"+strings.Join(real, "/"), dst, 16<<30)
	}
	for _, l := range g.layers {
		s, err := openLayer(l, l.unpacked+1)
		if err != nil {
			return nil, err
		}
		err = a.apply(ctx, s, func(n int64) {
			r.report(image.Progress{Phase: "unpack", Done: l.n, Total: l.of, Bytes: n, TotalBytes: l.unpacked, Line: l.String()})
		})
		if err == nil {
			// Read again since it was verified: checked again.
			_, err = s.finish()
		}
		s.Close()
		if err != nil {
			return nil, err
		}
	}
	if err := a.endGroup(); err != nil {
		return nil, err
	}
	if a.dropped > 0 {
		r.report(image.Progress{Phase: "unpack", Line: fmt.Sprintf("%d extended attribute(s) not kept, the first %s", a.dropped, a.dropOne)})
	}
	return func() error {
		defer close(g.done)
		defer os.RemoveAll(work)
		if _, err := writeIndex(upper, filepath.Join(tree, indexFile)); err != nil {
			return fmt.Errorf("list the layer: %w", err)
		}
		r.report(image.Progress{Phase: "image", Done: g.layers[len(g.layers)-1].n, Total: g.layers[0].of, Bytes: g.content,
			Line: fmt.Sprintf("writing berth layer %d (mkfs.ext4 -d, nothing mounted)", gi+1)})
		uuid := image.NewUUID()
		file := filepath.Join(work, "layer.img")
		if _, err := image.MakeLayer(ctx, tree, file, uuid); err != nil {
			return err
		}
		l, err := image.StoreLayer(r.o.ImagesDir, file, g.key, uuid)
		if err != nil {
			return err
		}
		g.layer = l
		return nil
	}, nil
}

// resolveUser checks the config's User against the image's own
// /etc/passwd and /etc/group, by the rules the agent runs commands as it
// with (guest/users), and records its ids and home.
func (r *reader) resolveUser(ctx context.Context, c *image.Config, v *view, groups []*group) error {
	if c.User == "" {
		return nil
	}
	passwd, err := r.imageFile(ctx, v, groups, "etc/passwd")
	if err != nil {
		return err
	}
	grp, err := r.imageFile(ctx, v, groups, "etc/group")
	if err != nil {
		return err
	}
	u, err := users.Lookup(c.User, passwd, grp)
	var unknown *users.UnknownError
	switch {
	case errors.As(err, &unknown):
		return fmt.Errorf("the image's config runs as %s %q, which the image's /etc/%s does not have: the image cannot run as it says",
			unknown.Kind, unknown.Name, unknown.File())
	case err != nil:
		return fmt.Errorf("the image's config names its user badly: %w", err)
	}
	c.UID, c.GID, c.Home = u.UID, u.GID, u.Home
	return nil
}

// imageFile reads a small file of the image, through its symlinks, out
// of the layer holding it; nil when the image has none.
func (r *reader) imageFile(ctx context.Context, v *view, groups []*group, p string) ([]byte, error) {
	parts, _ := splitPath(p)
	real, err := v.resolve(parts, true)
	if err != nil {
		return nil, fmt.Errorf("/%s: %w", p, err)
	}
	n := v.lookup(real)
	if n == nil || n.kind != kindFile {
		return nil, nil
	}
	var buf bytes.Buffer
	if err := readLayerFile(ctx, groups[n.group].layer.Path, "/upper/"+strings.Join(real, "/"), &buf, 4<<20); err != nil {
		return nil, fmt.Errorf("read /%s of the image: %w", p, err)
	}
	return buf.Bytes(), nil
}

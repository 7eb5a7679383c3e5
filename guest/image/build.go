// Package image builds berth's guest images: a Debian kernel fetched with
// apt (never installed on the host), a gzip'd initramfs holding the agent
// as /init with the kernel modules it loads, and for root filesystem images
// (debian, recipes) read-only ext4 layers built with mmdebstrap and
// mkfs.ext4 -d, without mounting anything. Images live under
// <data>/images/<name>/<digest>/; sessions pin the digest they were made
// with, so a rebuild never changes the layers under a session's system disk.
package image

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/berthvm/berth/assets"
)

// builderVersion changes whenever the layout the builder writes changes,
// so old images are rebuilt.
const builderVersion = "4"

// Image is a built guest image.
type Image struct {
	Name   string `json:"name"`
	Digest string `json:"digest"`
	// Dir is the image's directory; Kernel and Initramfs are in it.
	Dir       string `json:"-"`
	Kernel    string `json:"-"`
	Initramfs string `json:"-"`
	// Layers are the read-only root filesystem layers, bottom first; none
	// for mini, whose root is the initramfs.
	Layers        []Layer       `json:"layers,omitempty"`
	KernelVersion string        `json:"kernel_version"`
	Modules       []string      `json:"modules"`
	Packages      []string      `json:"packages,omitempty"`  // asked for
	Installed     int           `json:"installed,omitempty"` // packages in the root
	InitramfsSize int64         `json:"initramfs_size"`
	Built         time.Time     `json:"built"`
	BuildTook     time.Duration `json:"build_took_ns,omitempty"`
	// Source says what it was built from: "berth" for shipped images,
	// the recipe file's path, or for an imported image where it came from
	// (e.g. "oci-archive:/srv/app.tar", "docker-archive:-" for standard
	// input).
	Source string `json:"source"`
	// SourceDigest identifies an imported image as its source named it:
	// the OCI manifest's digest, or a docker archive's image id (its
	// config's digest); empty for built images.
	SourceDigest string `json:"source_digest,omitempty"`
	// Config is what an imported image's config asks of the commands run
	// in it; nil for built images. A committed image keeps its parent's.
	Config *Config `json:"config,omitempty"`
	// Parent is the build below an image's own top layer, for an image
	// committed from a session's system disk and for a recipe built on an
	// image ("base = image:NAME"): "debian@1a2b3c4d". An image with
	// children cannot be removed. Label is a commit's.
	Parent string `json:"parent,omitempty"`
	Label  string `json:"label,omitempty"`
	// ConfigBlob and ManifestBlob are the digests of an imported image's
	// config and OCI manifest as its source had them, kept in the blob
	// cache and linked into the build (blobs/<alg>/<hex>) so an export
	// gives the image back as it came; "" when the source had none (a
	// rootfs tarball has no config, a docker archive no OCI manifest).
	ConfigBlob   string `json:"config_blob,omitempty"`
	ManifestBlob string `json:"manifest_blob,omitempty"`
}

// CommittedSource is how a committed image's Source starts: the session's
// name follows.
const CommittedSource = "session:"

// Committed reports whether the image was committed from a session.
func (im Image) Committed() bool { return strings.HasPrefix(im.Source, CommittedSource) }

// Lacks lists what an imported image's record lacks that an import keeps
// now, for `image ls` to show and for the operations that need it to say
// "import it again": "blobs" (the blobs it came as, which an export gives
// back: imports before berth kept them) and "config" (its config's Env,
// User and WorkingDir: a source that has a config, recorded without
// one). Nil for an image berth built or committed.
func (im Image) Lacks() []string {
	if im.SourceDigest == "" || im.Committed() {
		return nil
	}
	var out []string
	if slices.ContainsFunc(im.Layers, func(l Layer) bool { return len(l.Blobs) == 0 }) {
		out = append(out, "blobs")
	}
	if im.Config == nil && !strings.HasPrefix(im.Source, "rootfs:") {
		out = append(out, "config")
	}
	return out
}

// LacksError is the one line an operation that needs what an imported
// image's record lacks (Lacks) says: what is missing and to import it
// again.
func LacksError(name, what, op string) error {
	why := "the blobs it came as"
	if what == "config" {
		why = "its config (Env, User, WorkingDir)"
	}
	return fmt.Errorf("image %s was imported by a berth that did not keep %s, which %s needs: import it again (berth image import SOURCE --name %s)", name, why, op, name)
}

// Config is the part of an OCI image config berth has a place for.
type Config struct {
	Env        []string `json:"env,omitempty"`
	User       string   `json:"user,omitempty"` // as the config says it
	WorkingDir string   `json:"working_dir,omitempty"`
	// Entrypoint and Cmd are kept for information: berth runs no
	// container process.
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
	// UID, GID and Home are User resolved against the image's own
	// /etc/passwd and /etc/group, so nobody parses them again; 0 and ""
	// for root or no User.
	UID  int    `json:"uid,omitempty"`
	GID  int    `json:"gid,omitempty"`
	Home string `json:"home,omitempty"`
}

// PackageCount is how many Debian packages the image's root holds: those
// its build installed, which on debian-minimal with no packages asked for
// are still the base system's. A manifest from before the count was kept
// has only the packages asked for.
func (im Image) PackageCount() int {
	if im.Installed > 0 {
		return im.Installed
	}
	return len(im.Packages)
}

// Layer is one read-only ext4 layer. Its tree lives under /upper in the
// filesystem, as in a system disk, so a build's system disk becomes a
// layer as it is.
type Layer struct {
	File string `json:"file"` // name in the image's directory
	Path string `json:"-"`
	UUID string `json:"uuid"` // ext4 filesystem UUID, how the agent finds it
	Size int64  `json:"size"` // apparent size
	Hash string `json:"hash"` // what went into it
	// Blobs are the OCI layer blobs an imported layer was made from,
	// bottom first (several when the import merged layers, with the
	// empty layers beside them), kept as they came in the blob cache
	// and linked into the build; none for layers berth made itself.
	Blobs []Blob `json:"blobs,omitempty"`
}

// Blob is one OCI layer blob, as an image's manifest and config name it.
type Blob struct {
	// MediaType is the OCI layer media type its bytes are (tar,
	// tar+gzip, tar+zstd), whatever the source called it.
	MediaType string `json:"media_type"`
	Digest    string `json:"digest"`
	Size      int64  `json:"size"`
	// DiffID is the digest of the tar inside.
	DiffID string `json:"diff_id"`
}

// RootFS reports whether the image boots into a root filesystem (layers
// plus a per-session system disk) rather than its initramfs.
func (im Image) RootFS() bool { return len(im.Layers) > 0 }

// DiskBytes is what the image occupies on the host's disk.
func (im Image) DiskBytes() int64 {
	var n int64
	for _, p := range []string{im.Kernel, im.Initramfs} {
		n += allocated(p)
	}
	for _, l := range im.Layers {
		n += allocated(l.Path)
	}
	return n
}

func allocated(path string) int64 {
	var st syscall.Stat_t
	if syscall.Stat(path, &st) != nil {
		return 0
	}
	return st.Blocks * 512
}

// Options configure Build.
type Options struct {
	// Name is the image to build: mini, or a shipped recipe (debian).
	// Ignored when Recipe is set.
	Name string
	// Recipe, if set, is built instead of a shipped image.
	Recipe    *Recipe
	ImagesDir string // <data>/images
	CacheDir  string // where the kernel package is unpacked
	Agent     string // the static berth-agent binary
	Busybox   string // a static busybox; default /bin/busybox
	// Steps runs a recipe's setup commands in a VM; recipes with setup
	// steps need it.
	Steps StepRunner
	// Report receives progress; Progress, when Report is nil, gets it as
	// lines of text.
	Report   func(Progress)
	Progress io.Writer
}

// A StepRunner runs a recipe's setup commands inside a berth VM of the
// image being built, never on the host: the VM boots the layers built so
// far with System as its system disk, and whatever the commands change
// lands on System, which becomes the image's top layer.
type StepRunner interface {
	RunSteps(ctx context.Context, b StepBuild) error
}

// StepBuild is one recipe's setup run.
type StepBuild struct {
	Image      Image  // kernel, initramfs and the layers below the new one
	System     string // path of a fresh, formatted system disk
	SystemUUID string
	// Files is a tar of the recipe's files at their image paths (relative
	// to /), to copy into the VM's root before the steps; nil for none.
	Files   []byte
	Steps   []string
	Timeout time.Duration // per step
	// Net is the network policy the steps get (the recipe's net; "" is
	// none).
	Net    string
	Report func(Progress)
}

// Names lists the images berth can build without a recipe.
func Names() []string { return append([]string{"mini"}, assets.ImageRecipes()...) }

// Files in an image's name directory.
const (
	currentFile  = "current"
	manifestFile = "manifest.json"
	layerCache   = ".layers"
	blobCache    = ".blobs"
)

// Load returns the current build of the named image.
func Load(imagesDir, name string) (Image, error) {
	if err := ValidateName(name); err != nil {
		return Image{}, err
	}
	b, err := os.ReadFile(filepath.Join(imagesDir, name, currentFile))
	if err != nil {
		return Image{}, fmt.Errorf("image %q is not built: run `berth image build %s`", name, name)
	}
	return LoadDigest(imagesDir, name, strings.TrimSpace(string(b)))
}

// LoadDigest returns one build of the named image.
func LoadDigest(imagesDir, name, digest string) (Image, error) {
	if err := ValidateName(name); err != nil {
		return Image{}, err
	}
	if digest == "" || strings.ContainsAny(digest, "/.") {
		return Image{}, fmt.Errorf("image %q: bad digest %q", name, digest)
	}
	dir := filepath.Join(imagesDir, name, digest)
	b, err := os.ReadFile(filepath.Join(dir, manifestFile))
	if err != nil {
		return Image{}, fmt.Errorf("image %s@%s is gone: %w", name, digest, fs.ErrNotExist)
	}
	var im Image
	if err := json.Unmarshal(b, &im); err != nil {
		return Image{}, fmt.Errorf("image %s@%s: corrupt manifest: %w", name, digest, err)
	}
	im.Dir = dir
	im.Kernel = filepath.Join(dir, "vmlinuz")
	im.Initramfs = filepath.Join(dir, "initramfs.cpio.gz")
	paths := []string{im.Kernel, im.Initramfs}
	for i := range im.Layers {
		im.Layers[i].Path = filepath.Join(dir, im.Layers[i].File)
		paths = append(paths, im.Layers[i].Path)
	}
	for _, p := range paths {
		if _, err := os.Stat(p); err != nil {
			return Image{}, fmt.Errorf("image %s@%s is incomplete (%v): rebuild it with `berth image build %s`", name, digest, err, name)
		}
	}
	return im, nil
}

// Builds lists every build of every image: the current one of each name
// first, then older ones still on disk (kept for the sessions made with
// them).
func Builds(imagesDir string) ([]Image, error) {
	ents, err := os.ReadDir(imagesDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Image
	for _, e := range ents {
		name := e.Name()
		if ValidateName(name) != nil {
			continue
		}
		cur, _ := Load(imagesDir, name)
		if cur.Digest != "" {
			out = append(out, cur)
		}
		ds, _ := os.ReadDir(filepath.Join(imagesDir, name))
		for _, d := range ds {
			if !d.IsDir() || d.Name() == cur.Digest || strings.HasPrefix(d.Name(), ".") {
				continue
			}
			if im, err := LoadDigest(imagesDir, name, d.Name()); err == nil {
				out = append(out, im)
			}
		}
	}
	return out, nil
}

// Remove deletes every build of the named image. The caller makes sure no
// session uses it.
func Remove(imagesDir, name string) error {
	if err := ValidateName(name); err != nil {
		return err
	}
	dir := filepath.Join(imagesDir, name)
	if _, err := os.Stat(dir); err != nil {
		return fmt.Errorf("image %q: %w", name, fs.ErrNotExist)
	}
	unlock, err := tryLockFile(nameLock(imagesDir, name))
	if errors.Is(err, errLocked) {
		return fmt.Errorf("image %q is being built (by another process using %s): remove it once that build ends", name, imagesDir)
	}
	if err != nil {
		return err
	}
	defer unlock()
	// Renamed away first, so a half-removed image is never loadable.
	gone := filepath.Join(imagesDir, ".rm-"+name+"-"+randHex(4))
	if err := os.Rename(dir, gone); err != nil {
		return err
	}
	err = os.RemoveAll(gone)
	pruneLayerCache(imagesDir)
	return err
}

// nameLock is the lock file a build of name holds (see lockFile), in a
// directory of its own so that removing the image leaves it alone. The
// directory is made here: images built before it existed have none.
func nameLock(imagesDir, name string) string {
	dir := filepath.Join(imagesDir, ".locks")
	os.MkdirAll(dir, 0o755)
	return filepath.Join(dir, name+".lock")
}

// Prune removes the builds of name that are neither current nor kept.
// While another process builds name, it leaves them for a later prune.
func Prune(imagesDir, name string, keep func(digest string) bool) {
	if unlock, err := tryLockFile(nameLock(imagesDir, name)); err == nil {
		cur, _ := Load(imagesDir, name)
		ds, _ := os.ReadDir(filepath.Join(imagesDir, name))
		for _, d := range ds {
			// Dot directories are builds being committed.
			if d.IsDir() && !strings.HasPrefix(d.Name(), ".") && d.Name() != cur.Digest && !keep(d.Name()) {
				os.RemoveAll(filepath.Join(imagesDir, name, d.Name()))
			}
		}
		unlock()
	}
	pruneLayerCache(imagesDir)
}

// pruneLayerCache drops cached layers no image links to any more, but not
// one a build holds: it has just stored it and links it into its image
// only when it commits. A shared initramfs goes once no image has linked
// it for initrdKeep (its ctime is its last link or unlink), so one image
// removed and another made soon after share it still; an image about to
// link one that is gone makes its own.
func pruneLayerCache(imagesDir string) {
	initrds, _ := filepath.Glob(filepath.Join(imagesDir, layerCache, "*"+initrdSuffix))
	for _, f := range initrds {
		var st syscall.Stat_t
		if syscall.Stat(f, &st) == nil && st.Nlink == 1 && time.Since(time.Unix(st.Ctim.Unix())) > initrdKeep {
			os.Remove(f)
		}
	}
	pruneBlobs(imagesDir)
	files, _ := filepath.Glob(filepath.Join(imagesDir, layerCache, "*.img"))
	for _, f := range files {
		var st syscall.Stat_t
		if syscall.Stat(f, &st) != nil || st.Nlink != 1 {
			continue
		}
		lock := strings.TrimSuffix(f, ".img") + ".lock"
		unlock, err := tryLockFile(lock)
		if err != nil {
			continue
		}
		if syscall.Stat(f, &st) == nil && st.Nlink == 1 {
			os.Remove(f)
			os.Remove(strings.TrimSuffix(f, ".img") + ".json")
			os.Remove(lock)
		}
		unlock()
	}
}

// Build builds an image unless a build from the same inputs exists. It
// reports whether it built anything.
func Build(ctx context.Context, o Options) (Image, bool, error) {
	if o.Report == nil {
		w := o.Progress
		if w == nil {
			w = io.Discard
		}
		o.Report = func(p Progress) { fmt.Fprintln(w, p.String()) }
	}
	if o.Busybox == "" {
		o.Busybox = "/bin/busybox"
	}
	r := o.Recipe
	if r == nil {
		if o.Name == "" {
			o.Name = "mini"
		}
		if o.Name != "mini" {
			var err error
			if r, err = ShippedRecipe(o.Name); err != nil {
				return Image{}, false, err
			}
		}
	}
	name := "mini"
	if r != nil {
		name = r.Name
	}
	// One build of an image at a time, across processes too: the second
	// finds the first's build up to date.
	unlock, err := lockFile(ctx, nameLock(o.ImagesDir, name), func() {
		o.Report(Progress{Phase: "wait", Line: waitingFor(filepath.Join(o.ImagesDir, name))})
	})
	if err != nil {
		return Image{}, false, err
	}
	defer unlock()
	b := &builder{o: o, start: time.Now()}
	defer b.release()
	if r == nil {
		return b.mini(ctx)
	}
	return b.rootfs(ctx, r)
}

type builder struct {
	o     Options
	start time.Time
	// held releases the layer locks the build holds until its image is
	// committed (pruning leaves a held layer alone).
	held []func()
	// shared, when set, makes commit link the kernel and an initramfs
	// many images share (sharedInitramfs) instead of writing copies.
	shared *sharedBoot
}

// sharedBoot is what an assembled image links rather than copies: the
// kernel from the kernel cache and an initramfs from the layer cache,
// with a way to make the initramfs's bytes should the cached file be
// pruned before it is linked.
type sharedBoot struct {
	initrd string
	make   func() ([]byte, error)
}

func (b *builder) release() {
	for _, unlock := range b.held {
		unlock()
	}
	b.held = nil
}

// holdLayer locks the cached layer hash: while a build makes it, others
// wait for it rather than make it again; once made, it stays until the
// build has linked it into its image. The lock is exclusive until then,
// also for a layer found cached: a daemon builds one image at a time
// anyway, and pruning, which runs beside builds, must not take the layer
// between the build finding it and linking it.
func (b *builder) holdLayer(ctx context.Context, hash string) error {
	cache := filepath.Join(b.o.ImagesDir, layerCache)
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return err
	}
	unlock, err := lockFile(ctx, filepath.Join(cache, hash+".lock"), func() {
		b.report(Progress{Phase: "wait", Line: waitingFor("layer " + hash + " in " + cache)})
	})
	if err != nil {
		return err
	}
	b.held = append(b.held, unlock)
	return nil
}

func (b *builder) report(p Progress) { b.o.Report(p) }

// inputs reads what every image boots from: the agent, the kernel and
// those of the wanted modules the kernel has, in load order.
func (b *builder) inputs(ctx context.Context, want []string) (agent []byte, k Kernel, mods []string, err error) {
	agent, err = os.ReadFile(b.o.Agent)
	if err != nil {
		return nil, Kernel{}, nil, fmt.Errorf("read the guest agent: %w (build it with `make`)", err)
	}
	k, err = FetchKernel(ctx, b.o.CacheDir, progressWriter{b.report})
	if err != nil {
		return nil, Kernel{}, nil, err
	}
	mods, err = resolveModules(k, want)
	if err != nil {
		return nil, Kernel{}, nil, err
	}
	return agent, k, mods, nil
}

// rootModules are what an image with a root filesystem boots with: the
// initramfs's and those its disks need.
func rootModules() []string { return append(assets.Modules(), assets.RootModules()...) }

type progressWriter struct{ report func(Progress) }

func (w progressWriter) Write(p []byte) (int, error) {
	w.report(Progress{Phase: "kernel", Line: strings.TrimSpace(string(p))})
	return len(p), nil
}

func (b *builder) mini(ctx context.Context) (Image, bool, error) {
	name := "mini"
	agent, k, mods, err := b.inputs(ctx, assets.Modules())
	if err != nil {
		return Image{}, false, err
	}
	busybox, err := os.ReadFile(b.o.Busybox)
	if err != nil {
		return Image{}, false, fmt.Errorf("read busybox: %w (install Debian's busybox-static)", err)
	}
	h := sha256.New()
	fmt.Fprintf(h, "builder %s\nmini\nkernel %s\nmodules %s\n", builderVersion, k.Package, strings.Join(mods, " "))
	h.Write(agent)
	h.Write(busybox)
	digest := hex.EncodeToString(h.Sum(nil))[:16]
	if im, ok := b.upToDate(name, digest, k); ok {
		return im, false, nil
	}
	applets, err := busyboxApplets(ctx, b.o.Busybox)
	if err != nil {
		return Image{}, false, err
	}
	b.report(Progress{Phase: "image", Line: "writing the initramfs"})
	raw, order, err := initramfs(k, mods, agent, gzip.BestCompression, func(cw *cpioWriter) {
		cw.File("bin/busybox", 0o755, busybox)
		for _, a := range applets {
			if a != "busybox" {
				cw.Symlink("bin/"+a, "busybox")
			}
		}
		cw.File("bin/printenv", 0o755, []byte(printenv))
		cw.File("bin/nohup", 0o755, []byte(nohup))
		cw.File("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\n"))
		cw.File("etc/group", 0o644, []byte("root:x:0:\n"))
		cw.File("etc/hostname", 0o644, []byte("berth\n"))
	})
	if err != nil {
		return Image{}, false, err
	}
	im := Image{Name: name, Digest: digest, KernelVersion: k.Version, Modules: order, Source: "berth"}
	im, err = b.commit(im, k, raw, nil)
	if err != nil {
		return Image{}, false, err
	}
	b.report(Progress{Phase: "done", Line: fmt.Sprintf("built image %s (%s) in %s: kernel %s, %d modules, agent %s, busybox with %d applets, initramfs %s: %s",
		name, digest, time.Since(b.start).Round(time.Millisecond), k.Version, len(order), mbytes(int64(len(agent))), len(applets), mbytes(im.InitramfsSize), im.Dir)})
	return im, true, nil
}

// upToDate returns the current build when it has digest.
func (b *builder) upToDate(name, digest string, k Kernel) (Image, bool) {
	im, err := Load(b.o.ImagesDir, name)
	if err != nil || im.Digest != digest {
		return Image{}, false
	}
	b.report(Progress{Phase: "done", Line: fmt.Sprintf("image %s is up to date (%s, kernel %s): %s", name, digest, k.Version, im.Dir)})
	return im, true
}

func resolveModules(k Kernel, want []string) ([]string, error) {
	ix, err := loadModuleIndex(k.ModulesDir)
	if err != nil {
		return nil, err
	}
	return ix.resolve(want)
}

// initramfs writes the agent as /init, the modules and their load order,
// and whatever extra adds.
func initramfs(k Kernel, mods []string, agent []byte, level int, extra func(*cpioWriter)) ([]byte, []string, error) {
	var raw bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&raw, level)
	cw := &cpioWriter{w: zw}
	for _, d := range []string{"bin", "sbin", "usr", "usr/bin", "usr/sbin", "dev", "proc", "sys", "tmp", "run", "root", "etc", "workspace", "lib", "lib/modules"} {
		cw.Dir(d, 0o755)
	}
	cw.File("init", 0o755, agent)
	if extra != nil {
		extra(cw)
	}
	var order []string
	for _, m := range mods {
		b, err := os.ReadFile(filepath.Join(k.ModulesDir, m))
		if err != nil {
			return nil, nil, err
		}
		name := filepath.Base(m)
		cw.File("lib/modules/"+name, 0o644, b)
		order = append(order, name)
	}
	cw.File("lib/modules/order", 0o644, []byte(strings.Join(order, "\n")+"\n"))
	if err := cw.Close(); err != nil {
		return nil, nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, nil, err
	}
	return raw.Bytes(), order, nil
}

// commit writes a build into a fresh directory, links its layers in, and
// makes it current: a half-written build is never loadable, and the
// builds sessions use stay as they are.
func (b *builder) commit(im Image, k Kernel, initrd []byte, layers []string) (Image, error) {
	nameDir := filepath.Join(b.o.ImagesDir, im.Name)
	if err := os.MkdirAll(nameDir, 0o755); err != nil {
		return Image{}, err
	}
	tmp, err := os.MkdirTemp(nameDir, ".build-")
	if err != nil {
		return Image{}, err
	}
	defer os.RemoveAll(tmp)
	vmlinuz, initramfs := filepath.Join(tmp, "vmlinuz"), filepath.Join(tmp, "initramfs.cpio.gz")
	if b.shared == nil || os.Link(k.Vmlinuz, vmlinuz) != nil { // another filesystem: a copy
		if err := copyFile(k.Vmlinuz, vmlinuz); err != nil {
			return Image{}, err
		}
	}
	if b.shared != nil && os.Link(b.shared.initrd, initramfs) == nil {
		fi, err := os.Stat(initramfs)
		if err != nil {
			return Image{}, err
		}
		im.InitramfsSize = fi.Size()
	} else {
		if initrd == nil && b.shared != nil {
			if initrd, err = b.shared.make(); err != nil {
				return Image{}, err
			}
		}
		if err := os.WriteFile(initramfs, initrd, 0o644); err != nil {
			return Image{}, err
		}
		im.InitramfsSize = int64(len(initrd))
	}
	for i, src := range layers {
		if err := os.Link(src, filepath.Join(tmp, im.Layers[i].File)); err != nil {
			return Image{}, fmt.Errorf("link layer: %w", err)
		}
	}
	if err := linkBlobs(b.o.ImagesDir, tmp, im); err != nil {
		return Image{}, err
	}
	im.Built = time.Now().UTC()
	im.BuildTook = time.Since(b.start).Round(time.Millisecond)
	man, _ := json.MarshalIndent(im, "", "  ")
	if err := os.WriteFile(filepath.Join(tmp, manifestFile), append(man, '\n'), 0o644); err != nil {
		return Image{}, err
	}
	if err := syncTree(tmp); err != nil {
		return Image{}, err
	}
	dst := filepath.Join(nameDir, im.Digest)
	os.RemoveAll(dst) // an incomplete build left by a crash
	if err := os.Rename(tmp, dst); err != nil {
		return Image{}, err
	}
	if err := writeAtomic(filepath.Join(nameDir, currentFile), []byte(im.Digest+"\n")); err != nil {
		return Image{}, err
	}
	return LoadDigest(b.o.ImagesDir, im.Name, im.Digest)
}

func (b *builder) rootfs(ctx context.Context, r *Recipe) (Image, bool, error) {
	if cur, err := Load(b.o.ImagesDir, r.Name); err == nil && cur.Source != sourceOf(r) {
		return Image{}, false, fmt.Errorf("image %q already exists, built from %s: remove it first (berth image rm %s) or choose another name: %w",
			r.Name, cur.Source, r.Name, fs.ErrExist)
	}
	p, err := r.plan()
	if err != nil {
		return Image{}, false, err
	}
	if p.setup() && b.o.Steps == nil {
		return Image{}, false, errors.New("this recipe has files or setup steps, which go in through a berth VM: build it through the daemon")
	}
	if p.base != "" {
		return b.onImage(ctx, r, p)
	}
	agent, k, mods, err := b.inputs(ctx, rootModules())
	if err != nil {
		return Image{}, false, err
	}
	rootHash := p.rootHash()
	layerHashes := []string{rootHash}
	if p.setup() {
		sh, err := p.stepsHash(rootHash)
		if err != nil {
			return Image{}, false, err
		}
		layerHashes = append(layerHashes, sh)
	}
	h := sha256.New()
	fmt.Fprintf(h, "builder %s\nrootfs %s\nkernel %s\nmodules %s\nlayers %s\n", builderVersion, r.Name, k.Package, strings.Join(mods, " "), strings.Join(layerHashes, " "))
	h.Write(agent)
	digest := hex.EncodeToString(h.Sum(nil))[:16]
	if im, ok := b.upToDate(r.Name, digest, k); ok {
		return im, false, nil
	}
	raw, order, err := initramfs(k, mods, agent, gzip.DefaultCompression, nil)
	if err != nil {
		return Image{}, false, err
	}
	im := Image{Name: r.Name, Digest: digest, KernelVersion: k.Version, Modules: order, Packages: p.packages, Source: sourceOf(r)}
	base, err := b.rootLayer(ctx, p, rootHash)
	if err != nil {
		return Image{}, false, err
	}
	im.Layers = append(im.Layers, base.layer("layer-0.img"))
	im.Installed = base.installed
	paths := []string{base.path}
	if p.setup() {
		// The setup VM boots the layers below; a partial image with them
		// exists only in a temporary directory.
		below := im
		below.Kernel, below.Layers = k.Vmlinuz, []Layer{base.layer("layer-0.img")}
		below.Layers[0].Path = base.path
		initrd, err := writeTemp(b.o.ImagesDir, raw)
		if err != nil {
			return Image{}, false, err
		}
		defer os.Remove(initrd)
		below.Initramfs = initrd
		top, err := b.stepsLayer(ctx, p, below, layerHashes[1])
		if err != nil {
			return Image{}, false, err
		}
		im.Layers = append(im.Layers, top.layer("layer-1.img"))
		paths = append(paths, top.path)
	}
	im, err = b.commit(im, k, raw, paths)
	if err != nil {
		return Image{}, false, err
	}
	b.report(Progress{Phase: "done", Line: fmt.Sprintf("built image %s (%s) in %s: %d packages, %d layer(s), %s on disk: %s",
		r.Name, digest, time.Since(b.start).Round(time.Millisecond), im.PackageCount(), len(im.Layers), mbytes(im.DiskBytes()), im.Dir)})
	return im, true, nil
}

// maxStack is how many read-only layers a guest stacks: each is a disk
// of the VM (vmm.MaxLayers).
const maxStack = 8

// onImage builds a recipe on an image already here: the base's layers as
// they are (shared through the layer cache, not copied), the recipe's
// files and steps as one setup layer on them, run in a VM of the base.
// The base's config (Env, User, WorkingDir) carries over.
func (b *builder) onImage(ctx context.Context, r *Recipe, p *plan) (Image, bool, error) {
	base, err := Load(b.o.ImagesDir, p.base)
	if err != nil {
		return Image{}, false, fmt.Errorf("base image %q: %w (import, commit or build it first)", p.base, err)
	}
	if !base.RootFS() {
		return Image{}, false, fmt.Errorf("base image %q has no root filesystem to build on", p.base)
	}
	n := len(base.Layers)
	if p.setup() {
		n++
	}
	if n > maxStack {
		return Image{}, false, fmt.Errorf("base image %q has %d layers: with the setup layer that is over the %d a guest stacks; build on an image with fewer", p.base, len(base.Layers), maxStack)
	}
	var layers []Layer
	var paths, hashes []string
	for i, l := range base.Layers {
		if err := b.holdLayer(ctx, l.Hash); err != nil {
			return Image{}, false, err
		}
		c, ok := b.cached(l.Hash)
		if !ok {
			return Image{}, false, fmt.Errorf("layer %s of base image %q is not in the layer cache %s: import or build %q again", l.Hash, p.base, LayerCacheDir(b.o.ImagesDir), p.base)
		}
		layers = append(layers, c.layer(fmt.Sprintf("layer-%d.img", i)))
		paths = append(paths, c.path)
		hashes = append(hashes, l.Hash)
	}
	agent, k, mods, err := b.inputs(ctx, rootModules())
	if err != nil {
		return Image{}, false, err
	}
	layerHashes := hashes
	var stepsHash string
	if p.setup() {
		if stepsHash, err = p.stepsHash("image " + strings.Join(hashes, ",")); err != nil {
			return Image{}, false, err
		}
		layerHashes = append(slices.Clone(hashes), stepsHash)
	}
	h := sha256.New()
	fmt.Fprintf(h, "builder %s\nrootfs %s\nkernel %s\nmodules %s\nlayers %s\n", builderVersion, r.Name, k.Package, strings.Join(mods, " "), strings.Join(layerHashes, " "))
	parent := base.Name + "@" + base.Digest
	fmt.Fprintf(h, "parent %s\n", parent) // the record names it: a new base build is a new build
	cfg, _ := json.Marshal(base.Config)
	h.Write(cfg)
	h.Write(agent)
	digest := hex.EncodeToString(h.Sum(nil))[:16]
	if im, ok := b.upToDate(r.Name, digest, k); ok {
		return im, false, nil
	}
	raw, order, err := initramfs(k, mods, agent, gzip.DefaultCompression, nil)
	if err != nil {
		return Image{}, false, err
	}
	im := Image{Name: r.Name, Digest: digest, KernelVersion: k.Version, Modules: order, Layers: layers,
		Packages: base.Packages, Installed: base.Installed, Source: sourceOf(r), Config: base.Config, Parent: parent}
	if p.setup() {
		below := im
		below.Kernel, below.Layers = k.Vmlinuz, slices.Clone(layers)
		initrd, err := writeTemp(b.o.ImagesDir, raw)
		if err != nil {
			return Image{}, false, err
		}
		defer os.Remove(initrd)
		below.Initramfs = initrd
		b.report(Progress{Phase: "setup", Line: fmt.Sprintf("building on image %s (%s, %d layers)", base.Name, base.Digest, len(base.Layers))})
		top, err := b.stepsLayer(ctx, p, below, stepsHash)
		if err != nil {
			return Image{}, false, err
		}
		im.Layers = append(im.Layers, top.layer(fmt.Sprintf("layer-%d.img", len(layers))))
		paths = append(paths, top.path)
	}
	im, err = b.commit(im, k, raw, paths)
	if err != nil {
		return Image{}, false, err
	}
	b.report(Progress{Phase: "done", Line: fmt.Sprintf("built image %s (%s) on image %s in %s: %d layer(s), %s on disk: %s",
		r.Name, digest, base.Name, time.Since(b.start).Round(time.Millisecond), len(im.Layers), mbytes(im.DiskBytes()), im.Dir)})
	return im, true, nil
}

func sourceOf(r *Recipe) string {
	if r.Dir == "" {
		return "berth"
	}
	return r.Source
}

// cachedLayer is a layer in the cache, shared by every image built on it.
type cachedLayer struct {
	path      string
	uuid      string
	size      int64
	hash      string
	installed int // packages, for a root layer
}

func (c cachedLayer) layer(file string) Layer {
	return Layer{File: file, Path: c.path, UUID: c.uuid, Size: c.size, Hash: c.hash}
}

func (b *builder) layerPath(hash string) string {
	return filepath.Join(b.o.ImagesDir, layerCache, hash+".img")
}

func (b *builder) cached(hash string) (cachedLayer, bool) {
	p := b.layerPath(hash)
	meta, err := os.ReadFile(strings.TrimSuffix(p, ".img") + ".json")
	if err != nil {
		return cachedLayer{}, false
	}
	var c cachedLayer
	var m struct {
		UUID      string `json:"uuid"`
		Size      int64  `json:"size"`
		Installed int    `json:"installed"`
	}
	if json.Unmarshal(meta, &m) != nil {
		return cachedLayer{}, false
	}
	fi, err := os.Stat(p)
	if err != nil || fi.Size() != m.Size {
		return cachedLayer{}, false
	}
	c = cachedLayer{path: p, uuid: m.UUID, size: m.Size, hash: hash, installed: m.Installed}
	return c, true
}

// store moves a finished layer file into the cache.
func (b *builder) store(file, hash, uuid string, installed int) (cachedLayer, error) {
	fi, err := os.Stat(file)
	if err != nil {
		return cachedLayer{}, err
	}
	meta, _ := json.Marshal(map[string]any{"uuid": uuid, "size": fi.Size(), "installed": installed})
	p := b.layerPath(hash)
	if err := syncFile(file); err != nil {
		return cachedLayer{}, err
	}
	if err := writeAtomic(strings.TrimSuffix(p, ".img")+".json", meta); err != nil {
		return cachedLayer{}, err
	}
	if err := os.Rename(file, p); err != nil {
		return cachedLayer{}, err
	}
	return cachedLayer{path: p, uuid: uuid, size: fi.Size(), hash: hash, installed: installed}, nil
}

func (b *builder) rootLayer(ctx context.Context, p *plan, hash string) (cachedLayer, error) {
	if err := b.holdLayer(ctx, hash); err != nil {
		return cachedLayer{}, err
	}
	if c, ok := b.cached(hash); ok {
		b.report(Progress{Phase: "resolve", Line: "root layer " + hash + " is cached"})
		return c, nil
	}
	cache := filepath.Join(b.o.ImagesDir, layerCache)
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return cachedLayer{}, err
	}
	work, err := os.MkdirTemp(cache, ".root-")
	if err != nil {
		return cachedLayer{}, err
	}
	defer os.RemoveAll(work)
	tree := filepath.Join(work, "tree", "upper")
	if err := os.MkdirAll(filepath.Dir(tree), 0o755); err != nil {
		return cachedLayer{}, err
	}
	installed, err := debootstrap(ctx, tree, filepath.Join(b.o.CacheDir, "debs"), work, p.packages, b.report)
	if err != nil {
		return cachedLayer{}, err
	}
	if err := customize(tree); err != nil {
		return cachedLayer{}, err
	}
	used, _, _ := treeSize(tree)
	b.report(Progress{Phase: "image", Bytes: used, Line: "writing the root layer (mkfs.ext4 -d, nothing mounted)"})
	uuid := newUUID()
	file := filepath.Join(work, "layer.img")
	if _, err := makeLayer(ctx, filepath.Join(work, "tree"), file, uuid); err != nil {
		return cachedLayer{}, err
	}
	return b.store(file, hash, uuid, installed)
}

func (b *builder) stepsLayer(ctx context.Context, p *plan, below Image, hash string) (cachedLayer, error) {
	if err := b.holdLayer(ctx, hash); err != nil {
		return cachedLayer{}, err
	}
	if c, ok := b.cached(hash); ok {
		b.report(Progress{Phase: "setup", Line: "setup layer " + hash + " is cached"})
		return c, nil
	}
	work, err := os.MkdirTemp(filepath.Join(b.o.ImagesDir, layerCache), ".steps-")
	if err != nil {
		return cachedLayer{}, err
	}
	defer os.RemoveAll(work)
	sys := filepath.Join(work, "system.img")
	uuid := newUUID()
	if err := CreateSystemDisk(ctx, sys, p.system, uuid); err != nil {
		return cachedLayer{}, err
	}
	files, err := filesTar(p.files)
	if err != nil {
		return cachedLayer{}, err
	}
	err = b.o.Steps.RunSteps(ctx, StepBuild{Image: below, System: sys, SystemUUID: uuid, Files: files, Steps: p.steps, Timeout: p.timeout, Net: p.net, Report: b.report})
	if err != nil {
		return cachedLayer{}, err
	}
	b.report(Progress{Phase: "image", Line: "sealing the setup layer"})
	if err := sealLayer(ctx, sys); err != nil {
		return cachedLayer{}, err
	}
	return b.store(sys, hash, uuid, 0)
}

// sealLayer makes a build's system disk a read-only layer: checked, and
// without a journal (a read-only device cannot replay one).
func sealLayer(ctx context.Context, file string) error {
	if out, err := helper(ctx, "e2fsck", "-fy", file); err != nil {
		var ee *exec.ExitError
		// 1: errors corrected; anything above means it is not sound.
		if !errors.As(err, &ee) || ee.ExitCode() > 1 {
			return fmt.Errorf("check the setup layer: %w: %s", err, lastLine(out))
		}
	}
	if out, err := helper(ctx, "tune2fs", "-O", "^has_journal", file); err != nil {
		return fmt.Errorf("seal the setup layer: %w: %s", err, lastLine(out))
	}
	return nil
}

func helper(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// CreateSystemDisk makes a session's system disk: a sparse ext4 image with
// almost nothing allocated (no reserved GDT blocks, lazy inode tables and
// journal), on which the agent keeps the overlay's upper and work
// directories.
func CreateSystemDisk(ctx context.Context, path string, size int64, uuid string) error {
	if size < 64<<20 {
		return fmt.Errorf("system disk of %d bytes is below the 64 MiB minimum", size)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create system disk: %w", err)
	}
	err = f.Truncate(size)
	f.Close()
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("size system disk: %w", err)
	}
	out, err := helper(ctx, "mkfs.ext4", "-q", "-F", "-L", "berth-system", "-U", uuid, "-O", "^resize_inode,metadata_csum_seed",
		"-E", "lazy_itable_init=1,lazy_journal_init=1,root_owner=0:0", "-m", "0", path)
	if err != nil {
		os.Remove(path)
		if _, lerr := exec.LookPath("mkfs.ext4"); lerr != nil {
			return errors.New("format system disk: mkfs.ext4 not found (install Debian's e2fsprogs)")
		}
		return fmt.Errorf("format system disk: %w: %s", err, lastLine(out))
	}
	return nil
}

func newUUID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func writeTemp(dir string, b []byte) (string, error) {
	f, err := os.CreateTemp(dir, ".initrd-")
	if err != nil {
		return "", err
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}

func writeAtomic(path string, b []byte) error {
	tmp := path + ".tmp-" + randHex(4)
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return syncDir(filepath.Dir(path))
}

func syncFile(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

func syncDir(path string) error {
	d, err := os.Open(path)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// syncTree fsyncs a build directory's files and the directory itself.
func syncTree(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.Type().IsRegular() {
			if err := syncFile(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	return syncDir(dir)
}

// nohup is missing from Debian's busybox build; scripts expect it.
const nohup = `#!/bin/sh
[ $# -eq 0 ] && { echo "usage: nohup COMMAND [ARG...]" >&2; exit 125; }
trap '' HUP
if [ -t 1 ]; then exec >>nohup.out; fi
if [ -t 2 ]; then exec 2>&1; fi
exec "$@"
`

// printenv is missing from busybox too.
const printenv = `#!/bin/sh
[ $# -eq 0 ] && exec env
rc=0
for n in "$@"; do
	case $n in ''|[!A-Za-z_]*|*[!A-Za-z0-9_]*) rc=1; continue;; esac
	if eval "[ \"\${$n+set}\" = set ]"; then eval "printf '%s\n' \"\$$n\""; else rc=1; fi
done
exit $rc
`

func busyboxApplets(ctx context.Context, busybox string) ([]string, error) {
	out, err := exec.CommandContext(ctx, busybox, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("list busybox applets: %w", err)
	}
	var applets []string
	for _, a := range strings.Fields(string(out)) {
		if !strings.ContainsAny(a, "/.") {
			applets = append(applets, a)
		}
	}
	return applets, nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// Store is a data directory's images: where they live and what builds
// them.
type Store struct {
	Dir      string // <data>/images
	CacheDir string // the kernel package cache
	Agent    string // the static berth-agent binary
	Busybox  string // default /bin/busybox
}

// Load returns a build of name: the given digest, or the current one.
func (s *Store) Load(name, digest string) (Image, error) {
	if digest == "" {
		return Load(s.Dir, name)
	}
	return LoadDigest(s.Dir, name, digest)
}

// Build builds name (or o.Recipe) in the store.
func (s *Store) Build(ctx context.Context, o Options) (Image, bool, error) {
	o.ImagesDir, o.CacheDir, o.Agent = s.Dir, s.CacheDir, s.Agent
	if o.Busybox == "" {
		o.Busybox = s.Busybox
	}
	return Build(ctx, o)
}

// Builds lists the store's builds, current ones first per name.
func (s *Store) Builds() ([]Image, error) { return Builds(s.Dir) }

// Remove deletes every build of name.
func (s *Store) Remove(name string) error { return Remove(s.Dir, name) }

// Prune removes builds of name that are neither current nor kept.
func (s *Store) Prune(name string, keep func(digest string) bool) { Prune(s.Dir, name, keep) }

// Shipped reports whether name is an image berth builds by itself.
func Shipped(name string) bool { return slices.Contains(Names(), name) }

// Package image builds berth's guest images in Go: a Debian kernel fetched
// with apt (never installed on the host) and a gzip'd initramfs holding the
// agent as /init, busybox, and the kernel modules the agent loads.
package image

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/berthvm/berth/assets"
)

// builderVersion changes whenever the layout the builder writes changes,
// so old images are rebuilt.
const builderVersion = "3"

// Image is a built guest image.
type Image struct {
	Name          string    `json:"name"`
	Dir           string    `json:"-"`
	Kernel        string    `json:"-"` // path to vmlinuz
	Initramfs     string    `json:"-"` // path to initramfs.cpio.gz
	Digest        string    `json:"digest"`
	KernelVersion string    `json:"kernel_version"`
	Modules       []string  `json:"modules"`
	Size          int64     `json:"initramfs_size"`
	Built         time.Time `json:"built"`
}

// Options configure Build.
type Options struct {
	Name      string // only "mini" for now
	ImagesDir string // <data>/images
	CacheDir  string // where the kernel package is unpacked
	Agent     string // the static berth-agent binary
	Busybox   string // a static busybox; default /bin/busybox
	Progress  io.Writer
}

// Names lists the images berth can build.
func Names() []string { return []string{"mini"} }

// Load returns an image built earlier.
func Load(imagesDir, name string) (Image, error) {
	dir := filepath.Join(imagesDir, name)
	b, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		return Image{}, fmt.Errorf("image %q is not built: run `berth image build %s`", name, name)
	}
	var im Image
	if err := json.Unmarshal(b, &im); err != nil {
		return Image{}, fmt.Errorf("image %q: corrupt manifest: %w", name, err)
	}
	im.Dir = dir
	im.Kernel = filepath.Join(dir, "vmlinuz")
	im.Initramfs = filepath.Join(dir, "initramfs.cpio.gz")
	for _, p := range []string{im.Kernel, im.Initramfs} {
		if _, err := os.Stat(p); err != nil {
			return Image{}, fmt.Errorf("image %q is incomplete (%v): rebuild it with `berth image build %s`", name, err, name)
		}
	}
	return im, nil
}

// Build builds the named image unless an image from the same inputs exists.
// It reports whether it built anything.
func Build(ctx context.Context, o Options) (Image, bool, error) {
	if o.Name == "" {
		o.Name = "mini"
	}
	if o.Name != "mini" {
		return Image{}, false, fmt.Errorf("unknown image %q: berth can build %s", o.Name, strings.Join(Names(), ", "))
	}
	if o.Busybox == "" {
		o.Busybox = "/bin/busybox"
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	agent, err := os.ReadFile(o.Agent)
	if err != nil {
		return Image{}, false, fmt.Errorf("read the guest agent: %w (build it with `make`)", err)
	}
	busybox, err := os.ReadFile(o.Busybox)
	if err != nil {
		return Image{}, false, fmt.Errorf("read busybox: %w (install Debian's busybox-static)", err)
	}
	k, err := FetchKernel(ctx, o.CacheDir, o.Progress)
	if err != nil {
		return Image{}, false, err
	}
	ix, err := loadModuleIndex(k.ModulesDir)
	if err != nil {
		return Image{}, false, err
	}
	mods, err := ix.resolve(assets.Modules())
	if err != nil {
		return Image{}, false, err
	}

	h := sha256.New()
	fmt.Fprintf(h, "builder %s\nkernel %s\nmodules %s\n", builderVersion, k.Package, strings.Join(mods, " "))
	h.Write(agent)
	h.Write(busybox)
	digest := hex.EncodeToString(h.Sum(nil))[:16]
	if im, err := Load(o.ImagesDir, o.Name); err == nil && im.Digest == digest {
		fmt.Fprintf(o.Progress, "image %s is up to date (%s, kernel %s): %s\n", o.Name, digest, k.Version, im.Dir)
		return im, false, nil
	}

	start := time.Now()
	applets, err := busyboxApplets(ctx, o.Busybox)
	if err != nil {
		return Image{}, false, err
	}
	var raw bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&raw, gzip.BestCompression)
	cw := &cpioWriter{w: zw}
	for _, d := range []string{"bin", "sbin", "usr", "usr/bin", "usr/sbin", "dev", "proc", "sys", "tmp", "run", "root", "etc", "workspace", "lib", "lib/modules"} {
		cw.Dir(d, 0o755)
	}
	cw.File("init", 0o755, agent)
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
	var order []string
	for _, m := range mods {
		b, err := os.ReadFile(filepath.Join(k.ModulesDir, m))
		if err != nil {
			return Image{}, false, err
		}
		name := filepath.Base(m)
		cw.File("lib/modules/"+name, 0o644, b)
		order = append(order, name)
	}
	cw.File("lib/modules/order", 0o644, []byte(strings.Join(order, "\n")+"\n"))
	if err := cw.Close(); err != nil {
		return Image{}, false, err
	}
	if err := zw.Close(); err != nil {
		return Image{}, false, err
	}

	// Write into a fresh directory and swap it in, so a running VM's image
	// and a half-written one never mix.
	if err := os.MkdirAll(o.ImagesDir, 0o755); err != nil {
		return Image{}, false, err
	}
	tmp, err := os.MkdirTemp(o.ImagesDir, "."+o.Name+"-")
	if err != nil {
		return Image{}, false, err
	}
	defer os.RemoveAll(tmp)
	im := Image{Name: o.Name, Digest: digest, KernelVersion: k.Version, Modules: order, Size: int64(raw.Len()), Built: time.Now().UTC()}
	if err := copyFile(k.Vmlinuz, filepath.Join(tmp, "vmlinuz")); err != nil {
		return Image{}, false, err
	}
	if err := os.WriteFile(filepath.Join(tmp, "initramfs.cpio.gz"), raw.Bytes(), 0o644); err != nil {
		return Image{}, false, err
	}
	man, _ := json.MarshalIndent(im, "", "  ")
	if err := os.WriteFile(filepath.Join(tmp, "manifest.json"), append(man, '\n'), 0o644); err != nil {
		return Image{}, false, err
	}
	dst := filepath.Join(o.ImagesDir, o.Name)
	old := dst + ".old"
	os.RemoveAll(old)
	os.Rename(dst, old)
	if err := os.Rename(tmp, dst); err != nil {
		return Image{}, false, err
	}
	os.RemoveAll(old)
	im, err = Load(o.ImagesDir, o.Name)
	if err != nil {
		return Image{}, false, err
	}
	fmt.Fprintf(o.Progress, "built image %s (%s) in %s: kernel %s, %d modules, agent %s, busybox with %d applets, initramfs %.1f MB\n  %s\n",
		o.Name, digest, time.Since(start).Round(time.Millisecond), k.Version, len(order), mb(len(agent)), len(applets), float64(im.Size)/1e6, dst)
	return im, true, nil
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

func mb(n int) string { return fmt.Sprintf("%.1f MB", float64(n)/1e6) }

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

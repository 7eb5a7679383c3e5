package image

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

// Kernel is an unpacked Debian kernel package in berth's cache. It is never
// installed on the host.
type Kernel struct {
	Package    string // e.g. linux-image-6.1.0-57-amd64
	Version    string // e.g. 6.1.0-57-amd64
	Vmlinuz    string
	ModulesDir string // lib/modules/<version>
}

// metaPackage is Debian's package that depends on the current kernel.
const metaPackage = "linux-image-amd64"

// run runs a helper with SIGTERM on cancel and a bounded wait.
func run(ctx context.Context, dir string, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 5 * time.Second
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, causeLine(stderr.String()))
	}
	return out, nil
}

// causeLine picks the line of a helper's stderr that says why it failed:
// apt's first "E:" line, else the last line, bounded.
func causeLine(stderr string) string {
	var last string
	for _, l := range strings.Split(stderr, "\n") {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "E: ") {
			last = l
			break
		}
		if l != "" {
			last = l
		}
	}
	if len(last) > 400 {
		last = last[:400] + "…"
	}
	return last
}

// aptState identifies apt's package lists as they are now: the answer
// to "which kernel" only changes when they do.
func aptState() string {
	var parts []string
	for _, p := range []string{"/var/lib/apt/lists", "/var/cache/apt/pkgcache.bin"} {
		if fi, err := os.Stat(p); err == nil {
			parts = append(parts, fmt.Sprintf("%s %d %d", p, fi.Size(), fi.ModTime().UnixNano()))
		}
	}
	return strings.Join(parts, ";")
}

// kernelPackage asks apt which kernel package the meta package points at,
// remembering the answer in dir while apt's lists stay the same (asking
// takes about a second, most of an up-to-date build's time).
func kernelPackage(ctx context.Context, dir string) (string, error) {
	memo := filepath.Join(dir, "resolved")
	state := aptState()
	if b, err := os.ReadFile(memo); err == nil {
		if st, pkg, ok := strings.Cut(strings.TrimSpace(string(b)), "\n"); ok && st == state && state != "" {
			return pkg, nil
		}
	}
	pkg, err := askKernelPackage(ctx)
	if err == nil && state != "" {
		os.MkdirAll(dir, 0o755)
		writeAtomic(memo, []byte(state+"\n"+pkg+"\n")) // read by other builds at any time
	}
	return pkg, err
}

func askKernelPackage(ctx context.Context) (string, error) {
	out, err := run(ctx, "", "apt-cache", "depends", metaPackage)
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(out), "\n") {
		if dep, ok := strings.CutPrefix(strings.TrimSpace(line), "Depends: "); ok && strings.HasPrefix(dep, "linux-image-") {
			return dep, nil
		}
	}
	return "", fmt.Errorf("apt-cache knows no kernel behind %s: run `apt-get update` first", metaPackage)
}

// FetchKernel returns the current Debian kernel, downloading it with
// `apt-get download` and unpacking it with `dpkg-deb -x` into cacheDir the
// first time. Without apt (offline) the newest cached kernel is used.
//
// The cache is shared by every build using cacheDir: a kernel's
// directory appears whole (renamed into place), and one build at a time
// fetches, under cacheDir/kernel/.lock; the others wait, then find it.
func FetchKernel(ctx context.Context, cacheDir string, progress io.Writer) (Kernel, error) {
	if progress == nil {
		progress = io.Discard
	}
	base := filepath.Join(cacheDir, "kernel")
	pkg, err := kernelPackage(ctx, base)
	if err != nil {
		if k, cerr := newestCached(base); cerr == nil {
			fmt.Fprintf(progress, "apt unavailable (%v); using cached %s\n", err, k.Package)
			return k, nil
		}
		return Kernel{}, fmt.Errorf("find the guest kernel package: %w", err)
	}
	dir := filepath.Join(base, pkg)
	if k, err := openKernel(dir, pkg); err == nil {
		return k, nil
	}
	if err := os.MkdirAll(base, 0o755); err != nil {
		return Kernel{}, err
	}
	unlock, err := lockFile(ctx, filepath.Join(base, ".lock"), func() { fmt.Fprintln(progress, waitingFor(base)) })
	if err != nil {
		return Kernel{}, err
	}
	defer unlock()
	if k, err := openKernel(dir, pkg); err == nil {
		return k, nil // fetched by the build we waited for
	}
	tmp, err := os.MkdirTemp(base, ".fetch-")
	if err != nil {
		return Kernel{}, err
	}
	defer os.RemoveAll(tmp)
	fmt.Fprintf(progress, "downloading %s with apt-get download…\n", pkg)
	if _, err := run(ctx, tmp, "apt-get", "download", "-q", pkg); err != nil {
		return Kernel{}, fmt.Errorf("download the guest kernel: %w", err)
	}
	debs, _ := filepath.Glob(filepath.Join(tmp, "*.deb"))
	if len(debs) != 1 {
		return Kernel{}, fmt.Errorf("apt-get download %s left %d .deb files", pkg, len(debs))
	}
	fmt.Fprintf(progress, "unpacking %s (not installing it)…\n", filepath.Base(debs[0]))
	root := filepath.Join(tmp, "root")
	if _, err := run(ctx, tmp, "dpkg-deb", "-x", debs[0], root); err != nil {
		return Kernel{}, fmt.Errorf("unpack the guest kernel: %w", err)
	}
	os.RemoveAll(dir)
	if err := os.Rename(root, dir); err != nil {
		return Kernel{}, err
	}
	return openKernel(dir, pkg)
}

func openKernel(dir, pkg string) (Kernel, error) {
	vmlinuz, _ := filepath.Glob(filepath.Join(dir, "boot", "vmlinuz-*"))
	mods, _ := filepath.Glob(filepath.Join(dir, "lib", "modules", "*"))
	if len(vmlinuz) != 1 || len(mods) != 1 {
		return Kernel{}, fmt.Errorf("%s holds no unpacked kernel", dir)
	}
	return Kernel{Package: pkg, Version: filepath.Base(mods[0]), Vmlinuz: vmlinuz[0], ModulesDir: mods[0]}, nil
}

func newestCached(base string) (Kernel, error) {
	dirs, _ := filepath.Glob(filepath.Join(base, "linux-image-*"))
	sort.Sort(sort.Reverse(sort.StringSlice(dirs)))
	for _, d := range dirs {
		if k, err := openKernel(d, filepath.Base(d)); err == nil {
			return k, nil
		}
	}
	return Kernel{}, errors.New("no cached kernel")
}

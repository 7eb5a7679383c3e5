package image

import (
	"github.com/berthvm/berth/session"

	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/berthvm/berth/assets"
)

// A Recipe says how to build a root filesystem image: Debian packages
// installed on the host with mmdebstrap, host files copied in, then setup
// commands run inside a berth VM of the image being built. Each part is a
// read-only layer, cached by the hash of what went into it.
type Recipe struct {
	// Name is the image's name; sessions choose it with --image.
	Name string `toml:"name"`
	// Base is what the image starts from: "debian" is Debian 12 from
	// Debian's packages (with the shipped debian recipe's packages, files
	// and setup), "debian-minimal" the same without them, "image:NAME"
	// an image already here (imported, committed or built), whose layers
	// the setup layer goes on.
	Base string `toml:"base"`
	// Packages are Debian packages to install besides the base's. An
	// image base has no mmdebstrap: its packages come from setup steps,
	// with the image's own package manager.
	Packages []string `toml:"packages"`
	// Files maps host paths (relative to the recipe's directory) to
	// absolute paths in the image. A directory is copied whole.
	Files map[string]string `toml:"files"`
	// Run lists setup commands, each run with /bin/sh -c as root in
	// /workspace of a build VM, in order; their changes become the top
	// layer.
	Run []string `toml:"run"`
	// StepTimeout bounds each setup command; default 10m.
	StepTimeout string `toml:"step_timeout"`
	// SystemDisk sizes the build VM's system disk, where the setup
	// commands' changes land; default 8G.
	SystemDisk string `toml:"system_disk"`
	// Net is the network policy the setup commands get (as berth create
	// --net); "" is none. A base's steps run under it too.
	Net string `toml:"net"`

	// Dir is where Files' relative paths start (the recipe file's
	// directory); Source names the recipe for messages.
	Dir    string `toml:"-"`
	Source string `toml:"-"`
}

// Suite is the Debian release berth builds from.
const Suite = "bookworm"

// DefaultStepTimeout bounds a setup command when the recipe sets none.
const DefaultStepTimeout = 10 * time.Minute

var (
	imageNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)
	// Debian policy §5.6.1: lower case letters, digits, + - . ; two or
	// more characters, starting with an alphanumeric.
	packageRE = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`)
)

// ValidateName checks an image name (the rules of session names: it is
// used in paths).
func ValidateName(name string) error {
	if !imageNameRE.MatchString(name) {
		return fmt.Errorf("invalid image name %q: use 1-63 of a-z, 0-9 and '-', starting with a letter or digit", name)
	}
	return nil
}

// ParseRecipe reads a recipe file. Unknown keys, missing files and
// malformed entries are errors naming the key or entry.
func ParseRecipe(file string) (*Recipe, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("recipe: %w", err)
	}
	abs, err := filepath.Abs(file)
	if err != nil {
		return nil, err
	}
	return parseRecipe(abs, filepath.Dir(abs), b)
}

// ShippedRecipe returns a recipe shipped with berth (assets/images/*.toml).
func ShippedRecipe(name string) (*Recipe, error) {
	b, ok := assets.ImageRecipe(name)
	if !ok {
		return nil, fmt.Errorf("unknown image %q: berth ships %s; build others with --recipe FILE", name, strings.Join(Names(), ", "))
	}
	return parseRecipe("berth's "+name+" recipe", "", b)
}

func parseRecipe(source, dir string, b []byte) (*Recipe, error) {
	r := &Recipe{Dir: dir, Source: source}
	md, err := toml.NewDecoder(bytes.NewReader(b)).Decode(r)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		return nil, fmt.Errorf("%s: unknown key %q (known: name, base, packages, files, run, step_timeout, system_disk, net)", source, und[0].String())
	}
	if err := r.validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	return r, nil
}

func (r *Recipe) validate() error {
	if r.Name == "" {
		return errors.New(`name is missing (name = "my-image")`)
	}
	if err := ValidateName(r.Name); err != nil {
		return err
	}
	if r.Name == "mini" {
		return errors.New(`name "mini" is berth's initramfs image; choose another`)
	}
	switch base, isImage := r.imageBase(); {
	case isImage:
		if err := ValidateName(base); err != nil {
			return fmt.Errorf("base %q: %w", r.Base, err)
		}
		if base == "mini" {
			return fmt.Errorf(`base %q: mini has no root filesystem to build on; use debian or an imported image`, r.Base)
		}
		if base == r.Name {
			return fmt.Errorf("base %q: an image cannot be built on itself", r.Base)
		}
		if len(r.Packages) > 0 {
			return fmt.Errorf(`packages: an image base has no mmdebstrap; install them in a setup step with the image's own package manager (run = ["apk add %s"] or ["apt-get install -y %s"])`,
				strings.Join(r.Packages, " "), strings.Join(r.Packages, " "))
		}
	case r.Base == "debian", r.Base == "debian-minimal":
	case r.Base == "":
		return errors.New(`base is missing (base = "debian")`)
	default:
		return fmt.Errorf("base %q: use debian, debian-minimal or image:NAME (an image here)", r.Base)
	}
	for _, p := range r.Packages {
		if !packageRE.MatchString(p) {
			return fmt.Errorf("packages: %q is not a Debian package name", p)
		}
	}
	for src, dst := range r.Files {
		if src == "" {
			return errors.New("files: an empty host path")
		}
		if !path.IsAbs(dst) || path.Clean(dst) == "/" || strings.Contains(dst, "\x00") {
			return fmt.Errorf("files: %q → %q: the image path must be absolute and not /", src, dst)
		}
		if c := path.Clean(dst); c == "/workspace" || strings.HasPrefix(c, "/workspace/") {
			return fmt.Errorf("files: %q → %q: /workspace is the session's volume, not part of the image", src, dst)
		}
		if r.Dir == "" {
			continue // shipped recipes carry no host files
		}
		if _, err := os.Lstat(r.hostPath(src)); err != nil {
			return fmt.Errorf("files: %q: %w", src, err)
		}
	}
	for i, step := range r.Run {
		if strings.TrimSpace(step) == "" {
			return fmt.Errorf("run: step %d is empty", i+1)
		}
	}
	if r.SystemDisk != "" {
		n, err := session.ParseSize(r.SystemDisk)
		if err != nil {
			return fmt.Errorf("system_disk %q: %w", r.SystemDisk, err)
		}
		if n < 64<<20 {
			return fmt.Errorf("system_disk %q: want a size of at least 64M, like 8G", r.SystemDisk)
		}
	}
	if r.StepTimeout != "" {
		d, err := time.ParseDuration(r.StepTimeout)
		if err != nil || d < time.Second {
			return fmt.Errorf("step_timeout %q: want a duration of at least 1s, like 10m", r.StepTimeout)
		}
	}
	return nil
}

// imageBase returns NAME for a base of "image:NAME".
func (r *Recipe) imageBase() (string, bool) {
	name, ok := strings.CutPrefix(r.Base, "image:")
	if !ok {
		return "", false
	}
	return name, true
}

// systemBytes is the build VM's system disk size.
func (r *Recipe) systemBytes() int64 {
	if n, err := session.ParseSize(r.SystemDisk); err == nil && r.SystemDisk != "" {
		return n
	}
	return 8 << 30
}

// Timeout is the bound of each setup command.
func (r *Recipe) Timeout() time.Duration {
	if d, err := time.ParseDuration(r.StepTimeout); err == nil && r.StepTimeout != "" {
		return d
	}
	return DefaultStepTimeout
}

func (r *Recipe) hostPath(src string) string {
	if filepath.IsAbs(src) {
		return src
	}
	return filepath.Join(r.Dir, src)
}

// plan is a recipe resolved against its base: the root layer's inputs
// (packages and files) and the setup steps on top.
type plan struct {
	name     string
	base     string   // an image to build on ("image:NAME"), or "" for Debian
	packages []string // sorted, unique
	files    []fileCopy
	steps    []string
	timeout  time.Duration
	system   int64  // the build VM's system disk
	net      string // the steps' network policy
}

type fileCopy struct {
	src, dst string // host path, image path
}

func (r *Recipe) plan() (*plan, error) {
	p := &plan{name: r.Name, timeout: r.Timeout(), system: r.systemBytes(), net: strings.TrimSpace(r.Net)}
	p.base, _ = r.imageBase()
	if r.Base == "debian" && r.Name != "debian" {
		base, err := ShippedRecipe("debian")
		if err != nil {
			return nil, err
		}
		bp, err := base.plan()
		if err != nil {
			return nil, err
		}
		p.packages, p.files, p.steps = bp.packages, bp.files, bp.steps
	}
	p.packages = append(slices.Clone(p.packages), r.Packages...)
	sort.Strings(p.packages)
	p.packages = slices.Compact(p.packages)
	srcs := make([]string, 0, len(r.Files))
	for src := range r.Files {
		srcs = append(srcs, src)
	}
	sort.Strings(srcs)
	for _, src := range srcs {
		p.files = append(p.files, fileCopy{src: r.hostPath(src), dst: path.Clean(r.Files[src])})
	}
	p.steps = append(slices.Clone(p.steps), r.Run...)
	return p, nil
}

// rootHash identifies the root layer: what mmdebstrap installs. Recipes
// that only add files and setup steps share their base's root layer.
func (p *plan) rootHash() string {
	h := sha256.New()
	fmt.Fprintf(h, "rootfs %s %s %s\n", builderVersion, Suite, strings.Join(p.packages, ","))
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// setup reports whether the plan has a setup layer: files or steps.
func (p *plan) setup() bool { return len(p.files) > 0 || len(p.steps) > 0 }

// stepsHash identifies the setup layer: the root it runs on, the files
// copied in (by content) and the steps.
func (p *plan) stepsHash(root string) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "setup %s %s\n", builderVersion, root)
	for _, f := range p.files {
		fmt.Fprintf(h, "file %s\n", f.dst)
		if err := hashTree(h, f.src); err != nil {
			return "", fmt.Errorf("files: %w", err)
		}
	}
	for _, s := range p.steps {
		fmt.Fprintf(h, "%d\n%s\n", len(s), s)
	}
	if p.net != "" { // what the steps could reach is an input too
		fmt.Fprintf(h, "net %s\n", p.net)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// hashTree hashes a file or directory tree: names, modes, link targets and
// contents, in a fixed order.
func hashTree(w io.Writer, root string) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "%s %o %d\n", rel, fi.Mode(), fi.Size())
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			t, err := os.Readlink(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "-> %s\n", t)
		case fi.Mode().IsRegular():
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(w, f)
			f.Close()
			if err != nil {
				return err
			}
		}
		return nil
	})
}

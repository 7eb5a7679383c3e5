package app

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/berthvm/berth/guest/image"
	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/ui/app/local"
	"github.com/berthvm/berth/ui/cli"
)

// imager connects to the daemon, which builds and keeps images: recipes'
// setup steps run in its VMs.
func imager(ctx context.Context, c *cli.Call) (session.Imager, func(), error) {
	cl, err := local.Connect(ctx, globals(c), "cli", false)
	if err != nil {
		return nil, nil, err
	}
	return cl, func() { cl.Close() }, nil
}

func imageBuildCmd() *cli.Command {
	return &cli.Command{
		Name: "image build", Action: session.ActionImage, Group: hostGroup, Usage: "[NAME] [--recipe FILE]", Args: []string{"[NAME]"},
		Summary: "build a guest image: mini, debian, or one from a recipe",
		Help: `Builds an image unless one from the same inputs exists (then it says so at once).
  mini    an initramfs: the berth agent, busybox and the kernel modules; the root is in memory
  debian  Debian 12 from Debian's packages, installed on this host with mmdebstrap (no
          container, no Docker) into a read-only ext4 layer every session of it shares
The kernel is Debian's, fetched with apt-get download into the cache, never installed.

A recipe (TOML) builds an image of your own:
  name = "py-tools"
  base = "debian"                       # or "debian-minimal" (without debian's packages),
                                        # or "image:NAME", an imported or committed image
  packages = ["jq", "make"]             # Debian packages, installed on the host
  files = { "./tool.sh" = "/usr/local/bin/tool.sh" }   # host path = image path
  run = ["pip install --break-system-packages ruff"]   # setup steps, run in a berth VM
  step_timeout = "10m"
Setup steps run inside a VM of the image being built, never on the host; their changes
become the image's top layer. On an image base there is no mmdebstrap: install packages
in setup steps with the image's own package manager (run = ["apk add jq"]); the base's
layers are shared, and its Env, User and WorkingDir carry over.
Each layer is cached by what went into it. Sessions keep
the build they were made with until 'berth replace'.`,
		Example: "berth image build debian\nberth image build --recipe ./py-tools.toml",
		Setup: func(fs *flag.FlagSet) cli.RunFunc {
			recipe := fs.String("recipe", "", "build the recipe in `FILE` (TOML)")
			return func(ctx context.Context, c *cli.Call, args []string) error {
				req := session.BuildRequest{Name: "mini"}
				switch {
				case *recipe != "" && len(args) > 0:
					return fmt.Errorf("image build takes a NAME or --recipe FILE, not both (the recipe names its image)")
				case *recipe != "":
					abs, err := filepath.Abs(*recipe)
					if err != nil {
						return err
					}
					// Checked here too, for an answer before the daemon is involved.
					if _, err := image.ParseRecipe(abs); err != nil {
						return err
					}
					req = session.BuildRequest{Recipe: abs}
				case len(args) == 1:
					req.Name = args[0]
				}
				im, done, err := imager(ctx, c)
				if err != nil {
					return err
				}
				defer done()
				p := newBuildProgress(c.Env().Stdout, c.Env().StdoutTTY)
				info, err := im.BuildImage(ctx, req, p.show)
				p.end()
				if err != nil {
					return err
				}
				if !p.done {
					fmt.Fprintf(c.Env().Stdout, "image %s (%s) is ready\n", info.Name, info.Digest)
				}
				return nil
			}
		},
	}
}

// buildProgress shows a build's progress: on a terminal, one line per
// phase redrawn in place, with setup output printed as it comes; else a
// line per phase and per quarter of a phase's packages.
type buildProgress struct {
	w       io.Writer
	tty     bool
	phase   string
	quarter int
	drawn   bool // a line is open on the terminal
	done    bool
	last    time.Time
}

func newBuildProgress(w io.Writer, tty bool) *buildProgress { return &buildProgress{w: w, tty: tty} }

func (b *buildProgress) show(p session.BuildProgress) {
	text := p.Phase
	if p.Total > 0 {
		text += fmt.Sprintf(" %d/%d", p.Done, p.Total)
	}
	if p.TotalBytes > 0 {
		text += fmt.Sprintf(" %s/%s", session.FormatBytes(p.Bytes), session.FormatBytes(p.TotalBytes))
	} else if p.Bytes > 0 {
		text += " " + session.FormatBytes(p.Bytes)
	}
	line := text
	if p.Line != "" {
		line += ": " + p.Line
	}
	changed := p.Phase != b.phase
	b.phase = p.Phase
	if changed {
		b.quarter = 0
	}
	switch {
	case p.Phase == "done":
		b.clear()
		fmt.Fprintln(b.w, p.Line)
		b.done = true
	case p.Phase == "setup" && p.Total == 0 && !strings.HasPrefix(p.Line, "$ ") && p.Line != "":
		// A setup command's output, or a note: a step's own line carries
		// the count (setup 2/4) and is drawn as progress.
		b.clear()
		fmt.Fprintln(b.w, "  | "+p.Line)
	case b.tty:
		if !changed && time.Since(b.last) < 100*time.Millisecond {
			return
		}
		b.last = time.Now()
		fmt.Fprintf(b.w, "\r%s\x1b[K", line)
		b.drawn = true
	default:
		q := 0
		if p.Total > 0 {
			q = p.Done * 4 / p.Total
		}
		if changed || q > b.quarter || p.Phase == "setup" || p.Phase == "image" {
			b.quarter = q
			fmt.Fprintln(b.w, line)
		}
	}
}

func (b *buildProgress) clear() {
	if b.drawn {
		fmt.Fprint(b.w, "\r\x1b[K")
		b.drawn = false
	}
}

func (b *buildProgress) end() {
	if b.drawn {
		fmt.Fprintln(b.w)
		b.drawn = false
	}
}

func imageImportCmd() *cli.Command {
	return &cli.Command{
		Name: "image import", Action: session.ActionImage, Group: hostGroup, Usage: "SOURCE --name NAME [--ref REF]", Args: []string{"SOURCE"},
		Summary: "import a container image (OCI layout, docker or podman save archive, rootfs tarball)",
		Help: `Imports a container image as a berth image sessions can be created from (--image NAME).
SOURCE is a path on this host, read by the daemon, or - for standard input:
  an OCI image layout     a directory with oci-layout and index.json, or a tar of one
  a docker save archive   docker save app:1 -o app.tar, podman save, or - from a pipe
  a root filesystem       a plain tarball of /, gzip'd or not
Layers are checked against their digests, applied in order with their whiteouts, owners,
modes, extended attributes, links and device nodes, and written as read-only ext4 layers
without mounting anything; each is cached by what it holds, so images that share layers
share them here. The daemon adds berth's kernel and agent; the agent stays PID 1.
The image's config is applied where berth has a place for it: its Env to commands and
shells (a command's own env wins), its WorkingDir as their directory when it is under
/workspace, its User as whom they run (exec and shell --user override it; a new session's
/workspace is that user's). A User the image's /etc/passwd lacks is refused here.
Importing needs the daemon to run as root on its host (layers keep owners and device
nodes). A failed import leaves nothing behind; importing a name again replaces an
earlier import of it, while sessions keep the build they were made with.`,
		Example: "berth image import ./app.tar --name app\ndocker save app:1 | berth image import - --name app\nberth image import ./layout --name tools --ref tools:2",
		Setup: func(fs *flag.FlagSet) cli.RunFunc {
			name := fs.String("name", "", "name the image `NAME` (required)")
			ref := fs.String("ref", "", "import `REF` of a source that holds several images (a tag, name:tag or a reference)")
			return func(ctx context.Context, c *cli.Call, args []string) error {
				if *name == "" {
					return cli.UsageErrorf("--name NAME is required: it names the image sessions are created from")
				}
				req := session.ImportRequest{Name: *name, Source: args[0], Ref: *ref}
				var src io.Reader
				if req.Source == session.ImportStdin {
					if c.Env().StdinTTY {
						return fmt.Errorf("standard input is a terminal: pipe an image into it (docker save app | berth image import - --name app) or give a path")
					}
					src = c.Env().Stdin
				} else {
					abs, err := filepath.Abs(req.Source)
					if err != nil {
						return err
					}
					req.Source = abs
				}
				// Checked here too, for an answer before the daemon is involved.
				if err := image.ValidateName(req.Name); err != nil {
					return err
				}
				im, done, err := imager(ctx, c)
				if err != nil {
					return err
				}
				defer done()
				p := newBuildProgress(c.Env().Stdout, c.Env().StdoutTTY)
				info, err := im.ImportImage(ctx, req, src, p.show)
				p.end()
				if err != nil {
					return err
				}
				out := c.Env().Stdout
				if !p.done {
					fmt.Fprintf(out, "imported %s (%s) as image %s (%s)\n", info.Source, info.SourceDigest, info.Name, info.Digest)
				}
				for _, n := range configNotes(info.Config) {
					fmt.Fprintln(out, n)
				}
				return nil
			}
		},
	}
}

// configNotes say what of an imported image's config berth applies.
func configNotes(c *session.ImageConfig) []string {
	if c == nil {
		return nil
	}
	var out []string
	if len(c.Env) > 0 {
		out = append(out, fmt.Sprintf("  env: %d variable(s) from the image for every command and shell", len(c.Env)))
	}
	switch wd := filepath.Clean(c.WorkingDir); {
	case c.WorkingDir == "":
	case wd == "/workspace" || strings.HasPrefix(wd, "/workspace/"):
		out = append(out, "  commands start in "+wd)
	default:
		out = append(out, fmt.Sprintf("  the image's working directory %s is outside /workspace: commands start in /workspace", c.WorkingDir))
	}
	if c.User != "" && c.User != "root" && c.User != "0" && !strings.HasPrefix(c.User, "0:") && !strings.HasPrefix(c.User, "root:") {
		out = append(out, fmt.Sprintf("  commands and shells run as %s (--user overrides); /workspace is theirs", c.User))
	}
	return out
}

func imageCommitCmd() *cli.Command {
	return &cli.Command{
		Name: "image commit", Action: session.ActionCommitImage, Group: hostGroup, Usage: "NAME IMAGE [--label L] [--json]", Args: []string{"NAME", "IMAGE"},
		Summary: "make session NAME's system disk a new image IMAGE, on the image it runs",
		Help: `The session's system disk (what it changed over its image: packages, /etc, /root) becomes
a read-only layer on top of the image build the session was made with, and IMAGE is that
image with the layer: create sessions from it with --image IMAGE. The session keeps running
on its own disk; a running session's filesystems are flushed and frozen while its disk is
copied (a reflink where the data directory's filesystem has them, else a sparse copy), so
its commands pause for the copy only. The workspace is not part of an image.
Left out, as a new machine makes its own: the machine id, the hostname, SSH host keys
(regenerate them with ssh-keygen -A), /tmp and /var/tmp, and apt's caches (/var/cache/apt;
apt's lists stay). Everything else is captured, secrets included: the output says what,
with the paths that changed most. IMAGE records its parent (image ls shows it), and an
image with sessions or committed images on it cannot be removed. Committing to an IMAGE
committed before makes a new build of it; sessions keep the build they were made with.`,
		Example: "berth image commit dev py-dev --label \"python and tools\"\nberth create next --image py-dev",
		Setup: func(fs *flag.FlagSet) cli.RunFunc {
			label := fs.String("label", "", "describe the image with `L` (one line)")
			asJSON := fs.Bool("json", false, "print the result as JSON")
			return func(ctx context.Context, c *cli.Call, args []string) error {
				req := session.CommitRequest{Session: args[0], Image: args[1], Label: *label}
				// Checked here too, for an answer before the daemon is involved.
				if err := req.Validate(); err != nil {
					return err
				}
				im, done, err := imager(ctx, c)
				if err != nil {
					return err
				}
				defer done()
				res, err := im.CommitImage(ctx, req)
				if err != nil {
					return err
				}
				out := c.Env().Stdout
				if *asJSON {
					enc := json.NewEncoder(out)
					enc.SetIndent("", "  ")
					return enc.Encode(res)
				}
				printCommit(out, req.Session, res)
				return nil
			}
		},
	}
}

// printCommit says what a commit captured and what it left out.
func printCommit(w io.Writer, name string, r session.CommitResult) {
	fmt.Fprintf(w, "image %s (%s) committed from session %s on %s\n", r.Image.Name, r.Image.Digest, name, r.Parent)
	fmt.Fprintf(w, "captured %s on disk: %s, %s", session.FormatBytes(r.Bytes), count(r.Files, "file"), count(r.Dirs, "directory"))
	if r.Deleted > 0 {
		fmt.Fprintf(w, ", %s of the image deleted", count(r.Deleted, "path"))
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if len(r.Top) > 0 {
		fmt.Fprintln(w, "most change:")
		for _, p := range r.Top {
			fmt.Fprintf(tw, "  %s\t%s\t%s\n", p.Path, session.FormatBytes(p.Bytes), count(p.Files, "file"))
		}
		tw.Flush()
	}
	if len(r.LeftOut) > 0 {
		fmt.Fprintln(w, "left out (a new session makes its own):")
		for _, p := range r.LeftOut {
			fmt.Fprintf(tw, "  %s\t%s\t%s\n", p.Path, session.FormatBytes(p.Bytes), count(p.Files, "file"))
		}
		tw.Flush()
	}
	switch {
	case r.State == session.StateCrashed:
		fmt.Fprintf(w, "the session had crashed: its disk is as the crash left it, repaired by e2fsck (%s)", r.Copy)
	case r.Frozen > 0:
		fmt.Fprintf(w, "system disk copied (%s) with the session's commands frozen for %s", r.Copy, r.Frozen.Round(time.Millisecond))
	default:
		fmt.Fprintf(w, "system disk copied (%s) from the %s session", r.Copy, r.State)
	}
	fmt.Fprintf(w, "; took %s\n", r.Took.Round(time.Millisecond))
}

// count is "1 file", "2 files", "3 directories".
func count(n int, one string) string {
	if n == 1 {
		return "1 " + one
	}
	if strings.HasSuffix(one, "y") {
		return fmt.Sprintf("%d %sies", n, strings.TrimSuffix(one, "y"))
	}
	return fmt.Sprintf("%d %ss", n, one)
}

func imageLsCmd() *cli.Command {
	return &cli.Command{
		Name: "image ls", Action: session.ActionRead, Group: hostGroup, Usage: "[--json]",
		Summary: "list images: size, digest, build time, source, the sessions using each",
		Help: `Older builds of an image are listed while sessions made with them exist. SOURCE is
"berth" for images berth ships, the recipe file for recipes, for an imported image
where it came from and the digest its source gave it, and for a committed image the
session and the build it was committed on (--json has them whole, with the label). An
image imported by an older berth says what its record lacks ("lacks" in --json): without
its blobs it cannot be exported, without its config no session can be made of it; import
it again to mend it.`,
		Example: "berth image ls",
		Setup: func(fs *flag.FlagSet) cli.RunFunc {
			asJSON := fs.Bool("json", false, "print JSON")
			return func(ctx context.Context, c *cli.Call, args []string) error {
				im, done, err := imager(ctx, c)
				if err != nil {
					return err
				}
				defer done()
				list, err := im.Images(ctx)
				if err != nil {
					return err
				}
				out := c.Env().Stdout
				if *asJSON {
					if list == nil {
						list = []session.ImageInfo{}
					}
					enc := json.NewEncoder(out)
					enc.SetIndent("", "  ")
					return enc.Encode(list)
				}
				if len(list) == 0 {
					fmt.Fprintln(c.Env().Stderr, "no images; build one with 'berth image build mini' or 'berth image build debian'")
					return nil
				}
				tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, "NAME\tDIGEST\tKIND\tSIZE\tPACKAGES\tBUILT\tTOOK\tSOURCE\tSESSIONS")
				for _, i := range list {
					name := i.Name
					if !i.Current {
						name += " (older)"
					}
					kind, pk := "initramfs", "-"
					if i.RootFS {
						kind = fmt.Sprintf("rootfs, %d layer(s)", i.Layers)
						pk = fmt.Sprint(i.Packages)
					}
					users := strings.Join(i.Sessions, ",")
					if users == "" {
						users = "-"
					}
					if i.SourceDigest != "" { // imported: no Debian packages to count
						pk = "-"
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", name, i.Digest, kind, session.FormatBytes(i.DiskBytes), pk,
						i.Built.Local().Format("2006-01-02 15:04"), i.BuildTook.Round(time.Second), imageSource(i), users)
				}
				return tw.Flush()
			}
		},
	}
}

// imageSource is where an image came from, as image ls shows it: "berth",
// the recipe, or an import's source with its digest, shortened.
func imageSource(i session.ImageInfo) string {
	src := i.Source
	if src == "" {
		src = "-"
	}
	if i.SourceDigest != "" {
		d := i.SourceDigest
		if alg, hex, ok := strings.Cut(d, ":"); ok && len(hex) > 12 {
			d = alg + ":" + hex[:12]
		}
		src += " " + d
	}
	if i.Parent != "" {
		src += " on " + i.Parent
	}
	if len(i.Lacks) > 0 {
		src += " (an older import without its " + strings.Join(i.Lacks, " and ") + ": import it again)"
	}
	return src
}

func imageExportCmd() *cli.Command {
	return &cli.Command{
		Name: "image export", Action: session.ActionImageExport, Group: hostGroup, Usage: "IMAGE -o FILE", Args: []string{"IMAGE"},
		Summary: "export an image as an OCI image layout tarball (berth image import, podman load)",
		Help: `Writes an image as an OCI image layout in a tar, which 'berth image import' (here or
on another host) and 'podman load' read, so images move between hosts. -o - writes it to
standard output (progress then goes to standard error).
The layers of an imported image are written as they were imported, byte for byte, so the
image keeps its digests: imported elsewhere it is the same image, its layers the same.
Layers berth made (debian's, a recipe's setup) are written from their ext4 layers as plain
tars, owners, modes, extended attributes, links and devices kept, deletions as whiteouts;
the first export of such a layer reads it once more to learn its digest. Exporting the
same image twice gives the same bytes. mini is refused: its root is berth's initramfs.
The tarball's size is known before it is written: a file system without room for it is
refused before a byte is written, and the file appears under its name only when whole.`,
		Example: "berth image export app -o app.tar\nberth image export debian -o - | ssh otherhost berth image import - --name debian-copy",
		Setup: func(fs *flag.FlagSet) cli.RunFunc {
			out := fs.String("o", "", "write the tarball to `FILE` (- for standard output; required)")
			return func(ctx context.Context, c *cli.Call, args []string) error {
				if *out == "" {
					return cli.UsageErrorf("-o FILE is required: it says where the tarball goes (- for standard output)")
				}
				if err := image.ValidateName(args[0]); err != nil {
					return err
				}
				env := c.Env()
				progressTo, tty := env.Stdout, env.StdoutTTY
				var dst *exportFile
				if *out == "-" {
					if env.StdoutTTY {
						return fmt.Errorf("standard output is a terminal: redirect it (berth image export %s -o - > %s.tar) or give -o FILE", args[0], args[0])
					}
					progressTo, tty = env.Stderr, false
				} else {
					var err error
					if dst, err = newExportFile(*out); err != nil {
						return err
					}
					defer dst.discard()
				}
				im, done, err := imager(ctx, c)
				if err != nil {
					return err
				}
				defer done()
				p := newBuildProgress(progressTo, tty)
				x, err := im.ExportImage(ctx, session.ExportRequest{Name: args[0]}, func(x session.ImageExport) (io.Writer, error) {
					if dst == nil {
						return env.Stdout, nil
					}
					return dst.open(x)
				}, p.show)
				p.end()
				if err != nil {
					return err
				}
				if dst != nil {
					if err := dst.commit(); err != nil {
						return err
					}
					fmt.Fprintf(progressTo, "wrote %s (%s)\n", *out, session.FormatBytes(x.Size))
				}
				return nil
			}
		},
	}
}

// exportFile is an export's output file: written under a temporary name
// beside it and renamed when whole, so a failed export leaves nothing
// at the path.
type exportFile struct {
	path string
	tmp  *os.File
	done bool
	// free says how many bytes the file's filesystem has free.
	free func(*os.File) (int64, error)
}

func fsFree(f *os.File) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Fstatfs(int(f.Fd()), &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * st.Bsize, nil
}

// newExportFile makes the temporary file for path now, before the
// daemon is asked: a path that cannot be written is said at once.
func newExportFile(path string) (*exportFile, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	if fi, err := os.Stat(abs); err == nil && fi.IsDir() {
		return nil, fmt.Errorf("%s is a directory: give the tarball's file name", path)
	}
	tmp, err := os.CreateTemp(filepath.Dir(abs), "."+filepath.Base(abs)+".berth-export-*")
	if err != nil {
		return nil, fmt.Errorf("cannot write %s: %w", path, errors.Unwrap(err))
	}
	return &exportFile{path: abs, tmp: tmp, free: fsFree}, nil
}

// open checks the tarball fits before a byte of it is written.
func (f *exportFile) open(x session.ImageExport) (io.Writer, error) {
	if free, err := f.free(f.tmp); err == nil {
		if x.Size > free {
			return nil, fmt.Errorf("the tarball of image %s is %s and %s has %s free: nothing was written; free some space or write it elsewhere",
				x.Name, session.FormatBytes(x.Size), filepath.Dir(f.path), session.FormatBytes(free))
		}
	}
	return f.tmp, nil
}

// commit makes the tarball durable and gives it its name.
func (f *exportFile) commit() error {
	if err := f.tmp.Sync(); err != nil {
		return fmt.Errorf("write %s: %w", f.path, err)
	}
	if err := f.tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", f.path, err)
	}
	if err := os.Rename(f.tmp.Name(), f.path); err != nil {
		return fmt.Errorf("write %s: %w", f.path, err)
	}
	f.done = true
	if d, err := os.Open(filepath.Dir(f.path)); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

// discard removes the temporary file unless commit renamed it.
func (f *exportFile) discard() {
	if !f.done {
		f.tmp.Close()
		os.Remove(f.tmp.Name())
	}
}

func imageRmCmd() *cli.Command {
	return &cli.Command{
		Name: "image rm", Action: session.ActionImage, Group: hostGroup, Usage: "NAME", Args: []string{"NAME"},
		Summary: "remove an image and all its builds; refused while a session or a committed image uses it",
		Example: "berth image rm py-tools",
		Setup: func(fs *flag.FlagSet) cli.RunFunc {
			return func(ctx context.Context, c *cli.Call, args []string) error {
				im, done, err := imager(ctx, c)
				if err != nil {
					return err
				}
				defer done()
				if err := im.RemoveImage(ctx, args[0]); err != nil {
					return err
				}
				fmt.Fprintf(c.Env().Stdout, "removed image %s\n", args[0])
				return nil
			}
		},
	}
}

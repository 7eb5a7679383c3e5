package engine

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/guest/image"
	"github.com/berthvm/berth/guest/image/oci"
	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/engine/internal/lock"
	"github.com/berthvm/berth/vmm"
)

var _ session.Imager = (*Manager)(nil)

// Image is what a VM boots: a build of an image, pinned by its digest.
type Image struct {
	Name, Digest      string
	Kernel, Initramfs string
	// Layers are the read-only root layers, bottom first; none for an
	// image whose root is its initramfs.
	Layers []Layer
	// Exec is what an imported image's config asks of its commands.
	Exec execDefaults
	// Lacks is what the record of an older import lacks (image.Lacks).
	Lacks []string
}

// execDefaults are an image's defaults for the commands run in it: the
// environment its config gives, the directory they start in and the user
// they run as.
type execDefaults struct {
	Env map[string]string
	Cwd string // "" for /workspace
	// User is the config's User as it says it ("": root), which the
	// agent resolves in the guest's passwd: commands run as it, and the
	// workspace and what the file API creates are its.
	User string
}

// imageExecDefaults reads an image config's Env, WorkingDir and User as
// defaults for managed commands and shells. A WorkingDir outside
// /workspace is not used: commands start in the session's project.
func imageExecDefaults(c *image.Config) execDefaults {
	var d execDefaults
	if c == nil {
		return d
	}
	for _, kv := range c.Env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.ContainsRune(k, 0) {
			continue
		}
		if d.Env == nil {
			d.Env = map[string]string{}
		}
		d.Env[k] = v
	}
	d.Cwd = workspaceDir(c.WorkingDir)
	d.User = c.User
	return d
}

// workspaceDir returns dir, cleaned, when it is /workspace or under it,
// else "".
func workspaceDir(dir string) string {
	if dir == "" {
		return ""
	}
	dir = filepath.Clean(dir)
	if dir == "/workspace" || strings.HasPrefix(dir, "/workspace/") {
		return dir
	}
	return ""
}

// Layer is one read-only root layer.
type Layer struct{ Path, UUID string }

// RootFS reports whether sessions of the image get a system disk.
func (im Image) RootFS() bool { return len(im.Layers) > 0 }

func fromBuild(b image.Image) Image {
	im := Image{Name: b.Name, Digest: b.Digest, Kernel: b.Kernel, Initramfs: b.Initramfs, Exec: imageExecDefaults(b.Config), Lacks: b.Lacks()}
	for _, l := range b.Layers {
		im.Layers = append(im.Layers, Layer{Path: l.Path, UUID: l.UUID})
	}
	return im
}

// imageBuilds serialises builds: two of the same image would race for its
// name, and on two cores two mmdebstraps only make both slow.
type imageBuilds struct{ mu lock.Mutex }

// resolveImage returns the build of name a session uses: digest, or the
// current build, built now if name is a shipped image never built here.
func (m *Manager) resolveImage(ctx context.Context, name, digest string) (Image, error) {
	st := m.cfg.Images
	if st == nil {
		return Image{}, fmt.Errorf("no image store configured: %w", session.ErrUnavailable)
	}
	b, err := st.Load(name, digest)
	if err == nil {
		return fromBuild(b), nil
	}
	if digest != "" {
		return Image{}, &session.Error{Class: session.ErrNotFound, Msg: fmt.Sprintf("%v; the session's system disk was made on that build", err), Hint: "replacing the session's VM moves it to the current build", Err: err}
	}
	if !image.Shipped(name) {
		return Image{}, &session.Error{Class: session.ErrNotFound, Field: session.FieldImage, Msg: fmt.Sprintf("%q does not exist here", name), Hint: "build it from a recipe or import one, or list the images there are"}
	}
	m.log.Info("building image", "image", name)
	m.builds.mu.Lock()
	defer m.builds.mu.Unlock()
	if b, err := st.Load(name, ""); err == nil {
		return fromBuild(b), nil // built meanwhile
	}
	b, _, err = st.Build(ctx, image.Options{Name: name, Steps: stepRunner{m}, Report: func(p image.Progress) {
		if p.Phase != "download" && p.Phase != "unpack" {
			m.log.Info("image build", "image", name, "progress", p.String())
		}
	}})
	if err != nil {
		return Image{}, fmt.Errorf("build image %q: %w", name, err)
	}
	return fromBuild(b), nil
}

// Images lists every build on disk, with the sessions using each.
func (m *Manager) Images(ctx context.Context) ([]session.ImageInfo, error) {
	if m.cfg.Images == nil {
		return nil, fmt.Errorf("no image store configured: %w", session.ErrUnavailable)
	}
	builds, err := m.cfg.Images.Builds()
	if err != nil {
		return nil, err
	}
	users := m.imageUsers()
	out := make([]session.ImageInfo, 0, len(builds))
	seen := map[string]bool{}
	for _, b := range builds {
		info := session.ImageInfo{
			Name: b.Name, Digest: b.Digest, Current: !seen[b.Name], RootFS: b.RootFS(), Layers: len(b.Layers),
			Packages: b.PackageCount(), DiskBytes: b.DiskBytes(), Built: b.Built, BuildTook: b.BuildTook,
			Source: b.Source, SourceDigest: b.SourceDigest, Config: imageConfig(b.Config), Parent: b.Parent, Label: b.Label,
			Kernel: b.KernelVersion, Sessions: []string{}, Lacks: b.Lacks(),
		}
		seen[b.Name] = true
		for _, u := range users[b.Name] {
			if u.digest == b.Digest || (u.digest == "" && info.Current) {
				info.Sessions = append(info.Sessions, u.session)
			}
		}
		out = append(out, info)
	}
	return out, nil
}

// imageConfig is the part of an image's config the contract shows.
func imageConfig(c *image.Config) *session.ImageConfig {
	if c == nil {
		return nil
	}
	return &session.ImageConfig{Env: c.Env, User: c.User, WorkingDir: c.WorkingDir}
}

type imageUser struct{ session, digest string }

// imageUsers maps image names to the sessions using them.
func (m *Manager) imageUsers() map[string][]imageUser {
	ss := m.all()
	users := map[string][]imageUser{}
	for _, s := range ss {
		s.mu.Lock()
		users[s.rec.Image] = append(users[s.rec.Image], imageUser{s.name, s.rec.ImageDigest})
		s.mu.Unlock()
	}
	for _, u := range users {
		sort.Slice(u, func(i, j int) bool { return u[i].session < u[j].session })
	}
	return users
}

// pruneImage removes builds of name no session uses any more, and their
// templates.
func (m *Manager) pruneImage(name string) {
	if m.cfg.Images == nil {
		return
	}
	before := m.buildDigests(name)
	users := m.imageUsers()[name]
	m.cfg.Images.Prune(name, func(digest string) bool {
		return slices.ContainsFunc(users, func(u imageUser) bool { return u.digest == digest })
	})
	after := m.buildDigests(name)
	m.dropTemplates(name, slices.DeleteFunc(before, func(d string) bool { return slices.Contains(after, d) }))
}

// buildDigests lists the digests of name's builds on disk.
func (m *Manager) buildDigests(name string) []string {
	builds, _ := m.cfg.Images.Builds()
	var out []string
	for _, b := range builds {
		if b.Name == name {
			out = append(out, b.Digest)
		}
	}
	return out
}

// BuildImage builds a shipped image or a recipe.
func (m *Manager) BuildImage(ctx context.Context, req session.BuildRequest, progress func(session.BuildProgress)) (session.ImageInfo, error) {
	if m.cfg.Images == nil {
		return session.ImageInfo{}, fmt.Errorf("no image store configured: %w", session.ErrUnavailable)
	}
	if progress == nil {
		progress = func(session.BuildProgress) {}
	}
	if err := m.checkFloor("build an image"); err != nil {
		return session.ImageInfo{}, err
	}
	o := image.Options{Steps: stepRunner{m}, Report: func(p image.Progress) {
		progress(session.BuildProgress{Phase: p.Phase, Done: p.Done, Total: p.Total, Bytes: p.Bytes, TotalBytes: p.TotalBytes, Line: p.Line})
	}}
	switch {
	case req.Recipe != "":
		r, err := image.ParseRecipe(req.Recipe)
		if err != nil {
			return session.ImageInfo{}, fmt.Errorf("%w: %w", err, session.ErrInvalid)
		}
		if r.Net != "" {
			p, err := session.ParsePolicy(r.Net)
			if err != nil {
				return session.ImageInfo{}, fmt.Errorf("%s: net: %w", r.Source, err)
			}
			r.Net = p.String()
		}
		o.Recipe = r
		req.Name = r.Name
	case req.Name == "":
		req.Name = "mini"
		fallthrough
	default:
		if !image.Shipped(req.Name) {
			return session.ImageInfo{}, &session.Error{Class: session.ErrInvalid, Field: session.FieldImage, Msg: fmt.Sprintf("%q is not one berth ships (%s)", req.Name, strings.Join(image.Names(), ", ")), Hint: "build others from a recipe"}
		}
		o.Name = req.Name
	}
	m.builds.mu.Lock()
	b, built, err := m.cfg.Images.Build(ctx, o)
	m.builds.mu.Unlock()
	if err != nil {
		switch {
		case errors.Is(err, fs.ErrExist):
			return session.ImageInfo{}, fmt.Errorf("%w: %w", err, session.ErrExists)
		case ctx.Err() != nil:
			return session.ImageInfo{}, err
		}
		return session.ImageInfo{}, fmt.Errorf("build image %q: %w", req.Name, err)
	}
	if built {
		m.pruneImage(b.Name)
	}
	return m.imageInfo(ctx, b)
}

// imageInfo lists build b as Images does.
func (m *Manager) imageInfo(ctx context.Context, b image.Image) (session.ImageInfo, error) {
	list, err := m.Images(ctx)
	if err != nil {
		return session.ImageInfo{}, err
	}
	for _, info := range list {
		if info.Name == b.Name && info.Digest == b.Digest {
			return info, nil
		}
	}
	return session.ImageInfo{Name: b.Name, Digest: b.Digest, Current: true, Source: b.Source, SourceDigest: b.SourceDigest}, nil
}

// ImportImage imports a container image with oci.Import: its layers
// into the layer cache every image shares, a kernel and initramfs as
// every image has, the build made current. Imports of different names
// run side by side; one of a name waits for another of it.
func (m *Manager) ImportImage(ctx context.Context, req session.ImportRequest, src io.Reader, progress func(session.BuildProgress)) (session.ImageInfo, error) {
	st := m.cfg.Images
	if st == nil {
		return session.ImageInfo{}, fmt.Errorf("no image store configured: %w", session.ErrUnavailable)
	}
	if progress == nil {
		progress = func(session.BuildProgress) {}
	}
	if err := req.Validate(src != nil); err != nil {
		return session.ImageInfo{}, err
	}
	if err := image.ValidateName(req.Name); err != nil {
		return session.ImageInfo{}, &session.Error{Class: session.ErrInvalid, Field: session.FieldName, Msg: err.Error(), Err: err}
	}
	if req.Source != session.ImportStdin {
		if !filepath.IsAbs(req.Source) {
			return session.ImageInfo{}, &session.Error{Class: session.ErrInvalid, Field: session.FieldSource,
				Msg: fmt.Sprintf("%q is relative", req.Source), Hint: "give the daemon an absolute path"}
		}
		if _, err := os.Stat(req.Source); err != nil {
			return session.ImageInfo{}, &session.Error{Class: session.ErrNotFound, Field: session.FieldSource,
				Msg: fmt.Sprintf("%s cannot be read on the daemon's host: %v", req.Source, errors.Unwrap(err)), Err: err}
		}
	}
	if err := m.checkFloor("import an image"); err != nil {
		return session.ImageInfo{}, err
	}
	b, err := oci.Import(ctx, oci.Options{
		Name: req.Name, Source: req.Source, Stdin: src, Ref: req.Ref,
		ImagesDir: st.Dir, CacheDir: st.CacheDir, Agent: st.Agent,
		Report: func(p image.Progress) {
			progress(session.BuildProgress{Phase: p.Phase, Done: p.Done, Total: p.Total, Bytes: p.Bytes, TotalBytes: p.TotalBytes, Line: p.Line})
		},
	})
	if err != nil {
		switch {
		case ctx.Err() != nil:
			return session.ImageInfo{}, ctx.Err()
		case errors.Is(err, fs.ErrExist):
			// The message says what exists and what to do; the class is
			// the contract's.
			return session.ImageInfo{}, &session.Error{Class: session.ErrExists, Msg: strings.TrimSuffix(err.Error(), ": "+fs.ErrExist.Error()), Err: err}
		}
		return session.ImageInfo{}, fmt.Errorf("import image %q: %w", req.Name, err)
	}
	m.log.Info("image imported", "image", b.Name, "digest", b.Digest, "source", b.Source, "source_digest", b.SourceDigest)
	m.pruneImage(b.Name)
	return m.imageInfo(ctx, b)
}

// ExportImage writes a build of an image as an OCI image layout tarball
// with oci.PlanExport: the blobs an import kept, as they came, and the
// layers berth made written from their ext4 images. It takes no lock:
// the plan holds every file it reads open, so an image removed meanwhile
// is still exported whole.
func (m *Manager) ExportImage(ctx context.Context, req session.ExportRequest, open func(session.ImageExport) (io.Writer, error), progress func(session.BuildProgress)) (session.ImageExport, error) {
	st := m.cfg.Images
	if st == nil {
		return session.ImageExport{}, fmt.Errorf("no image store configured: %w", session.ErrUnavailable)
	}
	if progress == nil {
		progress = func(session.BuildProgress) {}
	}
	if err := req.Validate(); err != nil {
		return session.ImageExport{}, err
	}
	// The image is the export's subject, not an option: its errors name
	// no field (a front end would render one as its --image flag).
	if err := image.ValidateName(req.Name); err != nil {
		return session.ImageExport{}, &session.Error{Class: session.ErrInvalid, Msg: err.Error(), Err: err}
	}
	b, err := st.Load(req.Name, req.Digest)
	if err != nil {
		msg := fmt.Sprintf("image %q does not exist here", req.Name)
		if req.Digest != "" {
			msg = fmt.Sprintf("image %s@%s does not exist here", req.Name, req.Digest)
		}
		return session.ImageExport{}, &session.Error{Class: session.ErrNotFound, Msg: msg, Hint: "list the images there are", Err: err}
	}
	if !b.RootFS() {
		return session.ImageExport{}, &session.Error{Class: session.ErrInvalid,
			Msg:  fmt.Sprintf("image %s has no root filesystem layers to export: its root is berth's initramfs (the agent and busybox), not a container image", req.Name),
			Hint: "export an imported image, debian, or one built from a recipe"}
	}
	if slices.Contains(b.Lacks(), "blobs") {
		// Its layers would be written from berth's ext4 layers: a valid
		// image, but not the one it came as, with other digests.
		return session.ImageExport{}, &session.Error{Class: session.ErrInvalid, Msg: image.LacksError(req.Name, "blobs", "an export").Error()}
	}
	e, err := oci.PlanExport(ctx, oci.ExportOptions{Image: b, ImagesDir: st.Dir, Report: func(p image.Progress) {
		progress(session.BuildProgress{Phase: p.Phase, Done: p.Done, Total: p.Total, Bytes: p.Bytes, TotalBytes: p.TotalBytes, Line: p.Line})
	}})
	if err != nil {
		if ctx.Err() != nil {
			return session.ImageExport{}, ctx.Err()
		}
		return session.ImageExport{}, fmt.Errorf("export image %q: %w", req.Name, err)
	}
	defer e.Close()
	x := session.ImageExport{Name: b.Name, Digest: b.Digest, Manifest: e.Manifest, Size: e.Size}
	for _, l := range e.Layers {
		x.Layers = append(x.Layers, session.ExportLayer{Digest: l.Digest, DiffID: l.DiffID, Size: l.Size, Offset: l.Offset, Made: l.Made})
	}
	w, err := open(x)
	if err != nil {
		return x, err
	}
	// Progress is by bytes out, as a client counting what it receives
	// says it: one rule (ProgressAt) for every side.
	pw := &progressWriter{w: w, x: x, progress: progress}
	if err := e.WriteTo(ctx, pw); err != nil {
		if ctx.Err() != nil {
			return x, ctx.Err()
		}
		return x, fmt.Errorf("export image %q: %w", req.Name, err)
	}
	progress(x.ProgressAt(x.Size))
	m.log.Info("image exported", "image", b.Name, "digest", b.Digest, "manifest", e.Manifest, "bytes", e.Size)
	return x, nil
}

// progressWriter reports an export's progress as its bytes go out
// (session.ReportExport).
type progressWriter struct {
	w        io.Writer
	x        session.ImageExport
	n, next  int64
	progress func(session.BuildProgress)
}

func (p *progressWriter) Write(b []byte) (int, error) {
	n, err := p.w.Write(b)
	p.n += int64(n)
	p.next = session.ReportExport(p.x, p.n, p.next, p.progress)
	return n, err
}

// RemoveImage deletes an image no session uses.
func (m *Manager) RemoveImage(ctx context.Context, name string) error {
	if m.cfg.Images == nil {
		return fmt.Errorf("no image store configured: %w", session.ErrUnavailable)
	}
	if err := image.ValidateName(name); err != nil {
		return fmt.Errorf("%w: %w", err, session.ErrInvalid)
	}
	digests, err := m.removeImageBuilds(name)
	if err != nil {
		return err
	}
	// The templates go once builds.mu is let go: tmplMu is taken before
	// it, never after.
	m.dropTemplates(name, digests)
	return nil
}

// removeImageBuilds removes name unless a session or an image built on it
// (committed, or a recipe on it) uses it, holding builds.mu, and returns the digests of the builds it
// removed.
func (m *Manager) removeImageBuilds(name string) ([]string, error) {
	m.builds.mu.Lock()
	defer m.builds.mu.Unlock()
	var sessions []string
	for _, u := range m.imageUsers()[name] {
		if !slices.Contains(sessions, u.session) {
			sessions = append(sessions, u.session)
		}
	}
	children, err := m.committedOn(name)
	if err != nil {
		return nil, err
	}
	if len(sessions) > 0 || len(children) > 0 {
		return nil, session.ImageInUse(name, sessions, children)
	}
	digests := m.buildDigests(name)
	if err := m.cfg.Images.Remove(name); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("image %q: %w", name, session.ErrNotFound)
		}
		return nil, err
	}
	return digests, nil
}

// committedOn lists the images built on a build of name (committed on it,
// or recipes on it: their Parent), other than name's own later builds, by
// name.
func (m *Manager) committedOn(name string) ([]string, error) {
	builds, err := m.cfg.Images.Builds()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, b := range builds {
		parent, _, _ := strings.Cut(b.Parent, "@")
		if parent == name && b.Name != name && !slices.Contains(out, b.Name) {
			out = append(out, b.Name)
		}
	}
	sort.Strings(out)
	return out, nil
}

// stepRunner runs a recipe's setup commands in a VM of the image being
// built: the layers built so far, the build's system disk on top, and a
// scratch workspace. Nothing runs on the host.
type stepRunner struct{ m *Manager }

func (r stepRunner) RunSteps(ctx context.Context, b image.StepBuild) error {
	m := r.m
	pol, err := session.ParsePolicy(orNet(b.Net))
	if err != nil {
		return fmt.Errorf("the recipe's net: %w", err)
	}
	dir, err := os.MkdirTemp(filepath.Join(m.cfg.DataDir), ".build-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	wsUUID := vmm.NewUUID()
	ws := filepath.Join(dir, "workspace.img")
	if err := vmm.CreateWorkspace(ctx, ws, 256<<20, wsUUID); err != nil {
		return err
	}
	d, err := m.driver(m.cfg.Defaults.VMM)
	if err != nil {
		return err
	}
	im := fromBuild(b.Image)
	cfg := vmm.Config{
		Dir: filepath.Join(dir, "vm"), Kernel: im.Kernel, Initramfs: im.Initramfs,
		Cmdline: bootCmdline(wsUUID, b.SystemUUID, im, "berth-build", randomMachineID()),
		CPUs:    m.cfg.Defaults.CPUs, MemoryMiB: max(m.cfg.Defaults.MemoryMiB, 1024),
		Workspace: ws, System: b.System, Layers: layerPaths(im), Accel: m.cfg.Defaults.Accel,
	}
	// No count yet: the first step is step 1, and booting is none.
	b.Report(image.Progress{Phase: "setup", Line: "booting a build VM of the image"})
	bctx, cancel := context.WithTimeout(ctx, m.cfg.BootTimeout)
	defer cancel()
	vm, err := d.Start(bctx, cfg)
	if err != nil {
		return fmt.Errorf("boot the build VM: %w", err)
	}
	defer func() {
		vm.Kill(context.Background())
		vm.Close()
	}()
	c, err := guest.Dial(bctx, vm.DialAgent)
	if err != nil {
		return fmt.Errorf("build VM: %w", err)
	}
	defer c.Close()
	h, err := c.Hello(bctx)
	if err == nil && !h.System.Mounted {
		err = fmt.Errorf("its system disk did not mount: %s", h.System.Error)
	}
	if err != nil {
		return fmt.Errorf("build VM: %w", err)
	}
	m.serveBuildEgress(c, pol, b.Report)
	if err := runSetup(ctx, c, b); err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, stopGrace+30*time.Second)
	defer cancel()
	if _, err := c.Shutdown(sctx, stopGrace); err != nil {
		return fmt.Errorf("shut the build VM down: %w", err)
	}
	select {
	case <-vm.Done():
	case <-time.After(20 * time.Second):
		return errors.New("the build VM did not power off after its setup steps")
	}
	return nil
}

// setupStep is one step of a recipe's setup, as the build's progress and
// its errors name it.
type setupStep struct {
	name   string // "copy files", or the command in backquotes
	header string // the progress line that starts it
	files  []byte // a tar to unpack into the scratch workspace first
	cmd    string // run with sh -c in the build VM
}

// setupSteps lists a build's setup steps: the recipe's files, when it has
// any, are the first, then each run command.
func setupSteps(b image.StepBuild) []setupStep {
	var out []setupStep
	if len(b.Files) > 0 {
		// The files go in through the scratch workspace (the file API
		// writes nowhere else) and are moved into place from there.
		out = append(out, setupStep{name: "copy files", header: "copy files", files: b.Files,
			cmd: "cp -a /workspace/.berth-files/. / && rm -rf /workspace/.berth-files"})
	}
	for _, cmd := range b.Steps {
		out = append(out, setupStep{name: "`" + oneLine(cmd, 80) + "`", header: "$ " + oneLine(cmd, 200), cmd: cmd})
	}
	return out
}

// runSetup runs a build's setup steps on the build VM's agent, in order,
// stopping at the first that fails. Steps count from 1, the same in the
// progress (setup 2/4) and in an error (setup step 2 of 4).
func runSetup(ctx context.Context, c *guest.Client, b image.StepBuild) error {
	steps := setupSteps(b)
	for i, st := range steps {
		if err := runStep(ctx, c, b, i+1, len(steps), st); err != nil {
			return err
		}
	}
	return nil
}

// runStep runs step number i (from 1) of n. Its header line carries the
// count; the lines of its output do not (they are output, not progress).
func runStep(ctx context.Context, c *guest.Client, b image.StepBuild, i, n int, st setupStep) error {
	label := fmt.Sprintf("step %d of %d (%s)", i, n, st.name)
	b.Report(image.Progress{Phase: "setup", Done: i, Total: n, Line: st.header})
	if st.files != nil {
		if _, err := c.Unpack(ctx, ".berth-files", bytes.NewReader(st.files)); err != nil {
			return fmt.Errorf("setup %s: copy the recipe's files into the build VM: %w", label, err)
		}
	}
	sctx, cancel := context.WithTimeout(ctx, b.Timeout)
	defer cancel()
	id := newExecID()
	// An image base's Env (its PATH above all) holds for its setup steps
	// as for its sessions' commands.
	env := imageExecDefaults(b.Image.Config).Env
	if env == nil {
		env = map[string]string{}
	}
	env["DEBIAN_FRONTEND"] = "noninteractive"
	x, err := c.Exec(sctx, guest.ExecRequest{ID: id, Argv: []string{"/bin/sh", "-c", st.cmd}, Cwd: "/workspace", Env: env})
	if err != nil {
		return fmt.Errorf("setup %s could not start: %w", label, err)
	}
	var last string
	var pending []byte
	emit := func(line []byte) {
		l := strings.TrimRight(string(line), "\r")
		if strings.TrimSpace(l) != "" {
			last = l
		}
		b.Report(image.Progress{Phase: "setup", Line: oneLine(l, 400)})
	}
	for o := range x.Output() {
		pending = append(pending, o.Data...)
		for {
			k := bytes.IndexByte(pending, '\n')
			if k < 0 {
				break
			}
			emit(pending[:k])
			pending = pending[k+1:]
		}
		if len(pending) > 64<<10 {
			emit(pending)
			pending = pending[:0]
		}
	}
	if len(pending) > 0 {
		emit(pending)
	}
	info, err := x.Result()
	switch {
	case sctx.Err() != nil && ctx.Err() == nil:
		kctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c.Signal(kctx, id, 9) // bounded: builds.mu is held
		cancel()
		return fmt.Errorf("setup %s timed out after %s (step_timeout in the recipe): %s", label, b.Timeout, last)
	case err != nil:
		return fmt.Errorf("setup %s: %w", label, err)
	case info == nil:
		return fmt.Errorf("setup %s: the build VM lost the command", label)
	case info.Signal != "":
		return fmt.Errorf("setup %s was killed by %s: %s", label, info.Signal, last)
	case info.ExitCode != 0:
		return fmt.Errorf("setup %s exited with code %d: %s", label, info.ExitCode, last)
	}
	return nil
}

// oneLine shortens text for a one-line message.
func oneLine(s string, n int) string {
	sc := bufio.NewScanner(strings.NewReader(s))
	if sc.Scan() {
		s = sc.Text()
	}
	if len(s) > n {
		s = s[:n] + "…"
	}
	return s
}

// randomMachineID returns a fresh machine id: 32 lower-case hex digits,
// as machine-id(5) has it.
func randomMachineID() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func layerPaths(im Image) []string {
	var out []string
	for _, l := range im.Layers {
		out = append(out, l.Path)
	}
	return out
}

// bootCmdline tells the agent what a cold boot mounts and who it is.
func bootCmdline(wsUUID, sysUUID string, im Image, hostname, machineID string) string {
	parts := []string{"berth.ws=" + orNone(wsUUID)}
	if im.RootFS() {
		uuids := make([]string, len(im.Layers))
		for i, l := range im.Layers {
			uuids[i] = l.UUID
		}
		parts = append(parts, "berth.layers="+strings.Join(uuids, ","), "berth.sys="+orNone(sysUUID))
	}
	if hostname != "" {
		parts = append(parts, "berth.name="+hostname)
	}
	if machineID != "" {
		parts = append(parts, "berth.mid="+machineID)
	}
	return strings.Join(parts, " ")
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

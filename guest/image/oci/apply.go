package oci

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// applier applies the layers of one berth layer (a group of the image's
// layers, often one) to its stage, in overlayfs's form: what the group
// adds or changes, whiteouts for what it removes from the layers below,
// opaque directories for those it empties. The view is kept in step,
// so paths resolve through the layers below as the guest will see them.
type applier struct {
	v     *view
	st    *stage
	group int
	// lower copies a file of a layer below for a hard link to it.
	lower func(ctx context.Context, group int, real []string, dst io.Writer) error

	// Per layer: paths it wrote (and their parents), and the
	// directories it makes opaque, applied when it ends (OCI: an opaque
	// whiteout hides the layers below, not its own layer's entries).
	touched map[string]bool
	opaque  [][]string

	// Per group: directory times, set last (making children touches
	// them), and extended attributes the host would not keep.
	dirTimes []dirTime
	dropped  int
	dropOne  string

	buf []byte
}

type dirTime struct {
	real []string
	t    time.Time
}

func newApplier(v *view, st *stage, group int) *applier {
	return &applier{v: v, st: st, group: group, buf: make([]byte, 1<<20)}
}

func (a *applier) drop(name string, err error) {
	if a.dropped == 0 {
		a.dropOne = fmt.Sprintf("%s (%v)", clip(name), err)
	}
	a.dropped++
}

// apply applies one layer's tar; the caller checks its digests after.
func (a *applier) apply(ctx context.Context, s *layerStream, progress func(int64)) error {
	a.touched, a.opaque = map[string]bool{"": true}, nil
	for i := 0; ; i++ {
		if i%256 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
			progress(s.plain.n)
		}
		h, err := s.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		e, err := parseEntry(h)
		if err != nil {
			return fmt.Errorf("%s: %w", s.l, err)
		}
		if err := a.entry(ctx, e, s); err != nil {
			return fmt.Errorf("%s: %w", s.l, err)
		}
	}
	progress(s.plain.n)
	if err := a.endLayer(); err != nil {
		return fmt.Errorf("%s: %w", s.l, err)
	}
	return nil
}

func (a *applier) entry(ctx context.Context, e entry, s *layerStream) error {
	switch e.op {
	case opWhiteout:
		return a.whiteout(e.parts)
	case opOpaque:
		real, err := a.v.resolve(e.parts, true)
		if err != nil {
			return err
		}
		a.opaque = append(a.opaque, real)
		a.touch(real)
		return nil
	case opWrite:
		return a.write(ctx, e, s)
	}
	return nil
}

func (a *applier) touch(real []string) {
	for i := len(real); i > 0; i-- {
		a.touched[strings.Join(real[:i], "/")] = true
	}
}

// mkDir gives a directory the stage lacks the attributes it has below
// (a layer that names a file without its parent directories changes
// nothing about them), or root's 0755 for a new one.
func (a *applier) mkDir(real []string) (meta, error) {
	if n := a.v.lookup(real); n != nil && n.kind == kindDir {
		return meta{mode: n.mode, uid: n.uid, gid: n.gid, xattr: n.xattr}, nil
	}
	if err := a.v.set(real, &node{kind: kindDir, mode: 0o755, group: a.group}); err != nil {
		return meta{}, err
	}
	return meta{mode: 0o755}, nil
}

// dir opens the stage's directory at real, made as the view has it.
func (a *applier) dir(real []string) (int, error) {
	fd, err := a.st.openDir(real, a.mkDir)
	if err != nil {
		return -1, fmt.Errorf("staging directory %w", err)
	}
	return fd, nil
}

// whiteout removes parts from the layers below.
func (a *applier) whiteout(parts []string) error {
	n := len(parts)
	parent, err := a.v.resolve(parts[:n-1], true)
	if err != nil {
		return fmt.Errorf("whiteout %q: %w", clip(strings.Join(parts, "/")), err)
	}
	real := append(parent, parts[n-1])
	if a.touched[strings.Join(real, "/")] {
		// Written by this layer: the whiteout hides only what is below.
		if x := a.v.lookup(real); x != nil && x.kind == kindDir {
			a.opaque = append(a.opaque, real)
		}
		return nil
	}
	if a.v.parent(real) == nil || a.v.lookup(real) == nil {
		return nil // nothing below to hide
	}
	pfd, err := a.dir(parent)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	name := real[len(real)-1]
	if err := removeAll(pfd, name); err != nil {
		return fmt.Errorf("whiteout %q: %w", clip(path.Join(real...)), err)
	}
	if err := mkWhiteout(pfd, name); err != nil {
		return fmt.Errorf("whiteout %q: %w", clip(path.Join(real...)), err)
	}
	a.v.remove(real)
	return nil
}

func (a *applier) write(ctx context.Context, e entry, s *layerStream) error {
	h := e.hdr
	m := meta{mode: e.mode, uid: h.Uid, gid: h.Gid, xattr: e.xattr}
	if len(e.parts) == 0 {
		if err := setMetaFd(a.st.root, m, a.drop); err != nil {
			return fmt.Errorf("the root directory: %w", err)
		}
		n := &node{kind: kindDir, mode: m.mode, uid: m.uid, gid: m.gid, xattr: m.xattr, group: a.group}
		a.dirTimes = append(a.dirTimes, dirTime{nil, h.ModTime})
		return a.v.set(nil, n)
	}
	last := len(e.parts) - 1
	parent, err := a.v.resolveDir(e.parts[:last])
	if err != nil {
		return err
	}
	real := append(parent, e.parts[last])
	name := e.parts[last]
	what := func(err error) error { return fmt.Errorf("%q: %w", clip(path.Join(real...)), err) }
	pfd, err := a.dir(parent)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	a.touch(parent)
	st, exists, err := lstat(pfd, name)
	if err != nil {
		return what(err)
	}
	n := &node{kind: e.kind, mode: m.mode, uid: m.uid, gid: m.gid, size: h.Size, group: a.group}
	switch e.kind {
	case kindDir:
		n.xattr = m.xattr
		replaced := false
		if exists && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			if err := removeAll(pfd, name); err != nil {
				return what(err)
			}
			exists, replaced = false, true
		}
		if !exists {
			if err := unix.Mkdirat(pfd, name, 0o700); err != nil {
				return what(err)
			}
		}
		fd, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return what(err)
		}
		err = setMetaFd(fd, m, a.drop)
		if err == nil && replaced {
			// It replaces a file or whiteout this group made over
			// what is below: the layers below must not show through.
			err = setOpaque(fd)
		}
		unix.Close(fd)
		if err != nil {
			return what(err)
		}
		if replaced {
			a.v.remove(real)
		}
		a.dirTimes = append(a.dirTimes, dirTime{real, h.ModTime})
	case kindHardlink:
		target, err := a.v.resolve(e.link, false)
		if err != nil {
			return fmt.Errorf("hard link %q: %w", clip(h.Name), err)
		}
		t := a.v.lookup(target)
		if t == nil {
			return fmt.Errorf("hard link %q points at %q, which the image does not have", clip(h.Name), clip(h.Linkname))
		}
		if t.kind == kindDir {
			return fmt.Errorf("hard link %q points at directory %q", clip(h.Name), clip(h.Linkname))
		}
		if strings.Join(target, "/") == strings.Join(real, "/") {
			return nil
		}
		if exists {
			if err := removeAll(pfd, name); err != nil {
				return what(err)
			}
		}
		n = &node{kind: t.kind, mode: t.mode, uid: t.uid, gid: t.gid, link: t.link, size: t.size, group: a.group}
		if t.group == a.group {
			tfd, err := a.st.openDir(target[:len(target)-1], nil)
			if err != nil {
				return fmt.Errorf("hard link %q: %w", clip(h.Name), err)
			}
			err = unix.Linkat(tfd, target[len(target)-1], pfd, name, 0)
			unix.Close(tfd)
			if err != nil {
				return what(err)
			}
		} else if err := a.copyLower(ctx, t, target, pfd, name); err != nil {
			return fmt.Errorf("hard link %q to %q in a layer below: %w", clip(h.Name), clip(h.Linkname), err)
		}
	default:
		if exists {
			if err := removeAll(pfd, name); err != nil {
				return what(err)
			}
		}
		if err := a.create(e, pfd, name, m, s); err != nil {
			return what(err)
		}
		if e.kind == kindSymlink {
			n.link, n.mode = h.Linkname, 0o777 // what lstat says of any symlink
		}
		if e.kind != kindDir && e.kind != kindSymlink {
			if err := setTimes(pfd, name, h.ModTime); err != nil {
				return what(err)
			}
		}
	}
	a.touch(real)
	return a.v.set(real, n)
}

// create makes a file, symlink, device or fifo.
func (a *applier) create(e entry, pfd int, name string, m meta, s *layerStream) error {
	h := e.hdr
	switch e.kind {
	case kindFile:
		if err := writeFile(pfd, name, s.tr, h.Size, m, a.buf, a.drop); err != nil {
			return fmt.Errorf("%w", s.why(err))
		}
		return nil
	case kindSymlink:
		if err := unix.Symlinkat(h.Linkname, pfd, name); err != nil {
			return err
		}
		if err := setMetaAt(pfd, name, m, true, a.drop); err != nil {
			return err
		}
		return setTimes(pfd, name, h.ModTime)
	case kindChar, kindBlock, kindFifo:
		mode := uint32(unix.S_IFIFO)
		switch e.kind {
		case kindChar:
			mode = unix.S_IFCHR
		case kindBlock:
			mode = unix.S_IFBLK
		}
		dev := unix.Mkdev(uint32(h.Devmajor), uint32(h.Devminor))
		if e.kind == kindFifo {
			dev = 0
		}
		if err := unix.Mknodat(pfd, name, mode|0o600, int(dev)); err != nil {
			return err
		}
		return setMetaAt(pfd, name, m, false, a.drop)
	}
	return fmt.Errorf("internal: cannot create kind %q", e.kind)
}

// copyLower copies a file of a layer below into the stage: a hard link
// cannot reach into another berth layer, and overlayfs copies a file up
// to link it anyway.
func (a *applier) copyLower(ctx context.Context, t *node, target []string, pfd int, name string) error {
	if t.kind == kindSymlink {
		if err := unix.Symlinkat(t.link, pfd, name); err != nil {
			return err
		}
		return setMetaAt(pfd, name, meta{uid: t.uid, gid: t.gid}, true, a.drop)
	}
	if t.kind != kindFile {
		return errors.New("only regular files and symlinks can be linked across layers")
	}
	if a.lower == nil {
		return errors.New("the layers below cannot be read")
	}
	fd, err := unix.Openat(pfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	if err := a.lower(ctx, t.group, target, f); err != nil {
		return err
	}
	return setMetaFd(fd, meta{mode: t.mode, uid: t.uid, gid: t.gid}, a.drop)
}

// endLayer applies the layer's opaque whiteouts.
func (a *applier) endLayer() error {
	seen := map[string]bool{}
	for _, d := range a.opaque {
		key := strings.Join(d, "/")
		if seen[key] {
			continue
		}
		seen[key] = true
		if err := a.makeOpaque(d); err != nil {
			return fmt.Errorf("opaque directory %q: %w", clip("/"+key), err)
		}
	}
	return nil
}

// makeOpaque hides what the layers below (and this group's earlier
// layers) hold in d, keeping this layer's own entries.
func (a *applier) makeOpaque(d []string) error {
	if n := a.v.lookup(d); n != nil && n.kind != kindDir {
		return errors.New("not a directory")
	}
	fd, err := a.dir(d)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if len(d) > 0 {
		if err := a.clear(fd, d); err != nil {
			return err
		}
		return setOpaque(fd)
	}
	// The root of a layer cannot be opaque to overlayfs: each name
	// below gets a whiteout instead.
	names, err := a.namesIn(fd, nil)
	if err != nil {
		return err
	}
	for k := range names {
		if a.touched[k] {
			// This layer's own directory: it hides what is below
			// under it as the opaque root would.
			if n := a.v.lookup([]string{k}); n != nil && n.kind == kindDir {
				if err := a.opaqueChild(fd, k); err != nil {
					return err
				}
			}
			continue
		}
		if err := removeAll(fd, k); err != nil {
			return err
		}
		if err := mkWhiteout(fd, k); err != nil {
			return err
		}
		a.v.remove([]string{k})
	}
	return nil
}

// namesIn is every name in the directory d (open as fd): those the layers
// below hold, in the view, and those staged in it.
func (a *applier) namesIn(fd int, d []string) (map[string]bool, error) {
	names := map[string]bool{}
	if n := a.v.lookup(d); n != nil {
		for k := range n.kids {
			names[k] = true
		}
	}
	staged, err := readNames(fd)
	if err != nil {
		return nil, err
	}
	for _, k := range staged {
		names[k] = true
	}
	return names, nil
}

// clear removes from the directory d (open as fd) and from the view
// whatever this layer did not write, descending into what it did.
func (a *applier) clear(fd int, d []string) error {
	names, err := a.namesIn(fd, d)
	if err != nil {
		return err
	}
	for k := range names {
		child := append(d[:len(d):len(d)], k)
		if a.touched[strings.Join(child, "/")] {
			if err := a.clearChild(fd, child); err != nil {
				return err
			}
			continue
		}
		if err := removeAll(fd, k); err != nil {
			return err
		}
		a.v.remove(child)
	}
	return nil
}

// opaqueChild clears the root's directory name and marks it opaque.
func (a *applier) opaqueChild(fd int, name string) error {
	cfd, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(cfd)
	if err := a.clear(cfd, []string{name}); err != nil {
		return err
	}
	return setOpaque(cfd)
}

// clearChild descends into a directory this layer wrote.
func (a *applier) clearChild(pfd int, child []string) error {
	n := a.v.lookup(child)
	if n == nil || n.kind != kindDir {
		return nil
	}
	name := child[len(child)-1]
	cfd, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(cfd)
	return a.clear(cfd, child)
}

// endGroup sets the directories' times, now that nothing more is made
// in them.
func (a *applier) endGroup() error {
	for _, dt := range a.dirTimes {
		if len(dt.real) == 0 {
			if err := setTimes(a.st.root, ".", dt.t); err != nil {
				return err
			}
			continue
		}
		pfd, err := a.st.openDir(dt.real[:len(dt.real)-1], nil)
		if err != nil {
			continue // removed by a later whiteout
		}
		err = setTimes(pfd, dt.real[len(dt.real)-1], dt.t)
		unix.Close(pfd)
		if err != nil && !errors.Is(err, unix.ENOENT) {
			return err
		}
	}
	return nil
}

package oci

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/berthvm/berth/guest/image/ext4"
)

// Turning a berth layer back into an OCI layer. A layer's tree is an
// overlayfs upper directory (upper/ in its ext4 image): what it adds or
// changes, whiteouts (character devices 0/0) for what it removes from
// the layers below, opaque directories (trusted.overlay.opaque=y) for
// those it empties. OCI says the same with .wh. entries, so the tree is
// written as a tar entry by entry, the whiteouts and opaque markers
// turned back into .wh.NAME and .wh..wh..opq.
//
// The ext4 image is read by guest/image/ext4, in-process: debugfs's
// rdump drops devices, whiteouts, extended attributes and hard links
// and a debugfs run per file would take minutes on a Debian root; a
// loop mount needs root, which a daemon on another host may not have;
// and the original layer blobs exist only for imported layers (those
// are exported as they came, see Export), not for the layers berth
// built (debian's, a recipe's setup layer, a committed system disk).
//
// The tar is the same bytes every time for the same layer: entries in
// name order, parents first, times to the second, no user or group
// names, hard links to the first name in that order. So a layer's
// digest is a function of the layer, an export made twice is identical,
// and an exported image imported elsewhere has the same digests.

// extLimits bound a layer's walk.
type extLimits struct {
	files int   // entries in all
	dirs  int   // entries in one directory
	bytes int64 // the files' sizes added up
}

// sparseFactor bounds a layer's files' sizes added up, as a multiple of
// its ext4 image's size (at least 1 GiB): sparse files may make them
// more than the image, but not many times more.
const sparseFactor = 16

// extLayer is one berth layer's tree, open for writing as a tar.
type extLayer struct {
	fs      *ext4.FS
	upper   *ext4.Inode
	lim     extLimits
	label   string // "berth layer 2 (layer-1.img)", for errors
	skipped int    // sockets, which a tar cannot hold
	skipOne string
}

// openExtLayer finds upper/ in the layer's ext4 image.
func openExtLayer(fs *ext4.FS, label string, lim extLimits) (*extLayer, error) {
	root, err := fs.Inode(ext4.RootIno)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", label, err)
	}
	ents, err := fs.ReadDir(root, lim.dirs)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", label, err)
	}
	for _, e := range ents {
		if e.Name != "upper" {
			continue
		}
		up, err := fs.Inode(e.Ino)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", label, err)
		}
		if up.Type() != ext4.ModeDir {
			break
		}
		return &extLayer{fs: fs, upper: up, lim: lim, label: label}, nil
	}
	return nil, fmt.Errorf("%s has no upper/ directory: it is not a berth layer", label)
}

// overlay's own extended attributes, as a layer's tree may carry them:
// opaque becomes .wh..wh..opq; redirect and metacopy say things a tar
// layer cannot (a directory renamed, a file whose data is below), so a
// layer with them is refused; the rest is overlayfs's bookkeeping
// (origin, impure, nlink, uuid…), meaningless elsewhere.
func overlayAttr(name string) (attr string, ok bool) {
	for _, p := range []string{"trusted.overlay.", "user.overlay."} {
		if a, ok := strings.CutPrefix(name, p); ok {
			return a, true
		}
	}
	return "", false
}

// write writes the tar to w, calling progress with the bytes written
// every so often.
func (lt *extLayer) write(ctx context.Context, w io.Writer, progress func(int64)) error {
	cw := &countWriter{w: w}
	tw := tar.NewWriter(cw)
	st := &tarWalk{lt: lt, tw: tw, ctx: ctx, first: map[uint32]string{}, dirs: map[uint32]bool{}, buf: make([]byte, 1<<20),
		progress: func() { progress(cw.n) }}
	if err := st.dir(lt.upper, ""); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	progress(cw.n)
	return nil
}

type tarWalk struct {
	lt *extLayer
	// bytes sums the files' sizes, bounded by the layer's limit: a
	// crafted layer of sparse files would be read as zeros for as long
	// as their sizes say.
	bytes    int64
	tw       *tar.Writer
	ctx      context.Context
	first    map[uint32]string // a hard-linked inode's first name
	dirs     map[uint32]bool   // directories walked: a loop is refused
	files    int
	buf      []byte
	progress func()
}

// dir writes the entries of directory in (at path p, "" for the root,
// else ending in "/").
func (s *tarWalk) dir(in *ext4.Inode, p string) error {
	if s.dirs[in.Ino] {
		return fmt.Errorf("%s: directory %q is reached twice: the filesystem is corrupt", s.lt.label, p)
	}
	s.dirs[in.Ino] = true
	ents, err := s.lt.fs.ReadDir(in, s.lt.lim.dirs)
	if err != nil {
		return fmt.Errorf("%s: /%s: %w", s.lt.label, p, err)
	}
	sort.Slice(ents, func(i, j int) bool { return ents[i].Name < ents[j].Name })
	for _, e := range ents {
		if s.files++; s.files > s.lt.lim.files {
			return fmt.Errorf("%s holds over %d files, the limit berth exports", s.lt.label, s.lt.lim.files)
		}
		if s.files%256 == 0 {
			if err := s.ctx.Err(); err != nil {
				return err
			}
			s.progress()
		}
		name := p + e.Name
		if len(name) > maxPath {
			return fmt.Errorf("%s: a path of over %d bytes (%q)", s.lt.label, maxPath, clip(name))
		}
		c, err := s.lt.fs.Inode(e.Ino)
		if err != nil {
			return fmt.Errorf("%s: /%s: %w", s.lt.label, clip(name), err)
		}
		if err := s.entry(c, name); err != nil {
			return err
		}
	}
	return nil
}

// entry writes one inode at name, and a directory's children.
func (s *tarWalk) entry(c *ext4.Inode, name string) error {
	what := func(err error) error { return fmt.Errorf("%s: /%s: %w", s.lt.label, clip(name), err) }
	h := &tar.Header{
		Name: name, Mode: int64(c.Mode & 0o7777), Uid: int(c.UID), Gid: int(c.GID),
		ModTime: c.Mtime.Truncate(time.Second),
	}
	if c.Type() == ext4.ModeChar && c.Major == 0 && c.Minor == 0 {
		// A whiteout (overlayfs may hard-link many to one inode).
		dir, base := splitName(name)
		return s.header(&tar.Header{Name: dir + whPrefix + base, Typeflag: tar.TypeReg, ModTime: h.ModTime})
	}
	opaque := false
	xs, err := s.lt.fs.Xattrs(c)
	if err != nil {
		return what(err)
	}
	for _, x := range xs {
		if attr, ok := overlayAttr(x.Name); ok {
			switch {
			case attr == "opaque" && string(x.Value) == "y" && c.Type() == ext4.ModeDir:
				opaque = true
			case attr == "redirect" || attr == "metacopy":
				return what(fmt.Errorf("it has overlayfs's %s attribute (a directory renamed or a file copied up without its data), which an OCI layer cannot hold", x.Name))
			}
			continue
		}
		if h.PAXRecords == nil {
			h.PAXRecords = map[string]string{}
		}
		h.PAXRecords["SCHILY.xattr."+x.Name] = string(x.Value)
	}
	switch c.Type() {
	case ext4.ModeDir:
		h.Typeflag, h.Name = tar.TypeDir, name+"/"
		if err := s.header(h); err != nil {
			return err
		}
		if opaque {
			if err := s.header(&tar.Header{Name: name + "/" + whOpaque, Typeflag: tar.TypeReg, ModTime: h.ModTime}); err != nil {
				return err
			}
		}
		return s.dir(c, name+"/")
	case ext4.ModeFile:
		if c.Links > 1 {
			if prev, ok := s.first[c.Ino]; ok {
				return s.header(&tar.Header{Name: name, Typeflag: tar.TypeLink, Linkname: prev, Mode: h.Mode, Uid: h.Uid, Gid: h.Gid, ModTime: h.ModTime})
			}
			s.first[c.Ino] = name
		}
		h.Typeflag, h.Size = tar.TypeReg, c.Size
		if s.bytes += c.Size; s.bytes > s.lt.lim.bytes {
			return what(fmt.Errorf("the layer's files add up to over %s, %d times the layer's own size (sparse files?): berth does not export it", gb(s.lt.lim.bytes), sparseFactor))
		}
		if err := s.header(h); err != nil {
			return err
		}
		r, err := s.lt.fs.Open(c)
		if err != nil {
			return what(err)
		}
		for {
			if err := s.ctx.Err(); err != nil {
				return err
			}
			n, rerr := r.Read(s.buf)
			if n > 0 {
				if _, err := s.tw.Write(s.buf[:n]); err != nil {
					return err
				}
				if n == len(s.buf) {
					s.progress()
				}
			}
			if rerr == io.EOF {
				return nil
			}
			if rerr != nil {
				return what(rerr)
			}
		}
	case ext4.ModeSym:
		target, err := s.lt.fs.Readlink(c)
		if err != nil {
			return what(err)
		}
		if strings.ContainsRune(target, 0) {
			return what(fmt.Errorf("a symlink target holding a NUL"))
		}
		h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, target, 0o777
		return s.header(h)
	case ext4.ModeChar, ext4.ModeBlock:
		h.Typeflag = tar.TypeChar
		if c.Type() == ext4.ModeBlock {
			h.Typeflag = tar.TypeBlock
		}
		h.Devmajor, h.Devminor = int64(c.Major), int64(c.Minor)
		return s.header(h)
	case ext4.ModeFifo:
		h.Typeflag = tar.TypeFifo
		return s.header(h)
	case ext4.ModeSocket:
		// A socket is a process's, not the image's: a tar has no form
		// for it, and docker and podman leave them out too.
		if s.lt.skipped == 0 {
			s.lt.skipOne = "/" + name
		}
		s.lt.skipped++
		return nil
	}
	return what(fmt.Errorf("unknown file type %o", c.Type()))
}

func (s *tarWalk) header(h *tar.Header) error {
	if err := s.tw.WriteHeader(h); err != nil {
		return fmt.Errorf("%s: /%s: %w", s.lt.label, clip(h.Name), err)
	}
	return nil
}

// splitName splits "a/b/c" into "a/b/" and "c".
func splitName(name string) (string, string) {
	i := strings.LastIndexByte(name, '/')
	return name[:i+1], name[i+1:]
}

// countWriter counts what goes through it.
type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

package oci

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// Source kinds, as the image's Source field names them.
const (
	kindLayout        = "oci-layout"     // a directory
	kindOCIArchive    = "oci-archive"    // a tar of a layout
	kindDockerArchive = "docker-archive" // docker save / podman save
	kindDockerDir     = "docker-dir"     // a docker save archive unpacked
	kindRootFS        = "rootfs"         // a plain root filesystem tarball
)

// fileSet is the files of a source: an image layout directory or the
// entries of a tar, opened by their slash-separated paths in it.
type fileSet interface {
	// open returns the file's content and size; it refuses paths
	// leading out of the set and anything but regular files.
	open(name string) (io.ReadCloser, int64, error)
	has(name string) bool
}

// dirSet is a directory, every access confined to it by os.Root.
type dirSet struct{ root *os.Root }

func (d dirSet) open(name string) (io.ReadCloser, int64, error) {
	f, err := d.root.Open(name)
	if err != nil {
		return nil, 0, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, 0, fmt.Errorf("%s is not a regular file", name)
	}
	return f, fi.Size(), nil
}

func (d dirSet) has(name string) bool {
	_, err := d.root.Stat(name)
	return err == nil
}

// tarSet is an uncompressed tar file read in place: an index of its
// regular files' offsets, links resolved to what they name.
type tarSet struct {
	f     *os.File
	files map[string]tarFile
}

type tarFile struct{ off, size int64 }

// maxArchiveEntries bounds the index of an image archive.
const maxArchiveEntries = 1 << 20

// indexTar reads a tar's headers, skipping its contents (tar.Reader
// seeks over them), and records where each regular file's bytes are.
func indexTar(ctx context.Context, f *os.File) (*tarSet, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	ts := &tarSet{f: f, files: map[string]tarFile{}}
	links := map[string]string{} // name → the name it stands for
	tr := tar.NewReader(f)
	for n := 0; ; n++ {
		if n%1024 == 0 && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if n > maxArchiveEntries {
			return nil, fmt.Errorf("over %d entries: not an image archive berth reads", maxArchiveEntries)
		}
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, tarErr(err)
		}
		name, ok := archivePath(h.Name)
		if !ok {
			continue
		}
		switch h.Typeflag {
		case tar.TypeReg:
			off, err := f.Seek(0, io.SeekCurrent)
			if err != nil {
				return nil, err
			}
			ts.files[name] = tarFile{off: off, size: h.Size}
			delete(links, name)
		case tar.TypeSymlink:
			// docker save links a layer it has already written.
			target := h.Linkname
			if !path.IsAbs(target) {
				target = path.Join(path.Dir(name), target)
			}
			if t, ok := archivePath(target); ok {
				links[name] = t
			}
			delete(ts.files, name)
		case tar.TypeLink:
			if t, ok := archivePath(h.Linkname); ok {
				links[name] = t
			}
			delete(ts.files, name)
		}
	}
	for name, target := range links {
		for hop := 0; hop < 8; hop++ {
			if tf, ok := ts.files[target]; ok {
				ts.files[name] = tf
				break
			}
			next, ok := links[target]
			if !ok {
				break
			}
			target = next
		}
	}
	return ts, nil
}

// archivePath cleans a path inside an archive; paths leading out of it
// are not files of it.
func archivePath(name string) (string, bool) {
	name = path.Clean("/" + name)[1:]
	if name == "" || strings.ContainsRune(name, 0) {
		return "", false
	}
	return name, true
}

func (t *tarSet) open(name string) (io.ReadCloser, int64, error) {
	tf, ok := t.files[name]
	if !ok {
		return nil, 0, fmt.Errorf("%s: %w", name, fs.ErrNotExist)
	}
	return io.NopCloser(io.NewSectionReader(t.f, tf.off, tf.size)), tf.size, nil
}

func (t *tarSet) has(name string) bool { _, ok := t.files[name]; return ok }

// readSmall reads a whole (JSON) file of a set, bounded.
func readSmall(set fileSet, name string, max int64) ([]byte, error) {
	rc, size, err := set.open(name)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	if size > max {
		return nil, fmt.Errorf("%s is %d bytes, over the limit of %d", name, size, max)
	}
	b, err := io.ReadAll(io.LimitReader(rc, max+1))
	if err != nil {
		return nil, tarErr(err)
	}
	if int64(len(b)) != size {
		return nil, fmt.Errorf("%s: read %d bytes of %d: the source is truncated", name, len(b), size)
	}
	return b, nil
}

// blobPath is where a layout keeps the blob digest.
func blobPath(digest string) string {
	alg, hexPart, _ := strings.Cut(digest, ":")
	return "blobs/" + alg + "/" + hexPart
}

// readBlob reads a small blob by descriptor and checks its size and
// digest.
func readBlob(set fileSet, d Descriptor, max int64) ([]byte, error) {
	if d.Size > max {
		return nil, fmt.Errorf("blob %s is %d bytes, over the limit of %d", short(d.Digest), d.Size, max)
	}
	b, err := readSmall(set, blobPath(d.Digest), max)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("blob %s is missing from the source", short(d.Digest))
	}
	if err != nil {
		return nil, err
	}
	if int64(len(b)) != d.Size {
		return nil, fmt.Errorf("blob %s is %d bytes and its descriptor says %d: the source is corrupt", short(d.Digest), len(b), d.Size)
	}
	h := newHash(d.Digest)
	h.Write(b)
	if got := sum(h, d.Digest); got != d.Digest {
		return nil, fmt.Errorf("blob %s does not match its digest (it hashes to %s): the source is corrupt", short(d.Digest), short(got))
	}
	return b, nil
}

// tarErr names a truncated tar as such.
func tarErr(err error) error {
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("truncated: %w", err)
	}
	return err
}

// opened is a source, opened: its files and what kind it is.
type opened struct {
	kind  string
	files fileSet
	// rootfs is the tarball of a rootfs source.
	rootfs *os.File
	close  func()
}

// openSource opens SOURCE (a path, or "-" for r) as one of the kinds
// berth reads. A stream is first copied into work, bounded by max and
// by the free space left.
func openSource(ctx context.Context, src string, r io.Reader, work string, max int64, free func() (int64, error)) (*opened, error) {
	if src == "-" {
		if r == nil {
			return nil, errors.New("source - is standard input, and there is none")
		}
		file := filepath.Join(work, "source")
		if err := bufferStream(ctx, r, file, "standard input", max, free); err != nil {
			return nil, err
		}
		return openFile(ctx, file, "standard input", work, max, free)
	}
	fi, err := os.Stat(src)
	if err != nil {
		return nil, fmt.Errorf("source %s: %w", src, err)
	}
	if fi.IsDir() {
		root, err := os.OpenRoot(src)
		if err != nil {
			return nil, fmt.Errorf("source %s: %w", src, err)
		}
		ds := dirSet{root: root}
		o := &opened{files: ds, close: func() { root.Close() }}
		switch {
		case ds.has("index.json"):
			o.kind = kindLayout
		case ds.has("manifest.json"):
			o.kind = kindDockerDir
		default:
			root.Close()
			return nil, fmt.Errorf("source %s is a directory but neither an OCI image layout (no index.json) nor an unpacked docker save archive (no manifest.json)", src)
		}
		return o, nil
	}
	if !fi.Mode().IsRegular() {
		// A pipe or device is a stream: read it once, as standard input.
		f, err := os.Open(src)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		return openSource(ctx, "-", f, work, max, free)
	}
	return openFile(ctx, src, "source "+src, work, max, free)
}

// bufferStream copies a stream into file, refusing it past max bytes or
// when the data filesystem would fill.
func bufferStream(ctx context.Context, r io.Reader, file, what string, max int64, free func() (int64, error)) error {
	out, err := os.OpenFile(file, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	buf := make([]byte, 1<<20)
	var n int64
	const check = 256 << 20 // how often free space is looked at
	next := int64(0)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if n >= next {
			left, err := free()
			if err != nil {
				return err
			}
			if left < reserve+check {
				return fmt.Errorf("reading the image from %s: %s read and %s free on the data filesystem: free some space", what, gb(n), gb(left))
			}
			next = n + check
		}
		k, rerr := r.Read(buf)
		if k > 0 {
			n += int64(k)
			if n > max {
				return fmt.Errorf("the image from %s is over %s, the limit for what berth copies aside: import a smaller image or raise the limit", what, gb(max))
			}
			if _, err := out.Write(buf[:k]); err != nil {
				return fmt.Errorf("buffer standard input: %w", err)
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return fmt.Errorf("read standard input: %w", rerr)
		}
	}
	if n == 0 {
		return fmt.Errorf("%s is empty: no image to import", what)
	}
	return nil
}

// openFile opens a file source: a tar archive of an image, or a root
// filesystem tarball (gzip'd, zstd'd or plain). A compressed archive of
// an image is unpacked into work first, as its blobs are read in place.
// label names the source in messages ("source /srv/app.tar", "standard
// input"): file may be a copy in work.
func openFile(ctx context.Context, file, label, work string, max int64, free func() (int64, error)) (*opened, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	comp, err := sniffCompression(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", label, err)
	}
	if comp != uncompressed {
		isImage, err := compressedImageArchive(ctx, f, comp)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("%s: %w", label, err)
		}
		if !isImage {
			return &opened{kind: kindRootFS, rootfs: f, close: func() { f.Close() }}, nil
		}
		plain := filepath.Join(work, "archive.tar")
		err = unpackStream(ctx, f, comp, plain, max, free)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", label, err)
		}
		return openFile(ctx, plain, label, work, max, free)
	}
	ts, err := indexTar(ctx, f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s is not a tar berth can read: %w", label, err)
	}
	o := &opened{files: ts, close: func() { f.Close() }}
	switch {
	case ts.has("index.json") && ts.has("oci-layout"):
		o.kind = kindOCIArchive
	case ts.has("manifest.json"):
		o.kind = kindDockerArchive
	default:
		o.kind, o.rootfs, o.files = kindRootFS, f, nil
	}
	return o, nil
}

// sniffCompression looks at a file's first bytes.
func sniffCompression(f *os.File) (compression, error) {
	var magic [4]byte
	n, err := f.ReadAt(magic[:], 0)
	if err != nil && err != io.EOF {
		return 0, err
	}
	if n == 0 {
		return 0, errors.New("empty file")
	}
	return compressionOf(magic[:n]), nil
}

func compressionOf(b []byte) compression {
	switch {
	case len(b) >= 2 && b[0] == 0x1f && b[1] == 0x8b:
		return gzipped
	case len(b) >= 4 && b[0] == 0x28 && b[1] == 0xb5 && b[2] == 0x2f && b[3] == 0xfd:
		return zstded
	}
	return uncompressed
}

// compressedImageArchive reads a compressed tar's headers to tell an
// image archive (docker save | gzip) from a root filesystem tarball.
func compressedImageArchive(ctx context.Context, f *os.File, comp compression) (bool, error) {
	dec, err := decompressor(io.NewSectionReader(f, 0, 1<<62), comp)
	if err != nil {
		return false, err
	}
	defer dec.Close()
	tr := tar.NewReader(dec)
	for n := 0; ; n++ {
		if n%1024 == 0 && ctx.Err() != nil {
			return false, ctx.Err()
		}
		h, err := tr.Next()
		if err == io.EOF {
			return false, nil
		}
		if err != nil {
			return false, tarErr(err)
		}
		name, _ := archivePath(h.Name)
		switch {
		case name == "manifest.json" || name == "index.json":
			return true, nil
		case !archiveName(name):
			// A root filesystem's entry: an image archive has none.
			return false, nil
		}
	}
}

// archiveName reports whether name may be in an image archive (docker
// save's legacy and current layouts, an OCI layout).
func archiveName(name string) bool {
	top, _, _ := strings.Cut(name, "/")
	switch top {
	case "manifest.json", "repositories", "index.json", "oci-layout", "blobs":
		return true
	}
	// Blobs named by their digests: <hex>, <hex>.json, <hex>.tar(.gz),
	// sha256:<hex>.
	top = strings.TrimPrefix(top, "sha256:")
	top, _, _ = strings.Cut(top, ".")
	if len(top) != 64 {
		return false
	}
	for _, c := range top {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// unpackStream decompresses f into file, bounded.
func unpackStream(ctx context.Context, f *os.File, comp compression, file string, max int64, free func() (int64, error)) error {
	dec, err := decompressor(io.NewSectionReader(f, 0, 1<<62), comp)
	if err != nil {
		return err
	}
	defer dec.Close()
	return bufferStream(ctx, dec, file, "the compressed archive", max, free)
}

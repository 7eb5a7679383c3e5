// Package diskcopy copies disk images for checkpoints, restores and forks:
// copy-on-write where the filesystem can, else sparse, never dense.
package diskcopy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// A copy is copy-on-write where the
// data directory's filesystem can do it (FICLONE: XFS, btrfs, bcachefs),
// so it costs metadata only; otherwise it is a sparse copy: only the
// ranges SEEK_DATA finds are copied, with copy_file_range (in the kernel,
// no bytes through user space), and holes stay holes. Never a dense copy:
// a 4 GiB workspace with 200 MB written costs 200 MB.

// How says how a file was copied.
type How int

const (
	Reflink How = iota + 1
	Sparse
)

func (h How) String() string {
	if h == Reflink {
		return "reflink"
	}
	return "sparse copy"
}

// Allocated is what path holds on the host's disk.
func Allocated(path string) int64 {
	var st syscall.Stat_t
	if syscall.Stat(path, &st) != nil {
		return 0
	}
	return st.Blocks * 512
}

// cloneFile makes dst (which must not exist) a reflink of src. It returns
// an error wrapping errors.ErrUnsupported when the filesystem cannot.
func cloneFile(src, dst string, sync bool) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	err = unix.IoctlFileClone(int(out.Fd()), int(in.Fd()))
	if err == nil && sync {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(dst)
		switch {
		case errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.ENOTTY), errors.Is(err, unix.EXDEV),
			errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOSYS):
			return fmt.Errorf("reflink %s: %w (%w)", src, errors.ErrUnsupported, err)
		}
		return fmt.Errorf("reflink %s: %w", src, err)
	}
	return nil
}

// SparseCopy copies src to dst (which must not exist), data ranges only,
// and with sync syncs dst. ctx is checked between ranges.
func SparseCopy(ctx context.Context, src, dst string, sync bool) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	err = copyRanges(ctx, in, out, fi.Size())
	if err == nil && sync {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(dst)
		return fmt.Errorf("copy %s: %w", src, err)
	}
	return nil
}

func copyRanges(ctx context.Context, in, out *os.File, size int64) error {
	if err := out.Truncate(size); err != nil {
		return err
	}
	ifd, ofd := int(in.Fd()), int(out.Fd())
	return DataExtents(in, size, func(off, n int64) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		return copyRange(ctx, ifd, ofd, off, n)
	})
}

// DataExtents calls fn with each range of f (of size bytes) that holds
// data, as SEEK_DATA and SEEK_HOLE find them; where they are not
// supported the whole file is data.
func DataExtents(f *os.File, size int64, fn func(off, n int64) error) error {
	fd := int(f.Fd())
	for off := int64(0); off < size; {
		start, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // the rest is a hole
		}
		if err != nil {
			if errors.Is(err, unix.EINVAL) && off == 0 {
				return fn(0, size)
			}
			return fmt.Errorf("seek data in %s: %w", f.Name(), err)
		}
		end, err := unix.Seek(fd, start, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole in %s: %w", f.Name(), err)
		}
		end = min(end, size)
		if end > start {
			if err := fn(start, end-start); err != nil {
				return err
			}
		}
		off = end
	}
	return nil
}

// copyRange copies n bytes at off from ifd to the same offset of ofd.
func copyRange(ctx context.Context, ifd, ofd int, off, n int64) error {
	const step = 64 << 20 // bounded, so a cancel is seen within a step
	for n > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		roff, woff := off, off
		c, err := unix.CopyFileRange(ifd, &roff, ofd, &woff, int(min(n, step)), 0)
		if err != nil {
			if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) {
				return copyRangeRW(ifd, ofd, off, n)
			}
			return fmt.Errorf("copy_file_range: %w", err)
		}
		if c == 0 {
			return io.ErrUnexpectedEOF // the source shrank under us
		}
		off += int64(c)
		n -= int64(c)
	}
	return nil
}

// copyRangeRW is copyRange through a buffer, for kernels and filesystems
// without copy_file_range between these files.
func copyRangeRW(ifd, ofd int, off, n int64) error {
	buf := make([]byte, 1<<20)
	for n > 0 {
		c, err := unix.Pread(ifd, buf[:min(n, int64(len(buf)))], off)
		if err != nil {
			return err
		}
		if c == 0 {
			return io.ErrUnexpectedEOF
		}
		if _, err := unix.Pwrite(ofd, buf[:c], off); err != nil {
			return err
		}
		off += int64(c)
		n -= int64(c)
	}
	return nil
}

// Copier copies a set of files, the first one deciding whether the
// filesystem reflinks: if it does, every file is cloned and no space is
// needed; if not, Room is asked whether the space the sparse copies need
// may be written before any byte is copied.
type Copier struct {
	// Room refuses (with the caller's error) to write need more bytes for
	// what; nil allows everything.
	Room func(what string, need int64) error
	// How is how the last CopyAll copied.
	How How
	// NoReflink forces sparse copies (tests compare the two).
	NoReflink bool
	// NoSync leaves the copies to the page cache: a fork's disks, which
	// the fork's first flush (an fdatasync of each image) makes durable,
	// and which are deleted with the half-made fork after a crash.
	NoSync bool
}

// CopyAll copies each src to its dst (none of which may exist). what
// names the operation for a refusal. On error every dst made is removed.
func (dc *Copier) CopyAll(ctx context.Context, what string, pairs [][2]string) (err error) {
	var made []string
	defer func() {
		if err != nil {
			for _, p := range made {
				os.Remove(p)
			}
		}
	}()
	if len(pairs) == 0 {
		return nil
	}
	if !dc.NoReflink {
		err := cloneFile(pairs[0][0], pairs[0][1], !dc.NoSync)
		if err == nil {
			made = append(made, pairs[0][1])
			dc.How = Reflink
			for _, p := range pairs[1:] {
				if err := cloneFile(p[0], p[1], !dc.NoSync); err != nil {
					return err
				}
				made = append(made, p[1])
			}
			return nil
		}
		if !errors.Is(err, errors.ErrUnsupported) {
			return err
		}
	}
	dc.How = Sparse
	var need int64
	for _, p := range pairs {
		need += Allocated(p[0])
	}
	if dc.Room != nil {
		if err := dc.Room(what, need); err != nil {
			return err
		}
	}
	for _, p := range pairs {
		if err := SparseCopy(ctx, p[0], p[1], !dc.NoSync); err != nil {
			return err
		}
		made = append(made, p[1])
	}
	return nil
}

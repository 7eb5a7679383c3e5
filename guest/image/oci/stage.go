package oci

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// stage is a layer's tree being made, in a directory only this import
// writes. Every operation is relative to a directory descriptor opened
// one component at a time with O_NOFOLLOW from the stage's root, and
// the *at calls never follow a final symlink: nothing a layer holds can
// steer a write out of the stage.
type stage struct {
	root int
	dir  string
}

// meta is what an entry's inode carries besides its content.
type meta struct {
	mode     uint32
	uid, gid int
	xattr    []xattr
}

func openStage(dir string) (*stage, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	return &stage{root: fd, dir: dir}, nil
}

func (s *stage) close() { unix.Close(s.root) }

// openDir opens the stage's directory real. A missing one is made when
// mk is not nil, with the attributes mk gives for it; a component that
// is not a directory (a symlink included) is an error, never followed.
func (s *stage) openDir(real []string, mk func(real []string) (meta, error)) (int, error) {
	fd, err := unix.Openat(s.root, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	for i, c := range real {
		nfd, err := s.child(fd, c, real[:i+1], mk)
		unix.Close(fd)
		if err != nil {
			if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
				err = errors.New("not a directory")
			}
			return -1, fmt.Errorf("%q: %w", path.Join(real[:i+1]...), err)
		}
		fd = nfd
	}
	return fd, nil
}

// child opens (or makes, with mk) the directory c in fd.
func (s *stage) child(fd int, c string, real []string, mk func([]string) (meta, error)) (int, error) {
	const flags = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
	nfd, err := unix.Openat(fd, c, flags, 0)
	if err == nil || mk == nil {
		return nfd, err
	}
	// A whiteout this group made: the directory that replaces it must
	// keep hiding what is below.
	opaque := false
	if errors.Is(err, unix.ENOTDIR) {
		st, ok, serr := lstat(fd, c)
		if serr != nil || !ok || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
			return -1, err
		}
		if err := unix.Unlinkat(fd, c, 0); err != nil {
			return -1, err
		}
		opaque = true
	} else if !errors.Is(err, unix.ENOENT) {
		return -1, err
	}
	m, err := mk(real)
	if err != nil {
		return -1, err
	}
	if err := unix.Mkdirat(fd, c, 0o700); err != nil {
		return -1, err
	}
	if nfd, err = unix.Openat(fd, c, flags, 0); err != nil {
		return -1, err
	}
	if err = setMetaFd(nfd, m, nil); err == nil && opaque {
		err = setOpaque(nfd)
	}
	if err != nil {
		unix.Close(nfd)
		return -1, err
	}
	return nfd, nil
}

// lstat looks at name in the directory pfd without following it.
func lstat(pfd int, name string) (unix.Stat_t, bool, error) {
	var st unix.Stat_t
	err := unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return st, false, nil
	}
	return st, err == nil, err
}

// removeAll removes name from pfd and, for a directory, all under it,
// descending by descriptor.
func removeAll(pfd int, name string) error {
	err := unix.Unlinkat(pfd, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
		return err
	}
	dfd, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	names, err := readNames(dfd)
	if err == nil {
		for _, n := range names {
			if err = removeAll(dfd, n); err != nil {
				break
			}
		}
	}
	unix.Close(dfd)
	if err != nil {
		return err
	}
	return unix.Unlinkat(pfd, name, unix.AT_REMOVEDIR)
}

// readNames lists a directory open as fd, leaving fd open.
func readNames(fd int) ([]string, error) {
	dup, err := unix.Dup(fd)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(dup), "dir")
	defer f.Close()
	return f.Readdirnames(-1)
}

// setMetaFd gives an open inode its owner, then its mode (a chown
// clears setuid bits), then its extended attributes (a chown clears
// security.capability too). Attributes the host's filesystem refuses
// are passed to drop.
func setMetaFd(fd int, m meta, drop func(name string, err error)) error {
	if err := unix.Fchown(fd, m.uid, m.gid); err != nil {
		return fmt.Errorf("set owner %d:%d: %w", m.uid, m.gid, err)
	}
	if err := unix.Fchmod(fd, m.mode); err != nil {
		return fmt.Errorf("set mode %o: %w", m.mode, err)
	}
	for _, x := range m.xattr {
		if overlayXattr(x.name) {
			if drop != nil {
				drop(x.name, errors.New("overlayfs's own"))
			}
			continue
		}
		if err := unix.Fsetxattr(fd, x.name, []byte(x.value), 0); err != nil && drop != nil {
			drop(x.name, err)
		}
	}
	return nil
}

// setMetaAt does what setMetaFd does for name in pfd, which is not
// followed: for symlinks, devices and fifos, which cannot be opened for
// it. Symlinks have no mode of their own.
func setMetaAt(pfd int, name string, m meta, symlink bool, drop func(string, error)) error {
	if err := unix.Fchownat(pfd, name, m.uid, m.gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set owner %d:%d: %w", m.uid, m.gid, err)
	}
	if !symlink {
		// The stage holds no symlink here: name was just made as a
		// device or fifo by this import, which alone writes the stage.
		if err := unix.Fchmodat(pfd, name, m.mode, 0); err != nil {
			return fmt.Errorf("set mode %o: %w", m.mode, err)
		}
	}
	// /proc/self/fd/N is the directory itself; the final name is not
	// followed by the l* call.
	p := "/proc/self/fd/" + strconv.Itoa(pfd) + "/" + name
	for _, x := range m.xattr {
		if overlayXattr(x.name) {
			if drop != nil {
				drop(x.name, errors.New("overlayfs's own"))
			}
			continue
		}
		if err := unix.Lsetxattr(p, x.name, []byte(x.value), 0); err != nil && drop != nil {
			drop(x.name, err)
		}
	}
	return nil
}

// setTimes sets name's times without following it.
func setTimes(pfd int, name string, t time.Time) error {
	ts := unix.NsecToTimespec(t.UnixNano())
	return unix.UtimesNanoAt(pfd, name, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
}

// writeFile makes name in pfd with the n bytes of r.
func writeFile(pfd int, name string, r io.Reader, n int64, m meta, buf []byte, drop func(string, error)) error {
	fd, err := unix.Openat(pfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	got, err := io.CopyBuffer(f, io.LimitReader(r, n), buf)
	if err != nil {
		return err
	}
	if got != n {
		return io.ErrUnexpectedEOF
	}
	return setMetaFd(int(f.Fd()), m, drop)
}

// mkWhiteout makes overlayfs's whiteout, a character device 0:0, at
// name: it hides name in the layers below.
func mkWhiteout(pfd int, name string) error {
	return unix.Mknodat(pfd, name, unix.S_IFCHR, 0)
}

// opaqueXattr marks a directory as hiding what the layers below hold
// under it.
const opaqueXattr = "trusted.overlay.opaque"

func setOpaque(fd int) error {
	if err := unix.Fsetxattr(fd, opaqueXattr, []byte("y"), 0); err != nil {
		return fmt.Errorf("mark a directory opaque (%s, needs root): %w", opaqueXattr, err)
	}
	return nil
}

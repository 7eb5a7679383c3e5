package agent

import (
	"errors"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/guest/tree"
)

// Path calls an SFTP server needs beyond the file API: attributes, links,
// the filesystem's figures, rmdir. Each is durable when it returns, as
// mkdir, remove and rename are.
//
// Symlinks are stored as given, whatever their target: creating one is no
// access. Following one is: every later call resolves paths through
// os.Root, which refuses a link that leads out of /workspace (or is
// absolute), so a link to /etc/passwd can be made and listed but never
// read or written through.

// setstat applies at to the file at p, following symlinks (inside the
// workspace), through one descriptor, and fsyncs it.
func (a *Agent) setstat(p string, at *guest.Attrs) error {
	root, r, err := a.open(p)
	if err != nil {
		return err
	}
	flag := os.O_RDONLY
	if at.Size != nil {
		flag = os.O_WRONLY // truncate(2) needs write access too
	}
	f, err := root.OpenFile(r, flag|syscall.O_NONBLOCK, 0)
	if err != nil {
		return escapeErr(err)
	}
	defer f.Close()
	if err := setAttrs(f, at); err != nil {
		return err
	}
	if err := f.Sync(); err != nil && !errors.Is(err, syscall.EINVAL) { // a FIFO cannot be synced, nor needs it
		return err
	}
	return nil
}

// statFollow is stat following a final symlink.
func (a *Agent) statFollow(p string) (guest.FileInfo, error) {
	root, r, err := a.open(p)
	if err != nil {
		return guest.FileInfo{}, err
	}
	fi, err := root.Stat(r)
	if err != nil {
		return guest.FileInfo{}, escapeErr(err)
	}
	return info(path.Base(r), fi, ""), nil
}

// symlink makes p a symlink whose content is target, owner's (nil:
// root's).
func (a *Agent) symlink(target, p string, owner *tree.Owner) error {
	root, r, err := a.open(p)
	if err != nil {
		return err
	}
	if strings.ContainsRune(target, 0) {
		return &fs.PathError{Op: "symlink", Path: p, Err: syscall.EINVAL}
	}
	if err := root.Symlink(target, r); err != nil {
		return escapeErr(err)
	}
	if owner != nil {
		if err := root.Lchown(r, owner.UID, owner.GID); err != nil {
			return err
		}
	}
	return syncDir(root, parent(r))
}

// link makes to a hard link to from (to from itself when it is a
// symlink, as link(2) on Linux does).
func (a *Agent) link(from, to string) error {
	root, rf, err := a.open(from)
	if err != nil {
		return err
	}
	_, rt, err := a.open(to)
	if err != nil {
		return err
	}
	if err := root.Link(rf, rt); err != nil {
		return escapeErr(err)
	}
	return syncDir(root, parent(rt))
}

// statfs reports the figures of the filesystem holding p.
func (a *Agent) statfs(p string) (guest.FSStat, error) {
	root, r, err := a.open(p)
	if err != nil {
		return guest.FSStat{}, err
	}
	f, err := root.OpenFile(r, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return guest.FSStat{}, escapeErr(err)
	}
	defer f.Close()
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
		return guest.FSStat{}, &fs.PathError{Op: "statfs", Path: p, Err: err}
	}
	frsize := uint64(st.Frsize)
	if frsize == 0 {
		frsize = uint64(st.Bsize)
	}
	return guest.FSStat{
		BlockSize: uint64(st.Bsize), FragmentSize: frsize,
		Blocks: st.Blocks, BlocksFree: st.Bfree, BlocksAvail: st.Bavail,
		// statfs has no "available to unprivileged users" for inodes;
		// statvfs(3) reports the free count there too.
		Files: st.Files, FilesFree: st.Ffree, FilesAvail: st.Ffree,
		FSID:    uint64(uint32(st.Fsid.Val[0])) | uint64(uint32(st.Fsid.Val[1]))<<32,
		Flags:   uint64(st.Flags) & stFlags, // not ST_VALID, statfs's own
		NameMax: uint64(st.Namelen),
	}, nil
}

// stFlags are the statvfs(3) mount flags.
const stFlags = unix.ST_RDONLY | unix.ST_NOSUID | unix.ST_NODEV | unix.ST_NOEXEC | unix.ST_SYNCHRONOUS |
	unix.ST_MANDLOCK | unix.ST_NOATIME | unix.ST_NODIRATIME | unix.ST_RELATIME

// rmdir removes the empty directory p; a file, or a symlink to a
// directory, is ENOTDIR, a directory with entries ENOTEMPTY.
func (a *Agent) rmdir(p string) error {
	root, r, err := a.open(p)
	if err != nil {
		return err
	}
	if r == "." {
		return &fs.PathError{Op: "rmdir", Path: p, Err: errBusy}
	}
	d, err := root.Open(parent(r))
	if err != nil {
		return escapeErr(err)
	}
	defer d.Close()
	// unlinkat in the directory opened through the root: nothing between
	// the check and the removal can swap the name for something else.
	if err := unix.Unlinkat(int(d.Fd()), path.Base(r), unix.AT_REMOVEDIR); err != nil {
		return &fs.PathError{Op: "rmdir", Path: p, Err: err}
	}
	return d.Sync()
}

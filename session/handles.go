package session

import (
	"context"
	"io/fs"
	"time"
)

// Open flags, as os.OpenFile takes them (the subset SFTP and berth use).
// They travel to the agent as these values, whatever the host's.
const (
	OpenRead      = 0x1  // O_RDONLY when alone
	OpenWrite     = 0x2  // O_WRONLY, or O_RDWR with OpenRead
	OpenAppend    = 0x4  // writes go to the end
	OpenCreate    = 0x8  // create if missing
	OpenTruncate  = 0x10 // truncate to zero
	OpenExclusive = 0x20 // with OpenCreate: fail if it exists
)

// Attrs are the attributes SETSTAT-like calls change; nil fields stay as
// they are (Atime without Mtime changes only the access time, UID without
// GID only the owner). They are applied in the order that keeps each:
// size, then ownership (a chown clears setuid and setgid), then mode,
// then times.
type Attrs struct {
	Size  *int64       `json:"size,omitempty"`  // truncate or extend (with zeros)
	Mode  *fs.FileMode `json:"mode,omitempty"`  // permission bits and fs.ModeSetuid, ModeSetgid, ModeSticky; other bits are ignored
	Atime *time.Time   `json:"atime,omitempty"` // usually with Mtime
	Mtime *time.Time   `json:"mtime,omitempty"`
	UID   *int         `json:"uid,omitempty"` // ownership: root in the guest may give any
	GID   *int         `json:"gid,omitempty"`
}

// FSStat is a filesystem's figures (statvfs).
type FSStat struct {
	BlockSize, FragmentSize         uint64
	Blocks, BlocksFree, BlocksAvail uint64
	Files, FilesFree, FilesAvail    uint64
	FSID, Flags, NameMax            uint64
}

// A File is an open file in a session's /workspace: reads and writes at
// any offset on one handle, as an SFTP client makes them. Its methods are
// safe for concurrent use, and concurrent calls are in flight together.
// ReadAt and WriteAt behave as io.ReaderAt and io.WriterAt: fewer bytes
// only with an error, io.EOF at the end of the file (returned as is, never
// classed). On a File opened with OpenAppend every write goes to the end,
// whatever its offset. Stat's Name is the base of the path opened.
//
// The ctx given to Open bounds the File's life: when it ends (the client
// went away), the File is released without Close. Close releases it too;
// calls after Close, Close included, fail with an error wrapping
// fs.ErrClosed (and ErrInvalid).
//
// Durability: a file opened as an upload is (Staged: for writing, with
// OpenCreate and OpenTruncate, without OpenExclusive — what put, scp and
// a shell's > do) is staged: it is written to a temporary file beside its
// name, and Close makes it durable (fsync) and renames it into place (and
// syncs the directory) — until then readers see the old content (or no
// file), and a File never closed (the client went away mid-upload, the
// VM stopped) leaves nothing under the name. A Close that fails put
// nothing in place. A symlink, or a file with several links, is
// truncated in place instead, so links stay links. Any other open for
// writing works in place, seen by readers at once (OpenCreate alone makes
// the file at once, as open(2) does; OpenCreate|OpenExclusive atomically,
// a lockfile); Sync, and Close after a write or Setstat, make the writes
// durable (Close of a file created in place syncs its directory too).
type File interface {
	ReadAt(p []byte, off int64) (int, error)
	WriteAt(p []byte, off int64) (int, error)
	Stat(ctx context.Context) (FileInfo, error)
	// Setstat changes the open file's attributes; Sync or Close makes
	// the change durable.
	Setstat(ctx context.Context, a Attrs) error
	Sync(ctx context.Context) error
	Close() error
}

// Handles are the file calls an SFTP server needs beyond Files: open
// handles, attribute changes, links and the filesystem's figures. Paths
// are under /workspace as for Files; symlinks that lead out (absolute
// ones included: the guest resolves paths inside its /workspace) are
// refused with ErrInvalid wherever they would be followed. Path calls are
// durable when they return.
//
// Errors carry a class, as for Files, and where the guest reported an
// errno, that syscall.Errno too (errors.Is(err, syscall.ENOTEMPTY)), so an
// SFTP server can answer precisely: ENOENT is ErrNotFound; EEXIST
// ErrExists; EACCES, EPERM and EROFS ErrPermission; ENOTEMPTY, ENOTDIR,
// EISDIR, EINVAL, ELOOP, EBADF, EXDEV, EMLINK, ENAMETOOLONG and EBUSY
// ErrInvalid; ENOSPC and EDQUOT ErrConflict (the workspace is full); a
// lost VM ErrUnavailable.
type Handles interface {
	// Open opens path as flags (Open*) say. perm is a new file's mode
	// (permission bits and setuid, setgid, sticky; the guest's umask,
	// 022, applies); 0 means 0644. Without OpenWrite the file is opened
	// for reading only. See File for what is staged.
	Open(ctx context.Context, name, path string, flags int, perm fs.FileMode) (File, error)
	// Setstat changes path's attributes, following symlinks.
	Setstat(ctx context.Context, name, path string, a Attrs) error
	// StatFollow describes path following symlinks (inside /workspace);
	// Files.Stat does not follow a final one.
	StatFollow(ctx context.Context, name, path string) (FileInfo, error)
	// Symlink makes path a symlink to target. The target is stored as
	// given, whatever it names (as OpenSSH's sftp-server does): making a
	// link reads nothing, and following one that leads out of /workspace
	// is refused on every later call.
	Symlink(ctx context.Context, name, target, path string) error
	// Link makes newpath a hard link to oldpath (to the symlink itself
	// when oldpath is one). A directory cannot be linked (EPERM).
	Link(ctx context.Context, name, oldpath, newpath string) error
	// Statfs reports the figures of the filesystem holding path.
	Statfs(ctx context.Context, name, path string) (FSStat, error)
	// Rmdir removes an empty directory (Remove removes files and empty
	// directories too; Rmdir refuses a file or a symlink with ENOTDIR,
	// a directory with entries with ENOTEMPTY, both ErrInvalid).
	Rmdir(ctx context.Context, name, path string) error
}

// Staged reports whether an Open with flags stages the file it writes
// (see File): the one rule for the guest, the fake and the SFTP server.
func Staged(flags int) bool {
	return flags&OpenWrite != 0 &&
		flags&(OpenCreate|OpenTruncate) == OpenCreate|OpenTruncate &&
		flags&OpenExclusive == 0
}

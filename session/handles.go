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
// they are.
type Attrs struct {
	Size  *int64       `json:"size,omitempty"`  // truncate or extend
	Mode  *fs.FileMode `json:"mode,omitempty"`  // permission bits (and setuid/setgid/sticky)
	Atime *time.Time   `json:"atime,omitempty"` // with Mtime
	Mtime *time.Time   `json:"mtime,omitempty"`
	UID   *int         `json:"uid,omitempty"` // ownership, where the guest allows it
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
// safe for concurrent use. Close releases it; a File whose caller goes
// away (its context ends) is released too.
//
// Durability: a file opened to create or truncate it, without
// OpenExclusive, is staged: it is written to a temporary file beside its
// name, and Close makes it durable (fsync) and renames it into place (and
// syncs the directory) — until then readers see the old content, and a
// File never closed (the client went away mid-upload) leaves nothing
// under the name. Any other open for writing writes in place; Sync, and
// Close after a write, make the writes durable.
type File interface {
	ReadAt(p []byte, off int64) (int, error)
	WriteAt(p []byte, off int64) (int, error)
	Stat(ctx context.Context) (FileInfo, error)
	Setstat(ctx context.Context, a Attrs) error
	Sync(ctx context.Context) error
	Close() error
}

// Handles are the file calls an SFTP server needs beyond Files: open
// handles, attribute changes, links and the filesystem's figures. Paths
// are under /workspace as for Files; symlinks that lead out are refused.
type Handles interface {
	Open(ctx context.Context, name, path string, flags int, perm fs.FileMode) (File, error)
	Setstat(ctx context.Context, name, path string, a Attrs) error
	// StatFollow describes path following symlinks (inside /workspace);
	// Files.Stat does not follow a final one.
	StatFollow(ctx context.Context, name, path string) (FileInfo, error)
	Symlink(ctx context.Context, name, target, path string) error
	Link(ctx context.Context, name, oldpath, newpath string) error // a hard link
	Statfs(ctx context.Context, name, path string) (FSStat, error)
	// Rmdir removes an empty directory (Remove removes files and empty
	// directories too; Rmdir refuses a file).
	Rmdir(ctx context.Context, name, path string) error
}

package ext4

import (
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"path"
	"strings"
)

// MaxDirEntries bounds one directory's entries when Lookup or Walk read
// it: a directory of 64 MiB of the shortest names holds about as many.
const MaxDirEntries = 1 << 22

// maxWalkDepth bounds how deep Walk descends, so a crafted directory that
// holds one of its ancestors cannot loop it.
const maxWalkDepth = 4096

// ErrSymlinkOnPath is a lookup through a symlink: nothing here follows
// one (the image is a guest's, and its links point into the guest's
// tree, not the host's), and a caller that named such a path is told so.
var ErrSymlinkOnPath = errors.New("a directory on the path is a symlink")

// FileMode is the inode's type and permissions as io/fs has them.
func (in *Inode) FileMode() iofs.FileMode {
	mode := iofs.FileMode(in.Mode & 0o777)
	if in.Mode&0o4000 != 0 {
		mode |= iofs.ModeSetuid
	}
	if in.Mode&0o2000 != 0 {
		mode |= iofs.ModeSetgid
	}
	if in.Mode&0o1000 != 0 {
		mode |= iofs.ModeSticky
	}
	switch in.Type() {
	case ModeDir:
		mode |= iofs.ModeDir
	case ModeSym:
		mode |= iofs.ModeSymlink
	case ModeFifo:
		mode |= iofs.ModeNamedPipe
	case ModeSocket:
		mode |= iofs.ModeSocket
	case ModeChar:
		mode |= iofs.ModeDevice | iofs.ModeCharDevice
	case ModeBlock:
		mode |= iofs.ModeDevice
	case ModeFile:
	default:
		mode |= iofs.ModeIrregular
	}
	return mode
}

// ID is the file's identity as the guest's agent reports it,
// "inode:generation".
func (in *Inode) ID() string { return fmt.Sprintf("%d:%d", in.Ino, in.Gen) }

// ReadFile reads a regular file whole, refusing one over limit bytes.
func (fs *FS) ReadFile(in *Inode, limit int64) ([]byte, error) {
	if in.Type() != ModeFile {
		return nil, fmt.Errorf("inode %d is not a regular file", in.Ino)
	}
	if in.Size > limit {
		return nil, fmt.Errorf("inode %d is a file of %d bytes, over the limit of %d", in.Ino, in.Size, limit)
	}
	r, err := fs.Open(in)
	if err != nil {
		return nil, err
	}
	b := make([]byte, in.Size)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, fmt.Errorf("inode %d: %w", in.Ino, err)
	}
	return b, nil
}

// Lookup finds rel (slash-separated, relative to the root, no "..")
// without following symlinks; a missing path is fs.ErrNotExist, one
// through a symlink ErrSymlinkOnPath.
func (fs *FS) Lookup(rel string) (*Inode, error) {
	in, err := fs.Inode(RootIno)
	if err != nil {
		return nil, err
	}
	if rel == "" || rel == "." {
		return in, nil
	}
	parts := strings.Split(path.Clean(rel), "/")
	for i, part := range parts {
		if part == ".." {
			return nil, fmt.Errorf("%q climbs out of the root: %w", rel, iofs.ErrInvalid)
		}
		switch in.Type() {
		case ModeSym:
			return nil, fmt.Errorf("%s: %w", path.Join(parts[:i]...), ErrSymlinkOnPath)
		case ModeDir:
		default:
			return nil, fmt.Errorf("%s: %w", rel, iofs.ErrNotExist)
		}
		ents, err := fs.ReadDir(in, MaxDirEntries)
		if err != nil {
			return nil, err
		}
		var next uint32
		for _, e := range ents {
			if e.Name == part {
				next = e.Ino
				break
			}
		}
		if next == 0 {
			return nil, fmt.Errorf("%s: %w", rel, iofs.ErrNotExist)
		}
		if in, err = fs.Inode(next); err != nil {
			return nil, err
		}
	}
	return in, nil
}

// Walk calls fn for every entry under the directory dir (whose path is
// dirRel), depth first, each directory before what it holds. It follows
// no symlink and stops at fn's first error, which it returns.
func (fs *FS) Walk(dirRel string, dir *Inode, fn func(rel string, in *Inode) error) error {
	return fs.walk(dirRel, dir, fn, 0)
}

func (fs *FS) walk(rel string, dir *Inode, fn func(string, *Inode) error, depth int) error {
	if depth > maxWalkDepth {
		return fmt.Errorf("%s: directories nested over %d deep", rel, maxWalkDepth)
	}
	ents, err := fs.ReadDir(dir, MaxDirEntries)
	if err != nil {
		return err
	}
	for _, e := range ents {
		in, err := fs.Inode(e.Ino)
		if err != nil {
			return err
		}
		p := path.Join(rel, e.Name)
		if err := fn(p, in); err != nil {
			return err
		}
		if in.Type() == ModeDir {
			if err := fs.walk(p, in, fn, depth+1); err != nil {
				return err
			}
		}
	}
	return nil
}

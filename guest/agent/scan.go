package agent

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"os"
	"path"

	"golang.org/x/sys/unix"

	"github.com/berthvm/berth/guest"
)

// Scans describe paths for a diff: what a checkpoint's copy of the same
// filesystem can be compared with without reading contents. Each path is
// looked at from its parent directory (opened through the workspace root,
// which refuses escapes) with calls that follow no symlink: a symlink is
// described, never entered, and a walk does not descend into one.

// scanBatch bounds the entries in one data frame.
const scanBatch = 256

// maxScanDepth bounds a walk's depth.
const maxScanDepth = 4096

type scanner struct {
	s     *stream
	root  *os.Root
	sums  bool
	batch []guest.ScanEntry
	err   error // the stream's end: nothing more is sent
}

func (a *Agent) scan(s *stream, req *guest.Request) error {
	root, err := a.workspace()
	if err != nil {
		return err
	}
	sc := &scanner{s: s, root: root, sums: req.Sums}
	rels := make([]string, 0, len(req.Paths))
	for _, p := range req.Paths {
		r, err := rel(p)
		if err != nil {
			return err
		}
		rels = append(rels, r)
	}
	for _, r := range rels {
		if r == "." {
			if !req.All {
				continue
			}
			d, err := root.Open(".")
			if err != nil {
				return err
			}
			sc.walk(d, "", 0)
			d.Close()
			continue
		}
		dir, err := root.Open(parent(r))
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOTDIR) {
				sc.add(guest.ScanEntry{Path: r, Missing: true})
				continue
			}
			return escapeErr(err)
		}
		e, ok := sc.entry(dir, path.Base(r), r)
		if !ok {
			e = guest.ScanEntry{Path: r, Missing: true}
		}
		sc.add(e)
		if ok && req.All && fs.FileMode(e.Mode).IsDir() {
			if d, err := openDirAt(dir, path.Base(r)); err == nil {
				sc.walk(d, r, 0)
				d.Close()
			}
		}
		dir.Close()
		if sc.err != nil {
			return nil
		}
	}
	sc.flush()
	if sc.err == nil {
		s.send(guest.FrameEnd, nil)
	}
	return nil
}

func (sc *scanner) add(e guest.ScanEntry) {
	sc.batch = append(sc.batch, e)
	if len(sc.batch) >= scanBatch {
		sc.flush()
	}
}

func (sc *scanner) flush() {
	if len(sc.batch) == 0 || sc.err != nil {
		return
	}
	sc.err = sc.s.sendJSON(guest.FrameData, sc.batch)
	sc.batch = sc.batch[:0]
}

// entry describes name in dir (whose path is rel's parent); false when it
// does not exist.
func (sc *scanner) entry(dir *os.File, name, rel string) (guest.ScanEntry, bool) {
	dfd := int(dir.Fd())
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return guest.ScanEntry{}, false
	}
	mode := fileMode(st.Mode)
	e := guest.ScanEntry{Path: rel, Mode: uint32(mode), Size: st.Size, Ino: st.Ino, Ctime: st.Ctim.Nano()}
	if h, _, err := unix.NameToHandleAt(dfd, name, 0); err == nil {
		e.Gen = handleGen(h)
	}
	switch {
	case mode.Type() == fs.ModeSymlink:
		buf := make([]byte, 4096)
		if n, err := unix.Readlinkat(dfd, name, buf); err == nil {
			e.Link = string(buf[:n])
		}
	case mode.IsRegular() && sc.sums:
		e.Sum = sumAt(dfd, name)
	}
	if mode.IsDir() {
		e.Size = 0
	}
	return e, true
}

// walk describes everything under the open directory d (path rel).
func (sc *scanner) walk(d *os.File, rel string, depth int) {
	if depth > maxScanDepth {
		return
	}
	for sc.err == nil {
		ents, err := d.ReadDir(listBatch)
		for _, ent := range ents {
			p := path.Join(rel, ent.Name())
			e, ok := sc.entry(d, ent.Name(), p)
			if !ok {
				continue // removed while walking
			}
			sc.add(e)
			if fs.FileMode(e.Mode).IsDir() {
				if sub, err := openDirAt(d, ent.Name()); err == nil {
					sc.walk(sub, p, depth+1)
					sub.Close()
				}
			}
		}
		if err != nil || len(ents) == 0 {
			return
		}
	}
}

// openDirAt opens directory name in dir, refusing a symlink.
func openDirAt(dir *os.File, name string) (*os.File, error) {
	fd, err := unix.Openat(int(dir.Fd()), name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), name), nil
}

// sumAt hashes regular file name in dfd ("" when it cannot be read).
func sumAt(dfd int, name string) string {
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return ""
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return ""
	}
	return hex.EncodeToString(h.Sum(nil))
}

// handleGen is the generation in an ext4 file handle (FILEID_INO32_GEN
// and its _PARENT form: the inode number, then the generation).
func handleGen(h unix.FileHandle) uint32 {
	b := h.Bytes()
	if (h.Type() != 1 && h.Type() != 2) || len(b) < 8 {
		return 0
	}
	return binary.LittleEndian.Uint32(b[4:])
}

// fileMode converts a stat mode.
func fileMode(m uint32) fs.FileMode {
	mode := fs.FileMode(m & 0o777)
	if m&unix.S_ISUID != 0 {
		mode |= fs.ModeSetuid
	}
	if m&unix.S_ISGID != 0 {
		mode |= fs.ModeSetgid
	}
	if m&unix.S_ISVTX != 0 {
		mode |= fs.ModeSticky
	}
	switch m & unix.S_IFMT {
	case unix.S_IFDIR:
		mode |= fs.ModeDir
	case unix.S_IFLNK:
		mode |= fs.ModeSymlink
	case unix.S_IFIFO:
		mode |= fs.ModeNamedPipe
	case unix.S_IFSOCK:
		mode |= fs.ModeSocket
	case unix.S_IFCHR:
		mode |= fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFBLK:
		mode |= fs.ModeDevice
	case unix.S_IFREG:
	default:
		mode |= fs.ModeIrregular
	}
	return mode
}

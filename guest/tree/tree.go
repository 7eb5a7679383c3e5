// Package tree copies directory trees as tar streams, the wire format of
// berth's CopyIn and CopyOut: the guest agent unpacks into /workspace and
// packs out of it, and the CLI does the same on the host's side. Both
// sides are untrusted by the other, so unpacking checks every entry: it
// stays inside the directory it is unpacked into, symlinks point inside
// the tree, and only files, directories and symlinks are accepted.
//
// Unpacking is durable like berth's file API: every file is written to a
// temporary name, fsynced and renamed into place, every directory touched
// is fsynced, and Unpack returns only then; an interrupted unpack leaves no
// partial file under a final name, and, into a directory that did not
// exist, nothing at all.
package tree

import (
	"archive/tar"
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Result reports a copy.
type Result struct {
	Entries  int   `json:"entries"`
	Files    int   `json:"files"`
	Dirs     int   `json:"dirs"`
	Symlinks int   `json:"symlinks"`
	Skipped  int   `json:"skipped,omitempty"` // sockets, fifos, devices: not packed
	Bytes    int64 `json:"bytes"`
	// Where an unpack's time went, for those measuring it: waiting for
	// the archive's bytes, and in Options.Sync.
	Waited time.Duration `json:"waited,omitempty"`
	Synced time.Duration `json:"synced,omitempty"`
}

// MaxEntries bounds one copy.
const MaxEntries = 1 << 20

// ErrEscape marks an entry or symlink that leads out of the tree.
var ErrEscape = errors.New("path escapes /workspace or the tree being copied")

// entryPath checks a tar entry's name: relative, clean, inside the tree.
func entryPath(name string) (string, error) {
	if strings.ContainsRune(name, 0) || path.IsAbs(name) {
		return "", fmt.Errorf("entry %q: %w", name, ErrEscape)
	}
	c := path.Clean(name)
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("entry %q: %w", name, ErrEscape)
	}
	return c, nil
}

// LinkInside reports whether a symlink at entry (relative to the tree's
// root) pointing at target stays inside the tree.
func LinkInside(entry, target string) bool {
	if target == "" || path.IsAbs(target) || strings.ContainsRune(target, 0) {
		return false
	}
	c := path.Clean(path.Join(path.Dir(entry), target))
	return c != ".." && !strings.HasPrefix(c, "../")
}

func parent(r string) string {
	d := path.Dir(r)
	if d == "" {
		return "."
	}
	return d
}

// Options tune Unpack.
type Options struct {
	// Progress, if set, is called after each entry.
	Progress func(Result)
	// Sync, if set, makes the whole filesystem under root durable (syncfs).
	// Files are then not synced one by one: a batch of files is written
	// under temporary names, Sync makes them durable, and only then are
	// they renamed into place; a last Sync makes the renames durable. Two
	// syncs per batch instead of one per file, and still no file under a
	// final name before its bytes are on the disk.
	Sync func() error
	// Owner, if set, owns the files, directories and symlinks the unpack
	// creates (in the guest: the session's user). What it replaces keeps
	// its owner either way.
	Owner *Owner
}

// SyncFS returns an Options.Sync for root: syncfs(2) of the filesystem
// holding it, through a descriptor opened now; close it when the unpack
// is done. One sync per batch costs far less than one fsync per file
// (2,000 of them for a tree of 2,000 files, each a flush of the disk).
func SyncFS(root *os.Root) (sync func() error, close func() error, err error) {
	d, err := root.Open(".")
	if err != nil {
		return nil, nil, err
	}
	return func() error { return unix.Syncfs(int(d.Fd())) }, d.Close, nil
}

// Owner is a uid and gid that new files are given.
type Owner struct{ UID, GID int }

// MkdirAll makes dir in root with every missing parent, mode 0755, gives
// each directory it made to owner (nil: left as made) and returns them,
// outermost first. A directory that exists, or a symlink to one inside
// root, is left as it is.
func MkdirAll(root *os.Root, dir string, owner *Owner) ([]string, error) {
	dir = path.Clean(dir)
	if dir == "." {
		return nil, nil
	}
	var made []string
	p := ""
	for _, part := range strings.Split(dir, "/") {
		p = path.Join(p, part)
		err := root.Mkdir(p, 0o755)
		if err == nil {
			made = append(made, p)
			if owner != nil {
				// Lchown: whatever the name is by now, it is not followed.
				if err := root.Lchown(p, owner.UID, owner.GID); err != nil {
					return made, err
				}
			}
			continue
		}
		if !errors.Is(err, fs.ErrExist) {
			return made, err
		}
		fi, err := root.Stat(p)
		if err != nil {
			return made, err
		}
		if !fi.IsDir() {
			return made, &fs.PathError{Op: "mkdir", Path: p, Err: syscall.ENOTDIR}
		}
	}
	return made, nil
}

// Own gives f, just created by the caller, its owner: old's when f
// replaces old (nil: nothing was there), else owner's (nil: as made).
// Keeping old's owner is best effort where the caller may not chown
// (EPERM: an unprivileged host user writing over another's file).
func Own(f *os.File, old fs.FileInfo, owner *Owner) error {
	if old != nil {
		st, ok := old.Sys().(*syscall.Stat_t)
		if !ok {
			return nil
		}
		if err := f.Chown(int(st.Uid), int(st.Gid)); err != nil && !errors.Is(err, syscall.EPERM) {
			return err
		}
		return nil
	}
	if owner == nil {
		return nil
	}
	return f.Chown(owner.UID, owner.GID)
}

// Batches of a syncing Unpack: renames wait for at most this much.
const (
	batchBytes = 64 << 20
	batchFiles = 4096
)

// dirRoots keeps the directories an unpack writes into open, so each
// file costs one openat of its own name instead of a walk of its path.
type dirRoots struct {
	root  *os.Root
	owner *Owner
	open  map[string]*os.Root
	order []string
}

func (d *dirRoots) get(dir string) (*os.Root, error) {
	if r, ok := d.open[dir]; ok {
		return r, nil
	}
	if _, err := MkdirAll(d.root, dir, d.owner); err != nil {
		return nil, err
	}
	r, err := d.root.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	if len(d.order) >= 16 {
		old := d.order[0]
		d.order = d.order[1:]
		d.open[old].Close()
		delete(d.open, old)
	}
	d.open[dir] = r
	d.order = append(d.order, dir)
	return r, nil
}

func (d *dirRoots) close() {
	for _, r := range d.open {
		r.Close()
	}
}

// firstMissing returns the first directory on the way to dir (dir itself
// included) that does not exist, or "" when dir exists.
func firstMissing(root *os.Root, dir string) (string, error) {
	if dir == "." {
		return "", nil
	}
	p := ""
	for _, part := range strings.Split(dir, "/") {
		p = path.Join(p, part)
		if _, err := root.Stat(p); errors.Is(err, fs.ErrNotExist) {
			if _, lerr := root.Lstat(p); lerr == nil {
				return "", nil // a dangling symlink: MkdirAll says what is wrong
			}
			return p, nil
		} else if err != nil {
			return "", err
		}
	}
	return "", nil
}

// Unpack writes the tar stream r into directory dir of root (created if
// missing). A dir that does not exist yet is built under a temporary name
// beside its first missing directory and renamed into place only once the
// whole copy is in and durable: a refused or interrupted copy leaves
// nothing under the final name, so a retry lands where the first try
// would have. Into an existing directory, each file is put in place whole
// (see Options.Sync), and what came before a refused entry stays.
func Unpack(root *os.Root, dir string, r io.Reader, o Options) (res Result, err error) {
	var rnd [6]byte
	rand.Read(rnd[:])
	suffix := ".berth-" + hex.EncodeToString(rnd[:])
	dir = path.Clean(dir)
	top, err := firstMissing(root, dir)
	if err != nil {
		return res, err
	}
	final := dir
	stage := ""
	if top != "" {
		stage = path.Join(parent(top), "."+path.Base(top)+suffix+"-copy")
		rest := strings.TrimPrefix(strings.TrimPrefix(dir, top), "/")
		dir = path.Join(stage, rest)
		defer func() {
			if stage != "" { // not renamed into place: the copy failed
				root.RemoveAll(stage)
			}
		}()
	}
	if _, err := MkdirAll(root, dir, o.Owner); err != nil {
		return res, err
	}
	dr := &dirRoots{root: root, owner: o.Owner, open: map[string]*os.Root{}}
	defer dr.close()
	// Files written but not yet renamed into place (syncing mode).
	type pending struct{ dir, tmp, name string }
	var waiting []pending
	var waitingBytes int64
	defer func() {
		for _, p := range waiting {
			root.Remove(path.Join(p.dir, p.tmp)) // an interrupted unpack leaves nothing behind
		}
	}()
	settle := func() error {
		if len(waiting) == 0 {
			return nil
		}
		if err := o.Sync(); err != nil {
			return fmt.Errorf("sync the copy: %w", err)
		}
		for len(waiting) > 0 {
			p := waiting[0]
			d, err := dr.get(p.dir)
			if err != nil {
				return err
			}
			if err := d.Rename(p.tmp, p.name); err != nil {
				return err
			}
			waiting = waiting[1:]
		}
		waitingBytes = 0
		return nil
	}
	if o.Sync != nil {
		sync := o.Sync
		o.Sync = func() error {
			start := time.Now()
			defer func() { res.Synced += time.Since(start) }()
			return sync()
		}
	}
	dirs := map[string]bool{parent(dir): true, dir: true}
	type stamp struct {
		name  string
		mode  fs.FileMode
		mtime time.Time
	}
	var stamps []stamp
	buf := make([]byte, 256<<10)
	tr := tar.NewReader(bufio.NewReaderSize(r, 1<<20))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return res, fmt.Errorf("unpack into %s: %w", final, err)
		}
		if res.Entries++; res.Entries > MaxEntries {
			return res, fmt.Errorf("unpack into %s: more than %d entries", final, MaxEntries)
		}
		rel, err := entryPath(h.Name)
		if err != nil {
			return res, err
		}
		// A sparse entry's holes read as zeros that the stream never
		// carried: a few bytes of a hostile peer's archive would write
		// any size (FuzzUnpack found one filling the disk). Pack never
		// makes one.
		for k := range h.PAXRecords {
			if strings.HasPrefix(k, "GNU.sparse.") {
				return res, fmt.Errorf("unpack %s: sparse files are not copied: %w", rel, syscall.EINVAL)
			}
		}
		target := path.Join(dir, rel)
		mode := fs.FileMode(h.Mode).Perm()
		if h.Mode&0o4000 != 0 {
			mode |= fs.ModeSetuid
		}
		if h.Mode&0o2000 != 0 {
			mode |= fs.ModeSetgid
		}
		if h.Mode&0o1000 != 0 {
			mode |= fs.ModeSticky
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if rel != "." {
				if _, err := dr.get(target); err != nil {
					return res, err
				}
				res.Dirs++
			}
			dirs[target], dirs[parent(target)] = true, true
			stamps = append(stamps, stamp{target, mode, h.ModTime})
		case tar.TypeReg:
			pdir, base := parent(target), path.Base(target)
			d, err := dr.get(pdir)
			if err != nil {
				return res, err
			}
			// Into a staged directory nothing is under a final name
			// until the stage is: a file goes straight to its name
			// (no rename, no look for one it replaces), unless the
			// archive names it twice.
			direct := false
			if stage != "" {
				err := writeFile(d, base, base, tr, buf, h.Size, mode, h.ModTime, o.Owner, o.Sync == nil)
				if direct = !errors.Is(err, fs.ErrExist); direct && err != nil {
					return res, fmt.Errorf("unpack %s: %w", rel, err)
				}
			}
			switch {
			case direct:
			case o.Sync == nil:
				if err := writeFile(d, base, base+suffix, tr, buf, h.Size, mode, h.ModTime, o.Owner, true); err != nil {
					return res, fmt.Errorf("unpack %s: %w", rel, err)
				}
			default:
				tmp := fmt.Sprintf("%s%s-%d", base, suffix, res.Entries)
				if err := writeFile(d, base, tmp, tr, buf, h.Size, mode, h.ModTime, o.Owner, false); err != nil {
					return res, fmt.Errorf("unpack %s: %w", rel, err)
				}
				waiting = append(waiting, pending{pdir, tmp, base})
				if waitingBytes += h.Size; waitingBytes >= batchBytes || len(waiting) >= batchFiles {
					if err := settle(); err != nil {
						return res, err
					}
				}
			}
			dirs[pdir] = true
			res.Files++
			res.Bytes += h.Size
		case tar.TypeSymlink:
			if !LinkInside(rel, h.Linkname) {
				return res, fmt.Errorf("refusing symlink %s → %s: it points out of the tree being copied: %w", rel, h.Linkname, ErrEscape)
			}
			pdir, base := parent(target), path.Base(target)
			d, err := dr.get(pdir)
			if err != nil {
				return res, err
			}
			tmp := base + suffix
			if err := d.Symlink(h.Linkname, tmp); err != nil {
				return res, err
			}
			if err := ownLink(d, tmp, base, o.Owner); err != nil {
				d.Remove(tmp)
				return res, err
			}
			if err := d.Rename(tmp, base); err != nil {
				d.Remove(tmp)
				return res, err
			}
			dirs[pdir] = true
			res.Symlinks++
		default:
			return res, fmt.Errorf("unpack %s: only files, directories and symlinks are copied (tar type %q): %w", rel, h.Typeflag, syscall.EINVAL)
		}
		if o.Progress != nil {
			o.Progress(res)
		}
	}
	if err := settle(); err != nil {
		return res, err
	}
	// Directories last, deepest first: their modes may forbid writing into
	// them, and writing into them changed their mtimes.
	sort.Slice(stamps, func(i, j int) bool { return len(stamps[i].name) > len(stamps[j].name) })
	for _, d := range stamps {
		root.Chmod(d.name, d.mode)
		root.Chtimes(d.name, d.mtime, d.mtime)
	}
	if o.Sync != nil {
		// The renames and the directories' modes, in one go.
		if err := o.Sync(); err != nil {
			return res, err
		}
	} else {
		names := make([]string, 0, len(dirs))
		for d := range dirs {
			names = append(names, d)
		}
		sort.Strings(names)
		for _, d := range names {
			if err := syncDir(root, d); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return res, err
			}
		}
	}
	if stage == "" {
		return res, nil
	}
	// Everything is durable under the temporary name; now the name.
	if err := root.Rename(stage, top); err != nil {
		return res, fmt.Errorf("unpack into %s: put the copy in place: %w", final, err)
	}
	stage = ""
	if o.Sync != nil {
		err := o.Sync()
		return res, err
	}
	return res, syncDir(root, parent(top))
}

// ownLink gives symlink tmp, about to replace name in d, its owner as Own
// gives a file its owner.
func ownLink(d *os.Root, tmp, name string, owner *Owner) error {
	if old, err := d.Lstat(name); err == nil {
		if st, ok := old.Sys().(*syscall.Stat_t); ok {
			if err := d.Lchown(tmp, int(st.Uid), int(st.Gid)); err != nil && !errors.Is(err, syscall.EPERM) {
				return err
			}
		}
		return nil
	}
	if owner == nil {
		return nil
	}
	return d.Lchown(tmp, owner.UID, owner.GID)
}

// writeFile writes size bytes from r into tmp in directory d, gives it its
// owner (Own), mode and mtime, and, when durable, syncs it and renames it
// to name. Otherwise the caller renames it once a batch is synced. With
// tmp == name the file is made under its name, which must not exist
// (fs.ErrExist, and nothing read from r, if it does), and never renamed.
func writeFile(d *os.Root, name, tmp string, r io.Reader, buf []byte, size int64, mode fs.FileMode, mtime time.Time, owner *Owner, durable bool) error {
	var old fs.FileInfo
	if tmp != name {
		fi, err := d.Lstat(name)
		if err == nil && fi.IsDir() {
			return &fs.PathError{Op: "unpack", Path: name, Err: syscall.EISDIR}
		}
		if err == nil {
			old = fi
		}
	}
	f, err := d.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	ok := false
	defer func() {
		if !ok {
			f.Close()
			d.Remove(tmp)
		}
	}()
	if err := Own(f, old, owner); err != nil {
		return err
	}
	// A plain writer: *os.File's ReadFrom would copy through its own
	// 32 KiB buffer, a write per 32 KiB.
	n, err := io.CopyBuffer(struct{ io.Writer }{f}, io.LimitReader(r, size), buf)
	if err != nil {
		return err
	}
	if n != size {
		return fmt.Errorf("short archive entry: %w", io.ErrUnexpectedEOF)
	}
	if err := f.Chmod(mode); err != nil {
		return err
	}
	ts := []unix.Timeval{unix.NsecToTimeval(mtime.UnixNano()), unix.NsecToTimeval(mtime.UnixNano())}
	if err := unix.Futimes(int(f.Fd()), ts); err != nil {
		return err
	}
	if durable {
		if err := f.Sync(); err != nil {
			return err
		}
	}
	if err := f.Close(); err != nil {
		return err
	}
	if durable && tmp != name {
		if err := d.Rename(tmp, name); err != nil {
			return err
		}
	}
	ok = true
	return nil
}

func syncDir(root *os.Root, dir string) error {
	d, err := root.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Pack writes the file or tree at p of root to w as a tar: a directory's
// entries relative to it, a file under its own name. Symlinks are packed
// as symlinks, never followed; one pointing out of the tree stops the copy.
func Pack(root *os.Root, p string, w io.Writer, progress func(Result)) (Result, error) {
	var res Result
	fi, err := root.Lstat(p)
	if err != nil {
		return res, err
	}
	var tw *tar.Writer
	mode := func(fi fs.FileInfo) int64 {
		m := int64(fi.Mode().Perm())
		if fi.Mode()&fs.ModeSetuid != 0 {
			m |= 0o4000
		}
		if fi.Mode()&fs.ModeSetgid != 0 {
			m |= 0o2000
		}
		if fi.Mode()&fs.ModeSticky != 0 {
			m |= 0o1000
		}
		return m
	}
	// Each directory is opened once, and its entries relative to it, so a
	// file costs an openat of its own name rather than a walk of its path.
	bw := bufio.NewWriterSize(w, 1<<20)
	tw = tar.NewWriter(bw)
	buf := make([]byte, 256<<10)
	// walk packs entry name of directory d (rel is its path in the tree).
	var walk func(d *os.Root, name, rel string, fi fs.FileInfo) error
	walk = func(d *os.Root, name, rel string, fi fs.FileInfo) error {
		if res.Entries++; res.Entries > MaxEntries {
			return fmt.Errorf("pack %s: more than %d entries", p, MaxEntries)
		}
		full := path.Join(p, rel)
		entry := rel
		switch {
		case rel == "." && !fi.IsDir():
			entry = path.Base(p) // one file: the archive holds it by its name
		case fi.IsDir() && entry != ".":
			entry += "/"
		}
		defer func() {
			if progress != nil {
				progress(res)
			}
		}()
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := d.Readlink(name)
			if err != nil {
				return err
			}
			if !LinkInside(rel, target) {
				return fmt.Errorf("refusing symlink %s → %s: it points out of the tree being copied: %w", full, target, ErrEscape)
			}
			res.Symlinks++
			return tw.WriteHeader(&tar.Header{Format: tar.FormatPAX, Typeflag: tar.TypeSymlink, Name: entry, Linkname: target, Mode: 0o777, ModTime: fi.ModTime()})
		case fi.IsDir():
			// The tree's own directory has no entry: its contents land in
			// the directory the copy goes to.
			if rel != "." {
				res.Dirs++
				if err := tw.WriteHeader(&tar.Header{Format: tar.FormatPAX, Typeflag: tar.TypeDir, Name: entry, Mode: mode(fi), ModTime: fi.ModTime()}); err != nil {
					return err
				}
			}
			sub, err := d.OpenRoot(name)
			if err != nil {
				return err
			}
			defer sub.Close()
			dir, err := sub.Open(".")
			if err != nil {
				return err
			}
			ents, err := dir.ReadDir(-1)
			dir.Close()
			if err != nil {
				return err
			}
			sort.Slice(ents, func(i, j int) bool { return ents[i].Name() < ents[j].Name() })
			for _, e := range ents {
				efi, err := e.Info()
				if err != nil {
					continue // removed meanwhile
				}
				if err := walk(sub, e.Name(), path.Join(rel, e.Name()), efi); err != nil {
					return err
				}
			}
			return nil
		case fi.Mode().IsRegular():
			f, err := d.Open(name)
			if err != nil {
				return err
			}
			defer f.Close()
			if err := tw.WriteHeader(&tar.Header{Format: tar.FormatPAX, Typeflag: tar.TypeReg, Name: entry, Size: fi.Size(), Mode: mode(fi), ModTime: fi.ModTime()}); err != nil {
				return err
			}
			n, err := io.CopyBuffer(tw, io.LimitReader(f, fi.Size()), buf)
			if err != nil {
				return fmt.Errorf("pack %s: %w", full, err)
			}
			if n != fi.Size() {
				return fmt.Errorf("pack %s: it shrank from %d to %d bytes while being copied", full, fi.Size(), n)
			}
			res.Files++
			res.Bytes += fi.Size()
			return nil
		}
		res.Skipped++
		return nil
	}
	dir, name := parent(p), path.Base(p)
	if p == "." {
		dir, name = ".", "."
	}
	top, err := root.OpenRoot(dir)
	if err != nil {
		return res, err
	}
	defer top.Close()
	if err := walk(top, name, ".", fi); err != nil {
		return res, err
	}
	if err := tw.Close(); err != nil {
		return res, err
	}
	return res, bw.Flush()
}

package agent

import (
	"archive/tar"
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

	"github.com/berthvm/berth/guest"
)

// Directory trees in and out of /workspace travel as tar streams in data
// frames. Unpacking is durable like write: every file is written to a
// temporary name, fsynced and renamed into place, every directory touched
// is fsynced, and the reply comes only then; an interrupted unpack leaves
// no partial file under a final name. Symlinks are kept as symlinks and
// must point inside the tree being copied.

// maxTreeEntries bounds one tree copy.
const maxTreeEntries = 1 << 20

// frameReader reads a stream's data frames as bytes, until FrameEnd.
type frameReader struct {
	s   *stream
	buf []byte
	end bool
}

func (r *frameReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.end {
			return 0, io.EOF
		}
		t, data, err := r.s.fr.Next()
		if err != nil {
			return 0, fmt.Errorf("copy interrupted: %w", err)
		}
		switch t {
		case guest.FrameData:
			r.buf = data
		case guest.FrameEnd:
			r.end = true
		default:
			return 0, &guest.Error{Code: guest.CodeBadRequest, Op: guest.OpUnpack, Message: "unexpected frame in a tree upload"}
		}
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// frameWriter sends bytes as data frames of at most DataChunk.
type frameWriter struct {
	s   *stream
	buf []byte
}

func (w *frameWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		room := guest.DataChunk - len(w.buf)
		k := min(room, len(p))
		w.buf = append(w.buf, p[:k]...)
		p = p[k:]
		if len(w.buf) == guest.DataChunk {
			if err := w.Flush(); err != nil {
				return 0, err
			}
		}
	}
	return n, nil
}

func (w *frameWriter) Flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	err := w.s.send(guest.FrameData, w.buf)
	w.buf = w.buf[:0]
	return err
}

// treePath checks a tar entry's name: relative, clean, inside the tree.
func treePath(name string) (string, error) {
	if strings.ContainsRune(name, 0) || path.IsAbs(name) {
		return "", fmt.Errorf("%q: %w", name, guest.ErrEscape)
	}
	c := path.Clean(name)
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("%q: %w", name, guest.ErrEscape)
	}
	return c, nil
}

// linkInside reports whether a symlink at entry (relative to the tree's
// root) pointing at target stays inside the tree.
func linkInside(entry, target string) bool {
	if target == "" || path.IsAbs(target) || strings.ContainsRune(target, 0) {
		return false
	}
	c := path.Clean(path.Join(path.Dir(entry), target))
	return c != ".." && !strings.HasPrefix(c, "../")
}

func (a *Agent) unpack(s *stream, p string) (guest.TreeResult, error) {
	root, dest, err := a.open(p)
	if err != nil {
		return guest.TreeResult{}, err
	}
	if err := root.MkdirAll(dest, 0o755); err != nil {
		return guest.TreeResult{}, escapeErr(err)
	}
	var res guest.TreeResult
	dirs := map[string]bool{parent(dest): true, dest: true}
	type stamp struct {
		name  string
		mode  fs.FileMode
		mtime time.Time
	}
	var dirStamps []stamp
	var rnd [6]byte
	rand.Read(rnd[:])
	suffix := ".berth-" + hex.EncodeToString(rnd[:])
	tr := tar.NewReader(&frameReader{s: s})
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return res, fmt.Errorf("unpack into %s: %w", p, err)
		}
		if res.Entries++; res.Entries > maxTreeEntries {
			return res, fmt.Errorf("unpack into %s: more than %d entries", p, maxTreeEntries)
		}
		rel, err := treePath(h.Name)
		if err != nil {
			return res, err
		}
		target := path.Join(dest, rel)
		mode := fs.FileMode(h.Mode).Perm() | fs.FileMode(h.Mode)&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(target, 0o755); err != nil {
				return res, escapeErr(err)
			}
			dirs[target], dirs[parent(target)] = true, true
			dirStamps = append(dirStamps, stamp{target, fs.FileMode(h.Mode).Perm(), h.ModTime})
			res.Dirs++
		case tar.TypeReg:
			if err := root.MkdirAll(parent(target), 0o755); err != nil {
				return res, escapeErr(err)
			}
			if err := writeFileDurable(root, target, suffix, tr, h.Size, mode, h.ModTime); err != nil {
				return res, err
			}
			dirs[parent(target)] = true
			res.Files++
			res.Bytes += h.Size
		case tar.TypeSymlink:
			if !linkInside(rel, h.Linkname) {
				return res, fmt.Errorf("refusing symlink %s → %s: it points out of the tree being copied: %w", rel, h.Linkname, guest.ErrEscape)
			}
			if err := root.MkdirAll(parent(target), 0o755); err != nil {
				return res, escapeErr(err)
			}
			tmp := target + suffix
			if err := root.Symlink(h.Linkname, tmp); err != nil {
				return res, escapeErr(err)
			}
			if err := root.Rename(tmp, target); err != nil {
				root.Remove(tmp)
				return res, escapeErr(err)
			}
			dirs[parent(target)] = true
			res.Symlinks++
		default:
			return res, fmt.Errorf("unpack %s: only files, directories and symlinks are copied (type %q): %w", rel, h.Typeflag, syscall.EINVAL)
		}
	}
	// Directories last: their modes may forbid writing into them, and
	// writing into them changed their mtimes.
	sort.Slice(dirStamps, func(i, j int) bool { return len(dirStamps[i].name) > len(dirStamps[j].name) })
	for _, d := range dirStamps {
		root.Chmod(d.name, d.mode)
		root.Chtimes(d.name, d.mtime, d.mtime)
	}
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
	return res, nil
}

// writeFileDurable writes size bytes from r to name through a temporary
// file in the same directory: fsynced, given its mode and mtime, renamed.
func writeFileDurable(root *os.Root, name, suffix string, r io.Reader, size int64, mode fs.FileMode, mtime time.Time) error {
	if fi, err := root.Lstat(name); err == nil && fi.IsDir() {
		return &fs.PathError{Op: "unpack", Path: name, Err: errIsDir}
	}
	tmp := name + suffix
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return escapeErr(err)
	}
	ok := false
	defer func() {
		if !ok {
			f.Close()
			root.Remove(tmp)
		}
	}()
	if _, err := io.CopyN(f, r, size); err != nil {
		return fmt.Errorf("unpack %s: %w", name, err)
	}
	if err := f.Chmod(mode); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := root.Chtimes(tmp, mtime, mtime); err != nil {
		return err
	}
	if err := root.Rename(tmp, name); err != nil {
		return escapeErr(err)
	}
	ok = true
	return nil
}

// pack streams the tree at p as a tar. Symlinks are sent as symlinks and
// never followed; one pointing out of the tree stops the copy.
func (a *Agent) pack(s *stream, p string) error {
	root, src, err := a.open(p)
	if err != nil {
		return err
	}
	fi, err := root.Lstat(src)
	if err != nil {
		return escapeErr(err)
	}
	fw := &frameWriter{s: s, buf: make([]byte, 0, guest.DataChunk)}
	tw := tar.NewWriter(fw)
	var res guest.TreeResult
	var walk func(rel string, fi fs.FileInfo) error
	walk = func(rel string, fi fs.FileInfo) error {
		if res.Entries++; res.Entries > maxTreeEntries {
			return fmt.Errorf("pack %s: more than %d entries", p, maxTreeEntries)
		}
		full := path.Join(src, rel)
		name := rel
		switch {
		case rel == "." && !fi.IsDir():
			name = path.Base(src) // one file: the archive holds it by its name
		case fi.IsDir() && name != ".":
			name += "/"
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := root.Readlink(full)
			if err != nil {
				return escapeErr(err)
			}
			if !linkInside(rel, target) {
				return fmt.Errorf("refusing symlink %s → %s: it points out of the tree being copied: %w", path.Join(p, rel), target, guest.ErrEscape)
			}
			res.Symlinks++
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: int64(fi.Mode().Perm()), ModTime: fi.ModTime()})
		case fi.IsDir():
			if rel != "." {
				res.Dirs++
				if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: int64(fi.Mode().Perm()), ModTime: fi.ModTime()}); err != nil {
					return err
				}
			}
			d, err := root.Open(full)
			if err != nil {
				return escapeErr(err)
			}
			ents, err := d.ReadDir(-1)
			d.Close()
			if err != nil {
				return err
			}
			sort.Slice(ents, func(i, j int) bool { return ents[i].Name() < ents[j].Name() })
			for _, e := range ents {
				efi, err := e.Info()
				if err != nil {
					continue // removed meanwhile
				}
				if err := walk(path.Join(rel, e.Name()), efi); err != nil {
					return err
				}
			}
			return nil
		case fi.Mode().IsRegular():
			f, err := root.Open(full)
			if err != nil {
				return escapeErr(err)
			}
			defer f.Close()
			hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Size: fi.Size(), Mode: int64(fi.Mode().Perm() | fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)), ModTime: fi.ModTime()}
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			if _, err := io.CopyN(tw, f, fi.Size()); err != nil {
				return fmt.Errorf("pack %s: %w (changed while copying?)", full, err)
			}
			res.Files++
			res.Bytes += fi.Size()
			return nil
		}
		res.Skipped++ // sockets, fifos, devices: not files anyone copies
		return nil
	}
	if err := walk(".", fi); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return nil
	}
	if err := fw.Flush(); err != nil {
		return nil
	}
	if err := s.send(guest.FrameEnd, nil); err != nil {
		return nil
	}
	s.sendJSON(guest.FrameResult, res)
	return nil
}

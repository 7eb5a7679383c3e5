package sessiontest

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/berthvm/berth/session"
)

// Tree copies, as the guest agent makes them: entries are applied in the
// order the tar holds them, each file whole (a file cut short is never
// put in place); the first refused entry ends the copy. Into a directory
// that did not exist, a failed copy leaves nothing under its name (the
// agent builds it under a temporary one); into an existing one, what came
// before the refused entry stays. Entries must stay inside the tree being
// copied, and so must symlinks' targets. Directories get their modes and
// mtimes last.

// treeEntry is one checked tar entry.
type treeEntry struct {
	rel   string // relative to the destination, clean; "." is the destination
	typ   byte   // tar.TypeDir, tar.TypeReg or tar.TypeSymlink
	mode  fs.FileMode
	mtime time.Time
	data  []byte
	link  string
}

// modeBits are the mode bits a copy keeps.
const modeBits = fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky

// tarMode is m as a tar header's (Unix) mode.
func tarMode(m fs.FileMode) int64 {
	u := int64(m.Perm())
	if m&fs.ModeSetuid != 0 {
		u |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		u |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		u |= 0o1000
	}
	return u
}

// treePath checks a tar entry's name: relative and inside the tree.
func treePath(name string) (string, error) {
	if strings.ContainsRune(name, 0) || path.IsAbs(name) {
		return "", fmt.Errorf("refusing tar entry %q: it escapes the tree being copied: %w", name, session.ErrInvalid)
	}
	c := path.Clean(name)
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("refusing tar entry %q: it escapes the tree being copied: %w", name, session.ErrInvalid)
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

// readTree reads and checks tar entries until the end or the first
// refused or broken one; it returns the entries before that and the
// error.
func readTree(r io.Reader, dest string) ([]treeEntry, error) {
	tr := tar.NewReader(r)
	var out []treeEntry
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, fmt.Errorf("copy into %s: reading the tar: %w", displayPath(dest), err)
		}
		rel, err := treePath(h.Name)
		if err != nil {
			return out, err
		}
		e := treeEntry{rel: rel, typ: h.Typeflag, mtime: h.ModTime, mode: h.FileInfo().Mode() & modeBits}
		switch h.Typeflag {
		case tar.TypeDir:
			e.mode = fs.ModeDir | e.mode.Perm()
		case tar.TypeReg:
			var buf bytes.Buffer
			if _, err := io.CopyN(&buf, tr, h.Size); err != nil {
				return out, fmt.Errorf("copy into %s: reading %s: %w", displayPath(dest), rel, err)
			}
			e.data = buf.Bytes()
		case tar.TypeSymlink:
			if !linkInside(rel, h.Linkname) {
				return out, fmt.Errorf("refusing symlink %s → %s: it points out of the tree being copied: %w", rel, h.Linkname, session.ErrInvalid)
			}
			e.mode, e.link = fs.ModeSymlink|0o777, h.Linkname
		default:
			return out, fmt.Errorf("copy %s: only files, directories and symlinks are copied (tar type %q): %w", rel, h.Typeflag, session.ErrInvalid)
		}
		out = append(out, e)
	}
}

// CopyIn writes the tar r into the directory dir (created if missing).
// Entries are read first, then applied in order under the lock; a refused
// entry or a broken tar ends the copy after the entries before it.
func (f *Fake) CopyIn(ctx context.Context, name, dir string, r io.Reader) (session.CopyResult, error) {
	start := f.now()
	var dest string
	check := func(*fakeSession) error {
		rel, err := cleanPath(dir)
		dest = rel
		return err
	}
	if err := f.files(ctx, "CopyIn", name, check); err != nil {
		return session.CopyResult{}, err
	}
	entries, rerr := readTree(ctxReader{ctx, r}, dest)
	var res session.CopyResult
	err := f.onUsable(ctx, name, func(s *fakeSession) error {
		top := s.firstMissing(dest)
		err := s.unpack(dest, entries, f.now(), &res)
		if (err != nil || rerr != nil) && top != "" {
			if d, base, _, perr := s.parent(top); perr == nil {
				delete(d.children, base)
			}
		}
		s.updateUsed()
		if err == nil && rerr == nil {
			f.publishLocked(ctx, s, session.Event{Kind: session.EventNote, Message: fmt.Sprintf("copied in %d files, %d directories, %d symlinks (%s) to %s",
				res.Files, res.Dirs, res.Symlinks, session.FormatBytes(res.Bytes), dir)})
		}
		return err
	})
	res.Took = f.now().Sub(start)
	if err == nil {
		err = rerr
	}
	return res, err
}

// firstMissing returns the first directory on the way to dest (dest
// included) that does not exist, or "" when dest exists.
func (s *fakeSession) firstMissing(dest string) string {
	p := ""
	for _, part := range splitPath(dest) {
		p = path.Join(p, part)
		if _, _, err := s.resolve(p, true); errors.Is(err, session.ErrNotFound) {
			if _, _, lerr := s.resolve(p, false); lerr == nil {
				return "" // a dangling symlink: mkdirs says what is wrong
			}
			return p
		}
	}
	return ""
}

// unpack applies entries under dest.
func (s *fakeSession) unpack(dest string, entries []treeEntry, now time.Time, res *session.CopyResult) error {
	if _, err := s.mkdirs(dest, now); err != nil {
		return err
	}
	type stamp struct {
		n     *node
		depth int
		mode  fs.FileMode
		mtime time.Time
	}
	var stamps []stamp
	for _, e := range entries {
		target := path.Join(dest, e.rel)
		if e.typ == tar.TypeDir {
			d, err := s.mkdirs(target, now)
			if err != nil {
				return err
			}
			stamps = append(stamps, stamp{d, strings.Count(target, "/"), e.mode, e.mtime})
			res.Dirs++
			continue
		}
		dir, base := path.Split(target)
		if base == "" {
			return fmt.Errorf("copy %s: /workspace itself cannot be replaced: %w", e.rel, session.ErrInvalid)
		}
		d, err := s.mkdirs(dir, now)
		if err != nil {
			return err
		}
		var old int64
		if c, ok := d.children[base]; ok {
			if c.dir {
				return fmt.Errorf("copy %s: %s is a directory: %w", e.rel, displayPath(target), session.ErrInvalid)
			}
			old = int64(len(c.data))
		}
		if e.typ == tar.TypeReg {
			if s.info.WorkspaceUsed-old+int64(len(e.data)) > s.info.DiskBytes {
				return &session.Error{Class: session.ErrConflict, Code: "ENOSPC", Msg: fmt.Sprintf("workspace of %q is full", s.info.Name), Hint: "free space in it, or create a session with a larger disk"}
			}
			d.children[base] = &node{data: e.data, mode: e.mode, mtime: e.mtime}
			s.info.WorkspaceUsed += int64(len(e.data)) - old
			res.Files++
			res.Bytes += int64(len(e.data))
		} else {
			d.children[base] = &node{link: e.link, mode: e.mode, mtime: e.mtime}
			s.info.WorkspaceUsed -= old
			res.Symlinks++
		}
		d.mtime = now
	}
	// Deepest first, as the agent does: a parent's stamp is the last word.
	sort.SliceStable(stamps, func(i, j int) bool { return stamps[i].depth > stamps[j].depth })
	for _, st := range stamps {
		st.n.mode, st.n.mtime = st.mode, st.mtime
	}
	return nil
}

// mkdirs makes the directory rel and its missing parents, following
// symlinks on the way, and returns it.
func (s *fakeSession) mkdirs(rel string, now time.Time) (*node, error) {
	rel = strings.TrimSuffix(path.Clean("/"+rel), "/")
	rel = strings.TrimPrefix(rel, "/")
	n, real := s.root, ""
	for _, part := range splitPath(rel) {
		next := path.Join(real, part)
		c, resolved, err := s.resolve(next, true)
		switch {
		case errors.Is(err, session.ErrNotFound):
			if _, ok := n.children[part]; ok {
				return nil, fmt.Errorf("mkdir %s: %s is a dangling symlink: %w", displayPath(rel), displayPath(next), session.ErrExists)
			}
			c, resolved = newDir(now), next
			n.children[part] = c
			n.mtime = now
		case err != nil:
			return nil, err
		case !c.dir:
			return nil, fmt.Errorf("mkdir %s: %s is not a directory: %w", displayPath(rel), displayPath(next), session.ErrInvalid)
		}
		n, real = c, resolved
	}
	return n, nil
}

// CopyOut returns a snapshot of the file or tree at p as a tar. A symlink
// pointing out of the tree ends the tar with an error: from CopyOut when
// nothing came before it, else from Read after the entries before it.
func (f *Fake) CopyOut(ctx context.Context, name, p string) (io.ReadCloser, error) {
	var buf bytes.Buffer
	var packErr error
	err := f.files(ctx, "CopyOut", name, func(s *fakeSession) error {
		n, rel, err := s.lookup(p)
		if err != nil {
			return err
		}
		packErr = pack(&buf, displayPath(rel), n)
		if packErr != nil && buf.Len() == 0 {
			return packErr
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return io.NopCloser(io.MultiReader(bytes.NewReader(buf.Bytes()), errReader{packErr})), nil
}

// errReader reads as its error, or as the end when there is none.
type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	return 0, io.EOF
}

// pack writes the tree at top (named full) as the agent does: a
// directory's entries relative to it, sorted, directories with a
// trailing slash; one file or symlink under its own name.
func pack(w io.Writer, full string, top *node) error {
	tw := tar.NewWriter(w)
	var walk func(rel string, n *node) error
	walk = func(rel string, n *node) error {
		name := rel
		switch {
		case rel == "." && !n.dir:
			name = path.Base(full)
		case n.dir && rel != ".":
			name += "/"
		}
		switch {
		case n.isLink():
			if !linkInside(rel, n.link) {
				return fmt.Errorf("refusing symlink %s → %s: it points out of the tree being copied: %w", path.Join(full, rel), n.link, session.ErrInvalid)
			}
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: n.link, Mode: int64(n.mode.Perm()), ModTime: n.mtime})
		case n.dir:
			if rel != "." {
				if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: int64(n.mode.Perm()), ModTime: n.mtime}); err != nil {
					return err
				}
			}
			names := make([]string, 0, len(n.children))
			for c := range n.children {
				names = append(names, c)
			}
			sort.Strings(names)
			for _, c := range names {
				if err := walk(path.Join(rel, c), n.children[c]); err != nil {
					return err
				}
			}
			return nil
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Size: int64(len(n.data)), Mode: tarMode(n.mode), ModTime: n.mtime}); err != nil {
			return err
		}
		_, err := tw.Write(n.data)
		return err
	}
	if err := walk(".", top); err != nil {
		return err
	}
	return tw.Close()
}

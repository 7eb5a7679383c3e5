package agent

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/guest/tree"
)

// rel turns a host-supplied path into one relative to the workspace root.
// os.Root then refuses ".." and symlinks that lead out of it.
func rel(p string) (string, error) {
	switch {
	case strings.ContainsRune(p, 0):
		return "", fmt.Errorf("%q: %w", p, guest.ErrEscape)
	case p == "" || p == "/workspace" || p == "/workspace/":
		return ".", nil
	case strings.HasPrefix(p, "/workspace/"):
		p = strings.TrimPrefix(p, "/workspace/")
	case path.IsAbs(p):
		return "", fmt.Errorf("%q is outside /workspace: %w", p, guest.ErrEscape)
	}
	c := path.Clean(p)
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("%q: %w", p, guest.ErrEscape)
	}
	return c, nil
}

// open resolves p against the workspace.
func (a *Agent) open(p string) (*os.Root, string, error) {
	root, err := a.workspace()
	if err != nil {
		return nil, "", err
	}
	r, err := rel(p)
	if err != nil {
		return nil, "", err
	}
	return root, r, nil
}

// escapeErr turns os.Root's escape refusal into berth's error class.
func escapeErr(err error) error {
	if err != nil && strings.Contains(err.Error(), "path escapes from parent") {
		return fmt.Errorf("%w: %v", guest.ErrEscape, err)
	}
	return err
}

func info(name string, fi fs.FileInfo, link string) guest.FileInfo {
	return guest.FileInfo{Name: name, Size: fi.Size(), Mode: uint32(fi.Mode()), ModTime: fi.ModTime(), Link: link}
}

func (a *Agent) stat(p string) (guest.FileInfo, error) {
	root, r, err := a.open(p)
	if err != nil {
		return guest.FileInfo{}, err
	}
	fi, err := root.Lstat(r)
	if err != nil {
		return guest.FileInfo{}, escapeErr(err)
	}
	var link string
	if fi.Mode()&fs.ModeSymlink != 0 {
		link, _ = root.Readlink(r)
	}
	return info(path.Base(r), fi, link), nil
}

// listBatch bounds a list frame: directories can hold millions of entries.
const listBatch = 512

func (a *Agent) list(s *stream, p string) error {
	root, r, err := a.open(p)
	if err != nil {
		return err
	}
	d, err := root.Open(r)
	if err != nil {
		return escapeErr(err)
	}
	defer d.Close()
	fi, err := d.Stat()
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return &fs.PathError{Op: "list", Path: p, Err: errNotDir}
	}
	for {
		ents, err := d.ReadDir(listBatch)
		batch := make([]guest.FileInfo, 0, len(ents))
		for _, ent := range ents {
			fi, ierr := ent.Info()
			if ierr != nil {
				continue // removed while listing
			}
			var link string
			if fi.Mode()&fs.ModeSymlink != 0 {
				link, _ = root.Readlink(path.Join(r, ent.Name()))
			}
			batch = append(batch, info(ent.Name(), fi, link))
		}
		if len(batch) > 0 {
			if serr := s.sendJSON(guest.FrameData, batch); serr != nil {
				return nil
			}
		}
		if err == io.EOF || len(ents) == 0 {
			break
		}
		if err != nil {
			return err
		}
	}
	s.send(guest.FrameEnd, nil)
	return nil
}

func (a *Agent) read(s *stream, p string) error {
	root, r, err := a.open(p)
	if err != nil {
		return err
	}
	f, err := root.Open(r)
	if err != nil {
		return escapeErr(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return &fs.PathError{Op: "read", Path: p, Err: errIsDir}
	}
	// The header goes in front of the bytes: one multiplexer frame each.
	buf := make([]byte, guest.FrameHeader+guest.DataChunk)
	for {
		n, err := f.Read(buf[guest.FrameHeader:])
		if n > 0 {
			if s.sendBuf(guest.FrameData, buf[:guest.FrameHeader+n]) != nil {
				return nil
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	s.send(guest.FrameEnd, nil)
	return nil
}

// write replaces p with the bytes the host streams, atomically and durably:
// a temporary file in the same directory, fsync, rename over the target,
// fsync of the directory. The reply is sent only after all of that, so a
// success means the bytes survive a crash of the VM. On any failure (full
// disk, host gone mid-upload) the temporary file is removed and the target
// keeps its old content.
//
// A new file is owner's (nil: root's); a file it replaces keeps its owner.
func (a *Agent) write(s *stream, p string, mode uint32, owner *tree.Owner) (guest.WriteResult, error) {
	root, r, err := a.open(p)
	if err != nil {
		return guest.WriteResult{}, err
	}
	if r == "." {
		return guest.WriteResult{}, &fs.PathError{Op: "write", Path: p, Err: errIsDir}
	}
	perm := fs.FileMode(mode).Perm()
	old, err := root.Stat(r)
	if err == nil {
		if old.IsDir() {
			return guest.WriteResult{}, &fs.PathError{Op: "write", Path: p, Err: errIsDir}
		}
		if mode == 0 {
			perm = old.Mode().Perm()
		}
	} else if err = escapeErr(err); errors.Is(err, guest.ErrEscape) {
		return guest.WriteResult{}, err
	} else {
		old = nil
	}
	if perm == 0 {
		perm = 0o644
	}
	dir, base := path.Split(r)
	if dir == "" {
		dir = "."
	}
	var rnd [6]byte
	rand.Read(rnd[:])
	tmp := path.Join(dir, "."+base+".berth-"+hex.EncodeToString(rnd[:]))
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return guest.WriteResult{}, escapeErr(err)
	}
	ok := false
	defer func() {
		if !ok {
			f.Close()
			root.Remove(tmp)
		}
	}()
	if err := tree.Own(f, old, owner); err != nil {
		return guest.WriteResult{}, err
	}
	var size int64
	for {
		t, data, err := s.fr.Next()
		if err != nil {
			return guest.WriteResult{}, fmt.Errorf("upload interrupted after %d bytes: %w", size, err)
		}
		if t == guest.FrameEnd {
			break
		}
		if t != guest.FrameData {
			return guest.WriteResult{}, &guest.Error{Code: guest.CodeBadRequest, Op: "write", Message: "unexpected frame in upload"}
		}
		if _, err := f.Write(data); err != nil {
			return guest.WriteResult{}, err
		}
		size += int64(len(data))
	}
	if err := f.Sync(); err != nil {
		return guest.WriteResult{}, err
	}
	if err := f.Close(); err != nil {
		return guest.WriteResult{}, err
	}
	if err := root.Rename(tmp, r); err != nil {
		return guest.WriteResult{}, escapeErr(err)
	}
	ok = true
	if err := syncDir(root, dir); err != nil {
		return guest.WriteResult{}, err
	}
	return guest.WriteResult{Size: size}, nil
}

func syncDir(root *os.Root, dir string) error {
	d, err := root.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func parent(r string) string {
	d := path.Dir(r)
	if d == "" {
		return "."
	}
	return d
}

// mkdir makes p (with its missing parents with all); what it makes is
// owner's (nil: root's), and durable when it returns.
func (a *Agent) mkdir(p string, all bool, owner *tree.Owner) error {
	root, r, err := a.open(p)
	if err != nil {
		return err
	}
	var made []string
	if all {
		made, err = tree.MkdirAll(root, r, owner)
	} else if err = root.Mkdir(r, 0o755); err == nil {
		made = []string{r}
		if owner != nil {
			err = root.Lchown(r, owner.UID, owner.GID)
		}
	}
	if err != nil {
		return escapeErr(err)
	}
	// Each new directory's entry, in its parent: outermost first, so an
	// entry is never durable before the directory holding it.
	for _, d := range made {
		if err := syncDir(root, parent(d)); err != nil {
			return err
		}
	}
	if len(made) == 0 {
		return syncDir(root, parent(r))
	}
	return nil
}

func (a *Agent) remove(p string, all bool) error {
	root, r, err := a.open(p)
	if err != nil {
		return err
	}
	if r == "." {
		return &fs.PathError{Op: "remove", Path: p, Err: errBusy}
	}
	if all {
		// RemoveAll succeeds on a missing path; a caller removing
		// something that is not there should hear so.
		if _, err := root.Lstat(r); err != nil {
			return escapeErr(err)
		}
		err = root.RemoveAll(r)
	} else {
		err = root.Remove(r)
	}
	if err != nil {
		return escapeErr(err)
	}
	return syncDir(root, parent(r))
}

func (a *Agent) rename(from, to string) error {
	root, rf, err := a.open(from)
	if err != nil {
		return err
	}
	_, rt, err := a.open(to)
	if err != nil {
		return err
	}
	if rf == "." || rt == "." {
		return &fs.PathError{Op: "rename", Path: from, Err: errBusy}
	}
	if err := root.Rename(rf, rt); err != nil {
		return escapeErr(err)
	}
	if err := syncDir(root, parent(rt)); err != nil {
		return err
	}
	return syncDir(root, parent(rf))
}

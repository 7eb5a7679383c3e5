package oci

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// indexFile is where a berth layer made from an image keeps the list of
// what it holds: beside upper/ at the layer's root, outside the guest's
// tree. An import that finds the layer cached replays it into its view
// instead of reading the layer's tar again, so a layer is self-describing
// wherever it is copied.
const indexFile = "berth-oci-index.jsonl.gz"

// indexEntry is one path of a layer, in overlayfs's form.
type indexEntry struct {
	Path   string            `json:"p"` // slash-separated, "" for the root
	Kind   string            `json:"k"` // d f l c b p w
	Mode   uint32            `json:"m,omitempty"`
	UID    int               `json:"u,omitempty"`
	GID    int               `json:"g,omitempty"`
	Size   int64             `json:"s,omitempty"`
	Link   string            `json:"l,omitempty"`
	Opaque bool              `json:"o,omitempty"`
	Xattr  map[string]string `json:"x,omitempty"` // directories'
}

// writeIndex lists the stage's tree (parents before children) into file.
func writeIndex(upper, file string) (entries int, err error) {
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	zw := gzip.NewWriter(f)
	bw := bufio.NewWriter(zw)
	enc := json.NewEncoder(bw)
	err = filepath.WalkDir(upper, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(upper, p)
		if rel == "." {
			rel = ""
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		e := indexEntry{Path: filepath.ToSlash(rel), Mode: st.Mode & 0o7777, UID: int(st.Uid), GID: int(st.Gid)}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			e.Kind = "d"
			x, err := listXattrs(p)
			if err != nil {
				return err
			}
			if x[opaqueXattr] == "y" {
				e.Opaque = true
			}
			delete(x, opaqueXattr)
			if len(x) > 0 {
				e.Xattr = x
			}
		case unix.S_IFREG:
			e.Kind, e.Size = "f", st.Size
		case unix.S_IFLNK:
			e.Kind = "l"
			if e.Link, err = os.Readlink(p); err != nil {
				return err
			}
		case unix.S_IFCHR:
			e.Kind = "c"
			if st.Rdev == 0 {
				e.Kind, e.Mode = "w", 0
			}
		case unix.S_IFBLK:
			e.Kind = "b"
		case unix.S_IFIFO:
			e.Kind = "p"
		default:
			return fmt.Errorf("%s: unexpected file type %o", p, st.Mode&unix.S_IFMT)
		}
		entries++
		return enc.Encode(e)
	})
	if err == nil {
		err = bw.Flush()
	}
	if err == nil {
		err = zw.Close()
	}
	if err == nil {
		err = f.Close()
	}
	return entries, err
}

// listXattrs reads a path's extended attributes, not following it.
func listXattrs(p string) (map[string]string, error) {
	buf := make([]byte, 64<<10)
	n, err := unix.Llistxattr(p, buf)
	if errors.Is(err, unix.ENOTSUP) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	val := make([]byte, maxXattrSize)
	for _, name := range strings.Split(strings.TrimRight(string(buf[:n]), "\x00"), "\x00") {
		if name == "" {
			continue
		}
		k, err := unix.Lgetxattr(p, name, val)
		if err != nil {
			return nil, fmt.Errorf("%s: read %s: %w", p, name, err)
		}
		out[name] = string(val[:k])
	}
	return out, nil
}

// maxIndexLine bounds one line of an index read back.
const maxIndexLine = 1 << 20

// replayIndex merges a layer's index into the view, as overlayfs stacks
// the layer on those below: whiteouts remove, an opaque directory
// replaces, a directory over a directory merges.
func replayIndex(r io.Reader, v *view, group int) error {
	zr, err := gzip.NewReader(r)
	if err != nil {
		return fmt.Errorf("layer index: %w", err)
	}
	sc := bufio.NewScanner(zr)
	sc.Buffer(make([]byte, 64<<10), maxIndexLine)
	for sc.Scan() {
		var e indexEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return fmt.Errorf("layer index: %w", err)
		}
		parts, err := splitPath(e.Path)
		if err != nil {
			return fmt.Errorf("layer index: %w", err)
		}
		if e.Kind == "w" {
			v.remove(parts)
			continue
		}
		if len(e.Kind) != 1 || !strings.Contains("dflcbp", e.Kind) {
			return fmt.Errorf("layer index: %q has kind %q", e.Path, e.Kind)
		}
		n := &node{kind: e.Kind[0], mode: e.Mode, uid: e.UID, gid: e.GID, size: e.Size, link: e.Link, group: group}
		for k, val := range e.Xattr {
			n.xattr = append(n.xattr, xattr{k, val})
		}
		if e.Opaque && len(parts) > 0 {
			v.remove(parts)
		}
		if v.parent(parts) == nil && len(parts) > 0 {
			return fmt.Errorf("layer index: %q comes before its directory", e.Path)
		}
		if err := v.set(parts, n); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("layer index: %w", err)
	}
	return nil
}

package oci

import (
	"archive/tar"
	"fmt"
	"sort"
	"strings"
)

// Bounds on a layer's entries.
const (
	maxPath      = 4096 // PATH_MAX
	maxName      = 255  // NAME_MAX
	maxXattrs    = 128  // per entry
	maxXattrSize = 64 << 10
)

// whiteout prefixes (OCI image-spec, layer.md).
const (
	whPrefix = ".wh."
	whOpaque = ".wh..wh..opq"
)

// op is what a layer's entry does.
type op int

const (
	opSkip     op = iota // nothing (a pax global header, aufs metadata)
	opWrite              // makes or replaces parts
	opWhiteout           // removes parts from the layers below
	opOpaque             // hides everything below in the directory parts
)

// entry is a layer's tar header, checked: its path as components,
// never absolute, never with "..".
type entry struct {
	op    op
	parts []string // empty: the root
	hdr   *tar.Header
	link  []string // a hard link's target
	kind  byte     // kindDir…, for opWrite
	mode  uint32   // permission bits with setuid, setgid, sticky
	xattr []xattr  // sorted by name
}

type xattr struct {
	name  string
	value string
}

// Node kinds, as layers and their indexes record them.
const (
	kindDir      = 'd'
	kindFile     = 'f'
	kindSymlink  = 'l'
	kindChar     = 'c'
	kindBlock    = 'b'
	kindFifo     = 'p'
	kindWhiteout = 'w' // overlayfs's: a character device 0:0
	kindHardlink = 'h' // in entries only: becomes the kind it links to
)

// splitPath cleans a path from a layer: leading slashes and "." go (an
// absolute path is inside the root), ".." is refused outright (no tool
// writes one, and one leading out is an attack).
func splitPath(name string) ([]string, error) {
	if len(name) > maxPath {
		return nil, fmt.Errorf("path of %d bytes is over the limit of %d", len(name), maxPath)
	}
	if strings.ContainsRune(name, 0) {
		return nil, fmt.Errorf("path %q holds a NUL byte", clip(name))
	}
	var parts []string
	for _, p := range strings.Split(name, "/") {
		switch {
		case p == "" || p == ".":
		case p == "..":
			return nil, fmt.Errorf("path %q has a \"..\" component, which berth refuses", clip(name))
		case len(p) > maxName:
			return nil, fmt.Errorf("path %q has a component over %d bytes", clip(name), maxName)
		default:
			parts = append(parts, p)
		}
	}
	return parts, nil
}

// parseEntry checks one header of a layer and says what it does.
func parseEntry(h *tar.Header) (entry, error) {
	e := entry{hdr: h}
	if h.Typeflag == tar.TypeXGlobalHeader {
		return entry{op: opSkip}, nil
	}
	parts, err := splitPath(h.Name)
	if err != nil {
		return e, err
	}
	if n := len(parts); n > 0 && strings.HasPrefix(parts[n-1], whPrefix) {
		base := parts[n-1]
		switch {
		case base == whOpaque:
			e.op, e.parts = opOpaque, parts[:n-1]
		case strings.HasPrefix(base, whPrefix+whPrefix):
			// aufs's own files (.wh..wh.plnk…): not part of the tree.
			e.op = opSkip
		default:
			target := strings.TrimPrefix(base, whPrefix)
			if target == "" || target == "." || target == ".." {
				return e, fmt.Errorf("whiteout %q names no file in its directory", clip(h.Name))
			}
			e.op, e.parts = opWhiteout, append(parts[:n-1:n-1], target)
		}
		return e, nil
	}
	e.op, e.parts = opWrite, parts
	if h.Mode < 0 || h.Mode > 0o7777|0o170000 {
		return e, fmt.Errorf("%q has mode %o", clip(h.Name), h.Mode)
	}
	e.mode = uint32(h.Mode) & 0o7777
	if h.Uid < 0 || h.Gid < 0 || int64(h.Uid) >= 1<<32-1 || int64(h.Gid) >= 1<<32-1 {
		return e, fmt.Errorf("%q has owner %d:%d", clip(h.Name), h.Uid, h.Gid)
	}
	switch h.Typeflag {
	case tar.TypeReg, tar.TypeRegA, tar.TypeGNUSparse:
		e.kind = kindFile
	case tar.TypeDir:
		e.kind = kindDir
	case tar.TypeSymlink:
		e.kind = kindSymlink
		if h.Linkname == "" || len(h.Linkname) > maxPath || strings.ContainsRune(h.Linkname, 0) {
			return e, fmt.Errorf("symlink %q has a bad target", clip(h.Name))
		}
	case tar.TypeLink:
		e.kind = kindHardlink
		link, err := splitPath(h.Linkname)
		if err != nil {
			return e, fmt.Errorf("hard link %q: target %w", clip(h.Name), err)
		}
		if len(link) == 0 {
			return e, fmt.Errorf("hard link %q points at the root directory", clip(h.Name))
		}
		e.link = link
	case tar.TypeChar:
		e.kind = kindChar
	case tar.TypeBlock:
		e.kind = kindBlock
	case tar.TypeFifo:
		e.kind = kindFifo
	default:
		return e, fmt.Errorf("%q is a tar entry of type %q, which a layer cannot hold", clip(h.Name), h.Typeflag)
	}
	if len(parts) == 0 && e.kind != kindDir {
		return e, fmt.Errorf("entry %q would replace the root directory", clip(h.Name))
	}
	if e.kind == kindChar || e.kind == kindBlock {
		if h.Devmajor < 0 || h.Devminor < 0 || h.Devmajor > 1<<12-1 || h.Devminor > 1<<20-1 {
			return e, fmt.Errorf("device %q has number %d:%d", clip(h.Name), h.Devmajor, h.Devminor)
		}
	}
	for k, v := range h.PAXRecords {
		name, ok := strings.CutPrefix(k, "SCHILY.xattr.")
		if !ok {
			continue
		}
		if name == "" || len(name) > maxName || len(v) > maxXattrSize || strings.ContainsRune(name, 0) {
			return e, fmt.Errorf("%q has a bad extended attribute %q", clip(h.Name), clip(name))
		}
		e.xattr = append(e.xattr, xattr{name, v})
	}
	if len(e.xattr) > maxXattrs {
		return e, fmt.Errorf("%q has %d extended attributes, over the limit of %d", clip(h.Name), len(e.xattr), maxXattrs)
	}
	sort.Slice(e.xattr, func(i, j int) bool { return e.xattr[i].name < e.xattr[j].name })
	return e, nil
}

// overlayXattr reports an extended attribute overlayfs reads as its own
// (trusted.overlay.*, user.overlay.*): an image carrying one would steer
// how its layers stack, so it is dropped.
func overlayXattr(name string) bool {
	return strings.HasPrefix(name, "trusted.overlay.") || strings.HasPrefix(name, "user.overlay.")
}

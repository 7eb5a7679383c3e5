package oci

import (
	"fmt"
	"path"
	"sort"
	"strings"
)

// view is the image's tree as the layers applied so far make it, in
// memory: what every entry's path resolves through (a directory, or a
// symlink from a layer below), and what a directory a layer names only
// implicitly must look like. Each berth layer is an overlayfs layer
// holding only its own changes, so the layers below it are known here,
// never read from disk while applying.
type view struct {
	root  *node
	count int // nodes
	max   int
}

// node is one path of the view.
type node struct {
	kind     byte
	mode     uint32
	uid, gid int
	link     string // a symlink's target
	size     int64
	xattr    []xattr // directories'
	kids     map[string]*node
	group    int // the berth layer holding it (an index in the import's groups)
}

func newView(max int) *view {
	return &view{root: &node{kind: kindDir, mode: 0o755, kids: map[string]*node{}}, max: max}
}

// maxLinks bounds the symlinks followed resolving one path (Linux's
// MAXSYMLINKS).
const maxLinks = 40

// escapeError is a symlink that leads out of the image's root.
type escapeError struct{ path, link, target string }

func (e *escapeError) Error() string {
	return fmt.Sprintf("%q resolves through symlink %q (-> %q) to outside the image's root, which berth refuses", clip(e.path), clip(e.link), clip(e.target))
}

// resolve turns parts into the real path of directories it names,
// following symlinks in every component but the last unless followLast,
// as the guest's kernel would. A ".." above the root is refused rather
// than stopped at the root: it is always an escape attempt. Components
// that do not exist are kept as they are (they become directories).
func (v *view) resolve(parts []string, followLast bool) ([]string, error) {
	var real []string
	queue := append([]string(nil), parts...)
	links := 0
	var lastLink, lastTarget string
	cur := v.root // nil once a component is missing
	for len(queue) > 0 {
		c := queue[0]
		queue = queue[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(real) == 0 {
				return nil, &escapeError{strings.Join(parts, "/"), lastLink, lastTarget}
			}
			real = real[:len(real)-1]
			cur = v.lookup(real)
			continue
		}
		var n *node
		if cur != nil {
			n = cur.kids[c]
		}
		if n != nil && n.kind == kindSymlink && (len(queue) > 0 || followLast) {
			links++
			if links > maxLinks {
				return nil, fmt.Errorf("%q: too many levels of symlinks", clip(strings.Join(parts, "/")))
			}
			lastLink, lastTarget = path.Join(append(append([]string{"/"}, real...), c)...), n.link
			if strings.HasPrefix(n.link, "/") {
				real, cur = real[:0], v.root
			}
			queue = append(strings.Split(n.link, "/"), queue...)
			continue
		}
		if n != nil && n.kind != kindDir && len(queue) > 0 {
			return nil, fmt.Errorf("%q: %q is not a directory", clip(strings.Join(parts, "/")), clip(path.Join(append(real, c)...)))
		}
		real = append(real, c)
		cur = n
	}
	return real, nil
}

// resolveDir resolves a parent directory: a file there is refused.
func (v *view) resolveDir(parts []string) ([]string, error) {
	real, err := v.resolve(parts, true)
	if err != nil {
		return nil, err
	}
	if n := v.lookup(real); n != nil && n.kind != kindDir {
		return nil, fmt.Errorf("%q is not a directory", clip(path.Join(real...)))
	}
	return real, nil
}

// lookup returns the node at a real path, or nil.
func (v *view) lookup(real []string) *node {
	n := v.root
	for _, c := range real {
		if n == nil || n.kind != kindDir {
			return nil
		}
		n = n.kids[c]
	}
	return n
}

// parent returns the directory holding real, or nil.
func (v *view) parent(real []string) *node {
	if len(real) == 0 {
		return nil
	}
	p := v.lookup(real[:len(real)-1])
	if p == nil || p.kind != kindDir {
		return nil
	}
	return p
}

// set puts n at real, replacing what was there (a directory put over a
// directory keeps its children: it is the same directory with new
// attributes). The parents must exist.
func (v *view) set(real []string, n *node) error {
	if len(real) == 0 {
		n.kids = v.root.kids
		v.root = n
		return nil
	}
	p := v.parent(real)
	if p == nil {
		return fmt.Errorf("internal: no directory for %q", strings.Join(real, "/"))
	}
	name := real[len(real)-1]
	old := p.kids[name]
	if old != nil && old.kind == kindDir && n.kind == kindDir {
		n.kids = old.kids
	} else {
		if old != nil {
			v.count -= old.size1()
		}
		v.count++
		if n.kind == kindDir && n.kids == nil {
			n.kids = map[string]*node{}
		}
	}
	if v.max > 0 && v.count > v.max {
		return fmt.Errorf("the image has over %d files, the limit berth imports", v.max)
	}
	p.kids[name] = n
	return nil
}

// remove deletes real and what is under it.
func (v *view) remove(real []string) {
	p := v.parent(real)
	if p == nil {
		return
	}
	name := real[len(real)-1]
	if old := p.kids[name]; old != nil {
		v.count -= old.size1()
		delete(p.kids, name)
	}
}

// size1 counts a node and everything under it.
func (n *node) size1() int {
	c := 1
	for _, k := range n.kids {
		c += k.size1()
	}
	return c
}

// sortedKids lists a directory's children by name.
func (n *node) sortedKids() []string {
	names := make([]string, 0, len(n.kids))
	for k := range n.kids {
		names = append(names, k)
	}
	sort.Strings(names)
	return names
}

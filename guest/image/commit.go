package image

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Committing a session's system disk. The engine copies the disk (frozen,
// or with no VM on it) into the layer cache; SealCommit makes the copy a
// layer: repaired as a mount would replay it, what a new machine must not
// inherit removed, no journal, a UUID of its own, its free blocks given
// back to the host. Nothing is mounted: the copy is the guest's and
// untrusted, and is read and changed only through e2fsprogs.

// PathBytes is a path, or a kind of path for what was left out, and the
// files and bytes (apparent sizes, each inode once) under it.
type PathBytes struct {
	Path  string
	Files int
	Bytes int64
}

// CommitReport is what SealCommit found in a system disk.
type CommitReport struct {
	// Files are the files, symlinks and devices kept, Dirs the
	// directories; Bytes their sizes. Deleted counts whiteouts: paths of
	// the layers below that the session removed.
	Files, Dirs, Deleted int
	Bytes                int64
	// Top are the paths (three levels deep at most) with the most bytes,
	// most first; at most TopPaths.
	Top []PathBytes
	// LeftOut is what was removed, by kind, in leaveOut's order; kinds
	// with nothing are not listed.
	LeftOut []PathBytes
}

// TopPaths is how many paths a CommitReport's Top has at most.
const TopPaths = 5

// A leave is one kind of path a commit leaves out of the layer.
type leave struct {
	what string
	// match reports whether the node at path p (in the guest's root,
	// "/etc/machine-id") is of this kind. Directories are left out only
	// where whole says so, and only when all they hold is left out too.
	match func(p string, dir bool) bool
	whole bool
}

// leaveOut lists what a committed layer does not carry: what a fresh
// identity regenerates (the agent writes the machine id and hostname of
// each session as it mounts its disks; SSH host keys are made anew with
// ssh-keygen -A), scratch space, and caches apt rebuilds by itself
// (/var/cache/apt: its package cache and downloaded .debs). apt's lists
// (/var/lib/apt/lists) stay: apt install needs them until the next
// apt update.
var leaveOut = []leave{
	{what: "machine id", match: func(p string, dir bool) bool {
		return !dir && (p == "/etc/machine-id" || p == "/var/lib/dbus/machine-id")
	}},
	{what: "hostname", match: func(p string, dir bool) bool { return !dir && p == "/etc/hostname" }},
	{what: "SSH host keys", match: func(p string, dir bool) bool {
		return !dir && strings.HasPrefix(p, "/etc/ssh/ssh_host_") && !strings.Contains(p[len("/etc/ssh/"):], "/")
	}},
	{what: "/tmp and /var/tmp", whole: true, match: func(p string, dir bool) bool {
		return strings.HasPrefix(p, "/tmp/") || strings.HasPrefix(p, "/var/tmp/")
	}},
	{what: "apt's caches", match: func(p string, dir bool) bool {
		return !dir && strings.HasPrefix(p, "/var/cache/apt/")
	}},
}

// The system disk's layout: the overlay's upper directory is the guest's
// root; the rest (its work directory, lost+found) is not.
const (
	upperDir = "/upper"
	// outsideRoot is what a report calls the files beside upper/.
	outsideRoot = "files beside the root (overlay work files, fsck's lost+found)"
)

// SealCommit makes file, a copy of a session's system disk, a read-only
// layer with the filesystem UUID uuid: it is checked and repaired first
// (a crashed session's disk has a journal to replay), the paths of
// leaveOut and everything outside the root tree are removed, the journal
// is dropped (a read-only device cannot replay one), and free blocks are
// punched out of the file, so nothing left out stays in it.
func SealCommit(ctx context.Context, file, uuid string) (CommitReport, error) {
	return sealCommit(ctx, file, uuid, defaultWalkLimits)
}

func sealCommit(ctx context.Context, file, uuid string, lim walkLimits) (CommitReport, error) {
	if err := fsck(ctx, file, "check the system disk's copy"); err != nil {
		return CommitReport{}, err
	}
	t, err := walkExt4(ctx, file, lim)
	if err != nil {
		return CommitReport{}, fmt.Errorf("read the system disk's copy: %w", err)
	}
	p := planCommit(t)
	if p.upper < 0 {
		return CommitReport{}, errors.New("the system disk holds no root tree (upper/): has the session ever booted?")
	}
	if len(p.drop) > 0 {
		var cmds bytes.Buffer
		for _, ino := range p.drop {
			// links_count 0 too: e2fsck takes an inode with links for
			// one in use and would bring it back.
			fmt.Fprintf(&cmds, "sif <%d> links_count 0\nkill_file <%d>\n", ino, ino)
		}
		if err := runDebugfs(ctx, file, true, &cmds, discard); err != nil {
			return CommitReport{}, fmt.Errorf("remove what the layer leaves out: %w", err)
		}
	}
	if out, err := helper(ctx, "tune2fs", "-O", "^has_journal", "-U", uuid, "-L", "berth-layer", file); err != nil {
		return CommitReport{}, fmt.Errorf("seal the layer: tune2fs: %w: %s", err, lastLine(out))
	}
	// The directory entries of what was removed are dropped here; a
	// second, clean pass punches the free blocks out (e2fsck discards
	// only on a pass that fixed nothing).
	if err := fsck(ctx, file, "seal the layer"); err != nil {
		return CommitReport{}, err
	}
	if out, err := helper(ctx, "e2fsck", "-fy", "-E", "discard", file); err != nil {
		return CommitReport{}, fmt.Errorf("seal the layer: e2fsck -E discard: %w: %s", err, lastLine(out))
	}
	if err := checkFreed(ctx, file, p.drop); err != nil {
		return CommitReport{}, err
	}
	return p.report, nil
}

func discard(r *bufio.Reader) error {
	_, err := r.WriteTo(io.Discard)
	return err
}

// fsck checks and repairs file; exit 1 (errors corrected) is success.
func fsck(ctx context.Context, file, doing string) error {
	out, err := helper(ctx, "e2fsck", "-fy", file)
	if err == nil {
		return nil
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 1 {
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("%s: its filesystem has errors e2fsck could not repair (%v): %s", doing, err, lastLine(out))
}

// checkFreed makes sure every inode removed is free now: its blocks were
// discarded, so what was left out is not in the layer's file.
func checkFreed(ctx context.Context, file string, inos []uint32) error {
	if len(inos) == 0 {
		return nil
	}
	var cmds bytes.Buffer
	for _, ino := range inos {
		fmt.Fprintf(&cmds, "testi <%d>\n", ino)
	}
	var inUse int
	err := runDebugfs(ctx, file, false, &cmds, func(r *bufio.Reader) error {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "is marked in use") {
				inUse++
			}
		}
		return sc.Err()
	})
	if err != nil {
		return fmt.Errorf("check the layer: %w", err)
	}
	if inUse > 0 {
		return fmt.Errorf("seal the layer: %d of the %d paths left out are still in it", inUse, len(inos))
	}
	return nil
}

// commitPlan is what to remove from a system disk and what it reports.
type commitPlan struct {
	upper  int      // the node of upper/, or -1
	drop   []uint32 // inodes to remove, each once
	report CommitReport
}

// planCommit decides what of t a layer keeps. A file (any non-directory)
// is removed only when every link to it is to be; a directory only when
// a whole-tree kind matches it and all it holds goes too. Whiteouts in the
// root tree are always kept: they carry no data, and dropping one would
// bring back what the session deleted.
func planCommit(t *extTree) commitPlan {
	p := commitPlan{upper: -1}
	n := len(t.nodes)
	guest := make([]string, n) // path in the guest's root; "" outside it
	inRoot := make([]bool, n)
	kind := make([]int, n) // index in leaveOut+1; -1: outside the root; 0: kept
	for i := 1; i < n; i++ {
		nd := t.nodes[i]
		par := int(nd.parent)
		switch {
		case par == 0 && nd.name == "upper" && nd.isDir() && p.upper < 0:
			p.upper = i
			inRoot[i] = true
			continue
		case par == 0:
			// lost+found itself stays: e2fsck wants it.
			if !(nd.name == "lost+found" && nd.isDir()) {
				kind[i] = -1
			}
			continue
		case !inRoot[par]:
			kind[i] = -1
			continue
		}
		inRoot[i] = true
		guest[i] = guest[par] + "/" + nd.name
		if nd.isChar() {
			continue // a whiteout
		}
		for k, l := range leaveOut {
			if l.match(guest[i], nd.isDir()) && (!nd.isDir() || l.whole) {
				kind[i] = k + 1
				break
			}
		}
	}
	// Links: an inode goes only when all its names go. (A directory has
	// one name, but a crafted disk may give it more: it is kept then.)
	links := map[uint32]int{}
	going := map[uint32]int{}
	for i := 1; i < n; i++ {
		nd := t.nodes[i]
		links[nd.ino]++
		if kind[i] != 0 {
			going[nd.ino]++
		}
	}
	gone := func(i int) bool { ino := t.nodes[i].ino; return kind[i] != 0 && going[ino] == links[ino] }
	drop := make([]bool, n)
	for i := 1; i < n; i++ {
		if !t.nodes[i].isDir() && gone(i) {
			drop[i] = true
		}
	}
	// Directories, deepest first (children come after their parents in
	// a breadth-first walk): one goes when it may and all it holds goes.
	keepsSome := make([]bool, n)
	for i := n - 1; i >= 1; i-- {
		nd := t.nodes[i]
		if nd.isDir() && gone(i) && !keepsSome[i] && links[nd.ino] == 1 {
			drop[i] = true
		}
		if !drop[i] {
			keepsSome[nd.parent] = true
		}
	}
	// What is kept and what goes, each inode counted once.
	counted := map[uint32]bool{}
	left := make([]PathBytes, len(leaveOut)+1)
	top := map[string]*PathBytes{}
	for i := 1; i < n; i++ {
		nd := t.nodes[i]
		if drop[i] {
			if !counted[nd.ino] {
				counted[nd.ino] = true
				p.drop = append(p.drop, nd.ino)
				k := kind[i]
				if k < 0 {
					k = len(leaveOut)
				} else {
					k--
				}
				if !nd.isDir() {
					left[k].Files++
					left[k].Bytes += nd.size
				}
			}
			continue
		}
		if !inRoot[i] || i == p.upper {
			continue
		}
		switch {
		case nd.isDir():
			p.report.Dirs++
		case nd.isChar():
			p.report.Deleted++
		case !counted[nd.ino]:
			counted[nd.ino] = true
			p.report.Files++
			p.report.Bytes += nd.size
			g := topPath(guest[i])
			if top[g] == nil {
				top[g] = &PathBytes{Path: g}
			}
			top[g].Files++
			top[g].Bytes += nd.size
		}
	}
	for k := range left {
		if left[k].Files > 0 {
			left[k].Path = outsideRoot
			if k < len(leaveOut) {
				left[k].Path = leaveOut[k].what
			}
			p.report.LeftOut = append(p.report.LeftOut, left[k])
		}
	}
	for _, pb := range top {
		p.report.Top = append(p.report.Top, *pb)
	}
	sort.Slice(p.report.Top, func(a, b int) bool {
		x, y := p.report.Top[a], p.report.Top[b]
		if x.Bytes != y.Bytes {
			return x.Bytes > y.Bytes
		}
		return x.Path < y.Path
	})
	if len(p.report.Top) > TopPaths {
		p.report.Top = p.report.Top[:TopPaths]
	}
	for k := range p.report.Top {
		p.report.Top[k].Path = printablePath(p.report.Top[k].Path)
	}
	return p
}

// topPath is the directory a file's bytes are counted under in a report:
// its path's first three levels, or its directory when that is less deep
// ("/usr/lib/python3" for /usr/lib/python3/dist-packages/x.py, "/etc" for
// /etc/motd).
func topPath(p string) string {
	parts := strings.Split(strings.TrimPrefix(p, "/"), "/")
	keep := min(3, len(parts)-1)
	return "/" + strings.Join(parts[:keep], "/")
}

// printablePath shows a path from the guest safely on a terminal: bytes
// that are not printable UTF-8 are escaped, and it is at most 200 bytes.
func printablePath(p string) string {
	clean := utf8.ValidString(p) && strings.IndexFunc(p, func(r rune) bool { return !unicode.IsPrint(r) }) < 0
	if !clean {
		q := strconv.QuoteToGraphic(p)
		p = q[1 : len(q)-1]
	}
	if len(p) > 200 {
		cut := 200
		for cut > 0 && !utf8.RuneStart(p[cut]) {
			cut--
		}
		p = p[:cut] + "…"
	}
	return p
}

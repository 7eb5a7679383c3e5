package session

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"
	"unicode/utf8"
)

// What a run changed, and taking it back. A run started with Keep has a
// checkpoint of its starting point; a diff compares a checkpoint's
// workspace with another's or with the workspace now, and an undo puts
// the workspace (or some of its paths) back as the checkpoint has it.

// Differ compares saved states of a session's workspace.
type Differ interface {
	// Diff compares checkpoint from with checkpoint to, or with the
	// workspace now when to is "".
	Diff(ctx context.Context, name, from, to string, opts DiffOptions) (Diff, error)
	// RunDiff compares a run's starting point with the workspace now.
	RunDiff(ctx context.Context, runID string, opts DiffOptions) (Diff, error)
	// UndoRun puts the workspace back as it was when the run started:
	// whole (a restore, with its automatic checkpoint of the state being
	// left) when paths is empty, else each path put back, or removed if
	// the run created it, durably. Refused while the run has running
	// commands.
	UndoRun(ctx context.Context, runID string, paths []string) (UndoResult, error)
}

// DiffOptions configure a diff.
type DiffOptions struct {
	// Paths limit the diff to these paths and what is under them.
	Paths []string `json:"paths,omitempty"`
	// Patch asks for each text file's unified diff.
	Patch bool `json:"patch,omitempty"`
}

// ChangeKind says what happened to a path.
type ChangeKind string

const (
	ChangeAdded    ChangeKind = "added"
	ChangeModified ChangeKind = "modified"
	ChangeRemoved  ChangeKind = "removed"
	ChangeRenamed  ChangeKind = "renamed"
)

// FileChange is one changed path. Old* describe it before (at the
// checkpoint), New* after; a side where it does not exist is zero.
type FileChange struct {
	Kind ChangeKind `json:"kind"`
	Path string     `json:"path"`           // relative to /workspace
	From string     `json:"from,omitempty"` // renamed: its path before
	// Content reports that its bytes (or a symlink's target, or its type)
	// changed; a change of mode alone leaves it false.
	Content bool        `json:"content,omitempty"`
	OldMode fs.FileMode `json:"old_mode,omitempty"`
	NewMode fs.FileMode `json:"new_mode,omitempty"`
	OldSize int64       `json:"old_size,omitempty"`
	NewSize int64       `json:"new_size,omitempty"`
	OldLink string      `json:"old_link,omitempty"`
	NewLink string      `json:"new_link,omitempty"`
	// Binary marks a file whose content is not text (or too large to
	// diff): it has no line counts, and its patch is one line.
	Binary bool `json:"binary,omitempty"`
	// Lines added and removed (text files).
	Added   int `json:"added,omitempty"`
	Removed int `json:"removed,omitempty"`
	// Patch is the unified diff (DiffOptions.Patch).
	Patch string `json:"patch,omitempty"`
}

// Diff is the difference between two states of a workspace.
type Diff struct {
	Session string `json:"session"`
	Run     string `json:"run,omitempty"`
	From    string `json:"from"`         // a checkpoint id
	To      string `json:"to,omitempty"` // a checkpoint id; "" is now
	// Changes, by path.
	Changes []FileChange `json:"changes"`
	// Full says the trees were compared whole, not through the record of
	// changed paths the guest keeps while a run is open; Note says why.
	Full bool   `json:"full,omitempty"`
	Note string `json:"note,omitempty"`
	// Totals.
	Files   int `json:"files"`
	Added   int `json:"added"`
	Removed int `json:"removed"`
}

// Summary is a one-line account: "3 files changed, 12 insertions(+), 4
// deletions(-)".
func (d Diff) Summary() string {
	return fmt.Sprintf("%d %s changed, %d %s(+), %d %s(-)", d.Files, plural(d.Files, "file", "files"),
		d.Added, plural(d.Added, "insertion", "insertions"), d.Removed, plural(d.Removed, "deletion", "deletions"))
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// UndoResult reports an undo.
type UndoResult struct {
	Run        string `json:"run"`
	Checkpoint string `json:"checkpoint"` // the run's starting point
	// Whole: the workspace was restored (Restore says how).
	Whole   bool           `json:"whole,omitempty"`
	Restore *RestoreResult `json:"restore,omitempty"`
	// Paths put back as they were, and paths removed (the run made them).
	Restored []string `json:"restored,omitempty"`
	Removed  []string `json:"removed,omitempty"`
}

// RunChanges counts a run's changes for listings.
type RunChanges struct {
	Files   int `json:"files"`
	Added   int `json:"added"`
	Removed int `json:"removed"`
}

// NoStartingPoint is the refusal of a diff or undo of a run that kept no
// checkpoint of its start, or whose checkpoint is gone.
func NoStartingPoint(runID, ckpt string) error {
	if ckpt == "" {
		return &Error{Class: ErrInvalidState, Field: FieldRun, Code: CodeNoStart, Msg: fmt.Sprintf("%q kept no starting point", runID),
			Hint: "start runs that keep theirs to compare or undo them"}
	}
	return &Error{Class: ErrNotFound, Field: FieldRun, Msg: fmt.Sprintf("%q: its starting point, checkpoint %s, was removed (by hand or by the checkpoint limits)", runID, ckpt),
		Hint: "nothing is left to compare it with"}
}

// CleanDiffPath checks a path a diff or undo names: relative to
// /workspace or absolute under it, with no ".." (a path that climbs is
// refused even when it would land inside: the caller means a path in the
// tree, not a walk). It returns the path relative to /workspace, "" for
// /workspace itself.
func CleanDiffPath(p string) (string, error) {
	if p == "" || strings.ContainsRune(p, 0) {
		return "", Invalid(FieldPath, fmt.Sprintf("%q: want a path under /workspace", p), "")
	}
	rel := p
	if path.IsAbs(p) {
		switch {
		case p == "/workspace" || p == "/workspace/":
			return "", nil
		case strings.HasPrefix(p, "/workspace/"):
			rel = strings.TrimPrefix(p, "/workspace/")
		default:
			return "", OutsideWorkspace(p)
		}
	}
	for _, seg := range strings.Split(rel, "/") {
		if seg == ".." {
			e := OutsideWorkspace(p)
			e.Msg = fmt.Sprintf("path %q climbs with ..: name the path under /workspace itself", p)
			return "", e
		}
	}
	c := path.Clean(rel)
	if c == "." {
		return "", nil
	}
	return c, nil
}

// Under reports whether rel is one of paths or beneath one; no paths
// means everything.
func Under(rel string, paths []string) bool {
	if len(paths) == 0 {
		return true
	}
	for _, p := range paths {
		if p == "" || rel == p || strings.HasPrefix(rel, p+"/") {
			return true
		}
	}
	return false
}

// CleanDiffPaths cleans each path with CleanDiffPath.
func CleanDiffPaths(paths []string) ([]string, error) {
	var out []string
	for _, p := range paths {
		rel, err := CleanDiffPath(p)
		if err != nil {
			return nil, err
		}
		out = append(out, rel)
	}
	return out, nil
}

// KeepUnder drops from m every path that is not under paths (see Under).
func KeepUnder[E any](m map[string]E, paths []string) {
	for p := range m {
		if !Under(p, paths) {
			delete(m, p)
		}
	}
}

// BuildDiff is the one way a diff is made from two states, whoever read
// them: the entries under paths compared (CompareEntries), their lines
// counted and, with patch, their patches written (FillLines, with readOld
// and readNew). Its Changes is never nil, so an empty diff encodes as [].
func BuildDiff(old, new map[string]DiffEntry, paths []string, patch bool, readOld, readNew func(p string) ([]byte, error)) (Diff, error) {
	KeepUnder(old, paths)
	KeepUnder(new, paths)
	d := Diff{Changes: CompareEntries(old, new)}
	if err := FillLines(&d, patch, readOld, readNew); err != nil {
		return Diff{}, err
	}
	if d.Changes == nil {
		d.Changes = []FileChange{}
	}
	return d, nil
}

// DiffEntry is one path's state in a tree, as a diff compares it.
type DiffEntry struct {
	Path string      // relative to /workspace
	Mode fs.FileMode // type and permission bits
	Size int64
	Link string // a symlink's target
	// ID is the file's identity where the filesystem gives one (inode
	// number and generation): the same file under another name is a
	// rename. "" when unknown.
	ID string
	// Sum is a regular file's content hash; two files with the same Sum
	// have the same bytes.
	Sum string
}

// modeBits are the mode bits a diff reports as a mode change.
const modeBits = fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky

// CompareEntries compares two states of the same set of paths: old and
// new hold what exists of them on each side (a path missing from a side
// does not exist there). Files that vanished from one path and appeared
// at another are renames when they are the same file (same ID) or,
// without IDs, have the same bytes. Directories are reported when they
// appear, vanish or change mode; what they hold is reported path by path.
// The result is sorted by path.
func CompareEntries(old, new map[string]DiffEntry) []FileChange {
	var out []FileChange
	var gone, made []DiffEntry
	for p, o := range old {
		n, ok := new[p]
		if !ok {
			gone = append(gone, o)
			continue
		}
		if c, changed := compareOne(o, n); changed {
			out = append(out, c)
		}
	}
	for p, n := range new {
		if _, ok := old[p]; !ok {
			made = append(made, n)
		}
	}
	sortEntries := func(es []DiffEntry) {
		slices.SortFunc(es, func(a, b DiffEntry) int { return strings.Compare(a.Path, b.Path) })
	}
	sortEntries(gone)
	sortEntries(made)
	// Renames: by identity first, then (files without one) by content.
	paired := map[string]bool{} // old paths renamed
	used := map[string]bool{}   // new paths renamed
	byID := map[string]DiffEntry{}
	for _, o := range gone {
		if o.ID != "" && !o.Mode.IsDir() {
			byID[o.ID] = o
		}
	}
	rename := func(o, n DiffEntry) {
		c, _ := compareOne(o, n)
		c.Kind, c.From = ChangeRenamed, o.Path
		out = append(out, c)
		paired[o.Path], used[n.Path] = true, true
	}
	for _, n := range made {
		if o, ok := byID[n.ID]; ok && n.ID != "" && !paired[o.Path] && o.Mode.Type() == n.Mode.Type() {
			rename(o, n)
		}
	}
	bySum := map[string][]DiffEntry{}
	for _, o := range gone {
		if !paired[o.Path] && o.ID == "" && o.Mode.IsRegular() && o.Sum != "" {
			bySum[o.Sum] = append(bySum[o.Sum], o)
		}
	}
	for _, n := range made {
		if used[n.Path] || n.ID != "" || !n.Mode.IsRegular() || n.Sum == "" {
			continue
		}
		if cands := bySum[n.Sum]; len(cands) > 0 {
			rename(cands[0], n)
			bySum[n.Sum] = cands[1:]
		}
	}
	for _, o := range gone {
		if !paired[o.Path] {
			out = append(out, FileChange{Kind: ChangeRemoved, Path: o.Path, Content: true, OldMode: o.Mode, OldSize: o.Size, OldLink: o.Link})
		}
	}
	for _, n := range made {
		if !used[n.Path] {
			out = append(out, FileChange{Kind: ChangeAdded, Path: n.Path, Content: true, NewMode: n.Mode, NewSize: n.Size, NewLink: n.Link})
		}
	}
	slices.SortFunc(out, func(a, b FileChange) int { return strings.Compare(a.Path, b.Path) })
	return out
}

// compareOne compares one path's two states.
func compareOne(o, n DiffEntry) (FileChange, bool) {
	c := FileChange{Kind: ChangeModified, Path: n.Path, OldMode: o.Mode, NewMode: n.Mode, OldSize: o.Size, NewSize: n.Size, OldLink: o.Link, NewLink: n.Link}
	switch {
	case o.Mode.Type() != n.Mode.Type():
		c.Content = true
	case o.Mode.IsRegular():
		c.Content = o.Size != n.Size || o.Sum != n.Sum
	case o.Mode.Type() == fs.ModeSymlink:
		c.Content = o.Link != n.Link
	}
	if o.Mode.IsDir() && n.Mode.IsDir() {
		c.OldSize, c.NewSize = 0, 0 // a directory's size says nothing a person can use
	}
	return c, c.Content || o.Mode&modeBits != n.Mode&modeBits
}

// MaxPatchBytes bounds each side of a text diff; a larger file is
// reported as binary is, by its sizes.
const MaxPatchBytes = 8 << 20

// maxEdit bounds the edit distance the line diff searches for; past it
// the differing middle is shown as removed and added whole (still a
// correct patch, only a longer one).
const maxEdit = 2000

// IsBinary reports whether content is not text, as git decides: a NUL
// byte in its first 8000 bytes.
func IsBinary(b []byte) bool {
	return bytes.IndexByte(b[:min(len(b), 8000)], 0) >= 0
}

// BinaryPatch is the one line a binary file's patch is.
func BinaryPatch(oldSize, newSize int64) string {
	return fmt.Sprintf("binary, %d → %d bytes\n", oldSize, newSize)
}

// LineDiff compares two texts line by line: the lines added and removed,
// and, with patch, the unified diff (three lines of context, git's
// headers with a/ and b/ and /dev/null for a side that does not exist).
func LineDiff(oldPath, newPath string, a, b []byte, patch bool) (added, removed int, out string) {
	al, bl := splitLines(a), splitLines(b)
	ops := editScript(al, bl)
	for _, o := range ops {
		switch o.kind {
		case '+':
			added++
		case '-':
			removed++
		}
	}
	if !patch || (added == 0 && removed == 0) {
		return added, removed, ""
	}
	var sb strings.Builder
	from, to := "a/"+oldPath, "b/"+newPath
	if oldPath == "" {
		from = "/dev/null"
	}
	if newPath == "" {
		to = "/dev/null"
	}
	fmt.Fprintf(&sb, "--- %s\n+++ %s\n", from, to)
	writeHunks(&sb, ops, al, bl)
	return added, removed, sb.String()
}

// splitLines splits text into lines, each with its newline (the last may
// lack one).
func splitLines(b []byte) []string {
	var out []string
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			out = append(out, string(b))
			break
		}
		out = append(out, string(b[:i+1]))
		b = b[i+1:]
	}
	return out
}

// edit is one step of an edit script: '=' keeps a[ai] (= b[bi]), '-'
// removes a[ai], '+' adds b[bi].
type edit struct {
	kind   byte
	ai, bi int
}

// editScript is a shortest edit script from a to b (Myers' algorithm on
// what differs between the common head and tail), or, past maxEdit
// differences, one that removes and adds the middle whole.
func editScript(a, b []string) []edit {
	pre := 0
	for pre < len(a) && pre < len(b) && a[pre] == b[pre] {
		pre++
	}
	suf := 0
	for suf < len(a)-pre && suf < len(b)-pre && a[len(a)-1-suf] == b[len(b)-1-suf] {
		suf++
	}
	var out []edit
	for i := range pre {
		out = append(out, edit{'=', i, i})
	}
	ma, mb := a[pre:len(a)-suf], b[pre:len(b)-suf]
	mid, ok := myers(ma, mb)
	if !ok {
		mid = mid[:0]
		for i := range ma {
			mid = append(mid, edit{'-', i, 0})
		}
		for j := range mb {
			mid = append(mid, edit{'+', len(ma), j})
		}
	}
	for _, e := range mid {
		e.ai += pre
		e.bi += pre
		out = append(out, e)
	}
	for i := range suf {
		out = append(out, edit{'=', len(a) - suf + i, len(b) - suf + i})
	}
	return out
}

// myers finds a shortest edit script, or reports false past maxEdit.
func myers(a, b []string) ([]edit, bool) {
	n, m := len(a), len(b)
	if n == 0 && m == 0 {
		return nil, true
	}
	maxD := min(n+m, maxEdit)
	off := maxD + 1
	v := make([]int, 2*maxD+3)
	var trace [][]int
	for d := 0; d <= maxD; d++ {
		// The state before step d, over the diagonals step d reads.
		lo, hi := off-d-1, off+d+1
		trace = append(trace, slices.Clone(v[lo:hi+1]))
		for k := -d; k <= d; k += 2 {
			var x int
			if k == -d || (k != d && v[off+k-1] < v[off+k+1]) {
				x = v[off+k+1]
			} else {
				x = v[off+k-1] + 1
			}
			y := x - k
			for x < n && y < m && a[x] == b[y] {
				x++
				y++
			}
			v[off+k] = x
			if x >= n && y >= m {
				return backtrack(trace, n, m), true
			}
		}
	}
	return nil, false
}

func backtrack(trace [][]int, x, y int) []edit {
	var rev []edit
	for d := len(trace) - 1; d >= 0; d-- {
		t := trace[d]
		at := func(k int) int { return t[k+d+1] } // t covers diagonals -d-1..d+1
		k := x - y
		var pk int
		if k == -d || (k != d && at(k-1) < at(k+1)) {
			pk = k + 1
		} else {
			pk = k - 1
		}
		px := at(pk)
		py := px - pk
		for x > px && y > py {
			x--
			y--
			rev = append(rev, edit{'=', x, y})
		}
		if d > 0 {
			if x == px {
				rev = append(rev, edit{'+', px, py})
			} else {
				rev = append(rev, edit{'-', px, py})
			}
		}
		x, y = px, py
	}
	slices.Reverse(rev)
	return rev
}

// writeHunks writes ops as unified diff hunks with three lines of context.
func writeHunks(sb *strings.Builder, ops []edit, a, b []string) {
	const ctx = 3
	for i := 0; i < len(ops); {
		if ops[i].kind == '=' {
			i++
			continue
		}
		// A hunk: from ctx lines before this change to ctx lines after
		// the last change that is within 2*ctx of the next.
		start := max(0, i-ctx)
		end := i
		for j := i; j < len(ops); j++ {
			if ops[j].kind != '=' {
				end = j
				continue
			}
			if j-end > 2*ctx {
				break
			}
		}
		stop := min(len(ops), end+ctx+1)
		aStart, bStart, aN, bN := -1, -1, 0, 0
		for _, o := range ops[start:stop] {
			if o.kind != '+' {
				if aStart < 0 {
					aStart = o.ai
				}
				aN++
			}
			if o.kind != '-' {
				if bStart < 0 {
					bStart = o.bi
				}
				bN++
			}
		}
		if aStart < 0 {
			aStart = ops[start].ai
		}
		if bStart < 0 {
			bStart = ops[start].bi
		}
		fmt.Fprintf(sb, "@@ -%s +%s @@\n", hunkRange(aStart, aN), hunkRange(bStart, bN))
		for _, o := range ops[start:stop] {
			var line string
			switch o.kind {
			case '=':
				line = " " + a[o.ai]
			case '-':
				line = "-" + a[o.ai]
			case '+':
				line = "+" + b[o.bi]
			}
			sb.WriteString(line)
			if !strings.HasSuffix(line, "\n") {
				sb.WriteString("\n\\ No newline at end of file\n")
			}
		}
		i = stop
	}
}

// hunkRange is a hunk header's range as diff -u writes it: "l,n", "l"
// when n is 1, and the line before with n 0 for an empty side.
func hunkRange(start, n int) string {
	switch n {
	case 0:
		return fmt.Sprintf("%d,0", start)
	case 1:
		return fmt.Sprintf("%d", start+1)
	}
	return fmt.Sprintf("%d,%d", start+1, n)
}

// FillLines completes d's changes of regular files: lines added and
// removed of text, Binary of the rest, and with patch each one's patch.
// readOld and readNew return a path's bytes before and after (they are
// called only for regular files of at most MaxPatchBytes). It sets d's
// totals.
func FillLines(d *Diff, patch bool, readOld, readNew func(p string) ([]byte, error)) error {
	d.Files, d.Added, d.Removed = len(d.Changes), 0, 0
	for i := range d.Changes {
		c := &d.Changes[i]
		oldPath, newPath := c.Path, c.Path
		if c.From != "" {
			oldPath = c.From
		}
		oldReg := c.Kind != ChangeAdded && c.OldMode.IsRegular()
		newReg := c.Kind != ChangeRemoved && c.NewMode.IsRegular()
		if !c.Content || (!oldReg && !newReg) {
			continue
		}
		if c.OldSize > MaxPatchBytes || c.NewSize > MaxPatchBytes {
			c.Binary = true
		}
		var a, b []byte
		var err error
		if !c.Binary && oldReg {
			if a, err = readOld(oldPath); err != nil {
				return fmt.Errorf("read %s as it was: %w", oldPath, err)
			}
		}
		if !c.Binary && newReg {
			if b, err = readNew(newPath); err != nil {
				return fmt.Errorf("read %s as it is: %w", newPath, err)
			}
		}
		if c.Binary || IsBinary(a) || IsBinary(b) {
			c.Binary = true
			if patch {
				c.Patch = BinaryPatch(c.OldSize, c.NewSize)
			}
			continue
		}
		if !oldReg {
			oldPath = ""
		}
		if !newReg {
			newPath = ""
		}
		c.Added, c.Removed, c.Patch = LineDiff(oldPath, newPath, a, b, patch)
		d.Added += c.Added
		d.Removed += c.Removed
	}
	return nil
}

// RunBusy is the refusal of an undo while n of the run's commands run.
func RunBusy(runID string, n int) error {
	return &Error{Class: ErrInvalidState, Field: FieldRun, Msg: fmt.Sprintf("%q has %d running %s: undoing under them would mix their writes with the old state", runID, n, plural(n, "command", "commands")),
		Hint: "wait for them to end, or cancel them"}
}

// StartLabel is the label of a run's starting-point checkpoint.
func StartLabel(runID, title string) string {
	l := "run " + runID
	if title != "" {
		l += ": " + title
	}
	if len(l) > MaxLabel {
		l = l[:MaxLabel]
		for !utf8.ValidString(l) {
			l = l[:len(l)-1]
		}
	}
	return strings.NewReplacer("\n", " ", "\r", " ", "\x00", " ").Replace(l)
}

package session

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestCleanDiffPath(t *testing.T) {
	for _, c := range []struct {
		in, want string
		escape   bool
	}{
		{"a/b", "a/b", false},
		{"/workspace/a/b", "a/b", false},
		{"/workspace", "", false},
		{".", "", false},
		{"a//b/", "a/b", false},
		{"./a", "a", false},
		{"../x", "", true},
		{"a/../b", "", true}, // climbs, though it lands inside
		{"/workspace/../etc", "", true},
		{"/etc/passwd", "", true},
		{"/workspacex/a", "", true},
	} {
		got, err := CleanDiffPath(c.in)
		if c.escape {
			if CodeOf(err) != CodeEscape || !errors.Is(err, ErrInvalid) {
				t.Errorf("CleanDiffPath(%q) = %q, %v; want an escape refusal", c.in, got, err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("CleanDiffPath(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	if _, err := CleanDiffPath("a\x00b"); !errors.Is(err, ErrInvalid) {
		t.Errorf("NUL: %v", err)
	}
}

func TestCompareEntries(t *testing.T) {
	file := func(p string, mode fs.FileMode, size int64, id, sum string) DiffEntry {
		return DiffEntry{Path: p, Mode: mode, Size: size, ID: id, Sum: sum}
	}
	dir := func(p string, mode fs.FileMode, id string) DiffEntry {
		return DiffEntry{Path: p, Mode: fs.ModeDir | mode, ID: id}
	}
	link := func(p, to, id string) DiffEntry {
		return DiffEntry{Path: p, Mode: fs.ModeSymlink | 0o777, Link: to, ID: id}
	}
	m := func(es ...DiffEntry) map[string]DiffEntry {
		out := map[string]DiffEntry{}
		for _, e := range es {
			out[e.Path] = e
		}
		return out
	}
	for _, c := range []struct {
		name     string
		old, new map[string]DiffEntry
		want     []string // kind path [from] [content] [mode]
	}{
		{"nothing", m(file("a", 0o644, 1, "1", "x")), m(file("a", 0o644, 1, "1", "x")), nil},
		{"added", m(), m(file("a", 0o644, 1, "1", "x")), []string{"added a"}},
		{"removed", m(file("a", 0o644, 1, "1", "x")), m(), []string{"removed a"}},
		{"content", m(file("a", 0o644, 1, "1", "x")), m(file("a", 0o644, 1, "1", "y")), []string{"modified a content"}},
		{"size", m(file("a", 0o644, 1, "1", "x")), m(file("a", 0o644, 2, "1", "x")), []string{"modified a content"}},
		{"mode only", m(file("a", 0o644, 1, "1", "x")), m(file("a", 0o755, 1, "1", "x")), []string{"modified a mode"}},
		{"dir mode", m(dir("d", 0o755, "2")), m(dir("d", 0o700, "2")), []string{"modified d mode"}},
		{"dir size ignored", m(DiffEntry{Path: "d", Mode: fs.ModeDir | 0o755, Size: 4096}), m(DiffEntry{Path: "d", Mode: fs.ModeDir | 0o755, Size: 8192}), nil},
		{"type", m(file("a", 0o644, 1, "1", "x")), m(dir("a", 0o755, "1")), []string{"modified a content mode"}},
		{"link target", m(link("l", "a", "3")), m(link("l", "b", "3")), []string{"modified l content"}},
		{"rename by id", m(file("a", 0o644, 1, "7", "x")), m(file("b", 0o644, 1, "7", "x")), []string{"renamed b from a"}},
		{"rename and edit by id", m(file("a", 0o644, 1, "7", "x")), m(file("b", 0o644, 2, "7", "y")), []string{"renamed b from a content"}},
		{"rename by content", m(file("a", 0o644, 1, "", "x")), m(file("b", 0o644, 1, "", "x")), []string{"renamed b from a"}},
		{"no rename across types", m(file("a", 0o644, 1, "7", "x")), m(dir("b", 0o755, "7")), []string{"removed a", "added b"}},
		{"other content is no rename", m(file("a", 0o644, 1, "", "x")), m(file("b", 0o644, 1, "", "y")), []string{"removed a", "added b"}},
		{"reused id of another type", m(dir("a", 0o755, "7")), m(dir("b", 0o755, "7")), []string{"removed a", "added b"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var got []string
			for _, ch := range CompareEntries(c.old, c.new) {
				s := string(ch.Kind) + " " + ch.Path
				if ch.From != "" {
					s += " from " + ch.From
				}
				if ch.Kind == ChangeModified || ch.Kind == ChangeRenamed {
					if ch.Content {
						s += " content"
					}
					if ch.OldMode&modeBits != ch.NewMode&modeBits || ch.OldMode.Type() != ch.NewMode.Type() {
						s += " mode"
					}
				}
				got = append(got, s)
			}
			if fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Errorf("got %q, want %q", got, c.want)
			}
		})
	}
}

// TestLineDiff checks the patch's hunks against diff -u's, and the counts.
func TestLineDiff(t *testing.T) {
	lines := func(n int, f func(i int) string) string {
		var b strings.Builder
		for i := range n {
			b.WriteString(f(i) + "\n")
		}
		return b.String()
	}
	base := lines(40, func(i int) string { return fmt.Sprintf("line %d", i) })
	for _, c := range []struct {
		name      string
		a, b      string
		add, rem  int
		wantHunks int
	}{
		{"same", base, base, 0, 0, 0},
		{"one line", base, strings.Replace(base, "line 20\n", "LINE 20\n", 1), 1, 1, 1},
		{"two far apart", base, strings.Replace(strings.Replace(base, "line 3\n", "x\n", 1), "line 30\n", "y\n", 1), 2, 2, 2},
		{"two near", base, strings.Replace(strings.Replace(base, "line 10\n", "x\n", 1), "line 16\n", "y\n", 1), 2, 2, 1},
		{"gap of seven", base, strings.Replace(strings.Replace(base, "line 10\n", "x\n", 1), "line 18\n", "y\n", 1), 2, 2, 2},
		{"insert at start", base, "new\n" + base, 1, 0, 1},
		{"append", base, base + "tail\n", 1, 0, 1},
		{"delete at end", base, strings.TrimSuffix(base, "line 39\n"), 0, 1, 1},
		{"no newline at end", "a\nb\n", "a\nb", 1, 1, 1},
		{"from empty", "", "a\nb\n", 2, 0, 1},
		{"to empty", "a\nb\n", "", 0, 2, 1},
		{"rewrite", "a\nb\nc\n", "x\ny\n", 2, 3, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			add, rem, patch := LineDiff("f", "f", []byte(c.a), []byte(c.b), true)
			if add != c.add || rem != c.rem {
				t.Errorf("added %d removed %d, want %d %d", add, rem, c.add, c.rem)
			}
			if n := strings.Count(patch, "\n@@ "); n != c.wantHunks {
				t.Errorf("%d hunks, want %d:\n%s", n, c.wantHunks, patch)
			}
			if _, err := exec.LookPath("diff"); err != nil {
				return
			}
			dir := t.TempDir()
			os.WriteFile(filepath.Join(dir, "a"), []byte(c.a), 0o644)
			os.WriteFile(filepath.Join(dir, "b"), []byte(c.b), 0o644)
			out, _ := exec.Command("diff", "-u", filepath.Join(dir, "a"), filepath.Join(dir, "b")).Output()
			if hunks(string(out)) != hunks(patch) {
				t.Errorf("patch differs from diff -u:\n%s\nwant:\n%s", patch, out)
			}
		})
	}
}

// hunks drops a patch's two header lines.
func hunks(p string) string {
	if i := strings.Index(p, "\n@@ "); i >= 0 {
		return p[i+1:]
	}
	return ""
}

func TestLineDiffLarge(t *testing.T) {
	// Past the edit bound the middle is replaced whole: still a patch
	// that counts every line.
	var a, b strings.Builder
	for i := range 3 * maxEdit {
		fmt.Fprintf(&a, "a%d\n", i)
		fmt.Fprintf(&b, "b%d\n", i)
	}
	add, rem, patch := LineDiff("f", "f", []byte(a.String()), []byte(b.String()), true)
	if add != 3*maxEdit || rem != 3*maxEdit || !strings.HasPrefix(patch, "--- a/f\n+++ b/f\n@@ -1,6000 +1,6000 @@\n") {
		t.Errorf("added %d removed %d, patch starts %q", add, rem, patch[:min(len(patch), 60)])
	}
}

func TestBinaryPatch(t *testing.T) {
	if got := BinaryPatch(10, 2048); got != "binary, 10 → 2048 bytes\n" {
		t.Errorf("got %q", got)
	}
	if !IsBinary([]byte("a\x00b")) || IsBinary([]byte("héllo\n")) {
		t.Error("IsBinary")
	}
}

package engine_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/berthvm/berth/session"
)

// treeHash is a hash of the workspace's paths, types, modes, link targets
// and contents (lost+found aside), taken in the guest.
const treeHash = `cd /workspace && find . -path ./lost+found -prune -o -print | sort | while read -r p; do
  if [ -L "$p" ]; then echo "$p L $(readlink "$p")"
  elif [ -d "$p" ]; then echo "$p D $(stat -c %a "$p")"
  else echo "$p F $(stat -c %a "$p") $(sha256sum < "$p")"; fi
done | sha256sum`

func (e *env) diff(args ...string) session.Diff {
	e.T.Helper()
	var d session.Diff
	out := e.OK(append(args, "--json")...)
	if err := json.Unmarshal([]byte(out), &d); err != nil {
		e.T.Fatalf("%v: %s", err, out)
	}
	return d
}

// changeList renders a diff's changes as "kind path [from]" lines.
func changeList(d session.Diff) []string {
	var out []string
	for _, c := range d.Changes {
		s := string(c.Kind) + " " + c.Path
		if c.From != "" {
			s += " from " + c.From
		}
		out = append(out, s)
	}
	return out
}

// TestRunDiffUndo is a run kept with --keep that changes a tree in every
// way a run can (text and binary edits, a removal, a rename, a mode
// change, a deep new directory, a symlink retargeted), plus a change made
// outside the run by a plain exec: run diff lists exactly those, from the
// guest's record; --patch shows the text edit; undo of paths puts those
// back; a whole undo gives the starting tree back hash-exact; bad paths
// are refused with one line.
func TestRunDiffUndo(t *testing.T) {
	e := newEnv(t)
	os.WriteFile(filepath.Join(e.Data, "config.toml"), []byte(ckptConfig), 0o644)
	e.StartDaemon()
	e.OK("create", "d")
	var lines strings.Builder
	for i := range 20 {
		fmt.Fprintf(&lines, "line %d\n", i)
	}
	e.OK("exec", "d", "--", "sh", "-c", "mkdir -p src/deep/a/b && printf '"+lines.String()+"' > src/main.txt && echo keep > keep.txt && "+
		"head -c 5000 /dev/urandom > blob.bin && echo old > gone.txt && echo mv > tomove.txt && echo 'echo hi' > script.sh && chmod 644 script.sh && ln -s keep.txt link")
	before := e.out("d", treeHash)
	mainBefore := e.out("d", "sha256sum src/main.txt")

	id := strings.TrimSpace(e.OK("run", "start", "d", "--title", "diff test", "--keep"))
	run := e.runs("d")[0]
	if run.ID != id || run.Checkpoint == "" {
		t.Fatalf("run %+v: no starting point", run)
	}
	ck := e.checkpoints("d")
	if len(ck) != 1 || ck[0].Run != id || !strings.Contains(ck[0].Label, id) || !strings.Contains(ck[0].Label, "diff test") {
		t.Fatalf("checkpoints %+v", ck)
	}
	e.OK("exec", "--run", id, "d", "--", "sh", "-c", "sed -i 's/^line 5$/LINE 5/' src/main.txt && head -c 100 /dev/urandom >> blob.bin && rm gone.txt && "+
		"mv tomove.txt moved.txt && chmod 755 script.sh && echo new > new.txt && mkdir -p src/deep/a/b/c && echo deep > src/deep/a/b/c/f.txt && ln -sfn gone.txt link")
	// Outside the run and its coordination: a plain exec.
	e.OK("exec", "d", "--", "sh", "-c", "echo outside > outside.txt")

	want := []string{"added new.txt", "added outside.txt", "added src/deep/a/b/c", "added src/deep/a/b/c/f.txt",
		"modified blob.bin", "modified link", "modified script.sh", "modified src/main.txt", "removed gone.txt", "renamed moved.txt from tomove.txt"}
	slices.Sort(want)
	e.Subtest(t, "diff lists exactly the changes", func(t *testing.T) {
		d := e.diff("run", "diff", id)
		got := changeList(d)
		slices.Sort(got)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("changes:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		if d.Full {
			t.Errorf("compared whole trees (%s), want the guest's record", d.Note)
		}
		for _, c := range d.Changes {
			switch c.Path {
			case "script.sh":
				if c.Content || c.OldMode.Perm() != 0o644 || c.NewMode.Perm() != 0o755 {
					t.Errorf("script.sh: %+v, want a mode change alone", c)
				}
			case "src/main.txt":
				if c.Added != 1 || c.Removed != 1 {
					t.Errorf("main.txt: +%d -%d", c.Added, c.Removed)
				}
			case "blob.bin":
				if !c.Binary || c.OldSize != 5000 || c.NewSize != 5100 {
					t.Errorf("blob.bin: %+v", c)
				}
			case "link":
				if c.OldLink != "keep.txt" || c.NewLink != "gone.txt" {
					t.Errorf("link: %+v", c)
				}
			}
		}
		patch := e.OK("run", "diff", id, "--patch")
		for _, w := range []string{"--- a/src/main.txt\n+++ b/src/main.txt\n@@ -3,7 +3,7 @@\n line 2\n line 3\n line 4\n-line 5\n+LINE 5\n", "binary, 5000 → 5100 bytes"} {
			if !strings.Contains(patch, w) {
				t.Errorf("patch lacks %q:\n%s", w, patch)
			}
		}
		stat := e.OK("run", "diff", id, "--stat")
		if !strings.Contains(stat, "10 files changed, 4 insertions(+), 2 deletions(-)") {
			t.Errorf("stat:\n%s", stat)
		}
		if d := e.diff("run", "diff", id, "src"); len(d.Changes) != 3 {
			t.Errorf("diff of src: %q", changeList(d))
		}
		if r := e.runs("d")[0]; r.Changes == nil || r.Changes.Files != 10 {
			t.Errorf("runs --json carries no change counts: %+v", r.Changes)
		}
	})

	e.Subtest(t, "bad paths and runs", func(t *testing.T) {
		e.Fails("climbs with ..", "run", "diff", id, "../etc")
		e.Fails("outside /workspace", "run", "diff", id, "/etc/passwd")
		e.Fails("climbs with ..", "run", "diff", id, "src/../keep.txt")
		e.Fails("outside /workspace", "run", "undo", id, "/etc/passwd", "--yes")
		e.Fails("no such run", "run", "diff", "r000000000000")
		e.Fails("not a terminal", "run", "undo", id)
		other := strings.TrimSpace(e.OK("run", "start", "d"))
		e.Fails("--keep", "run", "diff", other)
		e.OK("run", "end", other)
	})

	e.Subtest(t, "undo of paths", func(t *testing.T) {
		out := e.OK("run", "undo", id, "src/main.txt", "new.txt", "--yes")
		if !strings.Contains(out, "put back src/main.txt") || !strings.Contains(out, "removed new.txt") {
			t.Errorf("undo said %q", out)
		}
		if got := e.out("d", "sha256sum src/main.txt; test -e new.txt && echo new-exists; true"); got != mainBefore {
			t.Errorf("after undo: %q, want %q", got, mainBefore)
		}
		got := changeList(e.diff("run", "diff", id))
		if slices.Contains(got, "modified src/main.txt") || slices.Contains(got, "added new.txt") || len(got) != len(want)-2 {
			t.Errorf("after undo of two paths: %q", got)
		}
	})

	e.Subtest(t, "whole undo restores the start", func(t *testing.T) {
		e.OK("run", "undo", id, "--yes")
		if got := e.out("d", treeHash); got != before {
			t.Errorf("tree after a whole undo differs from the start")
		}
		if d := e.diff("run", "diff", id); len(d.Changes) != 0 {
			t.Errorf("after a whole undo: %q", changeList(d))
		}
	})

	e.Subtest(t, "two checkpoints", func(t *testing.T) {
		l := e.checkpoints("d")
		d := e.diff("diff", "d", l[0].ID, l[len(l)-1].ID)
		got := changeList(d)
		slices.Sort(got)
		// The automatic checkpoint holds the state the whole undo left.
		if len(got) != len(want)-2 {
			t.Errorf("diff of %s and %s: %q", l[0].ID, l[len(l)-1].ID, got)
		}
	})
}

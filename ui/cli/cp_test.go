package cli_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/sessiontest"
	"github.com/berthvm/berth/ui/cli"
)

// A refused copy leaves nothing under the name it was going to, so the
// same cp again, once the cause is gone, means what it meant: the tree
// lands in t2, not t2/src. A local tree is checked whole before anything
// is sent.
func TestCopyRefusedLeavesNothing(t *testing.T) {
	w := newWorld(t, sessiontest.Options{})
	w.sh(t, "create", "demo")
	src := filepath.Join(t.TempDir(), "src")
	os.MkdirAll(filepath.Join(src, "sub"), 0o755)
	os.WriteFile(filepath.Join(src, "a.txt"), []byte("a"), 0o644)
	os.WriteFile(filepath.Join(src, "sub", "b.txt"), []byte("b"), 0o644)
	os.Symlink("/etc/passwd", filepath.Join(src, "sub", "passwd"))

	tc{code: 1, stderr: "~refusing symlink sub/passwd → /etc/passwd: it points out of the tree being copied"}.
		check(t, w.run(t.Context(), cli.Env{}, "cp", src, "demo:t2"))
	if n := w.fake.Calls("CopyIn"); n != 0 {
		t.Errorf("a refused local tree reached the service (%d CopyIn calls)", n)
	}
	if _, err := w.fake.Stat(t.Context(), "demo", "t2"); !isNotFound(err) {
		t.Errorf("after the refused cp, Stat t2 = %v; want not found", err)
	}
	os.Remove(filepath.Join(src, "sub", "passwd"))
	tc{stdout: "~ to demo:t2, durably\n"}.check(t, w.run(t.Context(), cli.Env{}, "cp", src, "demo:t2"))
	for _, p := range []string{"t2/a.txt", "t2/sub/b.txt"} {
		if _, err := w.fake.Stat(t.Context(), "demo", p); err != nil {
			t.Errorf("after the retry, Stat %s = %v", p, err)
		}
	}
	if _, err := w.fake.Stat(t.Context(), "demo", "t2/src"); !isNotFound(err) {
		t.Errorf("the retry nested the tree: Stat t2/src = %v", err)
	}

	// Out of the session: a refused tree leaves no local directory.
	if err := w.fake.Symlink(t.Context(), "demo", "../../outside", "t2/sub/up"); err != nil { // inside /workspace, out of t2
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "deeper", "out")
	tc{code: 1, stderr: "~points out of the tree"}.check(t, w.run(t.Context(), cli.Env{}, "cp", "demo:t2", out))
	if _, err := os.Stat(filepath.Dir(out)); !os.IsNotExist(err) {
		t.Errorf("after a refused copy out, %s: %v; want nothing there", filepath.Dir(out), err)
	}
}

func isNotFound(err error) bool { return errors.Is(err, session.ErrNotFound) }

package engine_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestImportedImageTemplate: an imported image gets a booted template as
// debian has, so its sessions are restored from it rather than booted:
// the first create builds the template and restores from it, the next
// restores at once, and both run with the image's config. What the
// engine records (the session's cause) says how each VM came to be, so
// no timing is asserted.
func TestImportedImageTemplate(t *testing.T) {
	bb := staticBusybox(t)
	_, archive := busyboxImage(t, bb)
	// The test's own data directory with its own templates: the
	// template of the imported image is built here, not found in the
	// shared test cache.
	e, data := newImageEnv(t, true)
	file := filepath.Join(t.TempDir(), "bb.tar")
	os.WriteFile(file, archive, 0o644)
	e.OK("image", "import", file, "--name", "bb")

	for _, name := range []string{"t1", "t2"} {
		e.OK("create", name, "--image", "bb", "--memory", "256M", "--disk", "64M")
		if s := e.Info(name); !strings.Contains(s.Cause, "restored from a template") {
			t.Errorf("%s of the imported image: cause %q, want it restored from the image's template", name, s.Cause)
		}
		if out := e.OK("exec", name, "--", "sh", "-c", `echo "$GREETING"; pwd; hostname`); out != "hello from the image\n/workspace/src\n"+name+"\n" {
			t.Errorf("%s from the template: %q", name, out)
		}
	}
	bbInfo := e.imageInfo("bb")
	snaps, _ := filepath.Glob(filepath.Join(data, "templates", "*", "memory.snap"))
	if len(snaps) != 1 {
		t.Fatalf("templates: %v, want the imported image's one", snaps)
	}
	if b, _ := os.ReadFile(filepath.Join(filepath.Dir(snaps[0]), "image.json")); !strings.Contains(string(b), `"digest":"`+bbInfo.Digest+`"`) {
		t.Errorf("the template does not name its build bb@%s: %s", bbInfo.Digest, b)
	}
	if log, _ := os.ReadFile(filepath.Join(data, "test-daemon.log")); strings.Count(string(log), "template ready") != 1 {
		t.Errorf("the daemon built the template %d times, want once", strings.Count(string(log), "template ready"))
	}
	for _, name := range []string{"t1", "t2"} {
		e.OK("delete", name, "--yes")
	}
	// The template goes with its image.
	e.OK("image", "rm", "bb")
	if m, _ := filepath.Glob(filepath.Join(data, "templates", "*")); len(m) != 0 {
		t.Errorf("image rm left templates: %v", m)
	}
}

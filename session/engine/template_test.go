package engine_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestTemplates(t *testing.T) {
	e := newEnv(t)
	// A template of its own, so that breaking it harms no other test.
	link := filepath.Join(e.data, "templates")
	os.Remove(link)
	os.Mkdir(link, 0o755)
	os.WriteFile(filepath.Join(e.data, "config.toml"), []byte("memory = \"256M\"\ndisk = \"64M\"\nidle_timeout = \"0\"\n"), 0o644)
	e.startDaemon()

	e.ok("create", "t1")
	if s := e.info("t1"); !strings.Contains(s.Cause, "template") {
		t.Errorf("first create: cause %q, want a template restore", s.Cause)
	}
	e.ok("exec", "t1", "--", "sh", "-c", "echo kept > f.txt")
	start := time.Now()
	e.ok("create", "t2")
	t.Logf("create from a template took %s", time.Since(start))
	if got := e.ok("exec", "t2", "--", "sh", "-c", "ls /workspace; cat /proc/mounts | grep -c ' /workspace '"); !strings.Contains(got, "lost+found") || strings.Contains(got, "f.txt") {
		t.Errorf("t2's workspace: %q (must be its own, mounted)", got)
	}
	// Sessions restored from one template share no state.
	if a, b := e.ok("exec", "t1", "--", "cat", "/proc/sys/kernel/random/uuid"), e.ok("exec", "t2", "--", "cat", "/proc/sys/kernel/random/uuid"); a == b {
		t.Errorf("two sessions from one template drew the same random UUID %q", a)
	}
	// A session with a hot-plugged workspace sleeps and wakes like any.
	e.ok("exec", "t2", "--", "sh", "-c", "echo durable > d.txt")
	e.ok("sleep", "t2")
	if got := e.ok("exec", "t2", "--", "cat", "d.txt"); got != "durable\n" {
		t.Errorf("after sleep: %q", got)
	}
	e.ok("stop", "t1")
	e.ok("start", "t1")
	if got := e.ok("cat", "t1", "f.txt"); got != "kept\n" {
		t.Errorf("t1 after a cold start: %q", got)
	}

	// A broken template: the create boots cold and says why.
	snaps, _ := filepath.Glob(filepath.Join(link, "*", "memory.snap"))
	if len(snaps) != 1 {
		t.Fatalf("templates: %v", snaps)
	}
	os.Truncate(snaps[0], 4096)
	e.ok("create", "t3")
	if s := e.info("t3"); !strings.Contains(s.Cause, "cold") {
		t.Errorf("create from a broken template: cause %q", s.Cause)
	}
	if !strings.Contains(e.ok("events", "t3"), "template unusable") {
		t.Errorf("the timeline does not say why:\n%s", e.ok("events", "t3"))
	}
	if got := e.ok("exec", "t3", "--", "echo", "ok"); got != "ok\n" {
		t.Errorf("t3: %q", got)
	}
	for _, n := range []string{"t1", "t2", "t3"} {
		e.ok("delete", n, "--yes")
	}
}

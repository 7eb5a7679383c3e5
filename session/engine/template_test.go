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
	link := filepath.Join(e.Data, "templates")
	os.Remove(link)
	os.Mkdir(link, 0o755)
	os.WriteFile(filepath.Join(e.Data, "config.toml"), []byte("memory = \"256M\"\ndisk = \"64M\"\nidle_timeout = \"0\"\n"), 0o644)
	e.StartDaemon()

	e.OK("create", "t1")
	if s := e.Info("t1"); !strings.Contains(s.Cause, "template") {
		t.Errorf("first create: cause %q, want a template restore", s.Cause)
	}
	e.OK("exec", "t1", "--", "sh", "-c", "echo kept > f.txt")
	start := time.Now()
	e.OK("create", "t2")
	t.Logf("create from a template took %s", time.Since(start))
	if got := e.OK("exec", "t2", "--", "sh", "-c", "ls /workspace; cat /proc/mounts | grep -c ' /workspace '"); !strings.Contains(got, "lost+found") || strings.Contains(got, "f.txt") {
		t.Errorf("t2's workspace: %q (must be its own, mounted)", got)
	}
	// Sessions restored from one template share no state.
	if a, b := e.OK("exec", "t1", "--", "cat", "/proc/sys/kernel/random/uuid"), e.OK("exec", "t2", "--", "cat", "/proc/sys/kernel/random/uuid"); a == b {
		t.Errorf("two sessions from one template drew the same random UUID %q", a)
	}
	// A session with a hot-plugged workspace sleeps and wakes like any.
	e.OK("exec", "t2", "--", "sh", "-c", "echo durable > d.txt")
	e.OK("sleep", "t2")
	if got := e.OK("exec", "t2", "--", "cat", "d.txt"); got != "durable\n" {
		t.Errorf("after sleep: %q", got)
	}
	e.OK("stop", "t1")
	e.OK("start", "t1")
	if got := e.OK("cat", "t1", "f.txt"); got != "kept\n" {
		t.Errorf("t1 after a cold start: %q", got)
	}

	// A broken template: the create boots cold and says why.
	snaps, _ := filepath.Glob(filepath.Join(link, "*", "memory.snap"))
	if len(snaps) != 1 {
		t.Fatalf("templates: %v", snaps)
	}
	os.Truncate(snaps[0], 4096)
	e.OK("create", "t3")
	if s := e.Info("t3"); !strings.Contains(s.Cause, "cold") {
		t.Errorf("create from a broken template: cause %q", s.Cause)
	}
	if !strings.Contains(e.OK("events", "t3"), "template unusable") {
		t.Errorf("the timeline does not say why:\n%s", e.OK("events", "t3"))
	}
	if got := e.OK("exec", "t3", "--", "echo", "ok"); got != "ok\n" {
		t.Errorf("t3: %q", got)
	}
	for _, n := range []string{"t1", "t2", "t3"} {
		e.OK("delete", n, "--yes")
	}
}

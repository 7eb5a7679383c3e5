package engine_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/vmm/vmmtest"
)

// newDebianEnv is an env whose data directory shares the debian image
// (built once per machine, cached by its inputs).
func newDebianEnv(t *testing.T) *env {
	if testing.Short() {
		t.Skip("boots VMs")
	}
	vmmtest.Debian(t)
	return newEnv(t)
}

// A Debian guest: packages, python, git, and a system disk that stays
// with the session through everything but replace.
func TestDebianSystemDisk(t *testing.T) {
	e := newDebianEnv(t)
	e.StartDaemon()
	e.OK("create", "deb", "--image", "debian", "--disk", "256M")

	t.Run("an ordinary Debian system", func(t *testing.T) {
		out := e.OK("exec", "deb", "--", "sh", "-c", `. /etc/os-release; echo "$ID $VERSION_ID"; hostname; echo "$HOME"; pwd
python3 -c 'import sys, venv; print("py", sys.getdefaultencoding(), sys.stdout.encoding)'
cat /etc/machine-id`)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 6 || lines[0] != "debian 12" || lines[1] != "deb" || lines[2] != "/root" || lines[3] != "/workspace" ||
			lines[4] != "py utf-8 utf-8" || len(lines[5]) != 32 {
			t.Fatalf("guest says:\n%s", out)
		}
		e.OK("exec", "deb", "--", "sh", "-c", `git init -q repo && cd repo && echo hi > f && git add f &&
git -c user.name=t -c user.email=t@t commit -qm first && git log --oneline | grep -q first`)
		s := e.Info("deb")
		if s.SystemBytes == 0 || s.HomeDirectory != "/root" || s.RootDirectory != "/workspace" || s.ImageDigest == "" {
			t.Errorf("info: system %d, home %q, root %q, digest %q", s.SystemBytes, s.HomeDirectory, s.RootDirectory, s.ImageDigest)
		}
	})

	write := func(tag string) {
		t.Helper()
		e.OK("exec", "deb", "--", "sh", "-c", "echo "+tag+" > /etc/berth-probe && mkdir -p /usr/local/share && echo "+tag+" > /usr/local/share/probe")
	}
	check := func(tag, after string) {
		t.Helper()
		out := e.OK("exec", "deb", "--", "cat", "/etc/berth-probe", "/usr/local/share/probe")
		if out != tag+"\n"+tag+"\n" {
			t.Errorf("after %s: system files read %q, want %q twice", after, out, tag)
		}
	}

	write("stop")
	e.OK("stop", "deb")
	e.OK("start", "deb")
	check("stop", "stop/start")

	write("sleep")
	e.OK("sleep", "deb")
	e.WaitState("deb", session.StateSleeping, time.Second)
	check("sleep", "sleep/wake")

	write("crash")
	e.OK("flush", "deb")
	syscall.Kill(e.VMMPid("deb"), syscall.SIGKILL)
	e.WaitState("deb", session.StateCrashed, 5*time.Second)
	e.OK("start", "deb")
	check("crash", "kill -9 of the VMM and start")

	write("daemon")
	e.OK("flush", "deb")
	e.KillDaemon()
	e.StartDaemon()
	check("daemon", "kill -9 of the daemon")

	t.Run("sessions of one image do not share system changes", func(t *testing.T) {
		e.OK("create", "other", "--image", "debian", "--disk", "64M")
		if r := e.Run("exec", "other", "--", "cat", "/etc/berth-probe"); r.Code == 0 {
			t.Errorf("a second session sees the first one's /etc: %q", r.Stdout)
		}
		a := e.OK("exec", "deb", "--", "cat", "/etc/machine-id")
		b := e.OK("exec", "other", "--", "cat", "/etc/machine-id")
		if a == b {
			t.Errorf("two sessions share machine-id %s", a)
		}
		e.OK("delete", "other", "--yes")
	})
	e.OK("delete", "deb", "--yes")
}

// Replace drops the VM's system changes and keeps /workspace byte-exact.
func TestReplace(t *testing.T) {
	e := newDebianEnv(t)
	e.StartDaemon()
	e.OK("create", "rep", "--image", "debian", "--disk", "128M")
	e.OK("exec", "rep", "--", "sh", "-c", "echo mine > /etc/mine && head -c 3000000 /dev/urandom > /workspace/data && sha256sum /workspace/data > /workspace/sum")
	before := e.OK("exec", "rep", "--", "sha256sum", "/workspace/data")
	oldID := e.OK("exec", "rep", "--", "cat", "/etc/machine-id")
	e.Fails("stdin is not a terminal", "replace", "rep")
	if r := e.RunIn("wrong\n", "replace", "rep"); r.Code == 0 {
		t.Fatal("replace went ahead without the name typed")
	}
	out := e.OK("replace", "rep", "--yes")
	if !strings.Contains(out, "dropped") || !strings.Contains(out, "/workspace kept") {
		t.Errorf("replace said %q", out)
	}
	if r := e.Run("exec", "rep", "--", "cat", "/etc/mine"); r.Code == 0 {
		t.Errorf("replace kept the old system disk's /etc/mine: %q", r.Stdout)
	}
	if after := e.OK("exec", "rep", "--", "sha256sum", "/workspace/data"); after != before {
		t.Errorf("replace changed /workspace: %q, was %q", after, before)
	}
	if id := e.OK("exec", "rep", "--", "cat", "/etc/machine-id"); id == oldID {
		t.Error("the replaced VM kept its machine-id")
	}
	if !strings.Contains(e.OK("events", "rep"), "replaced") {
		t.Error("the timeline does not record the replacement")
	}
	// A missing system disk: the session does not start and names replace.
	e.OK("stop", "rep")
	os.Remove(filepath.Join(e.Data, "sessions", "rep", "system.img"))
	e.Fails("berth replace rep", "start", "rep")
	e.OK("replace", "rep", "--yes")
	e.OK("exec", "rep", "--", "true")
	// A corrupt one: the same.
	e.OK("stop", "rep")
	f, err := os.OpenFile(filepath.Join(e.Data, "sessions", "rep", "system.img"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt(make([]byte, 4096), 0) // the superblock is at 1024
	f.Close()
	e.Fails("berth replace rep", "start", "rep")
	e.OK("replace", "rep", "--yes")
	e.OK("exec", "rep", "--", "true")
	e.OK("delete", "rep", "--yes")
}

// A recipe: files and setup steps on debian, run in a build VM; cached;
// a failing one leaves nothing.
func TestRecipe(t *testing.T) {
	e := newDebianEnv(t)
	e.StartDaemon()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "hello.sh"), []byte("#!/bin/sh\necho hello from the recipe\n"), 0o755)
	recipe := filepath.Join(dir, "tools.toml")
	os.WriteFile(recipe, []byte(`name = "tools"
base = "debian"
files = { "hello.sh" = "/usr/local/bin/hello" }
run = ["echo built > /etc/built-by-recipe", "python3 -c 'import sys; print(sys.version)'"]
`), 0o644)
	out := e.OK("image", "build", "--recipe", recipe)
	if !strings.Contains(out, "built image tools") {
		t.Errorf("build said:\n%s", out)
	}
	start := time.Now()
	if out := e.OK("image", "build", "--recipe", recipe); !strings.Contains(out, "up to date") {
		t.Errorf("rebuild said:\n%s", out)
	}
	t.Logf("rebuild with no change took %s", time.Since(start))
	e.OK("create", "tl", "--image", "tools", "--disk", "64M")
	if got := e.OK("exec", "tl", "--", "sh", "-c", "hello; cat /etc/built-by-recipe"); got != "hello from the recipe\nbuilt\n" {
		t.Errorf("a session of the recipe's image sees %q", got)
	}
	if out := e.OK("image", "ls"); !strings.Contains(out, "tools") || !strings.Contains(out, "tl") {
		t.Errorf("image ls:\n%s", out)
	}
	e.Fails("used by tl", "image", "rm", "tools")

	bad := filepath.Join(dir, "bad.toml")
	for _, c := range []struct{ body, want string }{
		{"name = \"bad\"\nbase = \"debian\"\nrun = [\"echo about to fail\", \"echo oops >&2; exit 3\"]\n", "exited with code 3: oops"},
		{"name = \"bad\"\nbase = \"debian\"\nrun = [\"sleep 60\"]\nstep_timeout = \"2s\"\n", "timed out after 2s"},
		{"name = \"bad\"\nbase = \"debian\"\nextra = 1\n", `unknown key "extra"`},
		{"name = \"tools\"\nbase = \"debian-minimal\"\n", "already exists"},
	} {
		os.WriteFile(bad, []byte(c.body), 0o644)
		e.Fails(c.want, "image", "build", "--recipe", bad)
	}
	if strings.Contains(e.OK("image", "ls"), "bad") {
		t.Error("a failed build left an image")
	}
	if m, _ := filepath.Glob(filepath.Join(e.Data, "images", "bad")); len(m) > 0 {
		if ents, _ := os.ReadDir(m[0]); len(ents) > 0 {
			t.Errorf("a failed build left files: %v", ents)
		}
	}
	e.OK("delete", "tl", "--yes")
	e.OK("image", "rm", "tools")
}

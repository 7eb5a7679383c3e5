package session_test

import (
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
	e.startDaemon()
	e.ok("create", "deb", "--image", "debian", "--disk", "256M")

	t.Run("an ordinary Debian system", func(t *testing.T) {
		out := e.ok("exec", "deb", "--", "sh", "-c", `. /etc/os-release; echo "$ID $VERSION_ID"; hostname; echo "$HOME"; pwd
python3 -c 'import sys, venv; print("py", sys.getdefaultencoding(), sys.stdout.encoding)'
cat /etc/machine-id`)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 6 || lines[0] != "debian 12" || lines[1] != "deb" || lines[2] != "/root" || lines[3] != "/workspace" ||
			lines[4] != "py utf-8 utf-8" || len(lines[5]) != 32 {
			t.Fatalf("guest says:\n%s", out)
		}
		e.ok("exec", "deb", "--", "sh", "-c", `git init -q repo && cd repo && echo hi > f && git add f &&
git -c user.name=t -c user.email=t@t commit -qm first && git log --oneline | grep -q first`)
		s := e.info("deb")
		if s.SystemBytes == 0 || s.HomeDirectory != "/root" || s.RootDirectory != "/workspace" || s.ImageDigest == "" {
			t.Errorf("info: system %d, home %q, root %q, digest %q", s.SystemBytes, s.HomeDirectory, s.RootDirectory, s.ImageDigest)
		}
	})

	write := func(tag string) {
		t.Helper()
		e.ok("exec", "deb", "--", "sh", "-c", "echo "+tag+" > /etc/berth-probe && mkdir -p /usr/local/share && echo "+tag+" > /usr/local/share/probe")
	}
	check := func(tag, after string) {
		t.Helper()
		out := e.ok("exec", "deb", "--", "cat", "/etc/berth-probe", "/usr/local/share/probe")
		if out != tag+"\n"+tag+"\n" {
			t.Errorf("after %s: system files read %q, want %q twice", after, out, tag)
		}
	}

	write("stop")
	e.ok("stop", "deb")
	e.ok("start", "deb")
	check("stop", "stop/start")

	write("sleep")
	e.ok("sleep", "deb")
	e.waitState("deb", session.StateSleeping, time.Second)
	check("sleep", "sleep/wake")

	write("crash")
	e.ok("flush", "deb")
	syscall.Kill(e.vmmPid("deb"), syscall.SIGKILL)
	e.waitState("deb", session.StateCrashed, 5*time.Second)
	e.ok("start", "deb")
	check("crash", "kill -9 of the VMM and start")

	write("daemon")
	e.ok("flush", "deb")
	e.killDaemon()
	e.startDaemon()
	check("daemon", "kill -9 of the daemon")

	t.Run("sessions of one image do not share system changes", func(t *testing.T) {
		e.ok("create", "other", "--image", "debian", "--disk", "64M")
		if r := e.run("exec", "other", "--", "cat", "/etc/berth-probe"); r.code == 0 {
			t.Errorf("a second session sees the first one's /etc: %q", r.stdout)
		}
		a := e.ok("exec", "deb", "--", "cat", "/etc/machine-id")
		b := e.ok("exec", "other", "--", "cat", "/etc/machine-id")
		if a == b {
			t.Errorf("two sessions share machine-id %s", a)
		}
		e.ok("delete", "other", "--yes")
	})
	e.ok("delete", "deb", "--yes")
}

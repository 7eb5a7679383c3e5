package engine_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/berthvm/berth/session"
)

// imageInfo is image ls --json's entry for the current build of name.
func (e *env) imageInfo(name string) session.ImageInfo {
	e.t.Helper()
	var list []session.ImageInfo
	if err := json.Unmarshal([]byte(e.ok("image", "ls", "--json")), &list); err != nil {
		e.t.Fatal(err)
	}
	for _, im := range list {
		if im.Name == name && im.Current {
			return im
		}
	}
	e.t.Fatalf("image ls does not list %s", name)
	return session.ImageInfo{}
}

// TestCommitEndToEnd commits a running debian session as an image and
// creates sessions from it (from its template): they see the session's
// system changes, including a deletion, but not what a new machine makes
// its own; a second session of debian sees none of it; the committed
// session runs on; image rm is refused while sessions or committed
// images use an image, naming them.
func TestCommitEndToEnd(t *testing.T) {
	e := newDebianEnv(t)
	e.startDaemon()
	e.ok("create", "src", "--image", "debian", "--disk", "64M")
	e.ok("exec", "src", "--", "sh", "-c", `set -e
echo from src > /etc/commit-probe
mkdir -p /opt/tool && head -c 3000000 /dev/urandom > /opt/tool/blob && sha256sum /opt/tool/blob > /opt/tool/sum
rm /etc/motd
mkdir -p /etc/ssh && echo SECRET-HOST-KEY > /etc/ssh/ssh_host_ed25519_key && echo pub > /etc/ssh/ssh_host_ed25519_key.pub
mkdir -p /var/cache/apt/archives && echo deb > /var/cache/apt/archives/tool_1_amd64.deb
echo scratch > /var/tmp/scratch`)
	srcID := strings.TrimSpace(e.ok("exec", "src", "--", "cat", "/etc/machine-id"))
	debian := e.imageInfo("debian")

	out := e.ok("image", "commit", "src", "app", "--label", "tool in /opt")
	t.Logf("image commit:\n%s", out)
	for _, want := range []string{
		"image app (", "committed from session src on debian@" + debian.Digest,
		"1 path of the image deleted", "most change:", "/opt/tool", "left out", "machine id", "SSH host keys", "apt's caches", "/tmp and /var/tmp",
		"commands frozen for",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("image commit does not say %q", want)
		}
	}
	app := e.imageInfo("app")
	if app.Parent != "debian@"+debian.Digest || app.Label != "tool in /opt" || app.Source != "session:src" || app.Layers != debian.Layers+1 {
		t.Errorf("image ls --json: %+v; want parent debian@%s, the label, %d layers", app, debian.Digest, debian.Layers+1)
	}
	if ls := e.ok("image", "ls"); !strings.Contains(ls, "session:src on debian@"+debian.Digest) {
		t.Errorf("image ls does not show the parent:\n%s", ls)
	}
	e.subtest(t, "the committed session runs on", func(t *testing.T) {
		if got := e.ok("exec", "src", "--", "sh", "-c", "cat /etc/commit-probe; echo after > /etc/after-commit; cat /etc/machine-id"); got != "from src\n"+srcID+"\n" {
			t.Errorf("the session after its commit: %q", got)
		}
	})

	e.ok("create", "fromapp", "--image", "app", "--disk", "64M")
	e.subtest(t, "a session of the committed image", func(t *testing.T) {
		got := e.ok("exec", "fromapp", "--", "sh", "-c", `cat /etc/commit-probe; cd /opt/tool && sha256sum -c --quiet sum && echo blob intact
for f in /etc/motd /etc/ssh/ssh_host_ed25519_key /etc/ssh/ssh_host_ed25519_key.pub /var/cache/apt/archives/tool_1_amd64.deb /var/tmp/scratch /etc/after-commit; do
	test -e $f && echo "carried $f"
done
hostname; cat /etc/machine-id`)
		lines := strings.Split(strings.TrimSpace(got), "\n")
		if len(lines) != 4 || lines[0] != "from src" || lines[1] != "blob intact" || lines[2] != "fromapp" ||
			!regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(lines[3]) || lines[3] == srcID {
			t.Errorf("a session of app sees:\n%s\nwant the probe, the blob, no identity, no caches, its own hostname and machine id", got)
		}
		if s := e.info("fromapp"); !strings.Contains(s.Cause, "restored from a template") || s.Image != "app" {
			t.Errorf("created from app: image %s, cause %q; want it restored from app's template", s.Image, s.Cause)
		}
	})

	e.ok("create", "plain", "--image", "debian", "--disk", "64M")
	e.subtest(t, "a second session of the original image", func(t *testing.T) {
		if r := e.run("exec", "plain", "--", "sh", "-c", "cat /etc/commit-probe || test -e /opt/tool/blob"); r.code == 0 {
			t.Errorf("a new debian session sees the committed changes: %q", r.stdout)
		}
		if got := e.ok("exec", "plain", "--", "sh", "-c", "test -e /etc/motd && echo motd"); got != "motd\n" {
			t.Errorf("a new debian session lost /etc/motd: %q", got)
		}
	})

	e.subtest(t, "image rm refused while used", func(t *testing.T) {
		e.fails(`image "app" is used by fromapp (a session)`, "image", "rm", "app")
		e.fails("used by plain, src (sessions) and app (an image committed on it)", "image", "rm", "debian")
	})

	e.subtest(t, "refusals", func(t *testing.T) {
		e.fails(`session "nope" does not exist`, "image", "commit", "nope", "x")
		e.fails(`new image "debian" is one of berth's own images`, "image", "commit", "src", "debian")
		e.fails(`new image "Bad_Name" is not a name`, "image", "commit", "src", "Bad_Name")
		e.ok("create", "tiny", "--disk", "64M") // mini: its root is its initramfs
		e.fails("has no system disk to commit", "image", "commit", "tiny", "x")
		e.ok("pause", "tiny")
		e.fails(`cannot commit session "tiny": it is paused`, "image", "commit", "tiny", "x")
		e.ok("delete", "tiny", "--yes")
	})

	e.subtest(t, "a stopped session committed again", func(t *testing.T) {
		e.ok("stop", "src")
		out := e.ok("image", "commit", "src", "app")
		if !strings.Contains(out, "from the stopped session") {
			t.Errorf("commit of a stopped session:\n%s", out)
		}
		e.ok("create", "second", "--image", "app", "--disk", "64M")
		if got := e.ok("exec", "second", "--", "cat", "/etc/after-commit"); got != "after\n" {
			t.Errorf("the second commit's session: %q", got)
		}
		// The first build stays while fromapp uses it.
		if got := e.ok("exec", "fromapp", "--", "sh", "-c", "test -e /etc/after-commit || echo first build"); got != "first build\n" {
			t.Errorf("fromapp after the second commit: %q", got)
		}
		// Builds on one agent and kernel share their initramfs.
		if m, _ := filepath.Glob(filepath.Join(e.data, "images", "app", "*", "initramfs.cpio.gz")); len(m) != 2 {
			t.Errorf("app's builds: %v, want two", m)
		} else if a, b := statOf(t, m[0]), statOf(t, m[1]); !os.SameFile(a, b) {
			t.Error("two commits on one agent and kernel do not share their initramfs")
		}
		e.ok("delete", "second", "--yes")
	})

	for _, s := range []string{"fromapp", "plain", "src"} {
		e.ok("delete", s, "--yes")
	}
	e.ok("image", "rm", "app")
	if m, _ := filepath.Glob(filepath.Join(e.data, ".commit-*")); len(m) > 0 {
		t.Errorf("commits left work directories: %v", m)
	}
	if _, err := os.Stat(filepath.Join(e.data, "images", "app")); err == nil {
		t.Error("image rm left app's directory")
	}
}

func statOf(t *testing.T, p string) os.FileInfo {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi
}

// TestCommitCrash kills the daemon at each step of a commit of a running
// session: after a restart the session runs with its filesystems thawed
// and its files as they were, no image is listed under the name, no work
// directory is left, and the commit can be made again.
func TestCommitCrash(t *testing.T) {
	e := newDebianEnv(t)
	e.startDaemon()
	e.ok("create", "crashy", "--image", "debian", "--disk", "64M")
	e.ok("exec", "crashy", "--", "sh", "-c", "head -c 1000000 /dev/urandom > /opt/data.bin && sha256sum /opt/data.bin > /opt/data.sum")
	for _, point := range []string{"commit:frozen", "commit:copied-frozen", "commit:sealed", "commit:stored"} {
		e.subtest(t, point, func(t *testing.T) {
			e.killDaemon()
			os.Setenv("BERTH_CRASH_AT", point)
			e.startDaemon()
			os.Unsetenv("BERTH_CRASH_AT")
			if r := e.run("image", "commit", "crashy", "crashed"); r.code == 0 {
				t.Fatalf("the commit went through a crash at %s", point)
			}
			e.daemon.Wait() // the daemon died here
			e.daemon = nil
			e.startDaemon()
			if s := e.info("crashy"); s.State != session.StateRunning {
				t.Fatalf("after a crash at %s: %s (%s)", point, s.State, s.Cause)
			}
			if r := e.run("exec", "crashy", "--", "sh", "-c", "sha256sum -c --quiet /opt/data.sum && echo writable > /etc/w"); r.code != 0 {
				t.Fatalf("after a crash at %s: %s %s", point, r.stdout, r.stderr)
			}
			if strings.Contains(e.ok("image", "ls"), "crashed") {
				t.Errorf("after a crash at %s: a half-made image is listed", point)
			}
			if m, _ := filepath.Glob(filepath.Join(e.data, ".commit-*")); len(m) > 0 {
				t.Errorf("after a crash at %s: %v left", point, m)
			}
		})
	}
	e.ok("image", "commit", "crashy", "crashed")
	e.ok("delete", "crashy", "--yes")
	e.ok("image", "rm", "crashed")
}

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
	e.T.Helper()
	var list []session.ImageInfo
	if err := json.Unmarshal([]byte(e.OK("image", "ls", "--json")), &list); err != nil {
		e.T.Fatal(err)
	}
	for _, im := range list {
		if im.Name == name && im.Current {
			return im
		}
	}
	e.T.Fatalf("image ls does not list %s", name)
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
	e.StartDaemon()
	e.OK("create", "src", "--image", "debian", "--disk", "64M")
	e.OK("exec", "src", "--", "sh", "-c", `set -e
echo from src > /etc/commit-probe
mkdir -p /opt/tool && head -c 3000000 /dev/urandom > /opt/tool/blob && sha256sum /opt/tool/blob > /opt/tool/sum
rm /etc/motd
mkdir -p /etc/ssh && echo SECRET-HOST-KEY > /etc/ssh/ssh_host_ed25519_key && echo pub > /etc/ssh/ssh_host_ed25519_key.pub
mkdir -p /var/cache/apt/archives && echo deb > /var/cache/apt/archives/tool_1_amd64.deb
echo scratch > /var/tmp/scratch`)
	srcID := strings.TrimSpace(e.OK("exec", "src", "--", "cat", "/etc/machine-id"))
	debian := e.imageInfo("debian")

	out := e.OK("image", "commit", "src", "app", "--label", "tool in /opt")
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
	if ls := e.OK("image", "ls"); !strings.Contains(ls, "session:src on debian@"+debian.Digest) {
		t.Errorf("image ls does not show the parent:\n%s", ls)
	}
	e.Subtest(t, "the committed session runs on", func(t *testing.T) {
		if got := e.OK("exec", "src", "--", "sh", "-c", "cat /etc/commit-probe; echo after > /etc/after-commit; cat /etc/machine-id"); got != "from src\n"+srcID+"\n" {
			t.Errorf("the session after its commit: %q", got)
		}
	})

	e.OK("create", "fromapp", "--image", "app", "--disk", "64M")
	e.Subtest(t, "a session of the committed image", func(t *testing.T) {
		got := e.OK("exec", "fromapp", "--", "sh", "-c", `cat /etc/commit-probe; cd /opt/tool && sha256sum -c --quiet sum && echo blob intact
for f in /etc/motd /etc/ssh/ssh_host_ed25519_key /etc/ssh/ssh_host_ed25519_key.pub /var/cache/apt/archives/tool_1_amd64.deb /var/tmp/scratch /etc/after-commit; do
	test -e $f && echo "carried $f"
done
hostname; cat /etc/machine-id`)
		lines := strings.Split(strings.TrimSpace(got), "\n")
		if len(lines) != 4 || lines[0] != "from src" || lines[1] != "blob intact" || lines[2] != "fromapp" ||
			!regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(lines[3]) || lines[3] == srcID {
			t.Errorf("a session of app sees:\n%s\nwant the probe, the blob, no identity, no caches, its own hostname and machine id", got)
		}
		if s := e.Info("fromapp"); !strings.Contains(s.Cause, "restored from a template") || s.Image != "app" {
			t.Errorf("created from app: image %s, cause %q; want it restored from app's template", s.Image, s.Cause)
		}
	})

	e.OK("create", "plain", "--image", "debian", "--disk", "64M")
	e.Subtest(t, "a second session of the original image", func(t *testing.T) {
		if r := e.Run("exec", "plain", "--", "sh", "-c", "cat /etc/commit-probe || test -e /opt/tool/blob"); r.Code == 0 {
			t.Errorf("a new debian session sees the committed changes: %q", r.Stdout)
		}
		if got := e.OK("exec", "plain", "--", "sh", "-c", "test -e /etc/motd && echo motd"); got != "motd\n" {
			t.Errorf("a new debian session lost /etc/motd: %q", got)
		}
	})

	e.Subtest(t, "image rm refused while used", func(t *testing.T) {
		e.Fails(`image "app" is used by fromapp (a session)`, "image", "rm", "app")
		e.Fails("used by plain, src (sessions) and app (an image built on it)", "image", "rm", "debian")
	})

	e.Subtest(t, "refusals", func(t *testing.T) {
		e.Fails(`session "nope" does not exist`, "image", "commit", "nope", "x")
		e.Fails(`new image "debian" is one of berth's own images`, "image", "commit", "src", "debian")
		e.Fails(`new image "Bad_Name" is not a name`, "image", "commit", "src", "Bad_Name")
		e.OK("create", "tiny", "--disk", "64M") // mini: its root is its initramfs
		e.Fails("has no system disk to commit", "image", "commit", "tiny", "x")
		e.OK("pause", "tiny")
		e.Fails(`cannot commit session "tiny": it is paused`, "image", "commit", "tiny", "x")
		e.OK("delete", "tiny", "--yes")
	})

	e.Subtest(t, "a stopped session committed again", func(t *testing.T) {
		e.OK("stop", "src")
		out := e.OK("image", "commit", "src", "app")
		if !strings.Contains(out, "from the stopped session") {
			t.Errorf("commit of a stopped session:\n%s", out)
		}
		e.OK("create", "second", "--image", "app", "--disk", "64M")
		if got := e.OK("exec", "second", "--", "cat", "/etc/after-commit"); got != "after\n" {
			t.Errorf("the second commit's session: %q", got)
		}
		// The first build stays while fromapp uses it.
		if got := e.OK("exec", "fromapp", "--", "sh", "-c", "test -e /etc/after-commit || echo first build"); got != "first build\n" {
			t.Errorf("fromapp after the second commit: %q", got)
		}
		// Builds on one agent and kernel share their initramfs.
		if m, _ := filepath.Glob(filepath.Join(e.Data, "images", "app", "*", "initramfs.cpio.gz")); len(m) != 2 {
			t.Errorf("app's builds: %v, want two", m)
		} else if a, b := statOf(t, m[0]), statOf(t, m[1]); !os.SameFile(a, b) {
			t.Error("two commits on one agent and kernel do not share their initramfs")
		}
		e.OK("delete", "second", "--yes")
	})

	for _, s := range []string{"fromapp", "plain", "src"} {
		e.OK("delete", s, "--yes")
	}
	e.OK("image", "rm", "app")
	if m, _ := filepath.Glob(filepath.Join(e.Data, ".commit-*")); len(m) > 0 {
		t.Errorf("commits left work directories: %v", m)
	}
	if _, err := os.Stat(filepath.Join(e.Data, "images", "app")); err == nil {
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
	e.StartDaemon()
	e.OK("create", "crashy", "--image", "debian", "--disk", "64M")
	e.OK("exec", "crashy", "--", "sh", "-c", "head -c 1000000 /dev/urandom > /opt/data.bin && sha256sum /opt/data.bin > /opt/data.sum")
	for _, point := range []string{"commit:frozen", "commit:copied-frozen", "commit:sealed", "commit:stored"} {
		e.Subtest(t, point, func(t *testing.T) {
			e.KillDaemon()
			os.Setenv("BERTH_CRASH_AT", point)
			e.StartDaemon()
			os.Unsetenv("BERTH_CRASH_AT")
			if r := e.Run("image", "commit", "crashy", "crashed"); r.Code == 0 {
				t.Fatalf("the commit went through a crash at %s", point)
			}
			e.Daemon.Wait() // the daemon died here
			e.Daemon = nil
			e.StartDaemon()
			if s := e.Info("crashy"); s.State != session.StateRunning {
				t.Fatalf("after a crash at %s: %s (%s)", point, s.State, s.Cause)
			}
			if r := e.Run("exec", "crashy", "--", "sh", "-c", "sha256sum -c --quiet /opt/data.sum && echo writable > /etc/w"); r.Code != 0 {
				t.Fatalf("after a crash at %s: %s %s", point, r.Stdout, r.Stderr)
			}
			if strings.Contains(e.OK("image", "ls"), "crashed") {
				t.Errorf("after a crash at %s: a half-made image is listed", point)
			}
			if m, _ := filepath.Glob(filepath.Join(e.Data, ".commit-*")); len(m) > 0 {
				t.Errorf("after a crash at %s: %v left", point, m)
			}
		})
	}
	e.OK("image", "commit", "crashy", "crashed")
	e.OK("delete", "crashy", "--yes")
	e.OK("image", "rm", "crashed")
}

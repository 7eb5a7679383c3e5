package engine_test

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/berthvm/berth/session"
)

// TestImportedUserAndCreateFrom imports a busybox image whose config runs
// as user app (uid 1000) and boots sessions of it through the CLI and the
// daemon: commands and their files are app's, --user root overrides, the
// workspace is app's; a session made from a checkpoint of it has the
// checkpoint's system disk (a file in /etc, not one written after it),
// its own identity and system disk UUID, and still runs as app; once
// the image is gone, a create from that checkpoint is refused in one line.
func TestImportedUserAndCreateFrom(t *testing.T) {
	bb := staticBusybox(t)
	archive := userImage(t, bb)
	e, data := newImageEnv(t, false)
	if r := e.RunIn(string(archive), "image", "import", "-", "--name", "app"); r.Code != 0 {
		t.Fatalf("image import: exit %d: %s%s", r.Code, r.Stdout, r.Stderr)
	} else if !strings.Contains(r.Stdout, "run as app") {
		t.Errorf("the import does not say commands run as app:\n%s", r.Stdout)
	}
	e.OK("create", "u1", "--image", "app", "--memory", "256M", "--disk", "64M")

	e.Subtest(t, "the image's user", func(t *testing.T) {
		if got := e.out("u1", `echo "$(id -u):$(id -g) $HOME $USER"; stat -c %u:%g /workspace`); got != "1000:1000 /home/app app\n1000:1000" {
			t.Errorf("as the image's user: %q, want app's ids, home and name, and /workspace app's", got)
		}
		if got := e.out("u1", "echo mine > mine.txt && stat -c %u mine.txt"); got != "1000" {
			t.Errorf("a file app writes in /workspace: owner %q", got)
		}
		if got := strings.TrimSpace(e.OK("exec", "u1", "--user", "root", "--", "id", "-u")); got != "0" {
			t.Errorf("--user root: id -u = %q", got)
		}
		if got := strings.TrimSpace(e.OK("exec", "u1", "--user", "0:1000", "--", "sh", "-c", "echo $(id -u):$(id -g)")); got != "0:1000" {
			t.Errorf("--user 0:1000: %q", got)
		}
		if r := e.Run("exec", "u1", "--user", "ghost", "--", "true"); r.Code != 127 || !strings.Contains(r.Stderr, `cannot run as user "ghost"`) || strings.Count(strings.TrimSpace(r.Stderr), "\n") != 0 {
			t.Errorf("--user ghost: exit %d, stderr %q; want 127 and one line naming the user", r.Code, r.Stderr)
		}
		var execs []session.Execution
		json.Unmarshal([]byte(e.OK("ps", "u1", "--all", "--json")), &execs)
		users := map[string]bool{}
		for _, x := range execs {
			users[x.User] = true
		}
		if !users["app"] || !users["root"] {
			t.Errorf("the records do not say whom commands ran as: %v", users)
		}
	})

	e.OK("exec", "u1", "--user", "root", "--", "sh", "-c", "echo marker > /etc/marker")
	e.OK("checkpoint", "u1")
	ck := e.lastCheckpoint("u1")
	e.OK("exec", "u1", "--user", "root", "--", "sh", "-c", "echo later > /etc/later && rm /workspace/mine.txt")
	e.Subtest(t, "create --from a checkpoint with a system disk", func(t *testing.T) {
		e.OK("create", "u2", "--from", "u1@"+ck)
		if got := e.out("u2", "cat /etc/marker mine.txt; test -e /etc/later && echo later-exists; id -u"); got != "marker\nmine\n1000" {
			t.Errorf("u2 sees %q, want the checkpoint's /etc/marker and mine.txt, not /etc/later, as app", got)
		}
		src, got := strings.Fields(e.out("u1", identity)), strings.Fields(e.out("u2", identity))
		if len(src) != 3 || len(got) != 3 || got[0] != "u2" || got[1] == src[1] || got[2] == src[2] {
			t.Errorf("identity: u1 %q, u2 %q", src, got)
		}
		e.OK("flush", "u2")
		sys := func(name string) string { return fsUUID(t, filepath.Join(data, "sessions", name, "system.img")) }
		if a, b, c := sys("u1"), sys("u2"), fsUUID(t, filepath.Join(data, "sessions", "u1", "checkpoints", ck, "system.img")); a == "" || b == a || b == c {
			t.Errorf("system disk UUIDs: u1 %q, u2 %q, the checkpoint's %q", a, b, c)
		}
		e.OK("delete", "u2", "--yes")
	})

	e.Subtest(t, "create --from a run's starting point (the workspace only)", func(t *testing.T) {
		e.OK("exec", "u1", "--", "sh", "-c", "echo at-start > /workspace/start.txt")
		run := strings.TrimSpace(e.OK("run", "start", "u1", "--keep", "--title", "from-start"))
		e.OK("exec", "u1", "--", "sh", "-c", "echo in-run > /workspace/start.txt")
		var rs []session.Run
		if err := json.Unmarshal([]byte(e.OK("runs", "u1", "--json")), &rs); err != nil {
			t.Fatal(err)
		}
		var start string
		for _, r := range rs {
			if r.ID == run {
				start = r.Checkpoint
			}
		}
		if start == "" {
			t.Fatalf("run %s kept no starting point: %+v", run, rs)
		}
		e.OK("create", "u3", "--from", "u1@"+start)
		// The workspace as the run found it, a fresh system disk (none of
		// u1's /etc changes), the image's user.
		if got := e.out("u3", "cat start.txt; test -e /etc/marker && echo marker-carried; id -u"); got != "at-start\n1000" {
			t.Errorf("u3 from a workspace-only checkpoint sees %q, want the run's start, a fresh system disk, uid 1000", got)
		}
		e.OK("run", "end", run)
		e.OK("delete", "u3", "--yes")
	})

	e.Subtest(t, "a checkpoint whose image is gone", func(t *testing.T) {
		e.OK("replace", "u1", "--image", "mini", "--yes")
		e.OK("image", "rm", "app")
		e.Fails("--from u1@"+ck+": checkpoint "+ck+" runs on image app@", "create", "x", "--from", "u1@"+ck)
		if r := e.Run("info", "x"); r.Code == 0 {
			t.Error("a refused create left session x")
		}
	})
	e.OK("delete", "u1", "--yes")
}

// userImage is a one-layer busybox image, as a docker save archive, whose
// config runs as user app (1000:1000) with its home /home/app.
func userImage(t *testing.T, busybox []byte) []byte {
	t.Helper()
	ents := []tarEnt{
		{name: "bin/", typ: tar.TypeDir, mode: 0o755},
		{name: "bin/busybox", typ: tar.TypeReg, mode: 0o755, body: busybox},
		{name: "etc/", typ: tar.TypeDir, mode: 0o755},
		{name: "etc/passwd", typ: tar.TypeReg, mode: 0o644, body: []byte("root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:App:/home/app:/bin/sh\n")},
		{name: "etc/group", typ: tar.TypeReg, mode: 0o644, body: []byte("root:x:0:\napp:x:1000:\n")},
		{name: "home/", typ: tar.TypeDir, mode: 0o755},
		{name: "home/app/", typ: tar.TypeDir, mode: 0o755, uid: 1000, gid: 1000},
		{name: "root/", typ: tar.TypeDir, mode: 0o700},
		{name: "tmp/", typ: tar.TypeDir, mode: 0o1777},
	}
	for _, app := range []string{"sh", "echo", "cat", "test", "id", "stat", "rm", "hostname", "true", "sync"} {
		ents = append(ents, tarEnt{name: "bin/" + app, typ: tar.TypeSymlink, mode: 0o777, link: "busybox"})
	}
	img, err := mutate.AppendLayers(empty.Image, static.NewLayer(tarOf(t, ents), types.DockerUncompressedLayer))
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Env = []string{"PATH=/bin"}
	cf.Config.User = "app"
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag("example.com/user:1")
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := tarball.Write(tag, img, &b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

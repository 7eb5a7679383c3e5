package engine_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
)

// identity is what makes a VM a machine of its own, as the fork test
// reads it: hostname, machine id, boot id.
const identity = "hostname; cat /etc/machine-id; cat /proc/sys/kernel/random/boot_id"

// TestCreateFromCheckpoint makes sessions from checkpoints of another
// through the CLI and the daemon: one from a disk checkpoint sees the
// checkpoint's files and not those written after it, one from a memory
// checkpoint has the source's process still running; each has its own
// hostname, machine id, boot id and workspace UUID, and shares no file
// with the source. Refusals are one line.
func TestCreateFromCheckpoint(t *testing.T) {
	e := newEnv(t)
	os.WriteFile(filepath.Join(e.Data, "config.toml"), []byte(ckptConfig), 0o644)
	e.StartDaemon()
	e.OK("create", "src")
	e.OK("exec", "src", "--", "sh", "-c", "head -c 2000000 /dev/urandom > data.bin && sha256sum data.bin > data.sum && echo kept > kept.txt")
	e.OK("checkpoint", "src", "--label", "disks")
	disks := e.lastCheckpoint("src")
	e.OK("exec", "src", "--", "sh", "-c", "head -c 1000 /dev/urandom > data.bin && rm kept.txt && echo later > later.txt")
	sdir := filepath.Join(e.Data, "sessions", "src")

	// ownIdentity checks that name is a machine of its own, not src.
	ownIdentity := func(t *testing.T, name string) {
		t.Helper()
		src, got := strings.Fields(e.out("src", identity)), strings.Fields(e.out(name, identity))
		if len(src) != 3 || len(got) != 3 {
			t.Fatalf("identity: source %q, %s %q", src, name, got)
		}
		if got[0] != name {
			t.Errorf("%s's hostname is %q", name, got[0])
		}
		for i, what := range []string{"hostname", "machine-id", "boot id"} {
			if got[i] == src[i] {
				t.Errorf("%s's %s is the source's: %s", name, what, got[i])
			}
		}
		e.OK("flush", name)
		ndir := filepath.Join(e.Data, "sessions", name)
		if a, b := fsUUID(t, filepath.Join(sdir, "workspace.img")), fsUUID(t, filepath.Join(ndir, "workspace.img")); a == "" || a == b {
			t.Errorf("workspace filesystem UUIDs: source %q, %s %q", a, name, b)
		}
		if a, b := fsUUID(t, filepath.Join(sdir, "checkpoints", disks, "workspace.img")), fsUUID(t, filepath.Join(ndir, "workspace.img")); a == b {
			t.Errorf("%s's workspace has the checkpoint's filesystem UUID %q", name, a)
		}
		fds, _ := filepath.Glob("/proc/" + itoa(e.VMMPid(name)) + "/fd/*")
		for _, fd := range fds {
			if p, _ := os.Readlink(fd); strings.HasPrefix(p, sdir+"/") {
				t.Errorf("%s's VMM has the source's %s open", name, p)
			}
		}
	}

	e.Subtest(t, "from a disk checkpoint", func(t *testing.T) {
		start := time.Now()
		out := e.OK("create", "new1", "--from", "src@"+disks)
		t.Logf("create --from src@%s took %s: %s", disks, time.Since(start), strings.TrimSpace(out))
		if !strings.Contains(out, "created from checkpoint src@"+disks) {
			t.Errorf("create --from said %q", out)
		}
		if r := e.Run("exec", "new1", "--", "sha256sum", "-c", "data.sum"); r.Code != 0 {
			t.Fatalf("new1 does not have the checkpoint's data.bin: %s%s", r.Stdout, r.Stderr)
		}
		if got := e.out("new1", "cat kept.txt; test -e later.txt && echo later-exists; true"); got != "kept" {
			t.Errorf("new1 sees %q, want the checkpoint's kept.txt and not the later file", got)
		}
		ownIdentity(t, "new1")
		// Independent of the source from here.
		e.OK("exec", "new1", "--", "sh", "-c", "echo mine > only-new1.txt")
		if got := e.out("src", "test -e only-new1.txt && echo leaked; cat later.txt"); got != "later" {
			t.Errorf("the source after a write in new1: %q", got)
		}
		if s := e.Info("new1"); s.State != session.StateRunning || s.DiskBytes != e.Info("src").DiskBytes || s.Checkpoints != 0 {
			t.Errorf("new1: %+v", s)
		}
		if tl := e.OK("events", "new1"); !strings.Contains(tl, "created from checkpoint "+disks+" of src") {
			t.Errorf("new1's timeline does not name the checkpoint:\n%s", tl)
		}
		// A cold start mounts its own workspace by its new UUID.
		e.OK("stop", "new1")
		e.OK("start", "new1")
		if got := e.out("new1", "cat only-new1.txt kept.txt"); got != "mine\nkept" {
			t.Errorf("new1 after a cold start: %q", got)
		}
		e.OK("delete", "new1", "--yes")
	})

	e.Subtest(t, "from a memory checkpoint", func(t *testing.T) {
		e.startCounter("src")
		e.OK("checkpoint", "src", "--memory")
		mem := e.lastCheckpoint("src")
		e.OK("exec", "src", "--", "sh", "-c", "echo after > after-mem.txt")
		// --from NAME: its newest checkpoint, this one.
		start := time.Now()
		out := e.OK("create", "new2", "--from", "src")
		t.Logf("create --from src (%s, with memory) took %s: %s", mem, time.Since(start), strings.TrimSpace(out))
		if !strings.Contains(out, "created from checkpoint src@"+mem) || !strings.Contains(out, "memory resumed") {
			t.Errorf("create --from said %q", out)
		}
		// /tmp is in memory: the counter is there, and counts, only if the
		// checkpoint's processes went on.
		n := e.counter("new2")
		time.Sleep(300 * time.Millisecond)
		if again := e.counter("new2"); n <= 0 || again <= n {
			t.Errorf("the source's counting process does not run in new2: %d then %d", n, again)
		}
		if got := e.out("new2", "cat later.txt; test -e after-mem.txt && echo after-exists; true"); got != "later" {
			t.Errorf("new2 sees %q, want the memory checkpoint's files", got)
		}
		ownIdentity(t, "new2")
		if tl := e.OK("events", "src"); !strings.Contains(tl, "checkpoint "+mem+" copied into new session new2") {
			t.Errorf("the source's timeline does not say its checkpoint was used:\n%s", tl)
		}
		e.OK("delete", "new2", "--yes")
	})

	e.Subtest(t, "refusals", func(t *testing.T) {
		e.Fails(`--from src@c99: session "src" has no checkpoint "c99"`, "create", "x", "--from", "src@c99")
		e.Fails(`--from ghost: there is no session "ghost"`, "create", "x", "--from", "ghost")
		e.Fails(`--disk cannot be chosen for a session made from a checkpoint`, "create", "x", "--from", "src", "--disk", "64M")
		e.Fails(`--memory 512M differs from the 256M of the VM in the checkpoint`, "create", "x", "--from", "src", "--memory", "512M")
		e.Fails("already exists", "create", "src", "--from", "src@"+disks)
		if r := e.Run("info", "x"); r.Code == 0 {
			t.Error("a refused create from a checkpoint left session x")
		}
	})
	e.OK("delete", "src", "--yes")
}

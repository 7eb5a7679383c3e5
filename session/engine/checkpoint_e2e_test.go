package engine_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
)

const ckptConfig = "memory = \"256M\"\ndisk = \"128M\"\nidle_timeout = \"0\"\n"

func (e *env) checkpoints(name string) []session.Checkpoint {
	e.T.Helper()
	var l []session.Checkpoint
	if err := json.Unmarshal([]byte(e.OK("checkpoints", name, "--json")), &l); err != nil {
		e.T.Fatal(err)
	}
	return l
}

// lastCheckpoint is the newest checkpoint's id.
func (e *env) lastCheckpoint(name string) string {
	e.T.Helper()
	l := e.checkpoints(name)
	if len(l) == 0 {
		e.T.Fatalf("%s has no checkpoints", name)
	}
	return l[len(l)-1].ID
}

func (e *env) out(name string, script string) string {
	e.T.Helper()
	return strings.TrimSpace(e.OK("exec", name, "--", "sh", "-c", script))
}

// startCounter starts a background process outside any recorded command
// that counts in /tmp/counter (in memory: a cold boot loses it).
func (e *env) startCounter(name string) {
	e.T.Helper()
	e.OK("exec", name, "--", "sh", "-c", "nohup sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/counter.new; mv /tmp/counter.new /tmp/counter; sleep 0.05; done' >/dev/null 2>&1 &")
	for i := 0; e.Run("exec", name, "--", "test", "-s", "/tmp/counter").Code != 0; i++ {
		if i > 100 {
			e.T.Fatal("the background counter never started")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// fsUUID reads an ext4 image's UUID on the host.
func fsUUID(t *testing.T, img string) string {
	out, err := exec.Command("blkid", "-p", "-o", "value", "-s", "UUID", img).Output()
	if err != nil {
		t.Logf("blkid %s: %v", img, err)
	}
	return strings.TrimSpace(string(out))
}

func TestCheckpointRestoreFork(t *testing.T) {
	e := newEnv(t)
	os.WriteFile(filepath.Join(e.Data, "config.toml"), []byte(ckptConfig), 0o644)
	e.StartDaemon()
	e.OK("create", "src")
	e.OK("exec", "src", "--", "sh", "-c", "head -c 3000000 /dev/urandom > data.bin && sha256sum data.bin > data.sum && echo keep > other.txt")

	var first string
	e.Subtest(t, "checkpoint, overwrite, restore", func(t *testing.T) {
		out := e.OK("checkpoint", "src", "--label", "first")
		first = e.lastCheckpoint("src")
		if !strings.Contains(out, "checkpoint "+first) || !strings.Contains(out, "held for") {
			t.Errorf("checkpoint said %q", out)
		}
		l := e.checkpoints("src")
		if len(l) != 1 || l[0].Label != "first" || l[0].Bytes == 0 || l[0].Copy == "" || l[0].Frozen <= 0 {
			t.Fatalf("checkpoints %+v", l)
		}
		t.Logf("checkpoint: %s on disk by %s, frozen %s, took %s", session.FormatBytes(l[0].Bytes), l[0].Copy, l[0].Frozen, l[0].Took)
		if s := e.Info("src"); s.Checkpoints != 1 || s.CheckpointBytes != l[0].Bytes {
			t.Errorf("info: %d checkpoints, %d bytes", s.Checkpoints, s.CheckpointBytes)
		}
		e.OK("exec", "src", "--", "sh", "-c", "head -c 1000000 /dev/urandom > data.bin && rm other.txt && echo later > later.txt && sha256sum data.bin > later.sum")
		e.Fails("no checkpoint", "restore", "src", "c99", "--yes")
		if r := e.Run("restore", "src", first); r.Code == 0 {
			t.Fatal("restore without --yes on a non-terminal succeeded")
		}
		out = e.OK("restore", "src", first, "--yes")
		if !strings.Contains(out, "restored src to checkpoint "+first) {
			t.Errorf("restore said %q", out)
		}
		if r := e.Run("exec", "src", "--", "sha256sum", "-c", "data.sum"); r.Code != 0 {
			t.Fatalf("after restore, data.bin differs from the checkpoint's: %s%s", r.Stdout, r.Stderr)
		}
		if got := e.out("src", "cat other.txt; test -e later.txt && echo later-exists; true"); got != "keep" {
			t.Errorf("after restore: %q", got)
		}
		auto := e.lastCheckpoint("src")
		if l := e.checkpoints("src"); !l[len(l)-1].Auto || !strings.Contains(l[len(l)-1].Label, "before restore to "+first) {
			t.Errorf("automatic checkpoint %+v", l[len(l)-1])
		}
		e.OK("restore", "src", auto, "--yes")
		if r := e.Run("exec", "src", "--", "sha256sum", "-c", "later.sum"); r.Code != 0 {
			t.Fatalf("restoring the automatic checkpoint did not bring the later state back: %s%s", r.Stdout, r.Stderr)
		}
		if got := e.out("src", "cat later.txt; test -e other.txt && echo other-exists; true"); got != "later" {
			t.Errorf("after restoring the automatic checkpoint: %q", got)
		}
		tl := e.OK("events", "src")
		for _, want := range []string{"checkpoint " + first + " taken", "restored to checkpoint " + first, "restored to checkpoint " + auto} {
			if !strings.Contains(tl, want) {
				t.Errorf("timeline lacks %q", want)
			}
		}
	})

	e.Subtest(t, "memory checkpoint resumes a counting process", func(t *testing.T) {
		e.startCounter("src")
		e.OK("checkpoint", "src", "--memory")
		id := e.lastCheckpoint("src")
		at := e.counter("src")
		time.Sleep(500 * time.Millisecond)
		e.OK("stop", "src") // the counter is gone with the VM
		start := time.Now()
		e.OK("restore", "src", id, "--yes")
		t.Logf("memory restore took %s", time.Since(start))
		n := e.counter("src")
		if n <= 0 || n > at+40 {
			t.Errorf("counter after the memory restore: %d (it was %d at the checkpoint)", n, at)
		}
		time.Sleep(300 * time.Millisecond)
		if again := e.counter("src"); again <= n {
			t.Errorf("the counter does not run after the memory restore: %d then %d", n, again)
		}
	})

	e.Subtest(t, "fork", func(t *testing.T) {
		e.Fails("already exists", "fork", "src", "src")
		e.Fails("invalid session name", "fork", "src", "Bad_Name")
		e.Fails("not found", "fork", "ghost", "x")
		ident := "hostname; cat /etc/machine-id; cat /proc/sys/kernel/random/boot_id; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'"
		before := e.out("src", ident)
		// A recorded command running at the fork goes on in the fork as a
		// process; its record stays the source's.
		ticker := strings.TrimSpace(e.OK("exec", "src", "--detach", "--", "sh", "-c", "while true; do echo tick >> /tmp/ticks; sleep 0.1; done"))
		time.Sleep(300 * time.Millisecond)
		e.OK("schedule", "add", "src", "@every 1h", "--", "true")
		start := time.Now()
		out := e.OK("fork", "src", "fork1")
		took := time.Since(start)
		t.Logf("fork: %s (%s)", strings.TrimSpace(out), took)
		if b, err := os.ReadFile(filepath.Join(e.Data, "test-daemon.log")); err == nil {
			for _, l := range strings.Split(string(b), "\n") {
				if strings.Contains(l, "msg=fork") {
					t.Logf("daemon: %s", l[strings.Index(l, "msg="):])
				}
			}
		}
		if s := e.Info("fork1"); s.State != session.StateRunning {
			t.Fatalf("fork1 is %s", s.State)
		}
		if ls := e.OK("schedule", "ls", "fork1"); !strings.Contains(ls, "@every 1h") {
			t.Errorf("the fork did not keep the source's schedule:\n%s", ls)
		}
		if r := e.Run("exec", "fork1", "--", "sha256sum", "-c", "later.sum"); r.Code != 0 {
			t.Fatalf("the fork does not see the source's files: %s%s", r.Stdout, r.Stderr)
		}
		// The source's counting process runs on in the fork.
		n := e.counter("fork1")
		time.Sleep(300 * time.Millisecond)
		if again := e.counter("fork1"); again <= n {
			t.Errorf("the source's process does not run in the fork: %d then %d", n, again)
		}
		ticks := func(name string) string { return e.out(name, "wc -l < /tmp/ticks") }
		t1 := ticks("fork1")
		time.Sleep(400 * time.Millisecond)
		if t2 := ticks("fork1"); t2 == t1 {
			t.Errorf("the command running at the fork does not go on in the fork: %s then %s ticks", t1, t2)
		}
		for _, x := range e.Execs("fork1") {
			if x.ID == ticker {
				t.Errorf("the fork has the source's execution record %s", ticker)
			}
		}
		var srcRunning bool
		for _, x := range e.Execs("src") {
			if x.ID == ticker {
				srcRunning = x.State == session.ExecRunning
			}
		}
		if !srcRunning {
			t.Errorf("the source's command is no longer running and recorded after the fork")
		}
		src, fork := strings.Fields(before), strings.Fields(e.out("fork1", ident))
		srcNow := strings.Fields(e.out("src", ident))
		if len(src) != 4 || len(fork) != 4 || len(srcNow) != 4 {
			t.Fatalf("identity: %q %q", src, fork)
		}
		for i, what := range []string{"hostname", "machine-id", "boot id", "urandom"} {
			if fork[i] == srcNow[i] {
				t.Errorf("the fork's %s is the source's: %s", what, fork[i])
			}
		}
		if fork[0] != "fork1" || srcNow[0] != "src" || srcNow[1] != src[1] || srcNow[2] != src[2] {
			t.Errorf("identity before %q, source now %q, fork %q", src, srcNow, fork)
		}
		// Independent from here.
		e.OK("exec", "fork1", "--", "sh", "-c", "echo fork > only-fork.txt && echo fork > later.txt")
		e.OK("exec", "src", "--", "sh", "-c", "echo src > only-src.txt")
		if got := e.out("src", "cat later.txt; test -e only-fork.txt && echo leaked; true"); got != "later" {
			t.Errorf("the fork's writes reached the source: %q", got)
		}
		if got := e.out("fork1", "cat later.txt; test -e only-src.txt && echo leaked; true"); got != "fork" {
			t.Errorf("the source's writes reached the fork: %q", got)
		}
		// Execution records start empty but for the note; the source's own
		// are untouched.
		srcIDs := map[string]bool{}
		for _, x := range e.Execs("src") {
			srcIDs[x.ID] = true
		}
		for _, x := range e.Execs("fork1") {
			if srcIDs[x.ID] {
				t.Errorf("the fork has the source's execution %s (%v)", x.ID, x.Argv)
			}
		}
		if tl := e.OK("events", "fork1"); !strings.Contains(tl, "forked from src") {
			t.Errorf("the fork's timeline does not name the source:\n%s", tl)
		}
		// No shared writable file: its own disks, its own filesystem
		// identity, and its VMM has none of the source's files open.
		e.OK("flush", "fork1")
		sdir, fdir := filepath.Join(e.Data, "sessions", "src"), filepath.Join(e.Data, "sessions", "fork1")
		for _, f := range []string{"workspace.img"} {
			a, _ := os.Stat(filepath.Join(sdir, f))
			b, _ := os.Stat(filepath.Join(fdir, f))
			if a == nil || b == nil || os.SameFile(a, b) {
				t.Errorf("%s is shared", f)
			}
		}
		if a, b := fsUUID(t, filepath.Join(sdir, "workspace.img")), fsUUID(t, filepath.Join(fdir, "workspace.img")); a == "" || a == b {
			t.Errorf("workspace filesystem UUIDs: source %q, fork %q", a, b)
		}
		fds, _ := filepath.Glob("/proc/" + itoa(e.VMMPid("fork1")) + "/fd/*")
		for _, fd := range fds {
			if p, _ := os.Readlink(fd); strings.HasPrefix(p, sdir+"/") {
				t.Errorf("the fork's VMM has the source's %s open", p)
			}
		}
		// The source's disk stays its VM's alone: nothing else may open it
		// for writing while it runs.
		if out, err := exec.Command("qemu-io", "-f", "raw", "-c", "quit", filepath.Join(sdir, "workspace.img")).CombinedOutput(); err == nil || !strings.Contains(string(out), "lock") {
			t.Errorf("qemu-io opened the running source's workspace for writing: %v %s", err, out)
		}
		// A cold start of the fork mounts its own workspace by its UUID.
		e.OK("stop", "fork1")
		e.OK("start", "fork1")
		if got := e.out("fork1", "cat only-fork.txt"); got != "fork" {
			t.Errorf("the fork after a cold start: %q", got)
		}
	})

	e.Subtest(t, "delete removes checkpoints", func(t *testing.T) {
		s := e.Info("src")
		r := e.RunIn("nope\n", "delete", "src")
		if r.Code == 0 {
			t.Fatal("delete without confirmation succeeded")
		}
		e.OK("delete", "src", "--yes")
		e.OK("delete", "fork1", "--yes")
		if _, err := os.Stat(filepath.Join(e.Data, "sessions", "src")); err == nil || s.Checkpoints == 0 {
			t.Errorf("delete left the session's checkpoints (%d)", s.Checkpoints)
		}
	})
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// TestCheckpointCrashPoints kills the daemon at every step of checkpoint,
// restore, fork and create --from. Afterwards the source is running or
// cleanly stopped with its files intact, no half-made checkpoint is
// listed, and no half-made fork or new session exists.
func TestCheckpointCrashPoints(t *testing.T) {
	e := newEnv(t)
	os.WriteFile(filepath.Join(e.Data, "config.toml"), []byte(ckptConfig), 0o644)
	e.StartDaemon()
	e.OK("create", "crashy")
	e.OK("exec", "crashy", "--", "sh", "-c", "head -c 1000000 /dev/urandom > data.bin && sha256sum data.bin > data.sum")
	e.OK("checkpoint", "crashy")
	base := e.lastCheckpoint("crashy")
	crashDaemon := func(point string) {
		e.KillDaemon()
		os.Setenv("BERTH_CRASH_AT", point)
		e.StartDaemon()
		os.Unsetenv("BERTH_CRASH_AT")
	}
	check := func(t *testing.T, point string) {
		t.Helper()
		s := e.Info("crashy")
		switch s.State {
		case session.StateRunning:
		case session.StateStopped:
			e.OK("start", "crashy")
		default:
			t.Fatalf("after a crash at %s: %s (%s)\n%s", point, s.State, s.Cause, e.DaemonLog())
		}
		if r := e.Run("exec", "crashy", "--", "sha256sum", "-c", "data.sum"); r.Code != 0 {
			t.Fatalf("after a crash at %s: data.bin: %s %s", point, r.Stdout, r.Stderr)
		}
		e.OK("exec", "crashy", "--", "sh", "-c", "echo writable > w.txt") // thawed
		for _, c := range e.checkpoints("crashy") {
			if c.Bytes == 0 || c.Copy == "" {
				t.Errorf("after a crash at %s: a half-made checkpoint is listed: %+v", point, c)
			}
		}
		ents, _ := os.ReadDir(filepath.Join(e.Data, "sessions", "crashy", "checkpoints"))
		for _, d := range ents {
			if strings.HasPrefix(d.Name(), ".") {
				t.Errorf("after a crash at %s: %s left", point, d.Name())
			}
		}
		if r := e.Run("info", "crashy-fork"); r.Code == 0 {
			if s := e.Info("crashy-fork"); s.State != session.StateRunning {
				t.Errorf("after a crash at %s: the fork is %s", point, s.State)
			}
			e.OK("delete", "crashy-fork", "--yes")
		}
		if _, err := os.Stat(filepath.Join(e.Data, "sessions", "crashy-fork")); err == nil {
			t.Errorf("after a crash at %s: the fork's directory is left", point)
		}
	}
	cases := []struct {
		points []string
		args   []string
	}{
		{[]string{"checkpoint:frozen", "checkpoint:saved", "checkpoint:copied-frozen", "checkpoint:copied", "checkpoint:synced", "checkpoint:renamed"},
			[]string{"checkpoint", "crashy", "--memory"}},
		{[]string{"restore:auto", "restore:stopped", "restore:copied", "restore:swapped"},
			[]string{"restore", "crashy", base, "--yes"}},
		{[]string{"fork:frozen", "fork:saved", "fork:copied-frozen", "fork:copied", "fork:restored", "fork:noted"},
			[]string{"fork", "crashy", "crashy-fork"}},
		// A create from a checkpoint makes the same kind of new session.
		{[]string{"from:copied", "from:identity"}, []string{"create", "crashy-fork", "--from", "crashy@" + base}},
	}
	for _, c := range cases {
		for _, point := range c.points {
			e.Subtest(t, point, func(t *testing.T) {
				crashDaemon(point)
				e.Run(c.args...) // the daemon dies here
				e.Daemon.Wait()
				e.Daemon = nil
				e.StartDaemon()
				check(t, point)
			})
		}
	}
	e.OK("delete", "crashy", "--yes")
}

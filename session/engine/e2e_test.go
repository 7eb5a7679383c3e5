package engine_test

import (
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/daemon/daemontest"
	"github.com/berthvm/berth/vmm/vmmtest"
)

// env is a daemon of the test's own, driven through the real berth
// command (daemontest.Env), with the helpers this package's tests add.
type env struct{ *daemontest.Env }

func newEnv(t *testing.T) *env {
	if testing.Short() {
		t.Skip("boots VMs")
	}
	return newEnvAt(t, vmmtest.DataDir(t))
}

// newEnvAt is newEnv on the data directory data.
func newEnvAt(t *testing.T, data string) *env { return &env{daemontest.New(t, data)} }

func TestSessionEndToEnd(t *testing.T) {
	e := newEnv(t)
	e.StartDaemon()

	e.Subtest(t, "bad input", func(t *testing.T) {
		e.Fails("invalid session name", "create", "Bad_Name")
		e.Fails("not found", "info", "ghost")
		e.Fails("not found", "pause", "ghost")
		e.Fails("512Q", "create", "x", "--memory", "512Q")
		e.Fails("free space", "create", "toobig", "--disk", "900T")
		if strings.Contains(e.OK("ls"), "toobig") {
			t.Error("a failed create left a session behind")
		}
		if _, err := os.Stat(filepath.Join(e.Data, "sessions", "toobig")); err == nil {
			t.Error("a failed create left its directory behind")
		}
	})

	start := time.Now()
	e.OK("create", "alpha", "--disk", "256M", "--memory", "384M")
	t.Logf("create took %s", time.Since(start))
	e.Fails("already exists", "create", "alpha")

	e.Subtest(t, "workspace use measured at create", func(t *testing.T) {
		// Right after the create, not at the next refresh of the live
		// figures; never 0 B for a workspace that was not measured.
		deadline := time.Now().Add(5 * time.Second)
		for {
			s := e.Info("alpha")
			if s.WorkspaceKnown() && s.WorkspaceUsed > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("5s after create: %d bytes measured at %s", s.WorkspaceUsed, s.WorkspaceMeasuredAt)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})

	e.Subtest(t, "exec codes and streams", func(t *testing.T) {
		r := e.Run("exec", "alpha", "--", "sh", "-c", "echo out; echo err >&2; exit 3")
		if r.Stdout != "out\n" || r.Stderr != "err\n" || r.Code != 3 {
			t.Errorf("got %q %q %d", r.Stdout, r.Stderr, r.Code)
		}
		if r := e.Run("exec", "alpha", "--", "sh", "-c", "kill -9 $$"); r.Code != 137 {
			t.Errorf("signalled: exit %d, want 137", r.Code)
		}
		if r := e.RunIn("piped\n", "exec", "alpha", "--", "cat"); r.Stdout != "piped\n" {
			t.Errorf("stdin: %q", r.Stdout)
		}
		if r := e.Run("exec", "alpha", "--", "no-such-cmd"); r.Code == 0 {
			t.Errorf("unknown command succeeded")
		}
		if r := e.Run("exec", "alpha", "--timeout", "500ms", "--", "sleep", "30"); r.Code != 124 {
			t.Errorf("timeout: exit %d", r.Code)
		}
		// A missing working directory is named, not the command.
		r = e.Run("exec", "alpha", "--cwd", "/nonexistent", "--", "pwd")
		if want := "could not start: working directory /nonexistent does not exist\n"; r.Code != 127 || !strings.HasSuffix(r.Stderr, want) {
			t.Errorf("--cwd /nonexistent: exit %d, stderr %q; want 127 and %q", r.Code, r.Stderr, want)
		}
		l := e.Execs("alpha")
		states := map[session.ExecState]int{}
		for _, x := range l {
			states[x.State]++
		}
		if states[session.ExecFailed] != 2 || states[session.ExecTimedOut] != 1 {
			t.Errorf("states %v", states)
		}
	})

	e.Subtest(t, "crash, lost, start keeps the workspace", func(t *testing.T) {
		local := filepath.Join(t.TempDir(), "payload")
		data := make([]byte, 3<<20)
		rand.Read(data)
		os.WriteFile(local, data, 0o644)
		e.OK("put", "alpha", local, "payload.bin")
		id := strings.TrimSpace(e.OK("exec", "alpha", "--detach", "--", "sleep", "1000"))
		time.Sleep(300 * time.Millisecond)
		killed := time.Now()
		syscall.Kill(e.VMMPid("alpha"), syscall.SIGKILL)
		s := e.WaitState("alpha", session.StateCrashed, 3*time.Second)
		t.Logf("crashed after %s: %.80q", time.Since(killed), s.Cause)
		if !strings.Contains(s.Cause, "SIGKILL") {
			t.Errorf("cause %q does not say how the VMM died", s.Cause)
		}
		for _, x := range e.Execs("alpha") {
			if x.ID == id && x.State != session.ExecLost {
				t.Errorf("running exec after the crash: %s, want lost", x.State)
			}
		}
		e.OK("start", "alpha")
		got := e.OK("cat", "alpha", "payload.bin")
		if sha256.Sum256([]byte(got)) != sha256.Sum256(data) {
			t.Fatalf("durable put lost by a VMM kill: %d bytes back", len(got))
		}
	})

	e.Subtest(t, "logs replay byte-exact across a daemon kill -9", func(t *testing.T) {
		out := e.OK("exec", "alpha", "--detach", "--", "sh", "-c",
			"i=0; while [ $i -lt 300 ]; do echo line $i; echo e$i >&2; i=$((i+1)); sleep 0.01; done")
		id := strings.TrimSpace(out)
		time.Sleep(800 * time.Millisecond)
		e.Daemon.Process.Signal(syscall.SIGKILL) // VMs and commands keep running
		e.Daemon.Wait()
		e.Daemon = nil
		if syscall.Kill(e.VMMPid("alpha"), 0) != nil {
			t.Fatal("the VM died with the daemon")
		}
		e.StartDaemon()
		deadline := time.Now().Add(60 * time.Second)
		for {
			x := e.Execs("alpha")
			var st session.ExecState
			for _, ex := range x {
				if ex.ID == id {
					st = ex.State
				}
			}
			if st == session.ExecExited {
				break
			}
			if st.Done() || time.Now().After(deadline) {
				t.Fatalf("exec %s ended %s", id, st)
			}
			time.Sleep(200 * time.Millisecond)
		}
		r := e.Run("logs", "alpha", id)
		var want, wantErr strings.Builder
		for i := 0; i < 300; i++ {
			fmt.Fprintf(&want, "line %d\n", i)
			fmt.Fprintf(&wantErr, "e%d\n", i)
		}
		if r.Stdout != want.String() || r.Stderr != wantErr.String() {
			t.Fatalf("replay differs: %d/%d stdout bytes, %d/%d stderr bytes", len(r.Stdout), want.Len(), len(r.Stderr), wantErr.Len())
		}
	})

	e.Subtest(t, "pause, resume, flush", func(t *testing.T) {
		e.OK("pause", "alpha")
		e.WaitState("alpha", session.StatePaused, time.Second)
		e.Fails("resume it first", "exec", "alpha", "--", "true")
		e.Fails("it is already paused", "pause", "alpha")
		e.OK("resume", "alpha")
		e.OK("exec", "alpha", "--", "sh", "-c", "head -c 4000000 /dev/urandom > dirty.bin")
		if out := e.OK("flush", "alpha"); !strings.Contains(out, "flushed") {
			t.Errorf("flush said %q", out)
		}
		// The live figures (every 2 s) measure the file in.
		deadline := time.Now().Add(10 * time.Second)
		for e.Info("alpha").WorkspaceUsed < 4_000_000 {
			if time.Now().After(deadline) {
				t.Fatalf("10s after a 4 MB write, the workspace's use reads %d bytes", e.Info("alpha").WorkspaceUsed)
			}
			time.Sleep(200 * time.Millisecond)
		}
	})

	e.Subtest(t, "stop and wrong-state errors", func(t *testing.T) {
		e.OK("stop", "alpha")
		e.WaitState("alpha", session.StateStopped, time.Second)
		e.Fails(`cannot pause session "alpha": it is stopped`, "pause", "alpha")
		e.Fails("start it first", "exec", "alpha", "--", "true")
	})

	// The workspace's use is kept with the record: a stopped session
	// shows its last figure, also after a daemon restart, with its time.
	e.Subtest(t, "workspace use kept while stopped and across a restart", func(t *testing.T) {
		stopped := e.Info("alpha")
		if stopped.WorkspaceUsed < 4_000_000 || stopped.WorkspaceMeasuredAt.IsZero() {
			t.Fatalf("stopped: %d bytes measured at %s; want dirty.bin's 4 MB and more", stopped.WorkspaceUsed, stopped.WorkspaceMeasuredAt)
		}
		e.KillDaemon()
		e.StartDaemon()
		again := e.Info("alpha")
		if again.WorkspaceUsed != stopped.WorkspaceUsed || !again.WorkspaceMeasuredAt.Equal(stopped.WorkspaceMeasuredAt) {
			t.Errorf("after a daemon restart: %d bytes at %s; want %d at %s", again.WorkspaceUsed, again.WorkspaceMeasuredAt, stopped.WorkspaceUsed, stopped.WorkspaceMeasuredAt)
		}
		if out := e.OK("info", "alpha"); !strings.Contains(out, session.FormatBytes(stopped.WorkspaceUsed)+" used of") || !strings.Contains(out, "(measured ") {
			t.Errorf("info after a restart:\n%s", out)
		}
	})

	e.Subtest(t, "second daemon refused", func(t *testing.T) {
		r := e.Run("serve")
		if r.Code == 0 || !strings.Contains(r.Stderr, "in use by berth daemon pid") {
			t.Errorf("second daemon: exit %d, %q", r.Code, r.Stderr)
		}
	})

	e.Subtest(t, "timeline", func(t *testing.T) {
		out := e.OK("events", "alpha")
		for _, want := range []string{"crashed", "paused", "flush", "stopped"} {
			if !strings.Contains(out, want) {
				t.Errorf("timeline lacks %q:\n%s", want, out)
			}
		}
	})

	e.Subtest(t, "delete", func(t *testing.T) {
		r := e.Run("delete", "alpha")
		if r.Code == 0 {
			t.Fatal("delete without --yes on a non-terminal succeeded")
		}
		e.OK("delete", "alpha", "--yes")
		e.Fails("not found", "info", "alpha")
		if _, err := os.Stat(filepath.Join(e.Data, "sessions", "alpha")); err == nil {
			t.Error("delete left the session's storage")
		}
	})
}

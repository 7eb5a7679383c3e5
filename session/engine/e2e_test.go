package engine_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/api"
	"github.com/berthvm/berth/vmm/vmmtest"
)

// env is a data directory with a daemon under test, driven through the
// real berth command.
type env struct {
	t      *testing.T
	berth  string
	data   string
	daemon *exec.Cmd
}

func newEnv(t *testing.T) *env {
	if testing.Short() {
		t.Skip("boots VMs")
	}
	return newEnvAt(t, vmmtest.DataDir(t))
}

// newEnvAt is newEnv on the data directory data.
func newEnvAt(t *testing.T, data string) *env {
	e := &env{t: t, berth: vmmtest.Berth(t), data: data}
	t.Cleanup(func() {
		e.killDaemon()
		// VMs outlive daemons by design; tests must not leak them.
		pids, _ := filepath.Glob(filepath.Join(e.data, "sessions", "*", "vm", "vmm.pid"))
		for _, p := range pids {
			b, _ := os.ReadFile(p)
			if f := strings.Fields(string(b)); len(f) > 0 {
				if pid, err := strconv.Atoi(f[0]); err == nil {
					syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
	})
	return e
}

// subtest runs f as a subtest of t with the env's helpers failing the
// subtest: they report on e.t, and a FailNow on the parent from inside a
// subtest would abandon the subtest and panic.
func (e *env) subtest(t *testing.T, name string, f func(t *testing.T)) bool {
	return t.Run(name, func(t *testing.T) {
		parent := e.t
		e.t = t
		defer func() { e.t = parent }()
		f(t)
	})
}

func (e *env) cmd(args ...string) *exec.Cmd {
	c := exec.Command(e.berth, append([]string{"--data", e.data, "--cache", vmmtest.CacheDir()}, args...)...)
	c.Env = append(os.Environ(), "BERTH_DATA=", "NO_COLOR=1")
	return c
}

// startDaemon runs `berth serve` and waits for its socket.
func (e *env) startDaemon(args ...string) {
	e.t.Helper()
	c := e.cmd(append([]string{"serve"}, args...)...)
	logf, err := os.OpenFile(filepath.Join(e.data, "test-daemon.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		e.t.Fatal(err)
	}
	c.Stdout, c.Stderr = logf, logf
	if err := c.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.daemon = c
	// Ping the socket directly: a CLI command would start a second daemon
	// of its own if this one is not listening yet.
	client := api.Dial(filepath.Join(e.data, "berth.sock"))
	defer client.Close()
	for i := 0; i < 300; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := client.Ping(ctx)
		cancel()
		if err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	e.t.Fatalf("daemon did not come up: %s", e.daemonLog())
}

func (e *env) daemonLog() string {
	b, _ := os.ReadFile(filepath.Join(e.data, "test-daemon.log"))
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

func (e *env) killDaemon() {
	if e.daemon != nil && e.daemon.Process != nil {
		e.daemon.Process.Kill()
		e.daemon.Wait()
		e.daemon = nil
	}
}

type result struct {
	stdout, stderr string
	code           int
}

func (e *env) runIn(stdin string, args ...string) result {
	t := e.t
	c := e.cmd(args...)
	// No CLI call may hang a test: a stuck one fails it with the daemon's log.
	timer := time.AfterFunc(3*time.Minute, func() {
		t.Errorf("berth %s hung; daemon log:\n%s", strings.Join(args, " "), e.daemonLog())
		c.Process.Kill()
	})
	defer timer.Stop()
	c.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	err := c.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		e.t.Fatal(err)
	}
	return result{out.String(), errb.String(), code}
}

func (e *env) run(args ...string) result { return e.runIn("", args...) }

// ok runs a command that must succeed.
func (e *env) ok(args ...string) string {
	e.t.Helper()
	r := e.run(args...)
	if r.code != 0 {
		e.t.Fatalf("berth %s: exit %d: %s%s\ndaemon log:\n%s", strings.Join(args, " "), r.code, r.stdout, r.stderr, e.daemonLog())
	}
	return r.stdout
}

// fails runs a command that must fail with one line naming want.
func (e *env) fails(want string, args ...string) {
	e.t.Helper()
	r := e.run(args...)
	if r.code == 0 {
		e.t.Fatalf("berth %s succeeded, want an error mentioning %q", strings.Join(args, " "), want)
	}
	if !strings.Contains(r.stderr, want) || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
		e.t.Errorf("berth %s: stderr %q, want one line mentioning %q", strings.Join(args, " "), r.stderr, want)
	}
}

func (e *env) info(name string) session.Session {
	e.t.Helper()
	var s session.Session
	if err := json.Unmarshal([]byte(e.ok("info", name, "--json")), &s); err != nil {
		e.t.Fatal(err)
	}
	return s
}

func (e *env) waitState(name string, want session.State, within time.Duration) session.Session {
	e.t.Helper()
	deadline := time.Now().Add(within)
	for {
		s := e.info(name)
		if s.State == want {
			return s
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("session %s is %s after %s, want %s (cause %q)", name, s.State, within, want, s.Cause)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (e *env) execs(name string) []session.Execution {
	e.t.Helper()
	var l []session.Execution
	json.Unmarshal([]byte(e.ok("ps", name, "--all", "--json")), &l)
	return l
}

func (e *env) vmmPid(name string) int {
	b, _ := os.ReadFile(filepath.Join(e.data, "sessions", name, "vm", "vmm.pid"))
	pid, _ := strconv.Atoi(strings.Fields(string(b) + " 0")[0])
	return pid
}

func TestSessionEndToEnd(t *testing.T) {
	e := newEnv(t)
	e.startDaemon()

	e.subtest(t, "bad input", func(t *testing.T) {
		e.fails("invalid session name", "create", "Bad_Name")
		e.fails("not found", "info", "ghost")
		e.fails("not found", "pause", "ghost")
		e.fails("512Q", "create", "x", "--memory", "512Q")
		e.fails("free space", "create", "toobig", "--disk", "900T")
		if strings.Contains(e.ok("ls"), "toobig") {
			t.Error("a failed create left a session behind")
		}
		if _, err := os.Stat(filepath.Join(e.data, "sessions", "toobig")); err == nil {
			t.Error("a failed create left its directory behind")
		}
	})

	start := time.Now()
	e.ok("create", "alpha", "--disk", "256M", "--memory", "384M")
	t.Logf("create took %s", time.Since(start))
	e.fails("already exists", "create", "alpha")

	e.subtest(t, "workspace use measured at create", func(t *testing.T) {
		// Right after the create, not at the next refresh of the live
		// figures; never 0 B for a workspace that was not measured.
		deadline := time.Now().Add(5 * time.Second)
		for {
			s := e.info("alpha")
			if s.WorkspaceKnown() && s.WorkspaceUsed > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("5s after create: %d bytes measured at %s", s.WorkspaceUsed, s.WorkspaceMeasuredAt)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})

	e.subtest(t, "exec codes and streams", func(t *testing.T) {
		r := e.run("exec", "alpha", "--", "sh", "-c", "echo out; echo err >&2; exit 3")
		if r.stdout != "out\n" || r.stderr != "err\n" || r.code != 3 {
			t.Errorf("got %q %q %d", r.stdout, r.stderr, r.code)
		}
		if r := e.run("exec", "alpha", "--", "sh", "-c", "kill -9 $$"); r.code != 137 {
			t.Errorf("signalled: exit %d, want 137", r.code)
		}
		if r := e.runIn("piped\n", "exec", "alpha", "--", "cat"); r.stdout != "piped\n" {
			t.Errorf("stdin: %q", r.stdout)
		}
		if r := e.run("exec", "alpha", "--", "no-such-cmd"); r.code == 0 {
			t.Errorf("unknown command succeeded")
		}
		if r := e.run("exec", "alpha", "--timeout", "500ms", "--", "sleep", "30"); r.code != 124 {
			t.Errorf("timeout: exit %d", r.code)
		}
		// A missing working directory is named, not the command.
		r = e.run("exec", "alpha", "--cwd", "/nonexistent", "--", "pwd")
		if want := "could not start: working directory /nonexistent does not exist\n"; r.code != 127 || !strings.HasSuffix(r.stderr, want) {
			t.Errorf("--cwd /nonexistent: exit %d, stderr %q; want 127 and %q", r.code, r.stderr, want)
		}
		l := e.execs("alpha")
		states := map[session.ExecState]int{}
		for _, x := range l {
			states[x.State]++
		}
		if states[session.ExecFailed] != 2 || states[session.ExecTimedOut] != 1 {
			t.Errorf("states %v", states)
		}
	})

	e.subtest(t, "crash, lost, start keeps the workspace", func(t *testing.T) {
		local := filepath.Join(t.TempDir(), "payload")
		data := make([]byte, 3<<20)
		rand.Read(data)
		os.WriteFile(local, data, 0o644)
		e.ok("put", "alpha", local, "payload.bin")
		id := strings.TrimSpace(e.ok("exec", "alpha", "--detach", "--", "sleep", "1000"))
		time.Sleep(300 * time.Millisecond)
		killed := time.Now()
		syscall.Kill(e.vmmPid("alpha"), syscall.SIGKILL)
		s := e.waitState("alpha", session.StateCrashed, 3*time.Second)
		t.Logf("crashed after %s: %.80q", time.Since(killed), s.Cause)
		if !strings.Contains(s.Cause, "SIGKILL") {
			t.Errorf("cause %q does not say how the VMM died", s.Cause)
		}
		for _, x := range e.execs("alpha") {
			if x.ID == id && x.State != session.ExecLost {
				t.Errorf("running exec after the crash: %s, want lost", x.State)
			}
		}
		e.ok("start", "alpha")
		got := e.ok("cat", "alpha", "payload.bin")
		if sha256.Sum256([]byte(got)) != sha256.Sum256(data) {
			t.Fatalf("durable put lost by a VMM kill: %d bytes back", len(got))
		}
	})

	e.subtest(t, "logs replay byte-exact across a daemon kill -9", func(t *testing.T) {
		out := e.ok("exec", "alpha", "--detach", "--", "sh", "-c",
			"i=0; while [ $i -lt 300 ]; do echo line $i; echo e$i >&2; i=$((i+1)); sleep 0.01; done")
		id := strings.TrimSpace(out)
		time.Sleep(800 * time.Millisecond)
		e.daemon.Process.Signal(syscall.SIGKILL) // VMs and commands keep running
		e.daemon.Wait()
		e.daemon = nil
		if syscall.Kill(e.vmmPid("alpha"), 0) != nil {
			t.Fatal("the VM died with the daemon")
		}
		e.startDaemon()
		deadline := time.Now().Add(60 * time.Second)
		for {
			x := e.execs("alpha")
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
		r := e.run("logs", "alpha", id)
		var want, wantErr strings.Builder
		for i := 0; i < 300; i++ {
			fmt.Fprintf(&want, "line %d\n", i)
			fmt.Fprintf(&wantErr, "e%d\n", i)
		}
		if r.stdout != want.String() || r.stderr != wantErr.String() {
			t.Fatalf("replay differs: %d/%d stdout bytes, %d/%d stderr bytes", len(r.stdout), want.Len(), len(r.stderr), wantErr.Len())
		}
	})

	e.subtest(t, "pause, resume, flush", func(t *testing.T) {
		e.ok("pause", "alpha")
		e.waitState("alpha", session.StatePaused, time.Second)
		e.fails("resume it first", "exec", "alpha", "--", "true")
		e.fails("it is already paused", "pause", "alpha")
		e.ok("resume", "alpha")
		e.ok("exec", "alpha", "--", "sh", "-c", "head -c 4000000 /dev/urandom > dirty.bin")
		if out := e.ok("flush", "alpha"); !strings.Contains(out, "flushed") {
			t.Errorf("flush said %q", out)
		}
		// The live figures (every 2 s) measure the file in.
		deadline := time.Now().Add(10 * time.Second)
		for e.info("alpha").WorkspaceUsed < 4_000_000 {
			if time.Now().After(deadline) {
				t.Fatalf("10s after a 4 MB write, the workspace's use reads %d bytes", e.info("alpha").WorkspaceUsed)
			}
			time.Sleep(200 * time.Millisecond)
		}
	})

	e.subtest(t, "stop and wrong-state errors", func(t *testing.T) {
		e.ok("stop", "alpha")
		e.waitState("alpha", session.StateStopped, time.Second)
		e.fails(`cannot pause session "alpha": it is stopped`, "pause", "alpha")
		e.fails("start it first", "exec", "alpha", "--", "true")
	})

	// The workspace's use is kept with the record: a stopped session
	// shows its last figure, also after a daemon restart, with its time.
	e.subtest(t, "workspace use kept while stopped and across a restart", func(t *testing.T) {
		stopped := e.info("alpha")
		if stopped.WorkspaceUsed < 4_000_000 || stopped.WorkspaceMeasuredAt.IsZero() {
			t.Fatalf("stopped: %d bytes measured at %s; want dirty.bin's 4 MB and more", stopped.WorkspaceUsed, stopped.WorkspaceMeasuredAt)
		}
		e.killDaemon()
		e.startDaemon()
		again := e.info("alpha")
		if again.WorkspaceUsed != stopped.WorkspaceUsed || !again.WorkspaceMeasuredAt.Equal(stopped.WorkspaceMeasuredAt) {
			t.Errorf("after a daemon restart: %d bytes at %s; want %d at %s", again.WorkspaceUsed, again.WorkspaceMeasuredAt, stopped.WorkspaceUsed, stopped.WorkspaceMeasuredAt)
		}
		if out := e.ok("info", "alpha"); !strings.Contains(out, session.FormatBytes(stopped.WorkspaceUsed)+" used of") || !strings.Contains(out, "(measured ") {
			t.Errorf("info after a restart:\n%s", out)
		}
	})

	e.subtest(t, "second daemon refused", func(t *testing.T) {
		r := e.run("serve")
		if r.code == 0 || !strings.Contains(r.stderr, "in use by berth daemon pid") {
			t.Errorf("second daemon: exit %d, %q", r.code, r.stderr)
		}
	})

	e.subtest(t, "timeline", func(t *testing.T) {
		out := e.ok("events", "alpha")
		for _, want := range []string{"crashed", "paused", "flush", "stopped"} {
			if !strings.Contains(out, want) {
				t.Errorf("timeline lacks %q:\n%s", want, out)
			}
		}
	})

	e.subtest(t, "delete", func(t *testing.T) {
		r := e.run("delete", "alpha")
		if r.code == 0 {
			t.Fatal("delete without --yes on a non-terminal succeeded")
		}
		e.ok("delete", "alpha", "--yes")
		e.fails("not found", "info", "alpha")
		if _, err := os.Stat(filepath.Join(e.data, "sessions", "alpha")); err == nil {
			t.Error("delete left the session's storage")
		}
	})
}

// Package daemontest runs a berth daemon of a test's own, on a data
// directory of its own, and drives it as an operator does: through the
// real berth command. End-to-end tests in several packages (the engine's,
// the TUI's) share it, so that starting, stopping and asking the daemon
// behave the same everywhere and their failures carry the daemon's log.
package daemontest

import (
	"bytes"
	"context"
	"encoding/json"
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

// CommandTimeout bounds one CLI call: a stuck one fails the test with the
// daemon's log instead of hanging the suite.
const CommandTimeout = 3 * time.Minute

// Env is a data directory with a daemon under test.
type Env struct {
	T      *testing.T
	Berth  string // the berth binary
	Data   string // the data directory
	Cache  string // the cache directory
	Daemon *exec.Cmd
}

// New is an Env on the data directory data; nothing runs yet. Cleanup
// kills the daemon and every VM left on the data directory: VMs outlive
// daemons by design, and tests must not leak them.
func New(t *testing.T, data string) *Env {
	e := &Env{T: t, Berth: vmmtest.Berth(t), Data: data, Cache: vmmtest.CacheDir()}
	t.Cleanup(func() {
		e.KillDaemon()
		pids, _ := filepath.Glob(filepath.Join(e.Data, "sessions", "*", "vm", "vmm.pid"))
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

// Subtest runs f as a subtest of t with the Env's helpers failing the
// subtest: they report on e.T, and a FailNow on the parent from inside a
// subtest would abandon the subtest and panic.
func (e *Env) Subtest(t *testing.T, name string, f func(t *testing.T)) bool {
	return t.Run(name, func(t *testing.T) {
		parent := e.T
		e.T = t
		defer func() { e.T = parent }()
		f(t)
	})
}

// Cmd is the berth command with args, on the Env's data and cache.
func (e *Env) Cmd(args ...string) *exec.Cmd {
	c := exec.Command(e.Berth, append([]string{"--data", e.Data, "--cache", e.Cache}, args...)...)
	c.Env = append(os.Environ(), "BERTH_DATA=", "NO_COLOR=1")
	return c
}

// LogPath is where the daemon's output goes.
func (e *Env) LogPath() string { return filepath.Join(e.Data, "test-daemon.log") }

// StartDaemon runs `berth serve` with args and waits for its socket.
func (e *Env) StartDaemon(args ...string) {
	e.T.Helper()
	c := e.Cmd(append([]string{"serve"}, args...)...)
	logf, err := os.OpenFile(e.LogPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		e.T.Fatal(err)
	}
	defer logf.Close()
	c.Stdout, c.Stderr = logf, logf
	if err := c.Start(); err != nil {
		e.T.Fatal(err)
	}
	e.Daemon = c
	// Ping the socket directly: a CLI command would start a second daemon
	// of its own if this one is not listening yet.
	client := api.Dial(filepath.Join(e.Data, "berth.sock"))
	defer client.Close()
	for range 300 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := client.Ping(ctx)
		cancel()
		if err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	e.T.Fatalf("daemon did not come up: %s", e.DaemonLog())
}

// DaemonLog is the tail of the daemon's log, for failure messages.
func (e *Env) DaemonLog() string {
	b, _ := os.ReadFile(e.LogPath())
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

// KillDaemon kills the daemon (SIGKILL) and reaps it; its VMs run on.
func (e *Env) KillDaemon() {
	if e.Daemon != nil && e.Daemon.Process != nil {
		e.Daemon.Process.Kill()
		e.Daemon.Wait()
		e.Daemon = nil
	}
}

// Result is what a CLI call printed and its exit status.
type Result struct {
	Stdout, Stderr string
	Code           int
}

// RunIn runs the berth command with args and stdin.
func (e *Env) RunIn(stdin string, args ...string) Result {
	t := e.T
	c := e.Cmd(args...)
	timer := time.AfterFunc(CommandTimeout, func() {
		t.Errorf("berth %s hung; daemon log:\n%s", strings.Join(args, " "), e.DaemonLog())
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
		e.T.Fatal(err)
	}
	return Result{out.String(), errb.String(), code}
}

// Run runs the berth command with args.
func (e *Env) Run(args ...string) Result { return e.RunIn("", args...) }

// OK runs a command that must succeed and returns its stdout.
func (e *Env) OK(args ...string) string {
	e.T.Helper()
	r := e.Run(args...)
	if r.Code != 0 {
		e.T.Fatalf("berth %s: exit %d: %s%s\ndaemon log:\n%s", strings.Join(args, " "), r.Code, r.Stdout, r.Stderr, e.DaemonLog())
	}
	return r.Stdout
}

// Fails runs a command that must fail with one line naming want.
func (e *Env) Fails(want string, args ...string) {
	e.T.Helper()
	r := e.Run(args...)
	if r.Code == 0 {
		e.T.Fatalf("berth %s succeeded, want an error mentioning %q", strings.Join(args, " "), want)
	}
	if !strings.Contains(r.Stderr, want) || strings.Count(strings.TrimSpace(r.Stderr), "\n") != 0 {
		e.T.Errorf("berth %s: stderr %q, want one line mentioning %q", strings.Join(args, " "), r.Stderr, want)
	}
}

// Info is `berth info NAME --json`.
func (e *Env) Info(name string) session.Session {
	e.T.Helper()
	var s session.Session
	if err := json.Unmarshal([]byte(e.OK("info", name, "--json")), &s); err != nil {
		e.T.Fatal(err)
	}
	return s
}

// WaitState waits until the session is in state want, failing after within.
func (e *Env) WaitState(name string, want session.State, within time.Duration) session.Session {
	e.T.Helper()
	deadline := time.Now().Add(within)
	for {
		s := e.Info(name)
		if s.State == want {
			return s
		}
		if time.Now().After(deadline) {
			e.T.Fatalf("session %s is %s after %s, want %s (cause %q)", name, s.State, within, want, s.Cause)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Execs is `berth ps NAME --all --json`.
func (e *Env) Execs(name string) []session.Execution {
	e.T.Helper()
	var l []session.Execution
	if err := json.Unmarshal([]byte(e.OK("ps", name, "--all", "--json")), &l); err != nil {
		e.T.Fatalf("ps --json: %v", err)
	}
	return l
}

// VMMPid is the pid the session's VMM recorded, or 0.
func (e *Env) VMMPid(name string) int {
	b, _ := os.ReadFile(filepath.Join(e.Data, "sessions", name, "vm", "vmm.pid"))
	pid, _ := strconv.Atoi(strings.Fields(string(b) + " 0")[0])
	return pid
}

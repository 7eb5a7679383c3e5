package app_test

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/vmm/vmmtest"
)

// TestSoakFindings holds what the soak found, as tests that failed before
// the fixes, on one session driven through the real daemon and CLI.
//
// Killed mid start, mid restore: a daemon killed after a start or a
// restore has booted the VM but before it recorded the session running
// left that VM behind under a record that says stopped. The next daemon
// must stop it: the soak found a second QEMU started beside it by the
// next start (from a template, which takes the workspace only once
// hot-plugged, so no disk lock refused it), and, after a cold boot, a
// session that could not start at all ("workspace in use by VM pid N").
//
// A stop ends what commands left running: a server a command started in
// the background kept /workspace busy, so the clean stop could not
// unmount it and killed the VM instead ("stopped by killing the VM"),
// with that server's latest writes unflushed.
func TestSoakFindings(t *testing.T) {
	if testing.Short() {
		t.Skip("boots VMs")
	}
	berth, data, cache := vmmtest.Berth(t), vmmtest.DataDir(t), vmmtest.CacheDir()
	if err := os.WriteFile(filepath.Join(data, "config.toml"), []byte("memory = \"128M\"\ndisk = \"64M\"\nidle_timeout = \"0\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sshAddr := l.Addr().String()
	l.Close()
	env := append(os.Environ(), "BERTH_DATA=", "NO_COLOR=1")
	d := newSoakDaemon(berth, data, cache, sshAddr, env)
	w := &soakWorld{t: t, data: data, d: d}
	t.Cleanup(w.cleanupVMs)
	t.Cleanup(d.stop)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	run := func(args ...string) (string, error) {
		c := exec.CommandContext(ctx, berth, append([]string{"--data", data, "--cache", cache}, args...)...)
		c.Env = env
		out, err := c.CombinedOutput()
		return string(out), err
	}
	ok := func(t *testing.T, args ...string) string {
		t.Helper()
		out, err := run(args...)
		if err != nil {
			t.Fatalf("berth %s: %v: %s\n%s", strings.Join(args, " "), err, out, d.tail(0, 3000))
		}
		return out
	}
	info := func(t *testing.T) session.Session {
		t.Helper()
		var s session.Session
		if err := json.Unmarshal([]byte(ok(t, "info", "a", "--json")), &s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	// crashIn runs args on a daemon that kills itself at point, then
	// starts the next daemon, which must leave no VM running for a.
	crashIn := func(t *testing.T, point string, args ...string) {
		d.kill()
		if err := d.startWith(ctx, []string{"BERTH_CRASH_AT=" + point}); err != nil {
			t.Fatal(err)
		}
		run(args...) // the daemon dies in it
		select {
		case <-d.exited():
		case <-time.After(2 * time.Minute):
			t.Fatalf("the daemon did not die at %s:\n%s", point, d.tail(0, 3000))
		}
		if !strings.Contains(d.log(d.lastStart()), "crash point reached") {
			t.Fatalf("the daemon did not reach %s:\n%s", point, d.tail(d.lastStart(), 3000))
		}
		d.kill() // already dead: marks it so
		if err := d.start(ctx); err != nil {
			t.Fatal(err)
		}
		if s := info(t); s.State != session.StateStopped {
			t.Errorf("after the restart a is %s (%s), want stopped", s.State, s.Cause)
		}
		if pids := vmms(data)["a"]; len(pids) != 0 {
			t.Errorf("after the restart a is stopped, yet QEMU processes %v run for it", pids)
		}
		ok(t, "start", "a")
		s := info(t)
		if pids := vmms(data)["a"]; s.State != session.StateRunning || len(pids) != 1 || pids[0] != s.Pid {
			t.Errorf("after start: a is %s with VMM pid %d; QEMU processes for it: %v", s.State, s.Pid, pids)
		}
		if out := ok(t, "exec", "a", "--", "echo", "alive"); out != "alive\n" {
			t.Errorf("exec after start: %q", out)
		}
	}
	if err := d.start(ctx); err != nil {
		t.Fatal(err)
	}
	ok(t, "create", "a")
	t.Run("start", func(t *testing.T) {
		ok(t, "stop", "a")
		crashIn(t, "start:booted", "start", "a")
	})
	t.Run("restore", func(t *testing.T) {
		ok(t, "checkpoint", "a", "--label", "before")
		var l []session.Checkpoint
		if err := json.Unmarshal([]byte(ok(t, "checkpoints", "a", "--json")), &l); err != nil || len(l) == 0 {
			t.Fatalf("checkpoints --json: %v %d", err, len(l))
		}
		crashIn(t, "restore:booted", "restore", "a", l[len(l)-1].ID, "--yes")
	})
	// The daemon's log says what it stopped.
	if !strings.Contains(d.log(0), "stopping a VM left by a start the daemon died in") {
		t.Errorf("the daemon's log does not say it stopped the VM left behind")
	}
	t.Run("a stop ends what commands left running", func(t *testing.T) {
		ok(t, "exec", "a", "--", "sh", "-c", "mkdir -p /workspace/www; "+
			"(while :; do date >> /workspace/bg.log; sleep 0.2; done) </dev/null >/dev/null 2>&1 & "+
			"httpd -p 127.0.0.1:8080 -h /workspace/www </dev/null")
		ok(t, "stop", "a")
		if s := info(t); !strings.Contains(s.Cause, "stopped cleanly") {
			t.Errorf("stop with a server and a writer left running: %s (%s)", s.State, s.Cause)
		}
		ok(t, "start", "a")
		if out := ok(t, "exec", "a", "--", "sh", "-c", "test -s /workspace/bg.log && echo kept"); out != "kept\n" {
			t.Errorf("the writer's file after the stop: %q", out)
		}
	})
}

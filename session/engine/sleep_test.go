package engine_test

import (
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
)

// vmmAlive reports whether the session's VMM runs. A VMM whose daemon died
// is reparented to an init that may reap it late: a zombie is not alive.
func (e *env) vmmAlive(name string) bool {
	pid := e.VMMPid(name)
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		return false
	}
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	i := strings.LastIndexByte(string(b), ')')
	return i < 0 || i+2 >= len(b) || b[i+2] != 'Z'
}

// counter reads the background counter a test started in the guest.
func (e *env) counter(name string) int {
	e.T.Helper()
	n, err := strconv.Atoi(strings.TrimSpace(e.OK("exec", name, "--", "cat", "/tmp/counter")))
	if err != nil {
		e.T.Fatal(err)
	}
	return n
}

func TestSleepWake(t *testing.T) {
	e := newBenchEnv(t, "memory = \"256M\"\ndisk = \"128M\"\nidle_timeout = \"0\"\n")
	e.OK("create", "sleepy")
	e.OK("exec", "sleepy", "--", "sh", "-c", "head -c 2000000 /dev/urandom > data.bin && sha256sum data.bin > data.sum")
	e.OK("flush", "sleepy")
	// A background process outside any recorded command, as a shell's
	// nohup would leave: it must keep counting across sleep.
	e.OK("exec", "sleepy", "--", "sh", "-c", "nohup sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/counter.new; mv /tmp/counter.new /tmp/counter; sleep 0.05; done' >/dev/null 2>&1 &")
	for i := 0; e.Run("exec", "sleepy", "--", "test", "-s", "/tmp/counter").Code != 0; i++ {
		if i > 100 {
			t.Fatal("the background counter never started")
		}
		time.Sleep(100 * time.Millisecond)
	}
	before := e.counter("sleepy")

	e.OK("sleep", "sleepy")
	s := e.WaitState("sleepy", session.StateSleeping, time.Second)
	if e.vmmAlive("sleepy") {
		t.Fatal("a VMM still runs for a sleeping session")
	}
	if s.SnapshotBytes == 0 || !strings.Contains(e.OK("ls"), "sleeping (") {
		t.Errorf("ls does not show the snapshot: %+v\n%s", s, e.OK("ls"))
	}
	e.Fails("it is already sleeping", "sleep", "sleepy")

	// Any action wakes it: here exec.
	start := time.Now()
	after := e.counter("sleepy")
	t.Logf("wake + exec took %s", time.Since(start))
	if after <= before {
		t.Errorf("counter went from %d to %d across sleep", before, after)
	}
	time.Sleep(300 * time.Millisecond)
	if again := e.counter("sleepy"); again <= after {
		t.Errorf("counter stopped after wake: %d then %d", after, again)
	}
	if r := e.Run("exec", "sleepy", "--", "sha256sum", "-c", "data.sum"); r.Code != 0 {
		t.Fatalf("flushed file damaged across sleep: %s %s", r.Stdout, r.Stderr)
	}
	guest, _ := strconv.ParseInt(strings.TrimSpace(e.OK("exec", "sleepy", "--", "date", "+%s")), 10, 64)
	if d := time.Now().Unix() - guest; d < -1 || d > 1 {
		t.Errorf("guest clock is %ds off after wake", d)
	}
	info := e.Info("sleepy")
	if info.LastWake <= 0 {
		t.Errorf("no wake time recorded: %+v", info)
	}

	e.Subtest(t, "20 cycles", func(t *testing.T) {
		for i := 0; i < 20; i++ {
			e.OK("exec", "sleepy", "--", "sh", "-c", "head -c 100000 /dev/urandom >> data.bin && sha256sum data.bin > data.sum")
			e.OK("sleep", "sleepy")
			if r := e.Run("exec", "sleepy", "--", "sha256sum", "-c", "data.sum"); r.Code != 0 {
				t.Fatalf("cycle %d: %s %s", i, r.Stdout, r.Stderr)
			}
		}
	})

	e.Subtest(t, "busy sessions do not sleep", func(t *testing.T) {
		id := strings.TrimSpace(e.OK("exec", "sleepy", "--detach", "--", "sleep", "30"))
		e.Fails("still running", "sleep", "sleepy")
		e.OK("stop", "sleepy") // ends the command too
		for _, x := range e.Execs("sleepy") {
			if x.ID == id && x.State != session.ExecCancelled {
				t.Errorf("command after stop: %s", x.State)
			}
		}
	})
}

// TestSleepCrashPoints kills the daemon at every step of sleep and wake.
// Afterwards the session is running or cleanly sleeping (never half of
// each), and the flushed file is intact.
func TestSleepCrashPoints(t *testing.T) {
	e := newBenchEnv(t, "memory = \"256M\"\ndisk = \"128M\"\nidle_timeout = \"0\"\n")
	e.OK("create", "crashy")
	e.OK("exec", "crashy", "--", "sh", "-c", "head -c 1000000 /dev/urandom > data.bin && sha256sum data.bin > data.sum")
	e.OK("flush", "crashy")
	check := func(t *testing.T, point string) {
		t.Helper()
		s := e.Info("crashy")
		if s.State != session.StateRunning && s.State != session.StateSleeping {
			t.Fatalf("after a crash at %s: %s (%s)", point, s.State, s.Cause)
		}
		if s.State == session.StateSleeping && e.vmmAlive("crashy") {
			t.Fatalf("after a crash at %s: sleeping with a live VMM\n%s", point, e.DaemonLog())
		}
		if r := e.Run("exec", "crashy", "--", "sha256sum", "-c", "data.sum"); r.Code != 0 {
			t.Fatalf("after a crash at %s: flushed file: %s %s", point, r.Stdout, r.Stderr)
		}
		e.OK("exec", "crashy", "--", "sh", "-c", "echo writable > w.txt") // thawed
	}
	crashDaemon := func(point string) {
		e.KillDaemon()
		os.Setenv("BERTH_CRASH_AT", point)
		e.StartDaemon()
		os.Unsetenv("BERTH_CRASH_AT")
	}
	for _, point := range []string{"sleep:frozen", "sleep:paused", "sleep:saved", "sleep:synced", "sleep:recorded"} {
		e.Subtest(t, point, func(t *testing.T) {
			crashDaemon(point)
			e.Run("sleep", "crashy") // the daemon dies here
			e.Daemon.Wait()
			e.Daemon = nil
			e.StartDaemon()
			check(t, point)
		})
	}
	for _, point := range []string{"wake:restored", "wake:recorded", "wake:resumed"} {
		e.Subtest(t, point, func(t *testing.T) {
			e.OK("sleep", "crashy")
			crashDaemon(point)
			e.Run("exec", "crashy", "--", "true") // wakes; the daemon dies
			e.Daemon.Wait()
			e.Daemon = nil
			e.StartDaemon()
			check(t, point)
		})
	}
}

// TestIdleSleepAndFullDisk: a session idle past its timeout sleeps by
// itself, one with its own timeout of 0 never does, and a snapshot that
// does not fit on the disk abandons the sleep with the session running.
func TestIdleSleepAndFullDisk(t *testing.T) {
	e := newBenchEnv(t, "memory = \"256M\"\ndisk = \"64M\"\nidle_timeout = \"3s\"\n")
	e.OK("create", "dozy")
	e.OK("create", "awake", "--idle-timeout", "0")
	e.WaitState("dozy", session.StateSleeping, 60*time.Second)
	// The state is visible a moment before its event is recorded.
	var events string
	byIdle := func() bool {
		for _, l := range strings.Split(events, "\n") {
			if f := strings.Fields(l); len(f) > 4 && f[3] == "idle" && strings.HasPrefix(f[4], "sleeping") {
				return true
			}
		}
		return false
	}
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end) && !byIdle(); time.Sleep(100 * time.Millisecond) {
		events = e.OK("events", "dozy")
	}
	if !byIdle() {
		t.Errorf("the timeline does not say the idle timer did it:\n%s", events)
	}
	time.Sleep(4 * time.Second)
	if s := e.Info("awake"); s.State != session.StateRunning {
		t.Fatalf("a session with idle timeout 0 is %s", s.State)
	}

	snap := filepath.Join(e.Data, "sessions", "awake", "snapshot")
	os.MkdirAll(snap, 0o755)
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", snap).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a small tmpfs to fill the disk: %v %s", err, out)
	}
	defer exec.Command("umount", snap).Run()
	r := e.Run("sleep", "awake")
	if r.Code == 0 {
		t.Fatal("sleep succeeded with no room for the snapshot")
	}
	if s := e.Info("awake"); s.State != session.StateRunning {
		t.Fatalf("after an abandoned sleep: %s", s.State)
	}
	if !strings.Contains(e.OK("events", "awake"), "sleep abandoned") {
		t.Errorf("the timeline does not say why:\n%s", e.OK("events", "awake"))
	}
	if got := e.OK("exec", "awake", "--", "sh", "-c", "echo still > s.txt && cat s.txt"); got != "still\n" {
		t.Errorf("after an abandoned sleep: %q", got)
	}
}

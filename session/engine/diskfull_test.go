package engine_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/api"
	"github.com/berthvm/berth/vmm/vmmtest"
)

// smallFS mounts a tmpfs of size bytes for the test, or skips it.
func smallFS(t *testing.T, size int64) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a small filesystem needs root")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", size), "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("mount tmpfs: %v %s", err, out)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

func freeBytes(t *testing.T, dir string) int64 {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}

// fill writes a file at path that leaves about keep bytes free on dir's
// filesystem.
func fill(t *testing.T, dir, path string, keep int64) {
	t.Helper()
	n := freeBytes(t, dir) - keep
	if n <= 0 {
		return
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for n > 0 {
		k := min(int64(len(buf)), n)
		if _, err := f.Write(buf[:k]); err != nil {
			t.Fatalf("fill: %v", err)
		}
		n -= k
	}
}

func (e *env) execution(name, id string) session.Execution {
	e.T.Helper()
	for _, x := range e.Execs(name) {
		if x.ID == id {
			return x
		}
	}
	e.T.Fatalf("no execution %s in %s", id, name)
	return session.Execution{}
}

func (e *env) waitExec(name, id string, within time.Duration, done func(session.Execution) bool) session.Execution {
	e.T.Helper()
	deadline := time.Now().Add(within)
	for {
		x := e.execution(name, id)
		if done(x) {
			return x
		}
		if time.Now().After(deadline) {
			e.T.Fatalf("execution %s: %+v after %s\ndaemon log:\n%s", id, x, within, e.DaemonLog())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// A full host disk is an event, not a crash: on a small tmpfs as the data
// directory, output that does not fit is held in the guest, a guest that
// fills the host through its workspace is paused with the reason, what
// needs space is refused below the floor, and everything continues when
// space returns.
func TestDiskFull(t *testing.T) {
	if testing.Short() {
		t.Skip("boots VMs")
	}
	mnt := smallFS(t, 512<<20)
	e := newEnvAt(t, vmmtest.DataDirIn(t, filepath.Join(mnt, "data")))
	os.WriteFile(filepath.Join(e.Data, "config.toml"), []byte("memory = \"256M\"\ndisk = \"48M\"\nidle_timeout = \"0\"\nretention = \"1G\"\nfree_space_floor = \"96M\"\noutput_budget = \"0\"\n"), 0o644)
	e.StartDaemon()
	e.OK("create", "a")
	e.OK("create", "b")
	filler := filepath.Join(mnt, "filler")

	e.Subtest(t, "output that does not fit is held, then stored byte-exact", func(t *testing.T) {
		// Known output, fast to produce under TCG: a random file, catted
		// eight times (256 MB). A chunk lost or stored twice changes the
		// replay's length or its hash.
		block := make([]byte, 32<<20)
		rand.Read(block)
		local := filepath.Join(t.TempDir(), "block")
		os.WriteFile(local, block, 0o644)
		e.OK("put", "a", local, "block")
		fill(t, mnt, filler, 160<<20)
		id := strings.TrimSpace(e.OK("exec", "a", "--detach", "--", "cat", "block", "block", "block", "block", "block", "block", "block", "block"))
		x := e.waitExec("a", id, 3*time.Minute, func(x session.Execution) bool { return x.Held != "" || x.State.Done() })
		if x.State.Done() || !strings.HasPrefix(x.Held, "output held: host disk") {
			t.Fatalf("the output was not held: %+v", x)
		}
		// The daemon answers, and so do other sessions: the noisy one is
		// held first, so a quiet one's small output is still stored.
		e.OK("ls")
		if out := e.OK("exec", "b", "--", "echo", "alive"); out != "alive\n" {
			t.Errorf("a quiet session's echo with the noisy one held: %q", out)
		}
		// Whoever follows the held command is told at once, on stderr;
		// ls and info say which session is held.
		follow := e.Cmd("logs", "a", id, "-f")
		var notice lockedBuffer
		follow.Stdout, follow.Stderr = io.Discard, &notice
		if err := follow.Start(); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(30 * time.Second); !strings.Contains(notice.String(), "berth: output held: host disk") && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
		}
		follow.Process.Kill()
		follow.Wait()
		if !strings.Contains(notice.String(), "berth: output held: host disk") {
			t.Errorf("logs -f of the held command said %q, want the held notice", notice.String())
		}
		if r := e.Run("ls"); !strings.Contains(r.Stderr, "output held") || !strings.Contains(r.Stderr, ": a") {
			t.Errorf("ls with a held session: stderr %q", r.Stderr)
		}
		if out := e.OK("info", "a"); !strings.Contains(out, "Output held:") {
			t.Errorf("info of the held session:\n%s", out)
		}
		held := x.StdoutBytes
		time.Sleep(2 * time.Second)
		if x := e.execution("a", id); x.StdoutBytes > held+8<<20 || x.State.Done() {
			t.Errorf("held output kept being stored: %d → %d bytes (%s)", held, x.StdoutBytes, x.State)
		}
		os.Remove(filler)
		freed := time.Now()
		x = e.waitExec("a", id, 5*time.Minute, func(x session.Execution) bool { return x.State.Done() })
		t.Logf("held at %d bytes; finished %s after space returned", held, time.Since(freed).Round(time.Millisecond))
		if x.State != session.ExecExited || x.Held != "" || x.StdoutBytes != 8*int64(len(block)) {
			t.Fatalf("after space returned: %+v", x)
		}
		want := sha256.New()
		for i := 0; i < 8; i++ {
			want.Write(block)
		}
		c := e.Cmd("logs", "a", id)
		got := sha256.New()
		var stderr strings.Builder
		c.Stdout, c.Stderr = got, &stderr
		if err := c.Run(); err != nil {
			t.Fatalf("logs: %v: %s", err, stderr.String())
		}
		if string(got.Sum(nil)) != string(want.Sum(nil)) {
			t.Fatalf("the replay differs from what the command wrote (%d bytes recorded)", x.StdoutBytes)
		}
		e.OK("delete", "a", "--yes")
	})

	e.Subtest(t, "a guest filling the host through its workspace pauses, and resumes when space returns", func(t *testing.T) {
		e.OK("create", "w", "--disk", "256M")
		fill(t, mnt, filler, 150<<20)
		id := strings.TrimSpace(e.OK("exec", "w", "--detach", "--", "dd", "if=/dev/zero", "of=/workspace/big", "bs=1M", "count=200", "conv=fsync"))
		s := e.WaitState("w", session.StatePaused, 3*time.Minute)
		if !strings.Contains(s.Cause, "host disk full") || !strings.Contains(s.Cause, "free under") {
			t.Errorf("paused with cause %q", s.Cause)
		}
		start := time.Now()
		e.Fails("host disk full", "exec", "w", "--", "true")
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("exec on the paused session took %s to fail", d)
		}
		if x := e.execution("w", id); x.State.Done() {
			t.Fatalf("the command ended while the session was paused: %+v", x)
		}
		os.Remove(filler) // the session resumes by itself above the floor
		x := e.waitExec("w", id, 3*time.Minute, func(x session.Execution) bool { return x.State.Done() })
		if x.State != session.ExecExited || x.ExitCode == nil || *x.ExitCode != 0 {
			t.Fatalf("dd after space returned: %+v", x)
		}
		e.OK("flush", "w")
		if got := strings.TrimSpace(e.OK("exec", "w", "--", "stat", "-c", "%s", "/workspace/big")); got != strconv.Itoa(200<<20) {
			t.Errorf("the file is %s bytes, want %d", got, 200<<20)
		}
		e.OK("exec", "w", "--", "rm", "/workspace/big")
	})

	e.Subtest(t, "below the floor what needs space is refused, with the figures", func(t *testing.T) {
		fill(t, mnt, filler, 64<<20)
		e.Fails("below the 96 MiB floor", "create", "x")
		e.Fails("below the 96 MiB floor", "sleep", "w")
		r := e.Run("ls")
		if r.Code != 0 || !strings.Contains(r.Stderr, "host disk low") {
			t.Errorf("ls below the floor: %d %q", r.Code, r.Stderr)
		}
		e.OK("exec", "w", "--", "true") // running sessions keep running
		// A daemon killed below the floor comes back and says so. (Its
		// store gives back what it had preallocated; take that too.)
		e.KillDaemon()
		e.StartDaemon()
		fill(t, mnt, filler, 64<<20)
		time.Sleep(1500 * time.Millisecond) // the daemon notices within a second
		c := e.Cmd("ls", "--json")
		out, _ := c.Output()
		var list []session.Session
		json.Unmarshal(out, &list)
		if len(list) != 2 {
			t.Errorf("after the restart ls lists %d sessions", len(list))
		}
		if r := e.Run("ls"); !strings.Contains(r.Stderr, "host disk low") {
			t.Errorf("after the restart ls says %q", r.Stderr)
		}
		if out := e.OK("doctor"); !strings.Contains(out, "below the 96 MiB floor") {
			t.Errorf("doctor says:\n%s", out)
		}
		os.Remove(filler)
	})

	e.Subtest(t, "an end the full disk keeps from the store is reported so, and stored once space returns", func(t *testing.T) {
		c := e.Cmd("exec", "b", "--", "sleep", "4")
		var stderr lockedBuffer
		c.Stdout, c.Stderr = io.Discard, &stderr
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		fill(t, mnt, filler, 8<<20) // below what the store keeps free for its records
		err := c.Wait()
		os.Remove(filler)
		if err != nil || !strings.Contains(stderr.String(), session.EndNotRecordedNote) {
			t.Fatalf("exec whose end could not be stored: %v, stderr %q; want exit 0 and the note", err, stderr.String())
		}
		id := regexp.MustCompile(`berth: (x[0-9a-f]+): `).FindStringSubmatch(stderr.String())
		if id == nil {
			t.Fatalf("no execution id in %q", stderr.String())
		}
		x := e.waitExec("b", id[1], time.Minute, func(x session.Execution) bool { return x.State.Done() })
		if x.State != session.ExecExited || x.ExitCode == nil || *x.ExitCode != 0 || x.Error != "" {
			t.Errorf("once space returned, the record says %+v", x)
		}
	})
	e.OK("delete", "w", "--yes")
	e.OK("delete", "b", "--yes")
}

// TestBenchDiskFull prints issue 13's figure: the time from space
// returning to a held command's output being stored again.
func TestBenchDiskFull(t *testing.T) {
	needBench(t)
	mnt := smallFS(t, 512<<20)
	e := newEnvAt(t, vmmtest.DataDirIn(t, filepath.Join(mnt, "data")))
	os.WriteFile(filepath.Join(e.Data, "config.toml"), []byte("memory = \"256M\"\ndisk = \"48M\"\nidle_timeout = \"0\"\nretention = \"1G\"\nfree_space_floor = \"96M\"\noutput_budget = \"0\"\n"), 0o644)
	e.StartDaemon()
	client := api.Dial(filepath.Join(e.Data, "berth.sock"))
	defer client.Close()
	filler := filepath.Join(mnt, "filler")
	var resumed []time.Duration
	for i := 0; i < 5; i++ {
		name := fmt.Sprintf("h%d", i)
		e.OK("create", name)
		e.OK("exec", name, "--", "sh", "-c", "dd if=/dev/zero of=block bs=1M count=32 2>/dev/null")
		fill(t, mnt, filler, 140<<20)
		id := strings.TrimSpace(e.OK("exec", name, "--detach", "--", "cat", "block", "block", "block", "block"))
		x := e.waitExec(name, id, 3*time.Minute, func(x session.Execution) bool { return x.Held != "" || x.State.Done() })
		if x.State.Done() {
			t.Fatalf("not held: %+v", x)
		}
		time.Sleep(time.Second)
		held, _ := client.Execution(context.Background(), id)
		os.Remove(filler)
		start := time.Now()
		for {
			x, err := client.Execution(context.Background(), id)
			if err != nil {
				t.Fatal(err)
			}
			if x.StdoutBytes > held.StdoutBytes {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		resumed = append(resumed, time.Since(start))
		e.waitExec(name, id, 5*time.Minute, func(x session.Execution) bool { return x.State.Done() })
		e.OK("delete", name, "--yes")
	}
	t.Logf("BENCH %-44s %10s p50, %s max of %d (report)", "space returns → held output stored again", median(resumed).Round(time.Millisecond), slices.Max(resumed).Round(time.Millisecond), len(resumed))
}

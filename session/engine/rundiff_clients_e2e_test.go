package engine_test

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
)

// The change record against every way into a workspace, its overflow,
// a starting point the limits removed, and an undo racing writes.
//
// The daemon keeps at most two checkpoints per session (so a third run's
// start removes the oldest ended run's) and records at most 200 entries
// per run (so a run that makes 300 files overflows its record).
const clientsConfig = ckptConfig + "checkpoint_limit = 2\nrun_record_limit = 200\n"

// TestRunDiffClients: changes made during a run through put, cp
// (host→guest), sshfs and an interactive SSH shell — none of them the
// run's commands — are listed exactly by run diff, from the guest's
// record. A run whose record overflows says it fell back to a full
// comparison, and is still exact. A run whose starting point the limits
// removed says so in one line. An undo of a path racing a writer that
// replaces the file by rename, and readers, never shows a reader a
// half-restored file: every read is the start's content or a write's.
func TestRunDiffClients(t *testing.T) {
	e := newEnv(t)
	os.WriteFile(filepath.Join(e.Data, "config.toml"), []byte(clientsConfig), 0o644)
	se := newSSHEnv(t, e)
	const name = "cl"
	e.OK("create", name)
	defer e.Run("delete", name, "--yes")
	// The race file is 256 KiB of S at the start: a reader that saw a
	// partly written copy would see a size or a sum of neither.
	e.OK("exec", name, "--", "sh", "-c", "mkdir tree && echo one > tree/one.txt && echo two > tree/two.txt && echo keep > keep.txt && "+
		"echo ssh > byssh.txt && echo fs > byfs.txt && echo old > fsold.txt && head -c 262144 /dev/zero | tr '\\0' S > race.txt")

	id := strings.TrimSpace(e.OK("run", "start", name, "--title", "clients", "--keep"))
	local := t.TempDir()
	os.WriteFile(filepath.Join(local, "put.txt"), []byte("by put\n"), 0o644)
	os.WriteFile(filepath.Join(local, "keep.txt"), []byte("keep, put again\n"), 0o644)
	os.MkdirAll(filepath.Join(local, "cptree", "sub"), 0o755)
	os.WriteFile(filepath.Join(local, "cptree", "a.txt"), []byte("by cp\n"), 0o644)
	os.WriteFile(filepath.Join(local, "cptree", "sub", "b.bin"), []byte("\x00\x01binary"), 0o600)

	want := []string{
		"added cptree", "added cptree/a.txt", "added cptree/sub", "added cptree/sub/b.bin", // cp
		"added put.txt", "modified keep.txt", // put, in the run and outside it
		"added fsnew.txt", "modified byfs.txt", "renamed fsmoved.txt from fsold.txt", // sshfs
		"added shell.txt", "added shlink", "modified byssh.txt", "removed tree/two.txt", // an SSH shell
	}
	slices.Sort(want)

	e.Subtest(t, "put, cp, sshfs and an SSH shell are listed exactly", func(t *testing.T) {
		e.OK("put", "--run", id, name, filepath.Join(local, "put.txt"), "put.txt")
		e.OK("put", name, filepath.Join(local, "keep.txt"), "keep.txt") // outside the run: still its workspace's change
		e.OK("cp", "--run", id, filepath.Join(local, "cptree"), name+":cptree")

		// sshfs: a new file, an append, a rename.
		if _, err := exec.LookPath("sshfs"); err != nil {
			t.Fatal("sshfs is not installed (make deps installs it): this test needs it")
		}
		mnt := t.TempDir()
		args := []string{name + "@127.0.0.1:/workspace", mnt, "-p", se.port, "-o", "IdentityFile=" + se.keys["admin"],
			"-o", "IdentitiesOnly=yes", "-o", "UserKnownHostsFile=" + filepath.Join(se.dir, "known_hosts"),
			"-o", "StrictHostKeyChecking=accept-new", "-o", "BatchMode=yes", "-o", "cache=no"}
		if _, errs, code := se.run("sshfs", args...); code != 0 {
			t.Fatalf("sshfs: %d %s", code, errs)
		}
		c := exec.Command("sh", "-c", "echo new > fsnew.txt && echo more >> byfs.txt && mv fsold.txt fsmoved.txt")
		c.Dir = mnt
		out, err := c.CombinedOutput()
		exec.Command("fusermount", "-u", "-z", mnt).Run()
		if err != nil {
			t.Fatalf("on sshfs: %v\n%s", err, out)
		}

		// An interactive shell with a terminal, as a person uses one.
		// The line is typed once the shell has prompted, as a person
		// would: typed ahead, a shell setting up its line editing may
		// drop part of it (under load, one run in many lost all but the
		// first command).
		sh := exec.Command("ssh", append(append(se.opts("admin"), "-tt", "-p", se.port), name+"@127.0.0.1")...)
		sh.Env = append(os.Environ(), "HOME="+se.dir)
		typed, err := sh.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		shOut := &syncBuf{}
		sh.Stdout, sh.Stderr = shOut, shOut
		if err := sh.Start(); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(20 * time.Second); !strings.ContainsAny(shOut.String(), "#$"); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				sh.Process.Kill()
				sh.Wait()
				t.Fatalf("the SSH shell did not prompt within 20s: %q", shOut.String())
			}
		}
		io.WriteString(typed, "cd /workspace && echo shell > shell.txt && rm tree/two.txt && echo more >> byssh.txt && ln -s keep.txt shlink; exit 3\n")
		sh.Wait()
		if sh.ProcessState == nil || sh.ProcessState.ExitCode() != 3 {
			t.Fatalf("ssh shell: %v\n%s", sh.ProcessState, shOut.String())
		}

		d := e.diff("run", "diff", id)
		got := changeList(d)
		slices.Sort(got)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("changes:\n%s\nwant:\n%s\nthe SSH shell said:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"), shOut.String())
		}
		if d.Full {
			t.Errorf("compared whole trees (%s), want the guest's record", d.Note)
		}
		e.OK("run", "end", id)
	})

	var id2 string
	e.Subtest(t, "an overflowed record falls back to a full comparison", func(t *testing.T) {
		id2 = strings.TrimSpace(e.OK("run", "start", name, "--title", "many", "--keep"))
		e.OK("exec", "--run", id2, name, "--", "sh", "-c", "mkdir many && i=0; while [ $i -lt 300 ]; do echo $i > many/f$i; i=$((i+1)); done; echo changed >> keep.txt")
		d := e.diff("run", "diff", id2)
		if !d.Full || !strings.Contains(d.Note, "overflowed") || !strings.Contains(d.Note, "fell back to a full comparison") {
			t.Errorf("full %v, note %q: want the fallback said", d.Full, d.Note)
		}
		got := changeList(d)
		if len(got) != 302 || !slices.Contains(got, "added many") || !slices.Contains(got, "added many/f299") || !slices.Contains(got, "modified keep.txt") {
			t.Errorf("%d changes after an overflow, want 302 (many, 300 files in it, keep.txt): %q", len(got), got[:min(len(got), 5)])
		}
		if stat := e.OK("run", "diff", id2, "--stat"); !strings.Contains(stat, "fell back to a full comparison") || !strings.Contains(stat, "302 files changed") {
			t.Errorf("--stat does not say it fell back, or miscounts:\n%s", stat[max(0, len(stat)-400):])
		}
		e.OK("run", "end", id2)
	})

	var id3 string
	e.Subtest(t, "a starting point removed by the limits is said in one line", func(t *testing.T) {
		// Two checkpoints are kept: a third run's start removes the
		// oldest ended run's.
		id3 = strings.TrimSpace(e.OK("run", "start", name, "--title", "race", "--keep"))
		e.Fails("was removed (by hand or by the checkpoint limits)", "run", "diff", id)
		e.Fails("was removed (by hand or by the checkpoint limits)", "run", "undo", id, "keep.txt", "--yes")
		if d := e.diff("run", "diff", id2); d.Run != id2 {
			t.Errorf("the newer ended run's diff: %+v", d)
		}
	})

	e.Subtest(t, "an undo racing writes and reads", func(t *testing.T) {
		// Outside the run (an undo waits for none of them): a writer that
		// replaces race.txt by rename with 256 KiB of W, and a reader
		// that notes each read's size and sum.
		e.OK("exec", name, "--", "sh", "-c", "nohup sh -c 'while [ ! -e /tmp/stop ]; do head -c 262144 /dev/zero | tr \"\\0\" W > race.tmp && mv race.tmp race.txt; done' >/dev/null 2>&1 &"+
			" nohup sh -c 'while [ ! -e /tmp/stop ]; do sha256sum < race.txt >> /tmp/reads; done' >/dev/null 2>&1 &")
		for i := 0; reads(e.out(name, "cat /tmp/reads 2>/dev/null | wc -l")) < 5; i++ {
			if i > 100 {
				t.Fatal("the reader never started")
			}
			time.Sleep(100 * time.Millisecond)
		}
		// An undo that finds race.txt as the start has it (a previous
		// undo's, not yet overwritten) has nothing to put back: most do.
		putBack := 0
		for range 5 {
			if strings.Contains(e.OK("run", "undo", id3, "race.txt", "--yes"), "put back race.txt") {
				putBack++
			}
		}
		if putBack == 0 {
			t.Error("no undo put race.txt back: the race did not happen")
		}
		e.OK("exec", name, "--", "sh", "-c", "touch /tmp/stop; sleep 1; rm -f race.tmp")
		sums := e.out(name, "head -c 262144 /dev/zero | tr '\\0' S | sha256sum; head -c 262144 /dev/zero | tr '\\0' W | sha256sum; sort /tmp/reads | uniq -c")
		lines := strings.Split(sums, "\n")
		sumS, sumW := strings.Fields(lines[0])[0], strings.Fields(lines[1])[0]
		seen := map[string]bool{}
		for _, l := range lines[2:] {
			f := strings.Fields(l)
			if len(f) < 2 {
				continue
			}
			if f[1] != sumS && f[1] != sumW {
				t.Errorf("a reader saw race.txt neither as it was nor as written (%s times): %s", f[0], f[1])
			}
			seen[f[1]] = true
		}
		if !seen[sumW] {
			t.Errorf("the reader never saw a write: the race did not happen")
		}
		if final := e.out(name, "sha256sum < race.txt"); !strings.HasPrefix(final, sumS) && !strings.HasPrefix(final, sumW) {
			t.Errorf("race.txt ends as neither: %s", final)
		}
		e.OK("run", "end", id3)
	})

	e.Subtest(t, "run rm removes the record and its starting point, not while its commands run", func(t *testing.T) {
		id4 := strings.TrimSpace(e.OK("run", "start", name, "--title", "to remove", "--keep"))
		ck := e.runs(name)[len(e.runs(name))-1].Checkpoint
		before := e.checkpoints(name)
		x := strings.TrimSpace(e.OK("exec", "--detach", "--run", id4, name, "--", "sleep", "60"))
		e.Fails("running command", "run", "rm", id4)
		e.OK("run", "end", id4)
		e.Fails("running command", "run", "rm", id4) // ended, its command still runs
		e.OK("cancel", name, x)
		out := e.OK("run", "rm", id4)
		if !strings.Contains(out, "removed run "+id4+" and its starting point, checkpoint "+ck) {
			t.Errorf("run rm said %q", out)
		}
		after := e.checkpoints(name)
		if len(after) != len(before)-1 || slices.ContainsFunc(after, func(c session.Checkpoint) bool { return c.ID == ck }) {
			t.Errorf("checkpoints %d → %d, %s still there: %+v", len(before), len(after), ck, after)
		}
		if slices.ContainsFunc(e.runs(name), func(r session.Run) bool { return r.ID == id4 }) {
			t.Error("the removed run is still listed")
		}
		e.Fails("no such run", "run", "diff", id4)
		if !slices.ContainsFunc(e.Execs(name), func(xe session.Execution) bool { return xe.ID == x && xe.State == session.ExecCancelled }) {
			t.Errorf("the removed run's command %s is not kept with the session, cancelled", x)
		}
	})
}

func reads(s string) int {
	n, _ := strconv.Atoi(strings.TrimSpace(s))
	return n
}

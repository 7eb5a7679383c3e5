package sshd

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
)

// sshAs runs ssh as user (a session's name, or the workbench) with a
// remote command line.
func (o *openSSH) sshAs(ctx context.Context, user string, extra []string, remote string) *exec.Cmd {
	args := append(o.opts(), "-p", o.port)
	args = append(args, extra...)
	args = append(args, user+"@127.0.0.1")
	if remote != "" {
		args = append(args, remote)
	}
	return o.command(ctx, "ssh", args...)
}

// scp runs scp with the given arguments; remote paths are user@127.0.0.1:PATH.
func (o *openSSH) scp(ctx context.Context, args ...string) *exec.Cmd {
	all := append(o.opts(), "-P", o.port)
	return o.command(ctx, "scp", append(all, args...)...)
}

func runCmd(cmd *exec.Cmd) (stdout, stderr string, code int) {
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.Run()
	code = -1
	if cmd.ProcessState != nil {
		code = cmd.ProcessState.ExitCode()
	}
	return out.String(), errb.String(), code
}

// The user name picks the session: NAME@HOST runs commands in it with
// their streams apart and their exit status; berth@HOST reaches the
// workbench.
func TestSessionAsHost(t *testing.T) {
	op := newKey(t, "op@host", Operator)
	viewer := newKey(t, "viewer@host", Viewer)
	w := newWorld(t, worldOpts{}, op, viewer)
	w.create("demo", "idle")
	if _, err := w.fake.Stop(context.Background(), "idle"); err != nil {
		t.Fatal(err)
	}
	o := newOpenSSH(t, w, op)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	out, errs, code := runCmd(o.sshAs(ctx, "demo", nil, "echo o; echo e >&2; exit 3"))
	if out != "o\n" || errs != "e\n" || code != 3 {
		t.Errorf("demo@: stdout %q stderr %q exit %d", out, errs, code)
	}
	x, err := w.fake.Executions(ctx, "demo", true)
	if err != nil || len(x) == 0 || !x[len(x)-1].Outside || !strings.Contains(x[len(x)-1].By, "op@host") {
		t.Errorf("the command is not recorded as outside berth's coordination by the key: %+v %v", x, err)
	}
	if out, _, code := runCmd(o.sshAs(ctx, "berth", nil, "ls")); code != 0 || !strings.Contains(out, "demo") {
		t.Errorf("berth@ is not the workbench: %d %q", code, out)
	}
	if _, errs, code := runCmd(o.sshAs(ctx, "idle", nil, "true")); code == 0 || !strings.Contains(errs, "start it first") || strings.Count(errs, "\n") != 1 {
		t.Errorf("a stopped session: exit %d, %q", code, errs)
	}
	if _, errs, code := runCmd(o.sshAs(ctx, "demo", nil, "rsync --server -vlogDtpre.iLsfxC . /workspace")); code != 127 ||
		!strings.Contains(errs, "rsync: not found in session demo (image mini); use --image debian") {
		t.Errorf("a program the image lacks: exit %d, %q", code, errs)
	}
	ov := newOpenSSH(t, w, viewer)
	if _, errs, code := runCmd(ov.sshAs(ctx, "demo", nil, "true")); code == 0 || !strings.Contains(errs, "viewer") {
		t.Errorf("a viewer ran a command in a session: exit %d, %q", code, errs)
	}
	if err := session.ValidateName("berth"); err == nil {
		t.Error("berth is a valid session name")
	}
}

// scp in its classic protocol (-O), answered by berth itself: files and
// trees both ways, byte-exact, modes and times with -p.
func TestSCPClassic(t *testing.T) {
	needBinary(t, "scp")
	op := newKey(t, "op@scp", Operator)
	w := newWorld(t, worldOpts{}, op)
	w.create("demo")
	o := newOpenSSH(t, w, op)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	local := t.TempDir()
	data := make([]byte, 3<<20+7)
	rand.Read(data)
	os.WriteFile(filepath.Join(local, "f.bin"), data, 0o640)
	os.MkdirAll(filepath.Join(local, "tree", "sub"), 0o755)
	os.WriteFile(filepath.Join(local, "tree", "a.txt"), []byte("a\n"), 0o644)
	os.WriteFile(filepath.Join(local, "tree", "sub", "b.txt"), []byte("bb\n"), 0o600)
	old := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	os.Chtimes(filepath.Join(local, "f.bin"), old, old)

	if _, errs, code := runCmd(o.scp(ctx, "-O", "-p", filepath.Join(local, "f.bin"), "demo@127.0.0.1:f.bin")); code != 0 {
		t.Fatalf("scp -O up: exit %d: %s", code, errs)
	}
	if _, errs, code := runCmd(o.scp(ctx, "-O", "-r", filepath.Join(local, "tree"), "demo@127.0.0.1:tree")); code != 0 {
		t.Fatalf("scp -O -r up: exit %d: %s", code, errs)
	}
	back := t.TempDir()
	if _, errs, code := runCmd(o.scp(ctx, "-O", "-p", "demo@127.0.0.1:f.bin", filepath.Join(back, "f.bin"))); code != 0 {
		t.Fatalf("scp -O down: exit %d: %s", code, errs)
	}
	if _, errs, code := runCmd(o.scp(ctx, "-O", "-r", "demo@127.0.0.1:tree", back)); code != 0 {
		t.Fatalf("scp -O -r down: exit %d: %s", code, errs)
	}
	got, _ := os.ReadFile(filepath.Join(back, "f.bin"))
	if !bytes.Equal(got, data) {
		t.Errorf("f.bin came back as %d bytes", len(got))
	}
	if fi, err := os.Stat(filepath.Join(back, "f.bin")); err != nil || !fi.ModTime().Equal(old) || fi.Mode().Perm() != 0o640 {
		t.Errorf("-p: %v, %v", fi.ModTime(), fi.Mode())
	}
	for name, want := range map[string]string{"tree/a.txt": "a\n", "tree/sub/b.txt": "bb\n"} {
		if b, err := os.ReadFile(filepath.Join(back, name)); err != nil || string(b) != want {
			t.Errorf("%s: %q %v", name, b, err)
		}
	}
	if _, errs, code := runCmd(o.scp(ctx, "-O", "demo@127.0.0.1:nosuch", back)); code == 0 || !strings.Contains(errs, "nosuch") {
		t.Errorf("a missing source: exit %d, %q", code, errs)
	}
	if _, errs, code := runCmd(o.scp(ctx, "-O", filepath.Join(local, "f.bin"), "demo@127.0.0.1:../escape")); code == 0 || errs == "" {
		t.Errorf("an escaping target: exit %d, %q", code, errs)
	}
}

// TestUnknownUserWithCommand: a user name that is no session, with a
// command, is a typo of a session's name (or a forgotten berth@): it
// fails with one line naming the workbench, and never runs the command
// on the workbench, where "stop X" would act on session X. Without a
// command (ssh -t HOST, the user name being the local login) it opens the
// workbench, as berth@ does.
func TestUnknownUserWithCommand(t *testing.T) {
	needBinary(t, "tmux")
	op := newKey(t, "op@host", Operator)
	w := newWorld(t, worldOpts{}, op)
	w.create("demo", "x")
	o := newOpenSSH(t, w, op)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	for _, c := range []struct {
		user, remote string
		extra        []string
	}{
		{"nosuch", "ls", nil},
		{"typo", "stop x", nil},
		{"typo", "stop x", []string{"-tt"}},
		{"Not.A.Name", "ls", nil},
		{"typo", "tui", []string{"-tt"}},
	} {
		out, errs, code := runCmd(o.sshAs(ctx, c.user, c.extra, c.remote))
		want := `berth: no session "` + c.user + `" (the workbench is berth@127.0.0.1)`
		if code == 0 || strings.TrimRight(errs, "\r\n") != want || out != "" {
			t.Errorf("ssh %v %s@ %q: exit %d, stdout %q, stderr %q; want a failure with %q", c.extra, c.user, c.remote, code, out, errs, want)
		}
	}
	if s, _ := w.fake.Get(ctx, "x"); s.State != session.StateRunning {
		t.Errorf("typo@HOST stop x stopped x: %s", s.State)
	}
	if n := w.fake.Calls("Stop"); n != 0 {
		t.Errorf("%d Stop calls", n)
	}
	if out, errs, code := runCmd(o.sshAs(ctx, "berth", nil, "ls")); code != 0 || !strings.Contains(out, "demo") {
		t.Errorf("berth@ ls: exit %d, %q %q", code, out, errs)
	}

	// No command: the workbench's TUI, under any name.
	x := &tmux{t: t, sock: filepath.Join(o.dir, "tmux.sock")}
	sshLine := "HOME=" + o.dir + " ssh " + strings.Join(quoteAll(append(o.opts(), "-t", "-p", o.port, "nosuch@127.0.0.1")), " ") +
		"; echo ssh-exit=$?; sleep 30"
	if out, err := x.run("-f", "/dev/null", "new-session", "-d", "-s", "tui", "-x", "100", "-y", "30", sshLine); err != nil {
		t.Fatalf("tmux: %v: %s", err, out)
	}
	t.Cleanup(func() { x.run("kill-server") })
	x.waitScreen("berth › sessions", 15*time.Second)
	x.run("send-keys", "-t", "tui", "q")
	x.waitScreen("ssh-exit=0", 10*time.Second)
}

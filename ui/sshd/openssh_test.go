package sshd

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"
)

// openSSH runs the real OpenSSH client against a world.
type openSSH struct {
	t          *testing.T
	w          *world
	dir        string
	key        string
	knownHosts string
	port       string
}

func needBinary(t *testing.T, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			t.Skipf("%s is not installed (apt-get install -y openssh-client tmux): %v", n, err)
		}
	}
}

func newOpenSSH(t *testing.T, w *world, k testKey) *openSSH {
	t.Helper()
	needBinary(t, "ssh", "sftp")
	o := &openSSH{t: t, w: w, dir: t.TempDir()}
	o.key = k.writeOpenSSH(t, o.dir)
	_, o.port, _ = net.SplitHostPort(w.addr)
	o.knownHosts = filepath.Join(o.dir, "known_hosts")
	line := fmt.Sprintf("[127.0.0.1]:%s %s", o.port, gossh.MarshalAuthorizedKey(w.srv.HostKey()))
	if err := os.WriteFile(o.knownHosts, []byte(line), 0o600); err != nil {
		t.Fatal(err)
	}
	return o
}

// opts are the client options: no user config, no agent, only our key,
// the server's real host key.
func (o *openSSH) opts(identities ...string) []string {
	args := []string{"-F", "/dev/null",
		"-o", "UserKnownHostsFile=" + o.knownHosts, "-o", "GlobalKnownHostsFile=/dev/null",
		"-o", "StrictHostKeyChecking=yes", "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none",
		"-o", "BatchMode=yes", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=10"}
	if len(identities) == 0 {
		identities = []string{o.key}
	}
	for _, id := range identities {
		args = append(args, "-i", id)
	}
	return args
}

func (o *openSSH) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), "HOME="+o.dir)
	cmd.Dir = o.dir
	return cmd
}

// ssh runs ssh with a remote command line on the workbench.
func (o *openSSH) ssh(ctx context.Context, extra []string, remote string) *exec.Cmd {
	args := append(o.opts(), "-p", o.port)
	args = append(args, extra...)
	args = append(args, "berth@127.0.0.1", remote)
	return o.command(ctx, "ssh", args...)
}

// sftp runs an sftp batch as user (the session).
func (o *openSSH) sftp(ctx context.Context, user, batch string) *exec.Cmd {
	bf := filepath.Join(o.dir, "batch")
	if err := os.WriteFile(bf, []byte(batch), 0o600); err != nil {
		o.t.Fatal(err)
	}
	args := append(o.opts(), "-P", o.port, "-b", bf, user+"@127.0.0.1")
	return o.command(ctx, "sftp", args...)
}

func TestOpenSSHCommand(t *testing.T) {
	op := newKey(t, "op@openssh", Operator)
	w := newWorld(t, worldOpts{}, op)
	w.create("demo")
	o := newOpenSSH(t, w, op)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	cmd := o.ssh(ctx, nil, "exec demo -- sh -c 'echo out; echo err >&2; exit 7'")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 7 {
		t.Fatalf("ssh exec: %v (stderr %q), want exit 7", err, errb.String())
	}
	if out.String() != "out\n" || errb.String() != "err\n" {
		t.Errorf("stdout %q stderr %q", out.String(), errb.String())
	}

	cmd = o.ssh(ctx, nil, "frobnicate")
	errb.Reset()
	cmd.Stderr = &errb
	cmd.Run()
	if cmd.ProcessState.ExitCode() != 2 || !strings.HasPrefix(errb.String(), "berth: unknown command \"frobnicate\"") {
		t.Errorf("unknown command: exit %d, stderr %q", cmd.ProcessState.ExitCode(), errb.String())
	}

	// ssh HOST with no terminal: one line on how to get the TUI.
	cmd = o.ssh(ctx, []string{"-T"}, "")
	cmd.Args = cmd.Args[:len(cmd.Args)-1] // no remote command at all
	errb.Reset()
	cmd.Stderr = &errb
	cmd.Run()
	if cmd.ProcessState.ExitCode() != 2 || !strings.HasPrefix(errb.String(), "berth: the TUI needs a terminal: ssh -t") {
		t.Errorf("ssh -T: exit %d, stderr %q", cmd.ProcessState.ExitCode(), errb.String())
	}
}

// TestOpenSSHAuthBypass: ssh offers admin key A (it has only its public
// half, so after the server accepts the offer it cannot sign and moves
// on), then logs in with viewer key B: the session is B's.
func TestOpenSSHAuthBypass(t *testing.T) {
	a := newKey(t, "alice-admin", Admin)
	b := newKey(t, "bob-viewer", Viewer)
	w := newWorld(t, worldOpts{}, a, b)
	w.create("demo")
	o := newOpenSSH(t, w, b)
	pubOnly := filepath.Join(o.dir, "alice_pub_only")
	pub := gossh.MarshalAuthorizedKey(a.pub())
	os.WriteFile(pubOnly, pub, 0o600)
	os.WriteFile(pubOnly+".pub", pub, 0o600)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	args := append(o.opts(pubOnly, o.key), "-v", "-p", o.port, "berth@127.0.0.1", "pause demo")
	cmd := o.command(ctx, "ssh", args...)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	cmd.Run()
	log := errb.String()
	if !strings.Contains(log, "Server accepts key: "+pubOnly) {
		t.Skipf("this ssh did not offer the public-only key first; log:\n%s", log)
	}
	if cmd.ProcessState.ExitCode() != 1 || !strings.Contains(log, "role viewer may not pause sessions") {
		t.Errorf("exit %d; want the viewer's refusal; log:\n%s", cmd.ProcessState.ExitCode(), log)
	}
	if s, _ := w.fake.Get(ctx, "demo"); s.State != "running" {
		t.Errorf("demo is %s", s.State)
	}
}

func fileSHA(t *testing.T, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

func TestOpenSSHSFTPRoundTrip(t *testing.T) {
	op := newKey(t, "op@openssh", Operator)
	w := newWorld(t, worldOpts{}, op)
	w.create("demo")
	o := newOpenSSH(t, w, op)
	local := filepath.Join(o.dir, "big.bin")
	data := make([]byte, 20<<20)
	rand.Read(data)
	if err := os.WriteFile(local, data, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	back := filepath.Join(o.dir, "back.bin")
	cmd := o.sftp(ctx, "demo", fmt.Sprintf("put %s big.bin\nls -l\nget /workspace/big.bin %s\n", local, back))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("sftp: %v\n%s", err, out)
	}
	want := sha256.Sum256(data)
	if got := sha256.Sum256([]byte(w.readFile("demo", "big.bin"))); got != want {
		t.Error("the workspace copy differs from the upload")
	}
	if got := fileSHA(t, back); got != want {
		t.Error("the downloaded copy differs from the upload")
	}
	if !strings.Contains(string(out), "big.bin") {
		t.Errorf("ls -l output: %s", out)
	}

	// Escapes are refused (sftp globs first, so it says "not found").
	for _, batch := range []string{"get /etc/passwd " + filepath.Join(o.dir, "passwd"), "put " + local + " /tmp/escaped", "cd ..\nls"} {
		cmd = o.sftp(ctx, "demo", batch+"\n")
		out, err = cmd.CombinedOutput()
		if err == nil {
			t.Errorf("%q succeeded:\n%s", batch, out)
		}
	}
	if _, err := os.Stat(filepath.Join(o.dir, "passwd")); err == nil {
		t.Error("/etc/passwd was fetched")
	}
}

// TestOpenSSHInterruptedUpload: an sftp put killed mid-upload leaves the
// old content under the name and no handle open in the session.
func TestOpenSSHInterruptedUpload(t *testing.T) {
	op := newKey(t, "op@openssh", Operator)
	w := newWorld(t, worldOpts{}, op)
	w.create("demo")
	w.fake.WriteFile(context.Background(), "demo", "target.bin", strings.NewReader("old content"))
	w.fake.Hang("File.WriteAt") // the upload is stuck in its first write until released
	o := newOpenSSH(t, w, op)
	local := filepath.Join(o.dir, "new.bin")
	f, _ := os.Create(local)
	io.Copy(f, io.LimitReader(rand.Reader, 16<<20))
	f.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := o.sftp(ctx, "demo", "put "+local+" target.bin\n")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // sftp and its ssh
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the upload to start", func() bool { return w.fake.Calls("File.WriteAt") > 0 })
	if n := w.fake.OpenFiles("demo"); n != 1 {
		t.Fatalf("%d files open mid-upload, want 1", n)
	}
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	cmd.Wait()
	waitFor(t, 10*time.Second, "the server to release the upload", func() bool { return w.fake.OpenFiles("demo") == 0 })
	if got := w.readFile("demo", "target.bin"); got != "old content" {
		t.Errorf("target has %d bytes, want the old content", len(got))
	}
}

// waitFor polls cond until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// tmux drives a terminal for the real ssh client.
type tmux struct {
	t    *testing.T
	sock string
}

func (x *tmux) run(args ...string) (string, error) {
	out, err := exec.Command("tmux", append([]string{"-S", x.sock}, args...)...).CombinedOutput()
	return string(out), err
}

func (x *tmux) waitScreen(want string, within time.Duration) string {
	x.t.Helper()
	deadline := time.Now().Add(within)
	var screen string
	for time.Now().Before(deadline) {
		screen, _ = x.run("capture-pane", "-p", "-t", "tui")
		if strings.Contains(screen, want) {
			return screen
		}
		time.Sleep(50 * time.Millisecond)
	}
	x.t.Fatalf("no %q on the screen within %s:\n%s", want, within, screen)
	return ""
}

// TestOpenSSHTUI: ssh -t into the TUI in a real terminal (tmux): it
// renders, reacts to a key and to a resize, and quits on q.
func TestOpenSSHTUI(t *testing.T) {
	needBinary(t, "tmux")
	op := newKey(t, "op@openssh", Operator)
	w := newWorld(t, worldOpts{}, op)
	w.create("alpha", "beta")
	o := newOpenSSH(t, w, op)
	x := &tmux{t: t, sock: filepath.Join(o.dir, "tmux.sock")}
	sshLine := "HOME=" + o.dir + " ssh " + strings.Join(quoteAll(append(o.opts(), "-t", "-p", o.port, "127.0.0.1")), " ") +
		"; echo ssh-exit=$?; sleep 30"
	if out, err := x.run("-f", "/dev/null", "new-session", "-d", "-s", "tui", "-x", "100", "-y", "30", sshLine); err != nil {
		t.Fatalf("tmux: %v: %s", err, out)
	}
	t.Cleanup(func() { x.run("kill-server") })
	x.run("set-option", "-t", "tui", "window-size", "manual")

	screen := x.waitScreen("alpha", 15*time.Second)
	if !strings.Contains(screen, "beta") {
		t.Errorf("no beta on the screen:\n%s", screen)
	}
	x.run("send-keys", "-t", "tui", "?")
	x.waitScreen("pause/resume", 5*time.Second)
	x.run("send-keys", "-t", "tui", "Escape")

	x.run("resize-window", "-t", "tui", "-x", "30", "-y", "8")
	x.waitScreen("berth needs at", 5*time.Second)
	x.run("resize-window", "-t", "tui", "-x", "100", "-y", "30")
	x.waitScreen("alpha", 5*time.Second)

	x.run("send-keys", "-t", "tui", "q")
	x.waitScreen("ssh-exit=0", 10*time.Second)
}

func quoteAll(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return out
}

// TestOpenSSHTUIHelp80x24: in a real 80x24 terminal the executions tab's
// help is longer than the screen: it opens at its top, ignores a key of
// the view, scrolls to its end (K), and q closes it without quitting.
func TestOpenSSHTUIHelp80x24(t *testing.T) {
	needBinary(t, "tmux")
	op := newKey(t, "op@openssh", Operator)
	w := newWorld(t, worldOpts{}, op)
	w.create("alpha")
	o := newOpenSSH(t, w, op)
	x := &tmux{t: t, sock: filepath.Join(o.dir, "tmux.sock")}
	sshLine := "HOME=" + o.dir + " ssh " + strings.Join(quoteAll(append(o.opts(), "-t", "-p", o.port, "127.0.0.1")), " ") +
		"; echo ssh-exit=$?; sleep 30"
	if out, err := x.run("-f", "/dev/null", "new-session", "-d", "-s", "tui", "-x", "80", "-y", "24", sshLine); err != nil {
		t.Fatalf("tmux: %v: %s", err, out)
	}
	t.Cleanup(func() { x.run("kill-server") })
	x.run("set-option", "-t", "tui", "window-size", "manual")

	x.waitScreen("alpha", 15*time.Second)
	x.run("send-keys", "-t", "tui", "Enter")
	x.waitScreen("1 Executions", 5*time.Second)
	x.run("send-keys", "-t", "tui", "?")
	screen := x.waitScreen("Keys: executions tab", 5*time.Second)
	if strings.Contains(screen, "cancel execution") || !strings.Contains(screen, "lines 1-") {
		t.Errorf("the help's first screen shows its end, or not that it scrolls:\n%s", screen)
	}
	x.run("send-keys", "-t", "tui", "x")
	x.run("send-keys", "-t", "tui", "NPage")
	screen = x.waitScreen("K  cancel execution", 5*time.Second)
	if !strings.Contains(screen, "Keys: executions tab") || strings.Contains(screen, "Run in alpha") {
		t.Errorf("x with the help open did something:\n%s", screen)
	}
	x.run("send-keys", "-t", "tui", "q")
	screen = x.waitScreen("COMMAND", 5*time.Second)
	if strings.Contains(screen, "Keys:") || strings.Contains(screen, "ssh-exit=") {
		t.Errorf("q did not close the help, or quit the TUI:\n%s", screen)
	}
	x.run("send-keys", "-t", "tui", "q")
	x.waitScreen("ssh-exit=0", 10*time.Second)
}

// TestOpenSSHTUIChecksRoleFirst: an operator's d and R over SSH are
// refused at once with the role's reason, not after the name was typed;
// what the role may do (stop) still asks.
func TestOpenSSHTUIChecksRoleFirst(t *testing.T) {
	needBinary(t, "tmux")
	op := newKey(t, "op@openssh", Operator)
	w := newWorld(t, worldOpts{}, op)
	w.create("alpha")
	o := newOpenSSH(t, w, op)
	x := &tmux{t: t, sock: filepath.Join(o.dir, "tmux.sock")}
	sshLine := "HOME=" + o.dir + " ssh " + strings.Join(quoteAll(append(o.opts(), "-t", "-p", o.port, "berth@127.0.0.1")), " ") +
		"; echo ssh-exit=$?; sleep 30"
	if out, err := x.run("-f", "/dev/null", "new-session", "-d", "-s", "tui", "-x", "80", "-y", "24", sshLine); err != nil {
		t.Fatalf("tmux: %v: %s", err, out)
	}
	t.Cleanup(func() { x.run("kill-server") })
	x.run("set-option", "-t", "tui", "window-size", "manual")

	x.waitScreen("alpha", 15*time.Second)
	for _, c := range []struct{ key, refusal, dialog string }{
		{"d", "may not delete sessions", "permanently?"},
		{"R", "may not replace session VMs", "Replace the VM"},
	} {
		x.run("send-keys", "-t", "tui", c.key)
		screen := x.waitScreen(c.refusal, 5*time.Second)
		if strings.Contains(screen, c.dialog) {
			t.Errorf("%s asked for confirmation although the role may not:\n%s", c.key, screen)
		}
	}
	x.run("send-keys", "-t", "tui", ":stop alpha", "Enter")
	x.waitScreen("Stop alpha?", 5*time.Second)
	x.run("send-keys", "-t", "tui", "n")
	if n := w.fake.Calls("Delete") + w.fake.Calls("Replace") + w.fake.Calls("Stop"); n != 0 {
		t.Errorf("%d calls reached the service", n)
	}
	x.run("send-keys", "-t", "tui", "q")
	x.waitScreen("ssh-exit=0", 10*time.Second)
}

package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthvm/berth/guest"
)

// connect starts an agent on dir and returns a client over a socket pair.
func connect(t *testing.T, dir string) (*Agent, *guest.Client) {
	t.Helper()
	a, err := New(Config{Workspace: dir})
	if err != nil {
		t.Fatal(err)
	}
	return a, dial(t, a)
}

func dial(t *testing.T, a *Agent) *guest.Client {
	t.Helper()
	hc, gc := socketPair(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { a.ServeConn(ctx, gc); close(done) }()
	cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
	defer ccancel()
	c, err := guest.Connect(cctx, hc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); cancel(); <-done })
	return c
}

func socketPair(t *testing.T) (net.Conn, net.Conn) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	conv := func(fd int) net.Conn {
		f := os.NewFile(uintptr(fd), "sock")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	return conv(fds[0]), conv(fds[1])
}

type result struct {
	stdout, stderr []byte
	exit           guest.ExecInfo
	err            error
}

func run(t *testing.T, c *guest.Client, req guest.ExecRequest, stdin string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if req.ID == "" {
		req.ID = strings.ReplaceAll(t.Name(), "/", "_") + time.Now().Format("150405.000000000")
	}
	req.Stdin = stdin != ""
	e, err := c.Exec(ctx, req)
	if err != nil {
		return result{err: err}
	}
	if stdin != "" {
		go func() { e.Write([]byte(stdin)); e.CloseStdin() }()
	}
	var r result
	for o := range e.Output() {
		if o.Stream == guest.FrameStdout {
			r.stdout = append(r.stdout, o.Data...)
		} else {
			r.stderr = append(r.stderr, o.Data...)
		}
	}
	r.exit, r.err = e.Wait(ctx)
	return r
}

func TestExec(t *testing.T) {
	_, c := connect(t, t.TempDir())
	tests := []struct {
		name           string
		argv           []string
		stdin          string
		stdout, stderr string
		code           int
		signal         string
	}{
		{"echo", []string{"echo", "hello"}, "", "hello\n", "", 0, ""},
		{"stderr apart", []string{"sh", "-c", "echo out; echo err >&2"}, "", "out\n", "err\n", 0, ""},
		{"exit 1", []string{"sh", "-c", "exit 1"}, "", "", "", 1, ""},
		{"killed", []string{"sh", "-c", "kill -9 $$"}, "", "", "", -1, "SIGKILL"},
		{"stdin", []string{"cat"}, "typed\n", "typed\n", "", 0, ""},
		{"cwd is workspace", []string{"sh", "-c", "pwd"}, "", "", "", 0, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := run(t, c, guest.ExecRequest{Argv: tt.argv}, tt.stdin)
			if r.err != nil {
				t.Fatal(r.err)
			}
			if tt.name != "cwd is workspace" && string(r.stdout) != tt.stdout {
				t.Errorf("stdout = %q, want %q", r.stdout, tt.stdout)
			}
			if string(r.stderr) != tt.stderr {
				t.Errorf("stderr = %q, want %q", r.stderr, tt.stderr)
			}
			if r.exit.ExitCode != tt.code || r.exit.Signal != tt.signal {
				t.Errorf("exit = %d %q, want %d %q", r.exit.ExitCode, r.exit.Signal, tt.code, tt.signal)
			}
		})
	}
}

func TestExecNotFound(t *testing.T) {
	_, c := connect(t, t.TempDir())
	r := run(t, c, guest.ExecRequest{Argv: []string{"no-such-command-xyz"}}, "")
	if !errors.Is(r.err, fs.ErrNotExist) {
		t.Fatalf("err = %v, want ENOENT", r.err)
	}
}

// A command named without a slash is found on the PATH it runs with (an
// image's own), also where the agent's PATH does not look.
func TestExecUsesTheCommandsPath(t *testing.T) {
	ws := t.TempDir()
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "only-here"), []byte("#!/bin/sh\necho found in $0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, c := connect(t, ws)
	r := run(t, c, guest.ExecRequest{Argv: []string{"only-here"}, Env: map[string]string{"PATH": bin + ":/usr/bin:/bin"}}, "")
	if r.err != nil || string(r.stdout) != "found in "+filepath.Join(bin, "only-here")+"\n" {
		t.Errorf("only-here on the command's PATH: %q, %v", r.stdout, r.err)
	}
	// Not on it (nor on the agent's): not found, as before.
	r = run(t, c, guest.ExecRequest{Argv: []string{"only-here"}}, "")
	if !errors.Is(r.err, fs.ErrNotExist) {
		t.Errorf("only-here without its PATH: %v, want ENOENT", r.err)
	}
}

// A start that fails on its working directory says so, instead of
// blaming the program.
func TestExecBadCwd(t *testing.T) {
	dir := t.TempDir()
	_, c := connect(t, dir)
	os.WriteFile(filepath.Join(dir, "afile"), []byte("x"), 0o644)
	os.Mkdir(filepath.Join(dir, "sub"), 0o755)
	for _, tc := range []struct {
		cwd, prog string
		want      string
		is        error
	}{
		{"/nonexistent-berth-cwd", "pwd", "working directory /nonexistent-berth-cwd does not exist", fs.ErrNotExist},
		{"missing", "pwd", "working directory /workspace/missing does not exist", fs.ErrNotExist},
		{"/workspace/missing/deeper", "pwd", "working directory /workspace/missing/deeper does not exist", fs.ErrNotExist},
		{"afile", "pwd", "working directory /workspace/afile is not a directory", syscall.ENOTDIR},
		{"afile/below", "pwd", "working directory /workspace/afile/below is not a directory", syscall.ENOTDIR},
		// A good directory: the program is to blame, as before.
		{"sub", "no-such-command-xyz", `exec no-such-command-xyz: exec: "no-such-command-xyz": executable file not found in $PATH`, fs.ErrNotExist},
	} {
		t.Run(tc.cwd, func(t *testing.T) {
			r := run(t, c, guest.ExecRequest{Argv: []string{tc.prog}, Cwd: tc.cwd}, "")
			if r.err == nil || r.err.Error() != tc.want || !errors.Is(r.err, tc.is) {
				t.Errorf("exec %s in %s: %v, want %q (%v)", tc.prog, tc.cwd, r.err, tc.want, tc.is)
			}
		})
	}
	if r := run(t, c, guest.ExecRequest{Argv: []string{"pwd"}, Cwd: "sub"}, ""); r.err != nil || strings.TrimSpace(string(r.stdout)) != filepath.Join(dir, "sub") {
		t.Errorf("pwd in sub: %q, %v", r.stdout, r.err)
	}
}

func TestNoWorkspaceRefusesEverything(t *testing.T) {
	a, err := New(Config{WorkspaceError: "volume missing"})
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, a)
	ctx := context.Background()
	r := run(t, c, guest.ExecRequest{Argv: []string{"true"}}, "")
	if !errors.Is(r.err, guest.ErrNoWorkspace) {
		t.Errorf("exec err = %v, want ErrNoWorkspace", r.err)
	}
	if _, err := c.WriteFile(ctx, "x", strings.NewReader("x"), 0); !errors.Is(err, guest.ErrNoWorkspace) {
		t.Errorf("write err = %v, want ErrNoWorkspace", err)
	}
	if _, err := c.Flush(ctx); !errors.Is(err, guest.ErrNoWorkspace) {
		t.Errorf("flush err = %v", err)
	}
	h, err := c.Hello(ctx)
	if err != nil || h.Workspace.Mounted || !strings.Contains(h.Workspace.Error, "volume missing") {
		t.Errorf("hello = %+v, %v", h, err)
	}
}

func TestLargeOutputByteExact(t *testing.T) {
	_, c := connect(t, t.TempDir())
	// 20 MB through a 4 MiB agent buffer: exercises acks and back-pressure.
	r := run(t, c, guest.ExecRequest{Argv: []string{"sh", "-c", "head -c 20000000 /dev/urandom > r.bin && sha256sum r.bin >&2 && cat r.bin"}}, "")
	if r.err != nil {
		t.Fatal(r.err)
	}
	if len(r.stdout) != 20000000 {
		t.Fatalf("got %d bytes", len(r.stdout))
	}
	sum := sha256.Sum256(r.stdout)
	if !bytes.Contains(r.stderr, []byte(strings.ToLower(hexs(sum[:])))) {
		t.Fatalf("hash mismatch")
	}
}

func hexs(b []byte) string {
	const d = "0123456789abcdef"
	var s strings.Builder
	for _, x := range b {
		s.WriteByte(d[x>>4])
		s.WriteByte(d[x&15])
	}
	return s.String()
}

func TestReattachFromOffset(t *testing.T) {
	a, c := connect(t, t.TempDir())
	ctx := context.Background()
	e, err := c.Exec(ctx, guest.ExecRequest{ID: "counter", Argv: []string{"sh", "-c", "i=0; while [ $i -lt 300 ]; do echo line $i; i=$((i+1)); sleep 0.005; done"}}, guest.ManualAck())
	if err != nil {
		t.Fatal(err)
	}
	var got []byte
	for o := range e.Output() {
		if o.Offset != int64(len(got)) {
			t.Fatalf("offset %d, have %d", o.Offset, len(got))
		}
		got = append(got, o.Data...)
		if len(got) > 500 {
			break
		}
	}
	// The host goes away mid-command.
	c.Close()
	time.Sleep(100 * time.Millisecond)
	c2 := dial(t, a)
	e2, err := c2.Attach(ctx, "counter", int64(len(got)), 0)
	if err != nil {
		t.Fatal(err)
	}
	for o := range e2.Output() {
		if o.Offset != int64(len(got)) {
			t.Fatalf("after reattach: offset %d, have %d", o.Offset, len(got))
		}
		got = append(got, o.Data...)
	}
	if _, err := e2.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	var want strings.Builder
	for i := 0; i < 300; i++ {
		want.WriteString("line " + strconv.Itoa(i) + "\n")
	}
	if string(got) != want.String() {
		t.Fatalf("output differs after reattach: %d bytes, want %d", len(got), want.Len())
	}
}

func TestKillProcessTree(t *testing.T) {
	_, c := connect(t, t.TempDir())
	ctx := context.Background()
	marker := "berth-tree-" + strconv.Itoa(os.Getpid())
	e, err := c.Exec(ctx, guest.ExecRequest{ID: "tree", Argv: []string{"sh", "-c", "sleep 1000 & sleep 1000 & sh -c 'exec -a " + marker + " sleep 1000' & echo started; wait"}})
	if err != nil {
		t.Fatal(err)
	}
	<-e.Output()
	if err := c.Signal(ctx, "tree", int(syscall.SIGKILL)); err != nil {
		t.Fatal(err)
	}
	for range e.Output() {
	}
	exit, err := e.Wait(ctx)
	if err != nil || exit.Signal != "SIGKILL" {
		t.Fatalf("exit = %+v, %v", exit, err)
	}
	time.Sleep(100 * time.Millisecond)
	out, _ := osexec.Command("pgrep", "-f", marker).Output()
	if strings.TrimSpace(string(out)) != "" {
		t.Fatalf("survivors: %s", out)
	}
}

func TestPTY(t *testing.T) {
	_, c := connect(t, t.TempDir())
	ctx := context.Background()
	e, err := c.Exec(ctx, guest.ExecRequest{ID: "pty", TTY: true, Rows: 24, Cols: 80, Stdin: true,
		Argv: []string{"sh", "-c", "[ -t 1 ] && echo tty; stty size; read x; stty size"}})
	if err != nil {
		t.Fatal(err)
	}
	var got []byte
	for o := range e.Output() {
		got = append(got, o.Data...)
		if bytes.Contains(got, []byte("24 80")) {
			e.Resize(40, 100)
			time.Sleep(50 * time.Millisecond)
			e.Write([]byte("go\n"))
			break
		}
	}
	for o := range e.Output() {
		got = append(got, o.Data...)
	}
	if _, err := e.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(got, []byte("tty")) || !bytes.Contains(got, []byte("40 100")) {
		t.Fatalf("pty output %q lacks tty and the resized size", got)
	}
}

func TestFiles(t *testing.T) {
	dir := t.TempDir()
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "secret"), []byte("s"), 0o600)
	os.Symlink(outside, filepath.Join(dir, "out"))
	_, c := connect(t, dir)
	ctx := context.Background()

	data := bytes.Repeat([]byte("0123456789abcdef"), 20<<20/16)
	n, err := c.WriteFile(ctx, "/workspace/big.bin", bytes.NewReader(data), 0)
	if err != nil || n != int64(len(data)) {
		t.Fatalf("write: %d, %v", n, err)
	}
	r, err := c.ReadFile(ctx, "big.bin")
	if err != nil {
		t.Fatal(err)
	}
	back, err := io.ReadAll(r)
	r.Close()
	if err != nil || sha256.Sum256(back) != sha256.Sum256(data) {
		t.Fatalf("round trip differs: %d bytes, %v", len(back), err)
	}
	if err := c.Mkdir(ctx, "a/b/c", true); err != nil {
		t.Fatal(err)
	}
	if err := c.Rename(ctx, "big.bin", "a/b/moved.bin"); err != nil {
		t.Fatal(err)
	}
	ents, err := c.List(ctx, "a/b")
	if err != nil || len(ents) != 2 {
		t.Fatalf("list = %+v, %v", ents, err)
	}
	if _, err := c.Stat(ctx, "big.bin"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("stat of moved file: %v", err)
	}
	if _, err := c.ReadFile(ctx, "a"); !errors.Is(err, syscall.EISDIR) {
		t.Errorf("read of dir: %v, want EISDIR", err)
	}
	if err := c.Remove(ctx, "a", false); !errors.Is(err, syscall.ENOTEMPTY) && !errors.Is(err, syscall.EEXIST) {
		t.Errorf("remove non-empty: %v", err)
	}
	if err := c.Remove(ctx, "a", true); err != nil {
		t.Errorf("remove -r: %v", err)
	}
	// No temp files left behind.
	left, _ := os.ReadDir(dir)
	for _, e := range left {
		if strings.Contains(e.Name(), ".berth-") {
			t.Errorf("temp file left: %s", e.Name())
		}
	}

	escapes := []string{"../x", "/etc/passwd", "a/../../x", "out/secret", "/workspace/../etc"}
	for _, p := range escapes {
		if _, err := c.ReadFile(ctx, p); !errors.Is(err, guest.ErrEscape) {
			t.Errorf("read %q: %v, want ErrEscape", p, err)
		}
		if _, err := c.WriteFile(ctx, p, strings.NewReader("x"), 0); !errors.Is(err, guest.ErrEscape) {
			t.Errorf("write %q: %v, want ErrEscape", p, err)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(outside, "secret")); string(b) != "s" {
		t.Fatal("a write escaped the workspace")
	}
}

func TestInterruptedUploadKeepsOldContent(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "f"), []byte("old"), 0o644)
	_, c := connect(t, dir)
	ctx := context.Background()
	_, err := c.WriteFile(ctx, "f", io.MultiReader(bytes.NewReader(make([]byte, 3<<20)), failingReader{}), 0)
	if err == nil {
		t.Fatal("upload with a failing source succeeded")
	}
	if !strings.Contains(err.Error(), "write f: reading the source") {
		t.Errorf("error %q does not say the source failed", err)
	}
	time.Sleep(100 * time.Millisecond)
	if b, _ := os.ReadFile(filepath.Join(dir, "f")); string(b) != "old" {
		t.Fatalf("content = %d bytes, want the old content", len(b))
	}
	left, _ := os.ReadDir(dir)
	if len(left) != 1 {
		t.Fatalf("temp file left behind: %v", left)
	}
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("source broke") }

func TestHandshakeDiscardsStaleBytes(t *testing.T) {
	a, err := New(Config{Workspace: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	hc, gc := socketPair(t)
	// Garbage from an "old session" in both directions, queued before the
	// handshake starts, as a virtio-serial port keeps it. It is written
	// before the handshake, not alongside it: bytes the host writes after
	// its READY are its yamux stream, which no handshake can tell from
	// garbage. The socket buffers both writes.
	garbage := bytes.Repeat([]byte{0, 1, 2, 'B', 'E', '\n'}, 1000)
	if _, err := hc.Write(append(garbage, "BERTH-READY bogus\n"...)); err != nil {
		t.Fatal(err)
	}
	if _, err := gc.Write(append(garbage, "BERTH-ACK 1 bogus\n"...)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go a.ServeConn(ctx, gc)
	cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
	defer ccancel()
	c, err := guest.Connect(cctx, hc)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Hello(ctx); err != nil {
		t.Fatal(err)
	}
}

// A command's user is resolved against the passwd and group files the
// agent reads (the guest's /etc): it runs with that uid, gid and
// supplementary groups and that HOME and USER; root and bare uids need no
// entry; an unknown name is refused with its cause, never run as root.
func TestExecAsUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("running a command as another user needs root")
	}
	etc := t.TempDir()
	os.WriteFile(filepath.Join(etc, "passwd"), []byte("root:x:0:0:root:/root:/bin/sh\napp:x:1000:1001:App:/home/app:/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(etc, "group"), []byte("root:x:0:\napp:x:1001:\nstaff:x:50:app\n"), 0o644)
	ws := t.TempDir()
	os.Chmod(ws, 0o777)
	os.Chmod(filepath.Dir(ws), 0o755) // t.TempDir makes its parent 0700
	a, err := New(Config{Workspace: ws, Home: "/root", Etc: etc})
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, a)
	script := `echo "$(id -u) $(id -g) $(id -G) $HOME $USER"`
	for _, tc := range []struct {
		user, want string
	}{
		{"", "0 0 0 /root root"},
		{"app", "1000 1001 1001 50 /home/app app"},
		{"app:staff", "1000 50 50 /home/app app"},
		{"root", "0 0 0 /root root"},
		{"4242", "4242 0 0 / 4242"},
	} {
		r := run(t, c, guest.ExecRequest{Argv: []string{"sh", "-c", script}, User: tc.user}, "")
		if r.err != nil || strings.TrimSpace(string(r.stdout)) != tc.want {
			t.Errorf("as %q: %q %q, %v; want %q", tc.user, r.stdout, r.stderr, r.err, tc.want)
		}
	}
	// What the user writes in the workspace is the user's.
	if r := run(t, c, guest.ExecRequest{Argv: []string{"sh", "-c", "echo x > mine"}, User: "app"}, ""); r.err != nil || r.exit.ExitCode != 0 {
		t.Fatalf("write as app: %v %s", r.err, r.stderr)
	}
	if fi, err := os.Stat(filepath.Join(ws, "mine")); err != nil || fi.Sys().(*syscall.Stat_t).Uid != 1000 {
		t.Errorf("a file app wrote: %v, %+v", err, fi)
	}
	r := run(t, c, guest.ExecRequest{Argv: []string{"true"}, User: "ghost"}, "")
	var ge *guest.Error
	if !errors.As(r.err, &ge) || !errors.Is(r.err, fs.ErrNotExist) || !strings.Contains(r.err.Error(), `cannot run as user "ghost": the VM's `+etc+"/passwd does not have it") {
		t.Errorf("as an unknown user: %v", r.err)
	}
	if r := run(t, c, guest.ExecRequest{Argv: []string{"true"}, User: "app:"}, ""); r.err == nil || !strings.Contains(r.err.Error(), "want NAME or UID") {
		t.Errorf("as a malformed user: %v", r.err)
	}
}

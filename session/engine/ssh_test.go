package engine_test

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/pem"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"
)

// sshEnv is a daemon serving SSH on loopback, and an OpenSSH client setup
// for it: a key per role, known hosts learnt on first use.
type sshEnv struct {
	*env
	port string
	dir  string
	keys map[string]string // role → private key file
}

func newSSHEnv(t *testing.T, e *env) *sshEnv {
	t.Helper()
	for _, b := range []string{"ssh", "scp", "sftp"} {
		if _, err := exec.LookPath(b); err != nil {
			t.Skipf("%s is not installed: %v", b, err)
		}
	}
	se := &sshEnv{env: e, dir: t.TempDir(), keys: map[string]string{}}
	for _, role := range []string{"admin", "viewer"} {
		pub, priv, _ := ed25519.GenerateKey(rand.Reader)
		blk, err := gossh.MarshalPrivateKey(priv, role+"@test")
		if err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(se.dir, role)
		os.WriteFile(f, pem.EncodeToMemory(blk), 0o600)
		sp, _ := gossh.NewPublicKey(pub)
		os.WriteFile(f+".pub", append(gossh.MarshalAuthorizedKey(sp)[:len(gossh.MarshalAuthorizedKey(sp))-1], []byte(" "+role+"@test\n")...), 0o644)
		e.OK("ssh", "add-key", "--role", role, f+".pub")
		se.keys[role] = f
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, se.port, _ = net.SplitHostPort(ln.Addr().String())
	ln.Close()
	e.StartDaemon("--ssh", "127.0.0.1:"+se.port)
	deadline := time.Now().Add(10 * time.Second)
	for !regexp.MustCompile("berth ssh: listening").MatchString(e.DaemonLog()) {
		if time.Now().After(deadline) {
			t.Fatalf("the SSH server did not start:\n%s", e.DaemonLog())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return se
}

func (se *sshEnv) opts(role string) []string {
	return []string{"-F", "/dev/null", "-i", se.keys[role], "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none",
		"-o", "UserKnownHostsFile=" + filepath.Join(se.dir, "known_hosts"), "-o", "StrictHostKeyChecking=accept-new",
		"-o", "BatchMode=yes", "-o", "LogLevel=ERROR"}
}

// sshCmd is the ssh command line tools take with -e/GIT_SSH_COMMAND.
func (se *sshEnv) sshCmd(role string) string {
	return "ssh " + strings.Join(se.opts(role), " ") + " -p " + se.port
}

func (se *sshEnv) run(name string, args ...string) (string, string, int) {
	se.T.Helper()
	c := exec.Command(name, args...)
	c.Env = append(os.Environ(), "HOME="+se.dir)
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	timer := time.AfterFunc(3*time.Minute, func() { c.Process.Kill() })
	defer timer.Stop()
	c.Run()
	code := -1
	if c.ProcessState != nil {
		code = c.ProcessState.ExitCode()
	}
	return out.String(), errb.String(), code
}

func (se *sshEnv) ssh(role, user string, extra []string, remote ...string) (string, string, int) {
	args := append(se.opts(role), "-p", se.port)
	args = append(append(args, extra...), user+"@127.0.0.1")
	return se.run("ssh", append(args, remote...)...)
}

func (se *sshEnv) scp(role string, args ...string) (string, string, int) {
	return se.run("scp", append(append(se.opts(role), "-P", se.port), args...)...)
}

func hashTree(t *testing.T, root string) string {
	t.Helper()
	out, err := exec.Command("sh", "-c", "cd "+root+" && find . -type f -o -type l | LC_ALL=C sort | while read -r f; do if [ -L \"$f\" ]; then echo \"$f -> $(readlink \"$f\")\"; else echo \"$f $(stat -c %a \"$f\") $(sha256sum < \"$f\" | cut -c1-16)\"; fi; done").Output()
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// Each session is an SSH host for the real OpenSSH clients: shells,
// commands, scp both ways in both protocols, and sshfs.
func TestSSHClients(t *testing.T) {
	e := newEnv(t)
	se := newSSHEnv(t, e)
	e.OK("create", "demo", "--disk", "256M")

	e.Subtest(t, "a shell with a terminal", func(t *testing.T) {
		c := exec.Command("ssh", append(append(se.opts("admin"), "-tt", "-p", se.port), "demo@127.0.0.1")...)
		c.Stdin = strings.NewReader("echo tty=$(tty) cols=$(stty size); pwd; exit 4\n")
		out, _ := c.CombinedOutput()
		if c.ProcessState.ExitCode() != 4 || !strings.Contains(string(out), "tty=/dev/pts/") || !strings.Contains(string(out), "/workspace") {
			t.Errorf("ssh -tt: exit %d:\n%s", c.ProcessState.ExitCode(), out)
		}
	})
	e.Subtest(t, "a command with its streams and exit status", func(t *testing.T) {
		out, errs, code := se.ssh("admin", "demo", nil, "echo o; echo e >&2; exit 3")
		if out != "o\n" || errs != "e\n" || code != 3 {
			t.Errorf("stdout %q stderr %q exit %d", out, errs, code)
		}
		if out, _, _ := se.ssh("admin", "demo", nil, "cat"); out != "" {
			t.Errorf("stdin without input: %q", out)
		}
	})
	local := t.TempDir()
	data := make([]byte, 5<<20)
	rand.Read(data)
	os.WriteFile(filepath.Join(local, "f.bin"), data, 0o640)
	tree := filepath.Join(local, "tree")
	os.MkdirAll(filepath.Join(tree, "sub", "deep"), 0o755)
	os.WriteFile(filepath.Join(tree, "a.txt"), []byte("a\n"), 0o644)
	os.WriteFile(filepath.Join(tree, "sub", "deep", "b.bin"), data[:100000], 0o600)
	for _, mode := range []struct{ name, flag string }{{"sftp", "-s"}, {"classic", "-O"}} {
		e.Subtest(t, "scp "+mode.name+" both ways", func(t *testing.T) {
			dst := "scp-" + mode.name
			if _, errs, code := se.scp("admin", mode.flag, "-p", filepath.Join(local, "f.bin"), "demo@127.0.0.1:"+dst+".bin"); code != 0 {
				t.Fatalf("scp up: %d %s", code, errs)
			}
			if _, errs, code := se.scp("admin", mode.flag, "-r", tree, "demo@127.0.0.1:"+dst); code != 0 {
				t.Fatalf("scp -r up: %d %s", code, errs)
			}
			back := t.TempDir()
			if _, errs, code := se.scp("admin", mode.flag, "demo@127.0.0.1:"+dst+".bin", filepath.Join(back, "f.bin")); code != 0 {
				t.Fatalf("scp down: %d %s", code, errs)
			}
			if _, errs, code := se.scp("admin", mode.flag, "-r", "demo@127.0.0.1:"+dst, filepath.Join(back, "tree")); code != 0 {
				t.Fatalf("scp -r down: %d %s", code, errs)
			}
			if b, _ := os.ReadFile(filepath.Join(back, "f.bin")); !bytes.Equal(b, data) {
				t.Errorf("f.bin came back as %d bytes", len(b))
			}
			if got, want := hashTree(t, filepath.Join(back, "tree")), hashTree(t, tree); got != want {
				t.Errorf("the tree came back as\n%s\nwant\n%s", got, want)
			}
			if _, _, code := se.scp("admin", mode.flag, "demo@127.0.0.1:nosuch", back); code == 0 {
				t.Error("scp of a missing file succeeded")
			}
		})
	}
	e.Subtest(t, "sshfs", func(t *testing.T) { sshfsWorkload(t, se, "demo") })
	e.Subtest(t, "a sleeping session wakes", func(t *testing.T) {
		e.OK("sleep", "demo")
		if out, errs, code := se.ssh("admin", "demo", nil, "cat /workspace/scp-sftp.bin | wc -c"); code != 0 || strings.TrimSpace(out) != "5242880" {
			t.Fatalf("ssh to a sleeping session: %d %q %q", code, out, errs)
		}
		if out := e.OK("info", "demo"); !strings.Contains(out, "running") {
			t.Errorf("after ssh the session is not running:\n%s", out)
		}
	})
	e.Subtest(t, "a viewer", func(t *testing.T) {
		if _, errs, code := se.ssh("viewer", "demo", nil, "true"); code == 0 || !strings.Contains(errs, "viewer") {
			t.Errorf("a viewer ran a command: %d %q", code, errs)
		}
		if _, _, code := se.scp("viewer", filepath.Join(local, "f.bin"), "demo@127.0.0.1:viewer.bin"); code == 0 {
			t.Error("a viewer uploaded with scp")
		}
		if _, errs, code := se.scp("viewer", "demo@127.0.0.1:scp-sftp.bin", filepath.Join(t.TempDir(), "x")); code != 0 {
			t.Errorf("a viewer could not download: %d %s", code, errs)
		}
	})
	e.OK("delete", "demo", "--yes")
}

// sshfsWorkload mounts the session's /workspace and works on it as a
// developer's tools would.
func sshfsWorkload(t *testing.T, se *sshEnv, name string) {
	if _, err := exec.LookPath("sshfs"); err != nil {
		t.Skip("sshfs is not installed")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
	mnt := t.TempDir()
	args := []string{name + "@127.0.0.1:/workspace", mnt, "-p", se.port, "-o", "IdentityFile=" + se.keys["admin"],
		"-o", "IdentitiesOnly=yes", "-o", "UserKnownHostsFile=" + filepath.Join(se.dir, "known_hosts"),
		"-o", "StrictHostKeyChecking=accept-new", "-o", "BatchMode=yes", "-o", "cache=no"}
	if _, errs, code := se.run("sshfs", args...); code != 0 {
		t.Fatalf("sshfs: %d %s", code, errs)
	}
	t.Cleanup(func() { exec.Command("fusermount", "-u", "-z", mnt).Run() })
	d := filepath.Join(mnt, "fs")
	sh := func(script string) string {
		t.Helper()
		c := exec.Command("sh", "-c", script)
		c.Dir = d
		out, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", script, err, out)
		}
		return string(out)
	}
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	sh("echo hello > f && [ \"$(cat f)\" = hello ]")
	sh("dd if=/dev/urandom of=big bs=1M count=8 2>/dev/null && [ $(stat -c %s big) = 8388608 ]")
	sh("printf XYZ | dd of=big bs=1 seek=1000 conv=notrunc 2>/dev/null && [ \"$(dd if=big bs=1 skip=1000 count=3 2>/dev/null)\" = XYZ ]")
	sh("echo more >> f && [ \"$(cat f)\" = \"$(printf 'hello\\nmore')\" ]")
	sh("truncate -s 3 f && [ \"$(cat f)\" = hel ] && truncate -s 10 f && [ $(stat -c %s f) = 10 ]")
	sh("echo new > g && mv g f && [ \"$(cat f)\" = new ]")
	sh("ln -s f link && [ \"$(readlink link)\" = f ] && [ \"$(cat link)\" = new ]")
	sh("git init -q repo && cd repo && echo x > x && git add x && git -c user.name=t -c user.email=t@t commit -qm one && git log --oneline | grep -q one")
	// A seeded random workload, against the same on a local directory.
	ref := t.TempDir()
	for _, root := range []string{d, ref} {
		rng := mrand.New(mrand.NewPCG(7, 9))
		buf := make([]byte, 64<<10)
		for i := 0; i < 200; i++ {
			p := filepath.Join(root, fmt.Sprintf("w%d", rng.IntN(12)))
			f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			n := 1 + rng.IntN(len(buf))
			for j := range buf[:n] {
				buf[j] = byte(rng.Uint32())
			}
			switch rng.IntN(4) {
			case 0:
				f.Truncate(int64(rng.IntN(200 << 10)))
			default:
				if _, err := f.WriteAt(buf[:n], int64(rng.IntN(256<<10))); err != nil {
					t.Fatal(err)
				}
			}
			f.Close()
		}
	}
	sum := func(root string) string {
		var b strings.Builder
		for i := 0; i < 12; i++ {
			data, err := os.ReadFile(filepath.Join(root, fmt.Sprintf("w%d", i)))
			if err == nil {
				fmt.Fprintf(&b, "w%d %x\n", i, sha256.Sum256(data))
			}
		}
		return b.String()
	}
	if got, want := sum(d), sum(ref); got != want {
		t.Errorf("the random workload on sshfs differs:\n%s\nwant\n%s", got, want)
	}
}

// With the debian image: rsync both ways, and git clone and push over SSH.
func TestSSHRsyncGit(t *testing.T) {
	e := newDebianEnv(t)
	se := newSSHEnv(t, e)
	for _, b := range []string{"rsync", "git"} {
		if _, err := exec.LookPath(b); err != nil {
			t.Skipf("%s is not installed on the host", b)
		}
	}
	e.OK("create", "dev", "--image", "debian", "--disk", "256M")
	local := t.TempDir()
	src := filepath.Join(local, "src")
	os.MkdirAll(filepath.Join(src, "a", "b"), 0o755)
	for i := 0; i < 20; i++ {
		b := make([]byte, 1000*i)
		rand.Read(b)
		os.WriteFile(filepath.Join(src, "a", fmt.Sprintf("f%d", i)), b, 0o644)
	}
	os.Symlink("a/f1", filepath.Join(src, "l"))
	rsh := se.sshCmd("admin")
	if _, errs, code := se.run("rsync", "-a", "-e", rsh, src+"/", "dev@127.0.0.1:/workspace/src/"); code != 0 {
		t.Fatalf("rsync in: %d %s", code, errs)
	}
	out := filepath.Join(local, "out")
	if _, errs, code := se.run("rsync", "-a", "-e", rsh, "dev@127.0.0.1:/workspace/src/", out+"/"); code != 0 {
		t.Fatalf("rsync out: %d %s", code, errs)
	}
	if got, want := hashTree(t, out), hashTree(t, src); got != want {
		t.Errorf("rsync round trip:\n%s\nwant\n%s", got, want)
	}

	e.OK("exec", "dev", "--", "sh", "-c", "git init -q --bare /workspace/repo.git")
	work := filepath.Join(local, "clone")
	gitEnv := append(os.Environ(), "GIT_SSH_COMMAND="+rsh, "HOME="+se.dir)
	git := func(dir string, args ...string) {
		t.Helper()
		c := exec.Command("git", args...)
		c.Dir, c.Env = dir, gitEnv
		if out, err := c.CombinedOutput(); err != nil {
			t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	git(local, "clone", "-q", "dev@127.0.0.1:/workspace/repo.git", work)
	os.WriteFile(filepath.Join(work, "README"), []byte("hi\n"), 0o644)
	git(work, "add", "README")
	git(work, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
	git(work, "push", "-q", "origin", "HEAD")
	if got := e.OK("exec", "dev", "--", "git", "--git-dir=/workspace/repo.git", "log", "--format=%s"); strings.TrimSpace(got) != "first" {
		t.Errorf("the pushed log: %q", got)
	}
	// mini has neither: the client hears why.
	e.OK("create", "small", "--disk", "64M")
	if _, errs, code := se.run("rsync", "-a", "-e", rsh, src+"/", "small@127.0.0.1:/workspace/src/"); code == 0 ||
		!strings.Contains(errs, "rsync: not found in session small (image mini); use --image debian") {
		t.Errorf("rsync into mini: %d %q", code, errs)
	}
	e.OK("delete", "small", "--yes")
	e.OK("delete", "dev", "--yes")
}

// TestBenchSSH prints issue 14's figures against berth's own file API and
// exec, measured in the same run.
func TestBenchSSH(t *testing.T) {
	needBench(t)
	e := newEnv(t)
	os.WriteFile(filepath.Join(e.Data, "config.toml"), []byte("disk = \"1G\"\nidle_timeout = \"0\"\n"), 0o644)
	se := newSSHEnv(t, e)
	e.OK("create", "b")
	local := t.TempDir()
	data := make([]byte, 100<<20)
	rand.Read(data)
	f := filepath.Join(local, "f.bin")
	os.WriteFile(f, data, 0o644)
	timed := func(fn func()) time.Duration {
		start := time.Now()
		fn()
		return time.Since(start)
	}
	must := func(what string) func(string, string, int) {
		return func(_, errs string, code int) {
			if code != 0 {
				t.Fatalf("%s: %d %s", what, code, errs)
			}
		}
	}
	const n = 3
	var put, get, scpIn, scpOut []time.Duration
	for i := 0; i < n; i++ {
		put = append(put, timed(func() { e.OK("put", "b", f, "put.bin") }))
		get = append(get, timed(func() { e.OK("get", "b", "put.bin", filepath.Join(local, "get.bin")) }))
		scpIn = append(scpIn, timed(func() { must("scp in")(se.scp("admin", f, "b@127.0.0.1:scp.bin")) }))
		scpOut = append(scpOut, timed(func() { must("scp out")(se.scp("admin", "b@127.0.0.1:scp.bin", filepath.Join(local, "scp.bin"))) }))
	}
	mb := float64(len(data)) / 1e6
	rate := func(d time.Duration) float64 { return mb / d.Seconds() }
	t.Logf("BENCH %-44s %6.0f MB/s vs put %6.0f MB/s  ratio %.2fx  (target ≥ 0.8x)", "scp 100 MB in (median)", rate(median(scpIn)), rate(median(put)), rate(median(scpIn))/rate(median(put)))
	t.Logf("BENCH %-44s %6.0f MB/s vs get %6.0f MB/s  ratio %.2fx  (target ≥ 0.8x)", "scp 100 MB out (median)", rate(median(scpOut)), rate(median(get)), rate(median(scpOut))/rate(median(get)))

	if _, err := exec.LookPath("sshfs"); err == nil {
		mnt := t.TempDir()
		must("sshfs")(se.run("sshfs", "b@127.0.0.1:/workspace", mnt, "-p", se.port, "-o", "IdentityFile="+se.keys["admin"],
			"-o", "IdentitiesOnly=yes", "-o", "UserKnownHostsFile="+filepath.Join(se.dir, "known_hosts"), "-o", "StrictHostKeyChecking=accept-new", "-o", "cache=no"))
		defer exec.Command("fusermount", "-u", "-z", mnt).Run()
		var fw, fr []time.Duration
		for i := 0; i < n; i++ {
			fw = append(fw, timed(func() {
				if err := exec.Command("dd", "if="+f, "of="+filepath.Join(mnt, "fs.bin"), "bs=1M", "conv=fsync").Run(); err != nil {
					t.Fatal(err)
				}
			}))
			fr = append(fr, timed(func() {
				if err := exec.Command("dd", "if="+filepath.Join(mnt, "fs.bin"), "of=/dev/null", "bs=1M").Run(); err != nil {
					t.Fatal(err)
				}
			}))
		}
		t.Logf("BENCH %-44s %6.0f MB/s vs put %6.0f MB/s  ratio %.2fx  (report)", "sshfs sequential write 100 MB", rate(median(fw)), rate(median(put)), rate(median(fw))/rate(median(put)))
		t.Logf("BENCH %-44s %6.0f MB/s vs get %6.0f MB/s  ratio %.2fx  (report)", "sshfs sequential read 100 MB", rate(median(fr)), rate(median(get)), rate(median(fr))/rate(median(get)))
	}

	var sshTrue, execTrue []time.Duration
	for i := 0; i < 20; i++ {
		sshTrue = append(sshTrue, timed(func() { must("ssh true")(se.ssh("admin", "b", nil, "true")) }))
		execTrue = append(execTrue, timed(func() { e.OK("exec", "b", "--", "true") }))
	}
	t.Logf("BENCH %-44s %10s vs berth exec %10s  ratio %.2fx  (target ≤ 1.5x)", "ssh NAME@HOST true (median)", median(sshTrue).Round(time.Millisecond), median(execTrue).Round(time.Millisecond), float64(median(sshTrue))/float64(median(execTrue)))
	// A harness that keeps one connection (ControlMaster) pays the key
	// exchange once; this is the figure for it.
	mux := []string{"-o", "ControlMaster=auto", "-o", "ControlPath=" + filepath.Join(se.dir, "mux-%C"), "-o", "ControlPersist=60"}
	must("ssh mux")(se.ssh("admin", "b", mux, "true"))
	defer se.ssh("admin", "b", append(mux, "-O", "exit"))
	var muxTrue []time.Duration
	for i := 0; i < 20; i++ {
		muxTrue = append(muxTrue, timed(func() { must("ssh mux true")(se.ssh("admin", "b", mux, "true")) }))
	}
	t.Logf("BENCH %-44s %10s vs berth exec %10s  ratio %.2fx  (report)", "ssh NAME@HOST true, one connection (median)", median(muxTrue).Round(time.Millisecond), median(execTrue).Round(time.Millisecond), float64(median(muxTrue))/float64(median(execTrue)))
}

package engine_test

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	gssh "github.com/gliderlabs/ssh"
)

// gitSSHServer serves the bare repositories under root over SSH as a code
// host does: git-upload-pack for a clone, no authentication.
func gitSSHServer(t *testing.T, root string) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &gssh.Server{Handler: func(s gssh.Session) {
		argv := strings.Fields(s.RawCommand())
		if len(argv) != 2 || argv[0] != "git-upload-pack" {
			fmt.Fprintf(s.Stderr(), "only git-upload-pack here, not %q\n", s.RawCommand())
			s.Exit(1)
			return
		}
		repo := filepath.Join(root, filepath.Base(strings.Trim(argv[1], "'\"")))
		c := exec.Command("git-upload-pack", repo)
		c.Stdin, c.Stdout, c.Stderr = s, s, s.Stderr()
		err := c.Run()
		var ee *exec.ExitError
		switch {
		case err == nil:
			s.Exit(0)
		case errors.As(err, &ee):
			s.Exit(ee.ExitCode())
		default:
			fmt.Fprintln(s.Stderr(), err)
			s.Exit(1)
		}
	}}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l.Addr().(*net.TCPAddr).Port
}

// Clients that ignore the proxy variables, as a new user tries them in a
// debian session: OpenSSH's git clone from a code host on the host, and
// Node's built-in fetch (undici reads no proxy variables), through the
// NIC, allowed by allow:host.berth.internal:PORT only.
func TestNICDebianClients(t *testing.T) {
	e := newDebianEnv(t)
	for _, b := range []string{"git", "git-upload-pack", "node"} {
		if _, err := exec.LookPath(b); err != nil {
			t.Skipf("%s is not installed on the host", b)
		}
	}
	root := t.TempDir()
	work := filepath.Join(root, "work")
	for _, argv := range [][]string{
		{"init", "-q", "--bare", filepath.Join(root, "repo.git")},
		{"init", "-q", work},
		{"-C", work, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "from the host"},
		{"-C", work, "push", "-q", filepath.Join(root, "repo.git"), "HEAD:refs/heads/main"},
		{"-C", filepath.Join(root, "repo.git"), "symbolic-ref", "HEAD", "refs/heads/main"},
	} {
		if out, err := exec.Command("git", argv...).CombinedOutput(); err != nil {
			t.Fatalf("git %s: %v\n%s", strings.Join(argv, " "), err, out)
		}
	}
	sshPort := gitSSHServer(t, root)
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "fetched %s", r.URL.Path)
	}))
	defer web.Close()
	webPort := web.Listener.Addr().(*net.TCPAddr).Port
	closed, err := net.Listen("tcp", "127.0.0.1:0") // listening, not allowed
	if err != nil {
		t.Fatal(err)
	}
	defer closed.Close()
	closedPort := closed.Addr().(*net.TCPAddr).Port

	e.StartDaemon() // net_nic is on by default
	e.OK("create", "deb", "--image", "debian", "--disk", "512M", "--net",
		"allow:host.berth.internal:"+strconv.Itoa(sshPort)+",host.berth.internal:"+strconv.Itoa(webPort))
	const ssh = "ssh -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o ConnectTimeout=20"

	e.Subtest(t, "git clone over SSH from a code host on the host", func(t *testing.T) {
		out := e.OK("exec", "deb", "--", "sh", "-c", "cd /workspace && GIT_SSH_COMMAND='"+ssh+"' git clone -q ssh://git@host.berth.internal:"+strconv.Itoa(sshPort)+"/repo.git r 2>&1 && git -C r log --format=%s")
		if !strings.HasSuffix(strings.TrimSpace(out), "from the host") {
			t.Fatalf("git clone over SSH:\n%s", out)
		}
	})

	e.Subtest(t, "ssh to a port the policy does not name is refused at once", func(t *testing.T) {
		r := e.Run("exec", "deb", "--", "sh", "-c", ssh+" -p "+strconv.Itoa(closedPort)+" git@host.berth.internal true 2>&1")
		if r.Code == 0 || !strings.Contains(r.Stdout, "Connection refused") {
			t.Fatalf("exit %d:\n%s", r.Code, r.Stdout)
		}
	})

	e.Subtest(t, "Node's fetch without proxy variables", func(t *testing.T) {
		node, _ := exec.LookPath("node")
		e.OK("put", "deb", node, "node")
		url := "http://host.berth.internal:" + strconv.Itoa(webPort) + "/from-node"
		out := e.OK("exec", "deb", "--", "sh", "-c", "chmod 755 /workspace/node && env -u http_proxy -u https_proxy -u HTTP_PROXY -u HTTPS_PROXY "+
			"/workspace/node -e \"fetch('"+url+"').then(r => r.text()).then(t => console.log(t), e => { console.error(e.cause || e); process.exit(3) })\"")
		if strings.TrimSpace(out) != "fetched /from-node" {
			t.Fatalf("node fetch: %q", out)
		}
	})
}

package engine_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/daemon/daemontest"
)

// testHosts pins names for the daemon's egress resolver.
const testHosts = "ten.test=10.0.0.1,pkgs.test=127.0.0.1"

// forwarder is a running `berth port-forward`.
type forwarder struct {
	cmd    *exec.Cmd
	addrs  []string // the local addresses, in argument order
	stderr *lockedBuf
}

// syncBuf is a buffer a process writes while the test reads it.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type lockedBuf struct {
	ch chan string
	sb strings.Builder
}

// portForward starts `berth port-forward NAME SPECS...` and waits until it
// listens.
func (e *env) portForward(name string, specs ...string) *forwarder {
	e.T.Helper()
	c := e.Cmd(append([]string{"port-forward", name}, specs...)...)
	out, err := c.StdoutPipe()
	if err != nil {
		e.T.Fatal(err)
	}
	errPipe, err := c.StderrPipe()
	if err != nil {
		e.T.Fatal(err)
	}
	if err := c.Start(); err != nil {
		e.T.Fatal(err)
	}
	f := &forwarder{cmd: c, stderr: &lockedBuf{ch: make(chan string, 64)}}
	e.T.Cleanup(func() { c.Process.Kill(); c.Wait() })
	go func() {
		sc := bufio.NewScanner(errPipe)
		for sc.Scan() {
			f.stderr.ch <- sc.Text()
		}
		close(f.stderr.ch)
	}()
	sc := bufio.NewScanner(out)
	for range specs {
		if !sc.Scan() {
			e.T.Fatalf("port-forward %s %v printed nothing: %s", name, specs, <-f.stderr.ch)
		}
		// "forwarding 127.0.0.1:PORT -> NAME:REMOTE"
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			e.T.Fatalf("port-forward printed %q", sc.Text())
		}
		f.addrs = append(f.addrs, fields[1])
	}
	go io.Copy(io.Discard, out)
	return f
}

// nextErr waits for the forwarder's next stderr line.
func (f *forwarder) nextErr(t *testing.T, within time.Duration) string {
	select {
	case l := <-f.stderr.ch:
		return l
	case <-time.After(within):
		t.Fatalf("port-forward reported nothing within %s", within)
	}
	return ""
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func httpGet(t *testing.T, url string) (string, error) {
	t.Helper()
	c := &http.Client{Timeout: 90 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return string(b), fmt.Errorf("%s", resp.Status)
	}
	return string(b), err
}

// Egress by policy and port forwards on the mini image (busybox wget,
// nslookup and httpd), through the real daemon and CLI.
func TestNetMini(t *testing.T) {
	e := newEnv(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "host says %s", r.URL.Path)
	}))
	defer up.Close()
	hp := strconv.Itoa(up.Listener.Addr().(*net.TCPAddr).Port)
	hostURL := "http://host.berth.internal:" + hp + "/hello"
	t.Setenv("BERTH_TEST_HOSTS", testHosts)
	sshPort := strconv.Itoa(freePort(t))
	e.StartDaemon("--ssh", "127.0.0.1:"+sshPort)
	e.OK("create", "n1", "--disk", "64M")

	wget := func(url string) daemontest.Result {
		return e.Run("exec", "n1", "--", "wget", "-q", "-O-", url)
	}
	refused := func(t *testing.T, url, hostport, policy string) {
		t.Helper()
		r := wget(url)
		want := "berth: egress to " + hostport + " is not allowed for session n1 (policy: " + policy + ")"
		if r.Code == 0 || !strings.Contains(r.Stdout+r.Stderr, want) {
			t.Errorf("wget %s: exit %d, %q %q; want a failure saying %q", url, r.Code, r.Stdout, r.Stderr, want)
		}
	}

	reserved := func(t *testing.T, url, hostport, why string) {
		t.Helper()
		r := wget(url)
		want := "berth: egress to " + hostport + " is not allowed for session n1: " + why
		if r.Code == 0 || !strings.Contains(r.Stdout+r.Stderr, want) {
			t.Errorf("wget %s: exit %d, %q %q; want a failure saying %q", url, r.Code, r.Stdout, r.Stderr, want)
		}
	}

	e.Subtest(t, "default none, shown in info and refused visibly", func(t *testing.T) {
		if s := e.Info("n1"); s.Net != "none" {
			t.Errorf("info: net %q, want none", s.Net)
		}
		if out := e.OK("info", "n1"); !strings.Contains(out, "Network:") {
			t.Errorf("info does not show the network:\n%s", out)
		}
		refused(t, hostURL, "host.berth.internal:"+hp, "none")
		if out := e.OK("exec", "n1", "--", "sh", "-c", "echo $http_proxy $https_proxy $no_proxy; cat /etc/resolv.conf"); !strings.Contains(out, "http://127.0.0.1:3128 http://127.0.0.1:3128 localhost") || !strings.Contains(out, "nameserver 127.0.0.1") {
			t.Errorf("guest environment:\n%s", out)
		}
	})

	e.Subtest(t, "malformed policies are refused with the entry named", func(t *testing.T) {
		for arg, want := range map[string]string{
			"allow:":             "at least one entry",
			"allow:*.":           `"*."`,
			"allow::0":           `":0"`,
			"allow:a.test:65536": `"a.test:65536"`,
			"allow:10.0.0.0/33":  `"10.0.0.0/33"`,
		} {
			e.Fails(want, "net", "n1", arg)
			e.Fails(want, "create", "bad", "--net", arg)
		}
	})

	e.Subtest(t, "allowed host, then a change applies to new connections", func(t *testing.T) {
		e.OK("net", "n1", "allow:host.berth.internal:"+hp)
		if r := wget(hostURL); r.Code != 0 || r.Stdout != "host says /hello" {
			t.Fatalf("wget allowed: exit %d %q %q", r.Code, r.Stdout, r.Stderr)
		}
		refused(t, "http://host.berth.internal:1/", "host.berth.internal:1", "allow:host.berth.internal:"+hp)
		e.OK("net", "n1", "none")
		refused(t, hostURL, "host.berth.internal:"+hp, "none")
	})

	e.Subtest(t, "open still refuses the host, loopback, metadata and private names", func(t *testing.T) {
		e.OK("net", "n1", "open")
		refused(t, hostURL, "host.berth.internal:"+hp, "open")
		// A reserved address says which and its range, and that naming
		// it allows it.
		reserved(t, "http://169.254.169.254/latest/meta-data/", "169.254.169.254:80", "169.254.169.254 is a reserved address (169.254.0.0/16); naming 169.254.169.254 or 169.254.0.0/16 in the policy allows it (policy: open)")
		reserved(t, "http://ten.test/", "ten.test:80", "ten.test resolves to 10.0.0.1, a reserved address (10.0.0.0/8); naming 10.0.0.1 or 10.0.0.0/8 in the policy allows it (policy: open)")
		reserved(t, "http://pkgs.test:"+hp+"/", "pkgs.test:"+hp, "pkgs.test resolves to 127.0.0.1, a reserved address (127.0.0.0/8)")
		// 127.0.0.1 is the guest's own loopback (no_proxy): the host's is
		// not reached that way at all.
		if r := wget("http://127.0.0.1:" + hp + "/"); r.Code == 0 {
			t.Errorf("127.0.0.1 reached the host's server: %q", r.Stdout)
		}
		var st session.NetStatus
		json.Unmarshal([]byte(e.OK("net", "n1", "--json")), &st)
		if st.Refused < 5 {
			t.Errorf("net status counts %d refusals, want at least 5", st.Refused)
		}
		if ev := e.OK("events", "n1"); !strings.Contains(ev, "is not allowed for session n1") {
			t.Errorf("timeline has no refusal:\n%s", ev)
		}
	})

	e.Subtest(t, "a named address and guest DNS", func(t *testing.T) {
		e.OK("net", "n1", "allow:pkgs.test,127.0.0.1:"+hp)
		if r := wget("http://pkgs.test:" + hp + "/p"); r.Code != 0 || r.Stdout != "host says /p" {
			t.Errorf("wget pkgs.test: exit %d %q %q", r.Code, r.Stdout, r.Stderr)
		}
		if out := e.Run("exec", "n1", "--", "nslookup", "pkgs.test").Stdout; !strings.Contains(out, "127.0.0.1") {
			t.Errorf("nslookup of an allowed name:\n%s", out)
		}
		if r := e.Run("exec", "n1", "--", "nslookup", "ten.test"); strings.Contains(r.Stdout, "10.0.0.1") {
			t.Errorf("nslookup answered a name the policy does not allow:\n%s", r.Stdout)
		}
		e.OK("net", "n1", "none")
	})

	e.OK("exec", "n1", "--", "sh", "-c", "mkdir -p /workspace/www && echo hi from httpd > /workspace/www/index.html && httpd -p 127.0.0.1:8080 -h /workspace/www </dev/null >/dev/null 2>&1")
	// Started outside the subtests: it lives for the whole test.
	fw := e.portForward("n1", fmt.Sprintf("%d:8080", freePort(t)), fmt.Sprintf("%d:9", freePort(t)))
	e.Subtest(t, "port-forward to busybox httpd with no network policy", func(t *testing.T) {
		body, err := httpGet(t, "http://"+fw.addrs[0]+"/")
		if err != nil || body != "hi from httpd\n" {
			t.Fatalf("GET through the forward: %q %v", body, err)
		}
		c, err := net.Dial("tcp", fw.addrs[1])
		if err == nil {
			c.SetReadDeadline(time.Now().Add(30 * time.Second))
			n, _ := c.Read(make([]byte, 1))
			c.Close()
			if n != 0 {
				t.Errorf("a forward to a closed port delivered bytes")
			}
		}
		if l := fw.nextErr(t, 30*time.Second); !strings.Contains(l, "nothing listens on port 9") {
			t.Errorf("port-forward reported %q, want the refusal", l)
		}
		if body, err := httpGet(t, "http://"+fw.addrs[0]+"/"); err != nil || body != "hi from httpd\n" {
			t.Errorf("the forward did not stay up: %q %v", body, err)
		}
		// busybox wget ignores no_proxy: the proxy sends loopback back
		// into the guest.
		if out := e.OK("exec", "n1", "--", "wget", "-q", "-O-", "http://127.0.0.1:8080/"); out != "hi from httpd\n" {
			t.Errorf("wget of the guest's own loopback: %q", out)
		}
		out := e.OK("net", "n1")
		if !strings.Contains(out, "8080 (127.0.0.1)") {
			t.Errorf("net status does not list the guest's listener:\n%s", out)
		}
	})

	e.Subtest(t, "ssh -L with the OpenSSH client; a viewer may not forward", func(t *testing.T) {
		keys := t.TempDir()
		for _, role := range []string{"operator", "viewer"} {
			k := filepath.Join(keys, role)
			if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", role, "-f", k).CombinedOutput(); err != nil {
				t.Fatalf("ssh-keygen: %v %s", err, out)
			}
			e.OK("ssh", "add-key", "--role", role, k+".pub")
		}
		tunnel := func(role string) (string, *syncBuf) {
			local := strconv.Itoa(freePort(t))
			stderr := &syncBuf{}
			c := exec.Command("ssh", "-N", "-p", sshPort, "-i", filepath.Join(keys, role),
				"-o", "UserKnownHostsFile=/dev/null", "-o", "GlobalKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=no",
				"-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none", "-o", "BatchMode=yes", "-o", "ExitOnForwardFailure=yes",
				"-L", local+":localhost:8080", "n1@127.0.0.1")
			c.Stderr = stderr
			if err := c.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Process.Kill(); c.Wait() })
			for i := 0; i < 300; i++ {
				if conn, err := net.Dial("tcp", "127.0.0.1:"+local); err == nil {
					conn.Close()
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			return "http://127.0.0.1:" + local + "/", stderr
		}
		url, _ := tunnel("operator")
		if body, err := httpGet(t, url); err != nil || body != "hi from httpd\n" {
			t.Errorf("GET through ssh -L: %q %v", body, err)
		}
		url, stderr := tunnel("viewer")
		if body, err := httpGet(t, url); err == nil {
			t.Errorf("a viewer's ssh -L reached the guest: %q", body)
		}
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(stderr.String(), "may not change networks or forward ports") && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if !strings.Contains(stderr.String(), "role viewer may not change networks or forward ports") {
			t.Errorf("ssh said %q, want the role refusal", stderr.String())
		}
		// The SSH port is never an egress destination, even where the
		// policy names the host.
		e.OK("net", "n1", "allow:host.berth.internal")
		refused(t, "http://host.berth.internal:"+sshPort+"/", "host.berth.internal:"+sshPort, "allow:host.berth.internal")
		e.OK("net", "n1", "none")
	})

	e.Subtest(t, "the local port already in use", func(t *testing.T) {
		busy := strings.TrimPrefix(fw.addrs[0], "127.0.0.1:")
		e.Fails("already in use", "port-forward", "n1", busy+":8080")
	})

	e.Subtest(t, "a forward wakes a sleeping session and survives the wake", func(t *testing.T) {
		e.OK("sleep", "n1")
		e.WaitState("n1", session.StateSleeping, 30*time.Second)
		body, err := httpGet(t, "http://"+fw.addrs[0]+"/")
		if err != nil || body != "hi from httpd\n" {
			t.Fatalf("GET after sleep: %q %v", body, err)
		}
		if s := e.Info("n1"); s.State != session.StateRunning || s.Net != "none" {
			t.Errorf("after the wake: %s, net %q", s.State, s.Net)
		}
	})

	e.Subtest(t, "the policy survives stop/start and replace", func(t *testing.T) {
		e.OK("net", "n1", "allow:host.berth.internal:"+hp)
		e.OK("stop", "n1")
		e.OK("start", "n1")
		if s := e.Info("n1"); s.Net != "allow:host.berth.internal:"+hp {
			t.Errorf("after stop/start: net %q", s.Net)
		}
		if r := wget(hostURL); r.Code != 0 || r.Stdout != "host says /hello" {
			t.Errorf("wget after start: exit %d %q %q", r.Code, r.Stdout, r.Stderr)
		}
		e.OK("replace", "n1", "--yes")
		if s := e.Info("n1"); s.Net != "allow:host.berth.internal:"+hp {
			t.Errorf("after replace: net %q", s.Net)
		}
		if r := wget(hostURL); r.Code != 0 || r.Stdout != "host says /hello" {
			t.Errorf("wget after replace: exit %d %q %q", r.Code, r.Stdout, r.Stderr)
		}
	})
}

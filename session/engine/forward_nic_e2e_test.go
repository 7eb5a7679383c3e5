package engine_test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/session"
)

// guestHTTPD starts busybox httpd in session name on listen (ADDR:PORT
// or PORT), serving index.html ("hi") and /cgi-bin/peer, which answers
// the address the connection came from: 10.0.2.2 (host.berth.internal)
// through the NIC's stack, 127.0.0.1 through the agent.
func guestHTTPD(e *env, name string, listen ...string) {
	e.T.Helper()
	script := "mkdir -p /workspace/www/cgi-bin && echo hi > /workspace/www/index.html && " +
		`printf '#!/bin/sh\necho Content-Type: text/plain\necho\necho $REMOTE_ADDR\n' > /workspace/www/cgi-bin/peer && chmod 755 /workspace/www/cgi-bin/peer`
	for _, l := range listen {
		script += " && httpd -p " + l + " -h /workspace/www </dev/null >/dev/null 2>&1"
	}
	e.OK("exec", name, "--", "sh", "-c", script)
}

// sshTunnel runs OpenSSH's ssh -N -L LOCAL:localhost:port into session
// name through berth's SSH server on sshPort and returns LOCAL's address
// once it accepts.
func sshTunnel(t *testing.T, e *env, sshPort, name string, port int) string {
	t.Helper()
	k := filepath.Join(t.TempDir(), "key")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "op", "-f", k).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v %s", err, out)
	}
	e.OK("ssh", "add-key", "--role", "operator", k+".pub")
	local := "127.0.0.1:" + strconv.Itoa(freePort(t))
	c := exec.Command("ssh", "-N", "-p", sshPort, "-i", k,
		"-o", "UserKnownHostsFile=/dev/null", "-o", "GlobalKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=no",
		"-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none", "-o", "BatchMode=yes", "-o", "ExitOnForwardFailure=yes",
		"-L", fmt.Sprintf("%s:localhost:%d", local, port), name+"@127.0.0.1")
	stderr := &syncBuf{}
	c.Stderr = stderr
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Process.Kill(); c.Wait() })
	for range 500 {
		if conn, err := net.Dial("tcp", local); err == nil {
			conn.Close()
			return local
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("ssh -L did not listen on %s: %s", local, stderr.String())
	return ""
}

// peer is what the guest's /cgi-bin/peer answers through addr.
func peer(t *testing.T, addr string) string {
	t.Helper()
	body, err := httpGet(t, "http://"+addr+"/cgi-bin/peer")
	if err != nil {
		t.Fatalf("GET /cgi-bin/peer through %s: %q %v", addr, body, err)
	}
	// httpd on a dual-stack socket writes an IPv4 peer as [::ffff:A].
	return strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(body), "[::ffff:"), "]")
}

// peerBecomes waits up to 10 s for the guest to see connections through
// addr come from want: the NIC's stack is served beside the VM, and a
// forward made before it is up goes through the agent.
func peerBecomes(t *testing.T, addr, want string) string {
	t.Helper()
	got := ""
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if got = peer(t, addr); got == want {
			break
		}
	}
	return got
}

// With net_nic on, port-forward and ssh -L reach a guest port through the
// NIC's stack (the guest sees host.berth.internal connect), a port the
// guest serves on its loopback only through the agent, and both again
// after a sleep and the wake a forward makes, the NIC back with its
// address.
func TestForwardNIC(t *testing.T) {
	e := newEnv(t)
	os.WriteFile(filepath.Join(e.Data, "config.toml"), []byte("memory = \"256M\"\ndisk = \"64M\"\nidle_timeout = \"0\"\nnet_nic = true\n"), 0o644)
	sshPort := strconv.Itoa(freePort(t))
	e.StartDaemon("--ssh", "127.0.0.1:"+sshPort)
	e.OK("create", "f1", "--net", "allow:host.berth.internal:1")
	guestHTTPD(e, "f1", "8080", "127.0.0.1:8081")
	fw := e.portForward("f1", fmt.Sprintf("%d:8080", freePort(t)), fmt.Sprintf("%d:8081", freePort(t)))

	e.Subtest(t, "port-forward through the stack; a loopback listener through the agent", func(t *testing.T) {
		if body, err := httpGet(t, "http://"+fw.addrs[0]+"/"); err != nil || body != "hi\n" {
			t.Fatalf("GET through the forward: %q %v", body, err)
		}
		if p := peerBecomes(t, fw.addrs[0], "10.0.2.2"); p != "10.0.2.2" {
			t.Errorf("the guest saw the forward come from %q, want 10.0.2.2 (the NIC's stack)", p)
			// What the guest's NIC is, and what its agent said.
			t.Logf("eth0: %s", e.OK("exec", "f1", "--", "sh", "-c", "cat /sys/class/net/eth0/address; ip addr show eth0"))
			b, _ := os.ReadFile(filepath.Join(e.Data, "sessions", "f1", "vm", "console.log"))
			t.Logf("console: %s", b)
		}
		if p := peer(t, fw.addrs[1]); p != "127.0.0.1" {
			t.Errorf("the guest saw the forward to its loopback listener come from %q, want 127.0.0.1 (the agent)", p)
		}
		if st := netStatus(t, e, "f1"); st.Refused != 0 {
			t.Errorf("forwards counted as %d egress refusals", st.Refused)
		}
	})

	e.Subtest(t, "ssh -L through the stack", func(t *testing.T) {
		local := sshTunnel(t, e, sshPort, "f1", 8080)
		if body, err := httpGet(t, "http://"+local+"/"); err != nil || body != "hi\n" {
			t.Fatalf("GET through ssh -L: %q %v", body, err)
		}
		if p := peer(t, local); p != "10.0.2.2" {
			t.Errorf("the guest saw ssh -L come from %q, want 10.0.2.2", p)
		}
	})

	e.Subtest(t, "forward, sleep, a forward wakes it, the NIC is back with its address", func(t *testing.T) {
		// eth0's MAC and IPv4 address, which its MAC names.
		eth0 := func() string {
			out := e.OK("exec", "f1", "--", "ip", "-4", "addr", "show", "eth0")
			mac := strings.TrimSpace(e.OK("exec", "f1", "--", "cat", "/sys/class/net/eth0/address"))
			hw, err := net.ParseMAC(mac)
			if err != nil {
				t.Fatalf("eth0's MAC: %q", mac)
			}
			if want := "inet " + guest.NICAddrOf(hw).String() + " "; !strings.Contains(out, want) {
				t.Fatalf("eth0 (MAC %s) lacks %q:\n%s", mac, want, out)
			}
			return mac
		}
		before := eth0()
		e.OK("sleep", "f1")
		e.WaitState("f1", session.StateSleeping, 30*time.Second)
		// The first connection wakes the session; it may reach the guest
		// through the agent if the NIC's stack is not up yet.
		if body, err := httpGet(t, "http://"+fw.addrs[0]+"/"); err != nil || body != "hi\n" {
			t.Fatalf("GET after sleep: %q %v", body, err)
		}
		if s := e.Info("f1"); s.State != session.StateRunning {
			t.Fatalf("after the wake: %s", s.State)
		}
		if got := peerBecomes(t, fw.addrs[0], "10.0.2.2"); got != "10.0.2.2" {
			t.Errorf("after the wake the guest saw the forward come from %q, want 10.0.2.2 (the NIC's stack)", got)
		}
		if after := eth0(); after != before {
			t.Errorf("eth0's MAC was %s before the sleep, %s after the wake", before, after)
		}
		if p := peer(t, fw.addrs[1]); p != "127.0.0.1" {
			t.Errorf("after the wake, the loopback listener's forward came from %q", p)
		}
	})

	e.Subtest(t, "a guest whose NIC is down is reached through the agent", func(t *testing.T) {
		e.OK("exec", "f1", "--", "ip", "link", "set", "eth0", "down")
		start := time.Now()
		if p := peer(t, fw.addrs[0]); p != "127.0.0.1" {
			t.Errorf("with eth0 down the guest saw the forward come from %q, want 127.0.0.1 (the agent)", p)
		}
		// The NIC's try is bounded (2 s), then the agent's dial.
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("the forward took %s", took)
		}
	})
}

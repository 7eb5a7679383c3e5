package engine_test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/session"
)

// buildProbe builds testdata/nicprobe, static, for the guest.
func buildProbe(t testing.TB) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "nicprobe")
	c := exec.Command("go", "build", "-o", out, "./testdata/nicprobe")
	c.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := c.CombinedOutput(); err != nil {
		t.Fatalf("build nicprobe: %v\n%s", err, b)
	}
	return out
}

// tcpReplier answers each connection's first read with prefix and it.
func tcpReplier(t testing.TB, prefix string) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(30 * time.Second))
				buf := make([]byte, 4096)
				n, err := c.Read(buf)
				if err != nil {
					return
				}
				fmt.Fprintf(c, "%s %s", prefix, buf[:n])
			}()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

// tcpEcho answers every read of a connection with "echo " and it, and
// keeps the connection open until the client closes it.
func tcpEcho(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(2 * time.Minute))
				buf := make([]byte, 4096)
				for {
					n, err := c.Read(buf)
					if err != nil {
						return
					}
					fmt.Fprintf(c, "echo %s", buf[:n])
				}
			}()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

// udpReplier answers each datagram with prefix and it.
func udpReplier(t testing.TB, prefix string) int {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 4096)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo([]byte(prefix+" "+string(buf[:n])), from)
		}
	}()
	return pc.LocalAddr().(*net.UDPAddr).Port
}

func netStatus(t *testing.T, e *env, name string) session.NetStatus {
	t.Helper()
	var st session.NetStatus
	if err := json.Unmarshal([]byte(e.OK("net", name, "--json")), &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// The guest's NIC (net_nic): raw TCP, UDP and DNS clients that ignore the
// proxy variables, each flow decided by the policy at the host's stack.
func TestNetNIC(t *testing.T) {
	e := newEnv(t)
	probe := buildProbe(t)
	tcpOK := tcpReplier(t, "host got")
	tcpOther := tcpReplier(t, "must not reach") // listening: a refusal is the policy's
	udpOK := udpReplier(t, "udp got")
	udpOther := udpReplier(t, "must not reach")
	t.Setenv("BERTH_TEST_HOSTS", "pub.test=93.184.216.34")
	echo := tcpEcho(t)
	// net_nic is on by default: the config does not name it.
	os.WriteFile(filepath.Join(e.Data, "config.toml"), []byte("memory = \"256M\"\ndisk = \"64M\"\nidle_timeout = \"0\"\nnet_max_conns = 16\n"), 0o644)
	e.StartDaemon()
	hostTCP, hostUDP := "host.berth.internal:"+strconv.Itoa(tcpOK), "host.berth.internal:"+strconv.Itoa(udpOK)
	hostEcho := "host.berth.internal:" + strconv.Itoa(echo)
	e.OK("create", "n1", "--net", "allow:"+hostTCP+","+hostUDP+","+hostEcho+",pub.test:443")
	// A session with a NIC restores from a template made with one, as
	// every other does from its own: the NIC is served from the restore.
	if s := e.Info("n1"); !strings.Contains(s.Cause, "restored from a template") {
		t.Errorf("n1 was not restored from a template: %q", s.Cause)
	}
	e.OK("put", "n1", probe, "nicprobe")
	e.OK("exec", "n1", "--", "chmod", "755", "/workspace/nicprobe")
	run := func(args ...string) (string, string, int, time.Duration) {
		start := time.Now()
		r := e.Run(append([]string{"exec", "n1", "--", "/workspace/nicprobe"}, args...)...)
		return r.Stdout, r.Stderr, r.Code, time.Since(start)
	}

	// nicOf is session name's NIC as its guest sees it: eth0's MAC and the
	// probe's line for eth0 (name, MTU, addresses).
	nicOf := func(name string) (net.HardwareAddr, string) {
		t.Helper()
		out := e.OK("exec", name, "--", "sh", "-c", "cat /sys/class/net/eth0/address; /workspace/nicprobe ifaces | grep ^eth0")
		mac, line, _ := strings.Cut(strings.TrimSpace(out), "\n")
		hw, err := net.ParseMAC(mac)
		if err != nil {
			t.Fatalf("eth0 of %s: %q", name, out)
		}
		return hw, line
	}
	// hasAddr: the probe's line for eth0 names want first (an IPv6
	// link-local address may follow).
	hasAddr := func(line string, want netip.Prefix) bool {
		return strings.HasPrefix(line, "eth0 65520 ["+want.String()+" ") || line == "eth0 65520 ["+want.String()+"]"
	}
	var n1MAC net.HardwareAddr
	e.Subtest(t, "eth0 with its own MAC and the address it names, berth's DNS, the proxy variables kept", func(t *testing.T) {
		// n1 was restored from a template booted with the default MAC:
		// it has one of its own, and the address that MAC names.
		mac, line := nicOf("n1")
		want := guest.NICAddrOf(mac)
		if mac.String() == guest.NICMAC || !hasAddr(line, want) {
			t.Fatalf("eth0 of n1: MAC %s, %q; want a MAC of its own and %s", mac, line, want)
		}
		n1MAC = mac
		// The default route: destination 0, gateway 10.0.2.2 (little endian hex).
		if route := e.OK("exec", "n1", "--", "cat", "/proc/net/route"); !strings.Contains(route, "eth0\t00000000\t0202000A") {
			t.Errorf("no default route via 10.0.2.2:\n%s", route)
		}
		env := e.OK("exec", "n1", "--", "sh", "-c", "cat /etc/resolv.conf; echo $http_proxy")
		if !strings.Contains(env, "nameserver 10.0.2.3") || !strings.Contains(env, "http://127.0.0.1:3128") {
			t.Errorf("guest resolver and proxy:\n%s", env)
		}
	})

	e.Subtest(t, "a raw TCP client reaches an allowed host port", func(t *testing.T) {
		out, errs, code, _ := run("tcp", hostTCP, "hello")
		if code != 0 || out != "host got hello" {
			t.Fatalf("exit %d: %q %q", code, out, errs)
		}
	})

	e.Subtest(t, "a port not allowed is refused at once", func(t *testing.T) {
		before := netStatus(t, e, "n1").Refused
		out, errs, code, took := run("tcp", "host.berth.internal:"+strconv.Itoa(tcpOther), "hello")
		if code == 0 || !strings.Contains(errs, "connection refused") {
			t.Fatalf("exit %d: %q %q; want connection refused", code, out, errs)
		}
		// An exec costs ~0.1-1 s under TCG; a timeout would be 20 s.
		if took > 8*time.Second {
			t.Errorf("the refusal took %s", took)
		}
		if after := netStatus(t, e, "n1").Refused; after <= before {
			t.Errorf("refusals counted %d, then %d", before, after)
		}
		ev := e.OK("events", "n1")
		if !strings.Contains(ev, "egress to host.berth.internal:"+strconv.Itoa(tcpOther)+" is not allowed for session n1") {
			t.Errorf("the timeline does not note the refusal:\n%s", ev)
		}
	})

	e.Subtest(t, "a UDP datagram to an allowed port arrives, another port is unreachable", func(t *testing.T) {
		out, errs, code, _ := run("udp", hostUDP, "ping")
		if code != 0 || out != "udp got ping" {
			t.Fatalf("exit %d: %q %q", code, out, errs)
		}
		out, errs, code, took := run("udp", "host.berth.internal:"+strconv.Itoa(udpOther), "ping")
		if code == 0 || !strings.Contains(errs, "connection refused") || took > 8*time.Second {
			t.Fatalf("exit %d after %s: %q %q; want connection refused (ICMP port unreachable) at once", code, took, out, errs)
		}
	})

	e.Subtest(t, "DNS answers an allowed name and refuses another", func(t *testing.T) {
		out, errs, code, _ := run("dns", "pub.test")
		if code != 0 || strings.TrimSpace(out) != "[93.184.216.34]" {
			t.Fatalf("exit %d: %q %q", code, out, errs)
		}
		out, errs, code, took := run("dns", "other.test")
		if code == 0 || took > 8*time.Second || strings.Contains(errs, "timeout") {
			t.Fatalf("exit %d after %s: %q %q; want a refusal at once", code, took, out, errs)
		}
	})

	e.Subtest(t, "a policy change applies to new flows", func(t *testing.T) {
		e.OK("net", "n1", "allow:"+hostUDP)
		out, errs, code, _ := run("tcp", hostTCP, "again")
		if code == 0 || !strings.Contains(errs, "connection refused") {
			t.Fatalf("exit %d: %q %q; want connection refused", code, out, errs)
		}
		e.OK("net", "n1", "allow:"+hostTCP+","+hostUDP+","+hostEcho)
		if out, errs, code, _ := run("tcp", hostTCP, "back"); code != 0 || out != "host got back" {
			t.Fatalf("exit %d: %q %q", code, out, errs)
		}
	})

	e.Subtest(t, "none has no NIC", func(t *testing.T) {
		e.OK("create", "n0", "--net", "none")
		out := e.OK("exec", "n0", "--", "sh", "-c", "ls /sys/class/net; cat /etc/resolv.conf")
		if strings.Contains(out, "eth0") || !strings.Contains(out, "nameserver 127.0.0.1") {
			t.Errorf("a session with policy none:\n%s", out)
		}
	})

	e.Subtest(t, "a daemon restart serves the NIC again", func(t *testing.T) {
		e.KillDaemon()
		e.StartDaemon()
		out, errs, code, _ := run("tcp", hostTCP, "restarted")
		if code != 0 || out != "host got restarted" {
			t.Fatalf("after a daemon restart, exit %d: %q %q", code, out, errs)
		}
	})

	e.Subtest(t, "a fork has a NIC of its own: its MAC, its address, its port forwards", func(t *testing.T) {
		e.OK("fork", "n1", "f1")
		mac, line := nicOf("f1")
		want := guest.NICAddrOf(mac)
		if mac.String() == n1MAC.String() || want == guest.NICAddrOf(n1MAC) || !hasAddr(line, want) {
			t.Fatalf("eth0 of the fork: MAC %s, %q; n1's MAC is %s (%s): want another MAC and address", mac, line, n1MAC, guest.NICAddrOf(n1MAC))
		}
		if ev := e.OK("events", "f1"); strings.Contains(ev, "fork identity:") {
			t.Errorf("the fork's identity is incomplete:\n%s", ev)
		}
		r := e.Run("exec", "f1", "--", "/workspace/nicprobe", "tcp", hostTCP, "forked")
		if r.Code != 0 || r.Stdout != "host got forked" {
			t.Fatalf("in the fork, exit %d: %q %q", r.Code, r.Stdout, r.Stderr)
		}
		// The host's stack reaches the fork at its new address.
		guestHTTPD(e, "f1", "8080")
		fw := e.portForward("f1", fmt.Sprintf("%d:8080", freePort(t)))
		if got := peerBecomes(t, fw.addrs[0], guest.NICGateway); got != guest.NICGateway {
			t.Errorf("a forward into the fork comes from %q, want %s (through its NIC)", got, guest.NICGateway)
		}
		out, errs, code, _ := run("tcp", hostTCP, "source")
		if code != 0 || out != "host got source" {
			t.Fatalf("in the source after the fork, exit %d: %q %q", code, out, errs)
		}
		if mac, line := nicOf("n1"); mac.String() != n1MAC.String() || !hasAddr(line, guest.NICAddrOf(n1MAC)) {
			t.Errorf("the source's NIC changed with the fork: %s %q", mac, line)
		}
	})

	e.Subtest(t, "a guest flooding connections and datagrams is bounded and does not stall another", func(t *testing.T) {
		exchange := func() time.Duration {
			t.Helper()
			out, errs, code, took := run("tcp", hostTCP, "beside")
			if code != 0 || out != "host got beside" {
				t.Fatalf("exit %d: %q %q", code, out, errs)
			}
			return took
		}
		median := func() time.Duration {
			var d []time.Duration
			for range 5 {
				d = append(d, exchange())
			}
			slices.Sort(d)
			return d[2]
		}
		quiet := median()
		// f1 (the fork) opens 40 connections at once against
		// net_max_conns = 16 and sends refused datagrams meanwhile.
		e.OK("exec", "f1", "--", "sh", "-c", "rm -f /workspace/flood.out; setsid /workspace/nicprobe flood "+hostEcho+" 40 host.berth.internal:"+strconv.Itoa(udpOther)+" 8 >/workspace/flood.out 2>&1 </dev/null &")
		time.Sleep(time.Second)
		loud := median()
		var out string
		for deadline := time.Now().Add(45 * time.Second); !strings.Contains(out, "held"); time.Sleep(300 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the flood never reported:\n%s", out)
			}
			out = e.OK("exec", "f1", "--", "cat", "/workspace/flood.out")
		}
		// The echo's connections, and nothing else, count: 16 answered.
		if !strings.Contains(out, "held 16 of 40") {
			t.Errorf("net_max_conns = 16, the flood: %s", out)
		}
		ratio := float64(loud) / float64(quiet)
		t.Logf("n1's exec+exchange p50: %s quiet, %s beside the flood (%.2fx)", quiet, loud, ratio)
		// Stated bound: 8x (measured 2.4x here). Both guests share two
		// cores under TCG and the flooder's vCPU takes one of them, so
		// the figure is mostly CPU; a stall behind the flood's flows
		// would be seconds against ~0.1 s.
		if ratio > 8 {
			t.Errorf("a flood in another session slowed n1's traffic %.2fx (bound 8x)", ratio)
		}
	})

	e.Subtest(t, "sleep and wake keep the NIC", func(t *testing.T) {
		e.OK("sleep", "n1")
		out, errs, code, _ := run("tcp", hostTCP, "awake")
		if code != 0 || out != "host got awake" {
			t.Fatalf("after a wake, exit %d: %q %q", code, out, errs)
		}
	})

	e.Subtest(t, "a connection open across sleep and wake is reset, not left hanging", func(t *testing.T) {
		e.OK("exec", "n1", "--", "sh", "-c", "rm -f /workspace/go /workspace/hold.out; setsid /workspace/nicprobe hold "+hostEcho+" /workspace/go >/workspace/hold.out 2>&1 </dev/null &")
		held := func(want string) string {
			t.Helper()
			var out string
			for deadline := time.Now().Add(45 * time.Second); time.Now().Before(deadline); time.Sleep(300 * time.Millisecond) {
				if out = e.OK("exec", "n1", "--", "cat", "/workspace/hold.out"); strings.Contains(out, want) {
					return out
				}
			}
			t.Fatalf("the held connection's output never showed %q:\n%s", want, out)
			return ""
		}
		held(`reply "echo first"`)
		e.OK("sleep", "n1")
		e.OK("exec", "n1", "--", "touch", "/workspace/go") // wakes it
		out := held("after ")
		// The stack that served it is gone: the guest's next segment
		// meets a new one, which resets it; a hang would end in the
		// probe's 30-s deadline as "i/o timeout".
		if !strings.Contains(out, "connection reset by peer") {
			t.Fatalf("the connection held across sleep and wake:\n%s", out)
		}
	})

	e.Subtest(t, "a restore of a memory checkpoint has the NIC, and resets what was open", func(t *testing.T) {
		e.OK("exec", "n1", "--", "sh", "-c", "rm -f /workspace/go /workspace/hold.out; setsid /workspace/nicprobe hold "+hostEcho+" /workspace/go >/workspace/hold.out 2>&1 </dev/null &")
		for deadline := time.Now().Add(45 * time.Second); ; time.Sleep(300 * time.Millisecond) {
			if strings.Contains(e.OK("exec", "n1", "--", "cat", "/workspace/hold.out"), `reply "echo first"`) {
				break
			} else if time.Now().After(deadline) {
				t.Fatal("the held connection never answered")
			}
		}
		e.OK("checkpoint", "n1", "--memory")
		e.OK("restore", "n1", e.lastCheckpoint("n1"), "--yes")
		if out, errs, code, _ := run("tcp", hostTCP, "restored"); code != 0 || out != "host got restored" {
			t.Fatalf("after a restore, exit %d: %q %q", code, out, errs)
		}
		e.OK("exec", "n1", "--", "touch", "/workspace/go")
		var out string
		for deadline := time.Now().Add(45 * time.Second); !strings.Contains(out, "after "); time.Sleep(300 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the restored probe never wrote again:\n%s", out)
			}
			out = e.OK("exec", "n1", "--", "cat", "/workspace/hold.out")
		}
		if !strings.Contains(out, "connection reset by peer") {
			t.Fatalf("the connection held across a restore:\n%s", out)
		}
	})

	e.Subtest(t, "net_nic = false boots without a NIC", func(t *testing.T) {
		e.KillDaemon()
		os.WriteFile(filepath.Join(e.Data, "config.toml"), []byte("memory = \"256M\"\ndisk = \"64M\"\nidle_timeout = \"0\"\nnet_nic = false\n"), 0o644)
		e.StartDaemon()
		e.OK("create", "p1", "--net", "allow:"+hostTCP)
		out := e.OK("exec", "p1", "--", "sh", "-c", "ls /sys/class/net; echo $http_proxy")
		if strings.Contains(out, "eth0") || !strings.Contains(out, "http://127.0.0.1:3128") {
			t.Errorf("a session of a daemon with net_nic = false:\n%s", out)
		}
	})
}

package fleet_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/daemon/daemontest"
	"github.com/berthvm/berth/vmm/vmmtest"
)

// startEtcd runs `berth etcd` on ports of its choosing and returns its
// client URL, from the line it prints.
func startEtcd(t *testing.T, berth string, args ...string) (string, *exec.Cmd) {
	t.Helper()
	vmmtest.BerthEtcd(t) // berth-etcd next to berth, which berth etcd becomes
	scheme := "http"
	if len(args) > 0 {
		scheme = "https"
	}
	cmd := exec.Command(berth, append([]string{"etcd", "--name", "e1", "--data", filepath.Join(t.TempDir(), "etcd"),
		"--listen-client", scheme + "://127.0.0.1:0", "--listen-peer", scheme + "://127.0.0.1:0"}, args...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	line := make(chan string, 1)
	go func() {
		s := bufio.NewScanner(out)
		if s.Scan() {
			line <- s.Text()
		}
		close(line)
		io.Copy(io.Discard, out)
	}()
	select {
	case l := <-line:
		m := regexp.MustCompile(`clients on (https?://[0-9.:]+)`).FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("berth etcd said %q (stderr %q)", l, stderr.String())
		}
		return m[1], cmd
	case <-time.After(30 * time.Second):
		t.Fatalf("berth etcd said nothing in 30s (stderr %q)", stderr.String())
	}
	return "", nil
}

// fleetFollower is `berth events --follow --json` on a host, its fleet
// events read as they come.
type fleetFollower struct {
	cmd *exec.Cmd
	evs chan session.Event
}

func followFleet(t *testing.T, e *daemontest.Env, args ...string) *fleetFollower {
	t.Helper()
	f := &fleetFollower{cmd: e.Cmd(append([]string{"events", "--follow", "--json"}, args...)...), evs: make(chan session.Event, 100)}
	out, err := f.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := f.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.stop)
	go func() { // ends with the command's output
		defer close(f.evs)
		s := bufio.NewScanner(out)
		for s.Scan() {
			var ev session.Event
			if json.Unmarshal(s.Bytes(), &ev) == nil && ev.Kind == session.EventFleet && ev.Fleet != nil {
				f.evs <- ev
			}
		}
	}()
	return f
}

func (f *fleetFollower) stop() {
	if f.cmd.ProcessState == nil {
		f.cmd.Process.Kill()
		f.cmd.Wait()
	}
}

// next is the next fleet event.
func (f *fleetFollower) next(t *testing.T) session.Event {
	t.Helper()
	select {
	case ev, ok := <-f.evs:
		if !ok {
			t.Fatal("events --follow ended")
		}
		return ev
	case <-time.After(15 * time.Second):
		t.Fatal("no fleet event within 15s")
	}
	return session.Event{}
}

// until skips fleet events to the one shown as want.
func (f *fleetFollower) until(t *testing.T, want string) session.Event {
	t.Helper()
	for {
		if ev := f.next(t); shownFleet(ev) == want {
			return ev
		}
	}
}

func shownFleet(ev session.Event) string {
	if ev.Fleet == nil {
		return ""
	}
	return strings.TrimSpace(ev.Name + " " + string(ev.Fleet.Change) + " " + ev.Fleet.Host)
}

func hostLs(t *testing.T, e *daemontest.Env) session.HostList {
	t.Helper()
	var l session.HostList
	if err := json.Unmarshal([]byte(e.OK("host", "ls", "--json")), &l); err != nil {
		t.Fatal(err)
	}
	return l
}

func stateOf(l session.HostList, id string) session.HostInfo {
	for _, h := range l.Hosts {
		if h.ID == id {
			return h
		}
	}
	return session.HostInfo{}
}

// waitHost polls e's host ls until host id is in state want.
func waitHost(t *testing.T, e *daemontest.Env, id string, want session.HostState, within time.Duration) session.HostInfo {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		h := stateOf(hostLs(t, e), id)
		if h.State == want {
			return h
		}
		if time.Now().After(deadline) {
			t.Fatalf("host %s is %q, not %s within %s", id, h.State, want, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Two `berth serve --fleet` daemons on one `berth etcd`: each lists both;
// one killed with SIGKILL goes gone after its lease's TTL; restarted, it
// is ready again; the other, stopped cleanly, is gone at once; a berth
// without --fleet says it is in none; berth etcd stops on SIGINT.
func TestFleetEndToEnd(t *testing.T) {
	const ttl = 2 * time.Second
	a := daemontest.New(t, t.TempDir())
	b := daemontest.New(t, t.TempDir())
	url, etcd := startEtcd(t, a.Berth)
	serve := func(e *daemontest.Env, id, addr string) {
		e.StartDaemon("--fleet", url, "--host-id", id, "--listen", addr, "--fleet-ttl", ttl.String())
	}
	// Port 0: each takes one, and records the one it took.
	serve(a, "a", "127.0.0.1:0")
	serve(b, "b", "127.0.0.1:0")

	for _, c := range []struct {
		e    *daemontest.Env
		self string
	}{{a, "a"}, {b, "b"}} {
		l := hostLs(t, c.e)
		if !l.Fleet || l.Self != c.self || len(l.Hosts) != 2 {
			t.Fatalf("host ls from %s: %+v", c.self, l)
		}
		for _, h := range l.Hosts {
			if h.State != session.HostReady || h.CPUs <= 0 || h.MemoryMiB <= 0 || h.DiskFree <= 0 {
				t.Errorf("host ls from %s lists %+v", c.self, h)
			}
		}
		table := c.e.OK("host", "ls")
		if !strings.Contains(table, c.self+" (this)") || !strings.Contains(table, "127.0.0.1:") || strings.Contains(table, "127.0.0.1:0 ") {
			t.Errorf("host ls from %s:\n%s", c.self, table)
		}
	}

	// events --follow on b shows the fleet's hosts going and coming.
	fb := followFleet(t, b)

	// SIGKILL: still ready while the lease lives, gone after it.
	killed := time.Now()
	a.KillDaemon()
	if h := stateOf(hostLs(t, b), "a"); h.State != session.HostReady {
		t.Errorf("host a just after SIGKILL: %q, want still ready", h.State)
	}
	h := waitHost(t, b, "a", session.HostGone, ttl+5*time.Second)
	if h.Left {
		t.Errorf("a killed host is listed as left")
	}
	// The lease was last renewed up to a third of its TTL before the
	// kill (etcd's client renews at TTL/3): it ends 2/3 TTL after it at
	// the earliest.
	if took := time.Since(killed); took < ttl*2/3-200*time.Millisecond {
		t.Errorf("host a gone %s after SIGKILL, before two thirds of its %s TTL", took, ttl)
	}
	// Restarted on its data directory it is the same host, ready again.
	serve(a, "a", "127.0.0.1:0")
	if h := stateOf(hostLs(t, b), "a"); h.State != session.HostReady {
		t.Errorf("host a after its restart: %q", h.State)
	}

	lost := fb.until(t, "lost a")
	joined := fb.until(t, "joined a")
	if lost.Rev <= 0 || joined.Rev <= lost.Rev {
		t.Errorf("a lost at revision %d, joined again at %d", lost.Rev, joined.Rev)
	}
	fb.stop()
	// Resumed through the other front door after a's loss: a's return
	// first, then b's clean stop.
	fa := followFleet(t, a, "--since-rev", fmt.Sprint(lost.Rev))
	defer fa.stop()
	if ev := fa.next(t); shownFleet(ev) != "joined a" || ev.Rev != joined.Rev {
		t.Errorf("resumed after %d on a: first %q@%d, want joined a@%d", lost.Rev, shownFleet(ev), ev.Rev, joined.Rev)
	}

	// A clean stop deregisters at once.
	b.Daemon.Process.Signal(syscall.SIGTERM)
	if err := b.Daemon.Wait(); err != nil {
		t.Errorf("berth serve b on SIGTERM: %v; log:\n%s", err, b.DaemonLog())
	}
	b.Daemon = nil
	if h := stateOf(hostLs(t, a), "b"); h.State != session.HostGone || !h.Left {
		t.Errorf("host b right after a clean stop: %+v, want gone, left", h)
	}
	if gone, left := fa.next(t), fa.next(t); shownFleet(gone) != "lost b" || shownFleet(left) != "left b" || left.Rev <= gone.Rev {
		t.Errorf("b's clean stop followed as %q@%d, %q@%d; want lost b, left b", shownFleet(gone), gone.Rev, shownFleet(left), left.Rev)
	}

	// Without --fleet, nothing of it.
	solo := daemontest.New(t, t.TempDir())
	solo.StartDaemon()
	if out := solo.OK("host", "ls"); out != "this berth is not in a fleet (berth serve --fleet ETCD_URLS --host-id H joins one)\n" {
		t.Errorf("host ls without a fleet: %q", out)
	}

	etcd.Process.Signal(syscall.SIGINT)
	defer func() {
		// With etcd gone, host ls answers in one line within its bound.
		start := time.Now()
		r := a.Run("host", "ls")
		if r.Code != 1 || !strings.HasPrefix(r.Stderr, "berth: the fleet's etcd did not answer") || strings.Count(r.Stderr, "\n") != 1 {
			t.Errorf("host ls without etcd: %+v", r)
		}
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("host ls without etcd took %s", took)
		}
	}()
	done := make(chan error, 1)
	go func() { done <- etcd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("berth etcd on SIGINT: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Errorf("berth etcd did not stop within 15s of SIGINT")
	}
}

// berth fleet init, berth etcd --fleet-ca and berth serve --fleet-ca:
// the host joins over mutual TLS with a certificate it issued itself.
func TestFleetTLSEndToEnd(t *testing.T) {
	a := daemontest.New(t, t.TempDir())
	ca := filepath.Join(t.TempDir(), "ca")
	if out := a.OK("fleet", "init", "--dir", ca); !strings.HasPrefix(out, "made the fleet CA in ") {
		t.Errorf("fleet init said %q", out)
	}
	if r := a.Run("fleet", "init", "--dir", ca); r.Code != 1 || !strings.Contains(r.Stderr, "holds a fleet CA already") {
		t.Errorf("second fleet init: %+v", r)
	}
	url, _ := startEtcd(t, a.Berth, "--fleet-ca", ca)
	if !strings.HasPrefix(url, "https://") {
		t.Fatalf("berth etcd --fleet-ca serves %s", url)
	}
	a.StartDaemon("--fleet", url, "--host-id", "a", "--fleet-ca", ca, "--fleet-ttl", "2s")
	if l := hostLs(t, a); !l.Fleet || stateOf(l, "a").State != session.HostReady {
		t.Errorf("host ls over mutual TLS: %+v", l)
	}
}

// Two hosts over mutual TLS with an operator's certificate: berth --host
// on host a makes a session --on b, runs commands in it through a (its
// output, its exit status, stdin), lists it with its host from either,
// and deletes it; a client without a certificate is refused; plain text
// beyond loopback is refused. Boots one VM, on b.
func TestFleetFrontDoorEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM")
	}
	a := daemontest.New(t, t.TempDir())
	b := daemontest.New(t, vmmtest.DataDir(t))
	ca := filepath.Join(t.TempDir(), "ca")
	a.OK("fleet", "init", "--dir", ca)
	op := filepath.Join(t.TempDir(), "op")
	if out := a.OK("fleet", "cert", "--dir", ca, "--name", "operator", "--out", op); !strings.HasPrefix(out, "issued operator's certificate into ") {
		t.Errorf("fleet cert said %q", out)
	}
	url, _ := startEtcd(t, a.Berth, "--fleet-ca", ca)
	// Host a serves SSH too, for a key of the test's.
	sshDir := t.TempDir()
	key := filepath.Join(sshDir, "key")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "op@test", "-f", key).CombinedOutput(); err != nil {
		t.Skipf("ssh-keygen: %v %s", err, out)
	}
	a.OK("ssh", "add-key", "--role", "admin", key+".pub")
	sshLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sshAddr := sshLn.Addr().String()
	sshLn.Close()
	a.StartDaemon("--fleet", url, "--host-id", "a", "--listen", "127.0.0.1:0", "--fleet-ca", ca, "--fleet-ttl", "2s", "--ssh", sshAddr)
	b.StartDaemon("--fleet", url, "--host-id", "b", "--listen", "127.0.0.1:0", "--fleet-ca", ca, "--fleet-ttl", "2s")
	addr := stateOf(hostLs(t, a), "a").Addr
	if !strings.HasPrefix(addr, "127.0.0.1:") || strings.HasSuffix(addr, ":0") {
		t.Fatalf("host a records address %q", addr)
	}
	// The operator's berth: no data directory of its own in use, host a.
	remote := func(args ...string) []string {
		return append([]string{"--host", "tcp://" + addr, "--cert-dir", op}, args...)
	}
	out := a.OK(remote("create", "far", "--on", "b", "--memory", "384M", "--disk", "256M")...)
	if !strings.Contains(out, "host b") {
		t.Errorf("create --on b said %q", out)
	}
	r := a.RunIn("through a\n", remote("exec", "far", "--", "cat")...)
	if r.Code != 0 || r.Stdout != "through a\n" {
		t.Errorf("exec cat through a: %+v", r)
	}
	r = a.Run(remote("exec", "far", "--", "sh", "-c", "echo out; echo err >&2; exit 3")...)
	if r.Code != 3 || r.Stdout != "out\n" || !strings.Contains(r.Stderr, "err\n") {
		t.Errorf("exec through a: %+v, want exit 3 with its output", r)
	}
	// ssh NAME@host-a reaches the session on b.
	_, sshPort, _ := net.SplitHostPort(sshAddr)
	ssh := exec.Command("ssh", "-F", "/dev/null", "-i", key, "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none",
		"-o", "UserKnownHostsFile="+filepath.Join(sshDir, "known_hosts"), "-o", "StrictHostKeyChecking=accept-new",
		"-o", "BatchMode=yes", "-o", "LogLevel=ERROR", "-p", sshPort, "far@127.0.0.1", "sh", "-c", "'echo via ssh; exit 4'")
	ssh.Env = append(os.Environ(), "HOME="+sshDir)
	sshOut, err := ssh.Output()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 4 || string(sshOut) != "via ssh\n" {
		t.Errorf("ssh far@a: %q, %v (want exit 4); log of a:\n%s", sshOut, err, a.DaemonLog())
	}
	// BERTH_HOST and BERTH_CERT_DIR say the same.
	c := a.Cmd("ls", "--json")
	c.Env = append(c.Env, "BERTH_HOST=tcp://"+addr, "BERTH_CERT_DIR="+op)
	lsOut, err := c.Output()
	if err != nil {
		t.Fatalf("ls with BERTH_HOST: %v", err)
	}
	var list []session.Session
	if err := json.Unmarshal(lsOut, &list); err != nil || len(list) != 1 || list[0].Host != "b" || list[0].State != session.StateRunning {
		t.Errorf("ls --json through a: %s (%v)", lsOut, err)
	}
	if table := b.OK("ls"); !strings.Contains(table, "HOST") || !strings.Contains(table, "far   b ") {
		t.Errorf("ls on b:\n%s", table)
	}
	// No certificate, no entry.
	if r := a.Run("--host", "tcp://"+addr, "--cert-dir", filepath.Join(t.TempDir(), "none"), "ls"); r.Code == 0 {
		t.Errorf("ls without a certificate: %+v", r)
	}
	// A move through a front door that is neither end's: a forwards it
	// to b, the owner, which sends the session straight to... a. A running
	// session is refused; a sleeping one wakes there with its processes.
	a.OK(remote("exec", "far", "--", "sh", "-c", "echo moved > /workspace/m; setsid sleep 1000 >/dev/null 2>&1 </dev/null &")...)
	if r := a.Run(remote("move", "far", "--to", "a")...); r.Code == 0 || !strings.Contains(r.Stderr, "sleep") {
		t.Errorf("move of a running session: %+v", r)
	}
	a.OK(remote("sleep", "far")...)
	if out := a.OK(remote("move", "far", "--to", "a")...); !strings.HasPrefix(out, "moved far to a in ") || !strings.Contains(out, "it is sleeping there") {
		t.Errorf("move: %q", out)
	}
	if got := a.OK(remote("exec", "far", "--", "sh", "-c", "cat /workspace/m; cat /proc/[0-9]*/comm | grep -qx sleep && echo still sleeping")...); got != "moved\nstill sleeping\n" {
		t.Errorf("after the move, far says %q", got)
	}
	if _, err := os.Stat(filepath.Join(b.Data, "sessions", "far")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("b kept its copy of far: %v", err)
	}
	if l := hostLs(t, a); stateOf(l, "b").Used.Sessions != 0 || stateOf(l, "a").Used.Sessions != 1 {
		t.Errorf("after the move, sessions promised: a %d, b %d", stateOf(l, "a").Used.Sessions, stateOf(l, "b").Used.Sessions)
	}
	if table := b.OK("ls"); !strings.Contains(table, "far   a ") {
		t.Errorf("ls on b after the move:\n%s", table)
	}
	// A drain of a sends the sleeping far to b, the only other host,
	// where it wakes with its processes.
	a.OK(remote("sleep", "far")...)
	if out := a.OK(remote("host", "drain", "a")...); !strings.Contains(out, "moved far to b in ") || !strings.Contains(out, "(sleeping there)") {
		t.Errorf("host drain a: %q", out)
	}
	if got := a.OK(remote("exec", "far", "--", "sh", "-c", "cat /workspace/m; cat /proc/[0-9]*/comm | grep -qx sleep && echo still sleeping")...); got != "moved\nstill sleeping\n" {
		t.Errorf("after the drain, far says %q", got)
	}
	if _, err := os.Stat(filepath.Join(a.Data, "sessions", "far")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the drained a kept its copy of far: %v", err)
	}
	a.Fails("host a cannot take", remote("create", "x", "--on", "a")...)
	a.OK(remote("host", "undrain", "a")...)
	a.OK(remote("delete", "far", "--yes")...)
	if l := hostLs(t, a); stateOf(l, "b").Used.Sessions != 0 || stateOf(l, "a").Used.Sessions != 0 {
		t.Errorf("after delete, hosts have sessions promised: %+v", l.Hosts)
	}
	// Plain text beyond loopback is refused at start.
	c3 := daemontest.New(t, t.TempDir())
	if r := c3.Run("serve", "--fleet", url, "--host-id", "c", "--listen", "0.0.0.0:0"); r.Code == 0 || !strings.Contains(r.Stderr, "--fleet-ca") {
		t.Errorf("serve --listen 0.0.0.0:0 without a CA: %+v", r)
	}
}

// berth host drain and undrain through real daemons, with no VM: host
// b, drained through host a's berth, is listed draining and refuses
// create --on b in one line (placement refuses it: no VM is made); the
// mark outlasts a SIGKILL and restart of b's daemon; undrained, b is
// ready again. A host not in the fleet, and one gone, are refused in
// one line. (Sessions moving off a drained host: TestRouterDrain.)
func TestFleetDrainEndToEnd(t *testing.T) {
	a := daemontest.New(t, t.TempDir())
	b := daemontest.New(t, t.TempDir())
	url, _ := startEtcd(t, a.Berth)
	serve := func(e *daemontest.Env, id string) {
		e.StartDaemon("--fleet", url, "--host-id", id, "--listen", "127.0.0.1:0", "--fleet-ttl", "2s")
	}
	serve(a, "a")
	serve(b, "b")
	if out := a.OK("host", "drain", "b"); out != "host b is draining: it holds no sessions\n" {
		t.Errorf("host drain b through a said %q", out)
	}
	if h := stateOf(hostLs(t, a), "b"); h.State != session.HostDraining {
		t.Errorf("host b after the drain: %q, want draining", h.State)
	}
	if table := a.OK("host", "ls"); !regexp.MustCompile(`(?m)^b +draining `).MatchString(table) {
		t.Errorf("host ls:\n%s", table)
	}
	a.Fails("host b cannot take x: it is draining", "create", "x", "--on", "b")

	b.KillDaemon()
	serve(b, "b")
	if h := stateOf(hostLs(t, a), "b"); h.State != session.HostDraining {
		t.Errorf("host b after its daemon's restart: %q, want draining", h.State)
	}
	var res session.DrainResult
	if err := json.Unmarshal([]byte(b.OK("host", "drain", "b", "--json")), &res); err != nil || res.Host != "b" || len(res.Steps) != 0 {
		t.Errorf("host drain b --json on b: %+v, %v", res, err)
	}
	if out := a.OK("host", "undrain", "b"); out != "host b takes new sessions again\n" {
		t.Errorf("host undrain b said %q", out)
	}
	if h := stateOf(hostLs(t, a), "b"); h.State != session.HostReady {
		t.Errorf("host b undrained: %q, want ready", h.State)
	}

	a.Fails("no host zz in the fleet", "host", "drain", "zz")
	b.Daemon.Process.Signal(syscall.SIGTERM)
	b.Daemon.Wait()
	b.Daemon = nil
	a.Fails("host b is gone", "host", "drain", "b")
	a.Fails("host b is gone", "host", "undrain", "b")
}

// A gone host's session recovered through real daemons and the CLI: a
// memory checkpoint of a running session on a is replicated to b; a's
// daemon is killed (its VM runs on); berth recover on b is refused while
// etcd holds a's lease, says what it would do without --force, and then
// starts the session on b from the checkpoint (its workspace as it was
// then, its processes resumed from the checkpoint's memory); a,
// restarted, stops its VM and quarantines its copy at once, so one VMM
// runs the session in the fleet. Boots two VMs (run it under flock
// /tmp/berth-vm.lock).
func TestRecoverDaemonsEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("boots VMs")
	}
	const ttl = 2 * time.Second
	a := daemontest.New(t, vmmtest.DataDir(t))
	b := daemontest.New(t, vmmtest.DataDir(t))
	url, _ := startEtcd(t, a.Berth)
	serve := func(e *daemontest.Env, id string) {
		e.StartDaemon("--fleet", url, "--host-id", id, "--listen", "127.0.0.1:0", "--fleet-ttl", ttl.String())
	}
	serve(a, "a")
	serve(b, "b")
	a.OK("create", "rec", "--on", "a", "--memory", "384M", "--disk", "256M")
	a.OK("exec", "rec", "--", "sh", "-c", "echo kept > /workspace/state; sync; setsid sleep 1000 >/dev/null 2>&1 </dev/null &")
	if out := a.OK("checkpoint", "rec", "--memory", "--replicate", "b"); !strings.Contains(out, "checkpoint c1 of rec: workspace+memory") || !strings.Contains(out, "checkpoint c1 of rec copied to b in ") {
		t.Fatalf("checkpoint --replicate said %q", out)
	}
	a.OK("exec", "rec", "--", "sh", "-c", "echo lost > /workspace/state; echo x > /workspace/later; sync")
	if out := b.OK("checkpoints", "rec"); !strings.Contains(out, "REPLICAS") || !regexp.MustCompile(`c1 .* b\n`).MatchString(out) {
		t.Errorf("checkpoints from b:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(b.Data, "replicas", "rec", "c1", "session", "checkpoints", "c1", "workspace.img")); err != nil {
		t.Errorf("b keeps no replica: %v", err)
	}
	if _, err := os.Stat(filepath.Join(b.Data, "sessions", "rec")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the replica made a session directory on b: %v", err)
	}
	before := a.Info("rec")
	oldVMM := a.VMMPid("rec")
	if oldVMM == 0 {
		t.Fatal("no VMM pid for rec on a")
	}

	a.KillDaemon()
	killed := time.Now()
	if r := b.Run("checkpoints", "rec"); r.Code != 1 || !strings.Contains(r.Stderr, "the fleet keeps replicas of its checkpoints c1 (taken ") {
		t.Errorf("checkpoints of rec with a down: %+v", r)
	}
	recoverArgs := []string{"recover", "rec", "--from", "c1", "--on", "b"}
	r := b.Run(append(recoverArgs, "--force")...)
	if r.Code != 1 || !strings.HasPrefix(r.Stderr, "berth: host a, which owns session rec, still holds its etcd lease (it expires in ") || strings.Count(r.Stderr, "\n") != 1 {
		t.Fatalf("recover while a's lease lives: %+v", r)
	}
	for {
		r = b.Run(recoverArgs...)
		if !strings.Contains(r.Stderr, "still holds its etcd lease") {
			break
		}
		if time.Since(killed) > ttl+5*time.Second {
			t.Fatalf("a's lease still lives %s after the kill: %+v", time.Since(killed), r)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if r.Code != 1 || !strings.HasPrefix(r.Stderr, "berth: this would start session rec on host b from its replica of checkpoint c1") ||
		!strings.HasSuffix(r.Stderr, "; add --force to do it\n") || strings.Count(r.Stderr, "\n") != 1 {
		t.Fatalf("recover without --force: %+v", r)
	}
	out := b.OK(append(recoverArgs, "--force")...)
	if !strings.HasPrefix(out, "recovered rec on b from checkpoint c1 in ") || !strings.Contains(out, "(host a was gone); it is running") {
		t.Errorf("recover --force said %q", out)
	}
	after := b.Info("rec")
	if after.Host != "b" || after.State != session.StateRunning || after.Epoch <= before.Epoch {
		t.Errorf("after the recovery: host %s, %s, epoch %d (was %d)", after.Host, after.State, after.Epoch, before.Epoch)
	}
	if got := b.OK("exec", "rec", "--", "sh", "-c", "cat /workspace/state; if test -e /workspace/later; then echo later; fi; cat /proc/[0-9]*/comm | grep -qx sleep && echo still sleeping"); got != "kept\nstill sleeping\n" {
		t.Errorf("the recovered session says %q, want the checkpoint's workspace and processes", got)
	}
	if syscall.Kill(oldVMM, 0) != nil {
		t.Fatalf("a's VMM %d did not outlive its daemon", oldVMM)
	}

	// a comes back: its VM stops and its copy goes to quarantine before
	// the daemon answers.
	back := time.Now()
	serve(a, "a")
	for syscall.Kill(oldVMM, 0) == nil {
		if time.Since(back) > 10*time.Second {
			t.Fatalf("a's VMM %d still runs 10s after a's restart; log:\n%s", oldVMM, a.DaemonLog())
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("a's stale VM stopped %s after its restart", time.Since(back).Round(time.Millisecond))
	if q := a.OK("quarantine"); !strings.Contains(q, "rec") || !strings.Contains(q, "host b owns session rec") {
		t.Errorf("quarantine on a:\n%s", q)
	}
	if _, err := os.Stat(filepath.Join(a.Data, "sessions", "rec")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a's copy is still among its sessions: %v", err)
	}
	if pid := b.VMMPid("rec"); pid == 0 || syscall.Kill(pid, 0) != nil {
		t.Errorf("b's VMM for rec is not running (pid %d)", pid)
	}
	if table := a.OK("ls"); !regexp.MustCompile(`rec +b +running`).MatchString(table) {
		t.Errorf("ls on a after its return:\n%s", table)
	}
	b.OK("delete", "rec", "--yes")
}

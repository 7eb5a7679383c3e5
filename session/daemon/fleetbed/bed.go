// Package fleetbed builds a berth fleet on one machine for tests: etcd
// members and `berth serve --fleet` hosts, each in a network namespace of
// its own, joined by veth pairs to a bridge in one more namespace, and
// each host on a data directory of its own. Tests partition a host from
// etcd only (nftables in its namespace drops the etcd client port), heal
// it, kill -9 a daemon, and stop and start etcd members.
//
// Layout, for a bed of prefix P (default "bfl") on 10.231.0.0/24:
//
//	P-br      the bridge br0, with one veth end per member and host
//	P-e1..    etcd member i at 10.231.0.(10+i), clients :2379, peers :2380
//	P-h1..    berth host hi at 10.231.0.(20+i), --listen :7443
//
// Every member and host talks mutual TLS with certificates of one fleet
// CA (berth fleet init): berth allows plain text on loopback only. The
// hosts share the machine's filesystem (separate data directories, no
// mount namespaces): a test of moves would want unshare -m on top.
//
// With Config.Fake each host is the test binary itself, wiring the fleet
// as berth serve does over the sessiontest fake (fakehost.go): sessions
// and commands without VMs, for tests about coordination.
//
// Building a bed needs root and the ip and nft commands; New skips the
// test with the reason otherwise. Everything it makes is undone in
// t.Cleanup, failed test or not, and a bed left by a killed test run is
// removed before a new one is built.
package fleetbed

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/api"
	"github.com/berthvm/berth/session/daemon/daemontest"
	"github.com/berthvm/berth/session/fleet"
	"github.com/berthvm/berth/session/fleet/pki"
	"github.com/berthvm/berth/vmm/vmmtest"
)

// Config shapes a bed; zero fields take the defaults said on each.
type Config struct {
	// Prefix names the namespaces (default "bfl"); Subnet is the first
	// three octets of the bed's /24 (default "10.231.0").
	Prefix, Subnet string
	// Members and Hosts count etcd members and berth hosts (default 3
	// each, at most 9).
	Members, Hosts int
	// TTL is the hosts' lease TTL (default 3s).
	TTL time.Duration
	// Fake runs each host as a fake host: the fleet wired as berth
	// serve wires it, over the sessiontest fake instead of the engine
	// (sessions without VMs; see fakeHostEnv). The test package's
	// TestMain must call RunHelper.
	Fake bool
}

// Bed is a running fleet.
type Bed struct {
	T       *testing.T
	Berth   string // the berth binary
	CA      string // the fleet CA's directory
	TTL     time.Duration
	Members []*Member
	Hosts   []*Host
	prefix  string
	fake    bool
}

// Member is one etcd member.
type Member struct {
	b      *Bed
	Name   string
	NS, IP string
	Dir    string
	args   []string
	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

// Host is one berth host: a daemontest.Env (the CLI on its data
// directory) whose daemon runs in the host's namespace.
type Host struct {
	*daemontest.Env
	b      *Bed
	ID     string
	NS, IP string
}

// Skip skips t unless a bed can be built here.
func Skip(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the fleet bed needs root (network namespaces, nftables)")
	}
	for _, c := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(c); err != nil {
			t.Skipf("the fleet bed needs the %s command: %v", c, err)
		}
	}
}

// New builds the network and starts the etcd members (no hosts yet:
// StartHosts starts them).
func New(t *testing.T, c Config) *Bed {
	t.Helper()
	Skip(t)
	if c.Prefix == "" {
		c.Prefix = "bfl"
	}
	if c.Subnet == "" {
		c.Subnet = "10.231.0"
	}
	if c.Members == 0 {
		c.Members = 3
	}
	if c.Hosts == 0 {
		c.Hosts = 3
	}
	if c.TTL == 0 {
		c.TTL = 3 * time.Second
	}
	// One bed of a prefix at a time on the machine (two test processes
	// would share names and addresses): the second waits for the first.
	lock, err := os.OpenFile(filepath.Join(os.TempDir(), "berth-fleetbed-"+c.Prefix+".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		lock.Close()
		t.Fatalf("lock the fleet bed %s: %v", c.Prefix, err)
	}
	t.Cleanup(func() { lock.Close() }) // registered first: released last
	b := &Bed{T: t, Berth: vmmtest.BerthEtcd(t), TTL: c.TTL, prefix: c.Prefix, fake: c.Fake}
	b.removeNet() // a bed a killed run left behind
	t.Cleanup(b.removeNet)
	br := c.Prefix + "-br"
	b.ip("netns", "add", br)
	b.ip("-n", br, "link", "add", "br0", "type", "bridge")
	b.ip("-n", br, "link", "set", "br0", "up")
	b.ip("-n", br, "link", "set", "lo", "up")
	// The bridge's own address: the test's etcd calls go from there.
	b.ip("-n", br, "addr", "add", c.Subnet+".2/24", "dev", "br0")
	node := func(name, ip string) {
		ns := c.Prefix + "-" + name
		b.ip("netns", "add", ns)
		b.ip("-n", br, "link", "add", "p-"+name, "type", "veth", "peer", "name", "eth0", "netns", ns)
		b.ip("-n", br, "link", "set", "p-"+name, "master", "br0", "up")
		b.ip("-n", ns, "addr", "add", ip+"/24", "dev", "eth0")
		b.ip("-n", ns, "link", "set", "eth0", "up")
		b.ip("-n", ns, "link", "set", "lo", "up")
	}
	var initial []string
	for i := 1; i <= c.Members; i++ {
		m := &Member{b: b, Name: fmt.Sprintf("e%d", i), IP: fmt.Sprintf("%s.%d", c.Subnet, 10+i)}
		m.NS = c.Prefix + "-" + m.Name
		node(m.Name, m.IP)
		initial = append(initial, fmt.Sprintf("%s=https://%s:2380", m.Name, m.IP))
		b.Members = append(b.Members, m)
	}
	for i := 1; i <= c.Hosts; i++ {
		h := &Host{b: b, ID: fmt.Sprintf("h%d", i), IP: fmt.Sprintf("%s.%d", c.Subnet, 20+i)}
		h.NS = c.Prefix + "-" + h.ID
		node(h.ID, h.IP)
		b.Hosts = append(b.Hosts, h)
	}

	b.CA = filepath.Join(t.TempDir(), "ca")
	if out, err := exec.Command(b.Berth, "fleet", "init", "--dir", b.CA).CombinedOutput(); err != nil {
		t.Fatalf("berth fleet init: %v: %s", err, out)
	}
	dir := t.TempDir()
	for _, m := range b.Members {
		m.Dir = filepath.Join(dir, m.Name)
		m.args = []string{"etcd", "--name", m.Name, "--data", m.Dir, "--fleet-ca", b.CA,
			"--listen-client", "https://" + m.IP + ":2379", "--listen-peer", "https://" + m.IP + ":2380",
			"--initial-cluster", strings.Join(initial, ",")}
	}
	// A new cluster of several serves once a quorum has met: start them
	// together.
	var wg sync.WaitGroup
	for _, m := range b.Members {
		wg.Go(func() { m.start() })
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	t.Cleanup(func() {
		for _, m := range b.Members {
			m.kill()
		}
	})
	for _, h := range b.Hosts {
		if b.fake {
			h.Env = daemontest.New(t, t.TempDir())
		} else {
			h.Env = daemontest.New(t, vmmtest.DataDir(t))
		}
	}
	return b
}

// ip runs the ip command, failing the test on error.
func (b *Bed) ip(args ...string) {
	b.T.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		b.T.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// removeNet deletes the bed's namespaces (their veths go with them).
func (b *Bed) removeNet() {
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) > 0 && strings.HasPrefix(f[0], b.prefix+"-") {
			exec.Command("ip", "netns", "delete", f[0]).Run()
		}
	}
}

// Endpoints are the members' client URLs, as --fleet takes them.
func (b *Bed) Endpoints() string {
	var eps []string
	for _, m := range b.Members {
		eps = append(eps, "https://"+m.IP+":2379")
	}
	return strings.Join(eps, ",")
}

// StartHosts starts every host's daemon.
func (b *Bed) StartHosts() {
	b.T.Helper()
	for _, h := range b.Hosts {
		h.Start()
	}
}

// logf is an appending log file of the test's temporary directory.
func logf(t *testing.T, path string) *os.File {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// start runs the member and waits for its "clients on" line.
func (m *Member) start() {
	t := m.b.T
	cmd := exec.Command("ip", append([]string{"netns", "exec", m.NS, m.b.Berth}, m.args...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Error(err)
		return
	}
	errf := logf(t, m.Dir+".log")
	defer errf.Close()
	cmd.Stderr = errf
	if err := cmd.Start(); err != nil {
		t.Errorf("start etcd member %s: %v", m.Name, err)
		return
	}
	exited := make(chan struct{})
	m.mu.Lock()
	m.cmd, m.exited = cmd, exited
	m.mu.Unlock()
	line := make(chan string, 1)
	go func() {
		s := bufio.NewScanner(out)
		if s.Scan() {
			line <- s.Text()
		}
		close(line)
		io.Copy(io.Discard, out)
		cmd.Wait()
		close(exited)
	}()
	select {
	case l := <-line:
		if !regexp.MustCompile(`clients on https://`).MatchString(l) {
			t.Errorf("etcd member %s said %q; log:\n%s", m.Name, l, tail(m.Dir+".log"))
		}
	case <-time.After(60 * time.Second):
		t.Errorf("etcd member %s did not serve within 60s; log:\n%s", m.Name, tail(m.Dir+".log"))
	}
}

// Start starts a stopped member again on its data directory; it returns
// once the member serves (for a member rejoining a quorum, once it has).
func (m *Member) Start() {
	m.b.T.Helper()
	m.start()
	if m.b.T.Failed() {
		m.b.T.FailNow()
	}
}

// Stop stops the member as an operator would (SIGTERM) and waits for it.
func (m *Member) Stop() {
	m.b.T.Helper()
	m.mu.Lock()
	cmd, exited := m.cmd, m.exited
	m.cmd = nil
	m.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		<-exited
		m.b.T.Errorf("etcd member %s did not stop within 20s of SIGTERM", m.Name)
	}
}

func (m *Member) kill() {
	m.mu.Lock()
	cmd, exited := m.cmd, m.exited
	m.cmd = nil
	m.mu.Unlock()
	if cmd != nil {
		cmd.Process.Kill()
		<-exited
	}
}

// Start runs the host's daemon in its namespace and waits for its
// socket. The CLI (Env.Run, OK, …) reaches it through the socket, from
// any namespace.
func (h *Host) Start(extra ...string) {
	t := h.b.T
	t.Helper()
	args := append([]string{"netns", "exec", h.NS, h.Berth, "--data", h.Data, "--cache", h.Cache, "serve",
		"--fleet", h.b.Endpoints(), "--host-id", h.ID, "--listen", h.IP + ":7443",
		"--fleet-ttl", h.b.TTL.String(), "--fleet-ca", h.b.CA}, extra...)
	var env []string
	if h.b.fake {
		var exe string
		exe, args, env = h.fakeHostCmd()
		args = append([]string{"netns", "exec", h.NS, exe}, args...)
	}
	args = h.hidingOthers(args)
	c := exec.Command("ip", args...)
	c.Env = append(append(os.Environ(), "BERTH_DATA=", "NO_COLOR=1"), env...)
	f := logf(t, h.LogPath())
	defer f.Close()
	c.Stdout, c.Stderr = f, f
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	h.Daemon = c
	client := api.Dial(daemonSocket(h.Data))
	defer client.Close()
	for range 600 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := client.Ping(ctx)
		cancel()
		if err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("host %s: daemon did not come up: %s", h.ID, h.DaemonLog())
}

func daemonSocket(data string) string { return filepath.Join(data, "berth.sock") }

// hidingOthers turns `ip netns exec NS PROG ARGS…` into a command that,
// in the mount namespace `ip netns exec` makes (private: nothing mounted
// there propagates back), first covers every other host's data
// directory with an empty read-only tmpfs: a host sees its own files
// only, so what reaches it from another host (a move, a replica) came
// over the network. The test, in the first namespace, still sees all.
func (h *Host) hidingOthers(args []string) []string {
	var others []string
	for _, o := range h.b.Hosts {
		if o != h && o.Env != nil {
			others = append(others, o.Data)
		}
	}
	const script = `n=$1; shift; while [ "$n" -gt 0 ]; do mount -t tmpfs -o ro,size=4k,mode=0555 berth-bed-hidden "$1" || exit 1; shift; n=$((n-1)); done; exec "$@"`
	head, prog := args[:3], args[3:] // netns exec NS | PROG ARGS…
	out := append(append([]string{}, head...), "sh", "-c", script, "sh", strconv.Itoa(len(others)))
	out = append(out, others...)
	return append(out, prog...)
}

// Sees lists what host h's daemon sees at path, in its own mount
// namespace (through /proc/PID/root).
func (h *Host) Sees(path string) ([]string, error) {
	if h.Daemon == nil || h.Daemon.Process == nil {
		return nil, fmt.Errorf("host %s has no daemon", h.ID)
	}
	ents, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(h.Daemon.Process.Pid), "root", path))
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names, err
}

// Kill kills the host's daemon with SIGKILL; its VMs run on.
func (h *Host) Kill() { h.KillDaemon() }

// nftTable is the partition's table in a host's namespace.
const nftTable = "bfl_partition"

// Partition drops the host's etcd traffic (the client port, both ways)
// in its namespace; everything else still flows.
func (h *Host) Partition() {
	h.b.T.Helper()
	rules := fmt.Sprintf(`table inet %s {
	chain out { type filter hook output priority 0; policy accept; tcp dport 2379 drop; }
	chain in { type filter hook input priority 0; policy accept; tcp sport 2379 drop; }
}
`, nftTable)
	cmd := exec.Command("ip", "netns", "exec", h.NS, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		h.b.T.Fatalf("partition %s: nft: %v: %s", h.ID, err, out)
	}
}

// Heal removes the partition.
func (h *Host) Heal() {
	h.b.T.Helper()
	if out, err := exec.Command("ip", "netns", "exec", h.NS, "nft", "delete", "table", "inet", nftTable).CombinedOutput(); err != nil {
		h.b.T.Fatalf("heal %s: nft: %v: %s", h.ID, err, out)
	}
}

// Hosts is `berth host ls --json` asked of h, or its error's one line.
func (h *Host) Hosts() (session.HostList, error) {
	r := h.Run("host", "ls", "--json")
	if r.Code != 0 {
		return session.HostList{}, fmt.Errorf("%s", strings.TrimSpace(r.Stderr))
	}
	var l session.HostList
	if err := json.Unmarshal([]byte(r.Stdout), &l); err != nil {
		return l, fmt.Errorf("host ls --json: %w: %q", err, r.Stdout)
	}
	return l, nil
}

// State is host id's state as h lists it ("" when h cannot list).
func (h *Host) State(id string) session.HostState {
	l, err := h.Hosts()
	if err != nil {
		return ""
	}
	for _, x := range l.Hosts {
		if x.ID == id {
			return x.State
		}
	}
	return ""
}

// WaitHost polls h's host ls until host id is in state want, failing
// after within; it returns how long that took.
func (h *Host) WaitHost(id string, want session.HostState, within time.Duration) time.Duration {
	h.b.T.Helper()
	start := time.Now()
	for {
		if st := h.State(id); st == want {
			return time.Since(start)
		}
		if time.Since(start) > within {
			l, err := h.Hosts()
			h.b.T.Fatalf("host %s as %s lists it is not %s within %s: %+v %v; log:\n%s", id, h.ID, want, within, l, err, h.DaemonLog())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// helperEnv, set, makes the test binary an etcd client for one call
// (RunHelper): the test process itself is in the machine's namespace,
// where the bed's addresses do not route.
const helperEnv = "BERTH_FLEETBED_HELPER"

type helperCall struct {
	Endpoints string
	CA, Dir   string
	Op        string // "put", "get", "delete"
	Key       string
	Value     string
}

// RunHelper runs a helper call, or a fake host (Config.Fake), when the
// test binary was started as one, and then exits; otherwise it returns. A test package that uses the
// bed's etcd calls calls it first in TestMain.
func RunHelper() {
	runFakeHost()
	raw := os.Getenv(helperEnv)
	if raw == "" {
		return
	}
	var c helperCall
	if err := json.Unmarshal([]byte(raw), &c); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	out, err := helper(c)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Print(out)
	os.Exit(0)
}

func helper(c helperCall) (string, error) {
	if err := pki.Ensure(c.CA, c.Dir, "bed-client", nil, nil); err != nil {
		return "", err
	}
	tlsCfg, err := pki.ClientConfig(c.Dir)
	if err != nil {
		return "", err
	}
	cli, err := fleet.Dial(c.Endpoints, tlsCfg)
	if err != nil {
		return "", err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	switch c.Op {
	case "put":
		r, err := cli.Put(ctx, c.Key, c.Value)
		if err != nil {
			return "", err
		}
		return fmt.Sprint(r.Header.Revision), nil
	case "get":
		r, err := cli.Get(ctx, c.Key)
		if err != nil {
			return "", err
		}
		if len(r.Kvs) == 0 {
			return "", nil
		}
		return fmt.Sprintf("%d %s", r.Kvs[0].ModRevision, r.Kvs[0].Value), nil
	case "delete":
		_, err := cli.Delete(ctx, c.Key)
		return "", err
	}
	return "", fmt.Errorf("unknown helper op %q", c.Op)
}

// Etcd makes one etcd call from the bridge's namespace: op "put" (key,
// value) prints the revision, "get" (key) prints "MODREV VALUE" or
// nothing, "delete" (key) nothing. The test package must call RunHelper
// in its TestMain.
func (b *Bed) Etcd(op, key, value string) string {
	b.T.Helper()
	raw, _ := json.Marshal(helperCall{Endpoints: b.Endpoints(), CA: b.CA, Dir: filepath.Join(filepath.Dir(b.CA), "client"), Op: op, Key: key, Value: value})
	cmd := exec.Command("ip", "netns", "exec", b.prefix+"-br", os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+string(raw))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		b.T.Fatalf("etcd %s %s: %v: %s", op, key, err, stderr.String())
	}
	return string(out)
}

// tail is the end of a log file.
func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(bytes.TrimSpace(b))
}

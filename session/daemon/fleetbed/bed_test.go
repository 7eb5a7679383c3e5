package fleetbed_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/daemon/daemontest"
	"github.com/berthvm/berth/session/daemon/fleetbed"
	"github.com/berthvm/berth/session/fleet"
)

func TestMain(m *testing.M) {
	fleetbed.RunHelper()
	os.Exit(m.Run())
}

// electionTimeout is etcd's default, which berth etcd keeps.
const electionTimeout = time.Second

// isolatedLine is how a refused change begins on host h.
func isolatedLine(h *fleetbed.Host) string {
	return "berth: host " + h.ID + " is isolated from the fleet: its etcd lease expired "
}

// probe asks h for a change that cannot succeed anyway (stop a session
// that does not exist): an isolated host refuses it with its one line,
// a ready one answers "not found". It reports whether h is isolated.
func probe(t *testing.T, h *fleetbed.Host) (isolated bool, line string) {
	t.Helper()
	r := h.Run("stop", "ghost")
	line = strings.TrimSpace(r.Stderr)
	switch {
	case strings.HasPrefix(line, "berth: host "+h.ID+" is isolated from the fleet: "):
		return true, line
	case strings.Contains(line, "not found"), strings.Contains(line, "the fleet's etcd did not answer"):
		// Not isolated yet: its lease lives by its own clock, and the
		// front door found etcd out of reach.
		return false, line
	}
	t.Fatalf("stop ghost on %s: exit %d, %q", h.ID, r.Code, r.Stderr)
	return false, ""
}

// waitIsolated polls h until it says it is isolated (want) or ready, and
// returns how long that took.
func waitIsolated(t *testing.T, h *fleetbed.Host, want bool, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		if iso, _ := probe(t, h); iso == want {
			return time.Since(start)
		}
		if time.Since(start) > within {
			t.Fatalf("host %s isolated=%v, not %v within %s; log:\n%s", h.ID, !want, want, within, h.DaemonLog())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitAll polls every host until each is isolated (want) or ready, and
// returns for each how long after since it first was.
func waitAll(t *testing.T, hosts []*fleetbed.Host, want bool, since time.Time, within time.Duration) map[string]time.Duration {
	t.Helper()
	got := map[string]time.Duration{}
	for len(got) < len(hosts) {
		for _, h := range hosts {
			if _, ok := got[h.ID]; ok {
				continue
			}
			if iso, _ := probe(t, h); iso == want {
				got[h.ID] = time.Since(since)
			}
		}
		if time.Since(since) > within && len(got) < len(hosts) {
			t.Fatalf("within %s only %v are isolated=%v", within, got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return got
}

// checkRefusal checks that a change on h is refused in one line saying
// the host is isolated, why, and that what runs goes on.
func checkRefusal(t *testing.T, h *fleetbed.Host, args ...string) {
	t.Helper()
	r := h.Run(args...)
	line := strings.TrimSpace(r.Stderr)
	if r.Code == 0 || !strings.HasPrefix(line, isolatedLine(h)) || strings.Contains(line, "\n") ||
		!strings.Contains(line, "running VMs and commands go on, changes wait for it to rejoin") {
		t.Errorf("berth %s on isolated %s: exit %d, stderr %q", strings.Join(args, " "), h.ID, r.Code, r.Stderr)
	}
}

// The lease's life on a fleet of three etcd members and three hosts, no
// VMs: a host partitioned from etcd only knows itself isolated before
// the others see its lease gone, refuses changes, and is ready again
// after healing; losing one member changes nothing; losing two isolates
// every host until quorum is back; a host killed with SIGKILL is gone
// for the others within its TTL and ready again once restarted.
func TestFleetBedLease(t *testing.T) {
	b := fleetbed.New(t, fleetbed.Config{})
	b.StartHosts()
	h1, h2, h3 := b.Hosts[0], b.Hosts[1], b.Hosts[2]
	for _, h := range b.Hosts {
		waitIsolated(t, h, false, 10*time.Second)
		for _, o := range b.Hosts {
			h.WaitHost(o.ID, session.HostReady, 5*time.Second)
		}
	}
	ttl := b.TTL

	t.Run("partition from etcd", func(t *testing.T) {
		start := time.Now()
		h1.Partition()
		// Both watched in one loop. Once h2 lists h1 gone, h1 must
		// refuse changes: a probe of h1 begun after that must find it
		// isolated.
		var self, other time.Duration
		for self == 0 || other == 0 {
			if other == 0 && h2.State(h1.ID) == session.HostGone {
				other = time.Since(start)
			}
			if self == 0 {
				if iso, _ := probe(t, h1); iso {
					self = time.Since(start)
				} else if other != 0 {
					t.Fatalf("%s listed %s gone %s after the partition, and %s still took changes after that", h2.ID, h1.ID, other, h1.ID)
				}
			}
			if time.Since(start) > 2*ttl+5*time.Second {
				t.Fatalf("%s isolated after %s, gone for %s after %s; log:\n%s", h1.ID, self, h2.ID, other, h1.DaemonLog())
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Logf("partitioned: %s isolated by its own clock after %s, gone for %s after %s (TTL %s)",
			h1.ID, self.Round(10*time.Millisecond), h2.ID, other.Round(10*time.Millisecond), ttl)
		// By design at most TTL-margin after its last renewal; the probe
		// (a CLI call) adds its own time on a loaded machine. That it
		// comes before others see it gone is checked above, exactly.
		if self > ttl+time.Second {
			t.Errorf("%s knew itself isolated %s after the partition, later than the TTL %s and a second", h1.ID, self, ttl)
		}
		checkRefusal(t, h1, "create", "newone")
		checkRefusal(t, h1, "stop", "ghost")
		// Reads are answered (the list of sessions is local).
		if r := h1.Run("ls"); r.Code != 0 {
			t.Errorf("ls on isolated %s: %+v", h1.ID, r)
		}
		// host ls cannot reach etcd; it says the host is isolated.
		if r := h1.Run("host", "ls"); r.Code == 0 || !strings.Contains(r.Stderr, "is isolated from the fleet") {
			t.Errorf("host ls on isolated %s: %+v", h1.ID, r)
		}
		healed := time.Now()
		h1.Heal()
		back := waitIsolated(t, h1, false, 3*ttl+10*time.Second)
		seen := h2.WaitHost(h1.ID, session.HostReady, 10*time.Second) + back
		t.Logf("healed: %s ready after %s, ready for %s after %s (partition lasted %s)",
			h1.ID, back.Round(10*time.Millisecond), h2.ID, seen.Round(10*time.Millisecond), healed.Sub(start).Round(10*time.Millisecond))
	})

	t.Run("minority loss", func(t *testing.T) {
		b.Members[0].Stop()
		neverIsolated(t, b, 2*ttl)
		for _, h := range b.Hosts {
			if st := h2.State(h.ID); st != session.HostReady {
				t.Errorf("one member down: %s lists %s %q", h2.ID, h.ID, st)
			}
		}
		b.Members[0].Start()
	})

	t.Run("majority loss", func(t *testing.T) {
		b.Members[1].Stop()
		b.Members[2].Stop()
		lost := time.Now() // the second member has exited: no quorum
		for id, took := range waitAll(t, b.Hosts, true, lost, ttl+2*time.Second) {
			t.Logf("majority lost: %s isolated %s after the second member exited", id, took.Round(10*time.Millisecond))
			// A leader left without a quorum renews leases until it steps
			// down, an election timeout (1s) later: etcd extends leases
			// on the next leader's election, so those renewals are good,
			// and the lease lives on until TTL after the last of them.
			if bound := ttl + electionTimeout + time.Second; took > bound {
				t.Errorf("%s isolated %s after quorum was lost, later than the TTL and an election timeout (%s)", id, took, bound)
			}
		}
		for _, h := range b.Hosts {
			checkRefusal(t, h, "create", "newone")
		}
		b.Members[1].Start()
		back := time.Now() // a quorum serves again
		b.Members[2].Start()
		for id, took := range waitAll(t, b.Hosts, false, back, 3*ttl+10*time.Second) {
			t.Logf("quorum back: %s ready %s after a quorum served again", id, took.Round(10*time.Millisecond))
		}
		for _, h := range b.Hosts {
			h1.WaitHost(h.ID, session.HostReady, 10*time.Second)
		}
	})

	t.Run("kill -9", func(t *testing.T) {
		h3.Kill()
		gone := h1.WaitHost(h3.ID, session.HostGone, 2*ttl+3*time.Second)
		t.Logf("kill -9: %s gone for %s after %s (TTL %s)", h3.ID, h1.ID, gone.Round(10*time.Millisecond), ttl)
		// etcd expires the lease TTL after the last renewal it received,
		// which came up to one renewal interval before the kill.
		interval := (ttl - fleet.DefaultMargin(ttl)) / 4
		if early := ttl - interval - 100*time.Millisecond; gone < early {
			t.Errorf("%s gone %s after its kill, before its TTL %s less a renewal interval %s", h3.ID, gone, ttl, interval)
		}
		h3.Start()
		h1.WaitHost(h3.ID, session.HostReady, 10*time.Second)
		waitIsolated(t, h3, false, 10*time.Second)
	})
}

// stdoutBytes is how much output execution id has recorded on h.
func stdoutBytes(t *testing.T, h *fleetbed.Host, name, id string) int64 {
	t.Helper()
	for _, e := range h.Execs(name) {
		if e.ID == id {
			return e.StdoutBytes
		}
	}
	t.Fatalf("no execution %s in %s on %s", id, name, h.ID)
	return 0
}

// neverIsolated probes every host of b for d: none may say it is
// isolated (one etcd member of three down changes nothing).
func neverIsolated(t *testing.T, b *fleetbed.Bed, d time.Duration) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); {
		for _, h := range b.Hosts {
			if iso, line := probe(t, h); iso {
				t.Fatalf("one member of three down, %s: %s", h.ID, line)
			}
		}
	}
}

// alive says whether process pid exists.
func alive(pid int) bool { return pid > 0 && syscall.Kill(pid, 0) == nil }

// waitGrows waits until execution id on h has recorded more than n bytes.
func waitGrows(t *testing.T, h *fleetbed.Host, name, id string, n int64, within time.Duration) int64 {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		if m := stdoutBytes(t, h, name, id); m > n {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("the loop %s on %s recorded nothing past %d bytes in %s", id, h.ID, n, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A session on a host of the fleet (real VMs, two at most): a loop in it goes on
// while its host is partitioned from etcd, while the etcd majority is
// lost and while its daemon is killed and restarted, and every change
// to it is refused while the host is isolated; afterwards the same VMM
// runs it, at the same epoch, and the loop's output is replayed whole,
// each line once. It is moved to the other host and back, across the
// network (a host sees only its own data directory), the loop going on.
// Then a memory checkpoint of it is kept on the other host, its host is
// cut off from etcd, and it is recovered there from the checkpoint
// (refused while etcd holds the old host's lease); at the old host's
// rejoin its VM is stopped and its copy moved into quarantine with its
// records, leaving one VMM for the session in the fleet.
//
// Boots a VM: run under flock /tmp/berth-vm.lock.
func TestFleetBedSession(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM")
	}
	b := fleetbed.New(t, fleetbed.Config{Hosts: 2})
	b.StartHosts()
	h1, h2 := b.Hosts[0], b.Hosts[1]
	waitIsolated(t, h1, false, 10*time.Second)
	ttl := b.TTL

	h1.OK("create", "p1", "--on", "h1", "--disk", "256M", "--memory", "384M")
	loop := strings.TrimSpace(h1.OK("exec", "p1", "--detach", "--", "sh", "-c", "i=0; while :; do i=$((i+1)); echo $i; sleep 0.1; done"))
	pid := h1.VMMPid("p1")
	before := h1.Info("p1")
	if !alive(pid) || before.State != session.StateRunning {
		t.Fatalf("p1: pid %d, %+v", pid, before)
	}
	seen := waitGrows(t, h1, "p1", loop, 0, 30*time.Second)
	// Placement made h1 p1's owner, at the epoch p1's copy records:
	// nothing below may change that, nor set p1's copy aside.
	ownerKey := fleet.Prefix + "sessions/p1/owner"
	owner := b.Etcd("get", ownerKey, "")
	if want := fmt.Sprintf("%d {\"host\":\"h1\"}", before.Epoch); before.Epoch == 0 || owner != want {
		t.Fatalf("p1's owner key %q, its copy's epoch %d", owner, before.Epoch)
	}
	ownerUnchanged := func(what string) {
		t.Helper()
		if got := b.Etcd("get", ownerKey, ""); got != owner {
			t.Errorf("%s: p1's owner key is %q, want %q", what, got, owner)
		}
	}

	// unchanged checks that p1 is as it was: the same VMM, running, at
	// the same epoch, and the loop still recording.
	unchanged := func(what string) {
		t.Helper()
		s := h1.Info("p1")
		if s.State != session.StateRunning || s.Pid != pid || !alive(pid) || s.Epoch != before.Epoch || !s.CreatedAt.Equal(before.CreatedAt) {
			t.Errorf("%s: p1 %s pid %d (alive %v) epoch %d, want running pid %d epoch %d", what, s.State, s.Pid, alive(pid), s.Epoch, pid, before.Epoch)
		}
		seen = waitGrows(t, h1, "p1", loop, seen, 10*time.Second)
	}

	t.Run("partition", func(t *testing.T) {
		h1.Partition()
		waitIsolated(t, h1, true, ttl+2*time.Second)
		for _, args := range [][]string{
			{"exec", "p1", "--", "true"},
			{"stop", "p1"},
			{"sleep", "p1"},
			{"pause", "p1"},
			{"delete", "p1", "--yes"},
			{"cancel", "p1", loop},
			{"checkpoint", "p1"},
			{"fork", "p1", "p2"},
			{"create", "p3"},
		} {
			checkRefusal(t, h1, args...)
		}
		// What is running goes on, and reads are answered.
		unchanged("partitioned")
		if got := h1.OK("ls"); !strings.Contains(got, "p1") {
			t.Errorf("ls on isolated h1: %q", got)
		}
		h2.WaitHost(h1.ID, session.HostGone, 2*ttl+3*time.Second)
		h1.Heal()
		waitIsolated(t, h1, false, 3*ttl+10*time.Second)
		unchanged("healed")
		ownerUnchanged("healed")
		if r := h1.Run("exec", "p1", "--", "echo", "ok"); r.Code != 0 || r.Stdout != "ok\n" {
			t.Errorf("exec after healing: %+v", r)
		}
	})

	t.Run("majority loss", func(t *testing.T) {
		b.Members[0].Stop()
		b.Members[1].Stop()
		waitIsolated(t, h1, true, ttl+2*time.Second)
		checkRefusal(t, h1, "exec", "p1", "--", "true")
		unchanged("majority lost")
		b.Members[0].Start()
		b.Members[1].Start()
		waitIsolated(t, h1, false, 3*ttl+10*time.Second)
		unchanged("quorum back")
		ownerUnchanged("quorum back")
	})

	t.Run("kill -9", func(t *testing.T) {
		h1.Kill()
		h2.WaitHost(h1.ID, session.HostGone, 2*ttl+3*time.Second)
		if !alive(pid) {
			t.Fatalf("p1's VMM %d died with its daemon", pid)
		}
		h1.Start()
		waitIsolated(t, h1, false, 10*time.Second)
		h2.WaitHost(h1.ID, session.HostReady, 10*time.Second)
		unchanged("daemon restarted")
		ownerUnchanged("daemon restarted")
		// The loop's output across the kill, replayed: every count once,
		// in order, none lost.
		lines := strings.Fields(h1.OK("logs", "p1", loop, "--stream", "stdout"))
		for i, l := range lines {
			if l != strconv.Itoa(i+1) {
				t.Fatalf("the loop's output after the kill has %q at line %d (of %d), want %d", l, i+1, len(lines), i+1)
			}
		}
		if qs := h1.OK("quarantine"); qs != "no quarantined copies\n" {
			t.Errorf("quarantine after the rejoins: %q", qs)
		}
	})

	t.Run("a move crosses the network", func(t *testing.T) {
		// Each host sees its own data directory and not the other's: what
		// reaches h2 of p1 comes over the network.
		if got, err := h2.Sees(h1.Data); err != nil || len(got) != 0 {
			t.Fatalf("h2 sees h1's data directory: %v %v", got, err)
		}
		if got, err := h1.Sees(filepath.Join(h1.Data, "sessions")); err != nil || !slices.Contains(got, "p1") {
			t.Fatalf("h1 does not see its own sessions: %v %v", got, err)
		}
		// A session sleeps with no command running: the loop ends (its
		// records stay), and a process outside berth's records ticks on.
		h1.OK("cancel", "p1", loop)
		h1.OK("exec", "p1", "--", "sh", "-c", "echo crossed > /workspace/x; setsid sh -c 'while :; do echo t >> /workspace/ticks; sleep 0.2; done' </dev/null >/dev/null 2>&1 &")
		ticks := func(h *fleetbed.Host) int {
			t.Helper()
			return len(strings.Fields(h.OK("exec", "p1", "--", "cat", "/workspace/ticks")))
		}
		h1.OK("sleep", "p1")
		out := h2.OK("move", "p1", "--to", "h2")
		if !strings.HasPrefix(out, "moved p1 to h2 in ") {
			t.Errorf("move p1 --to h2 through h2's door: %q", out)
		}
		t.Logf("%s", strings.TrimSpace(out))
		if _, err := os.Stat(filepath.Join(h1.Data, "sessions", "p1")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("h1 kept its copy of p1: %v", err)
		}
		if got := h1.OK("exec", "p1", "--", "cat", "/workspace/x"); got != "crossed\n" {
			t.Errorf("p1 on h2, through h1's door, has /workspace/x %q", got)
		}
		// The ticking process woke with it on h2.
		n := ticks(h2)
		time.Sleep(time.Second)
		if m := ticks(h2); m <= n {
			t.Errorf("the ticking process did not go on after the move: %d ticks, then %d", n, m)
		}
		if s := h2.Info("p1"); s.Epoch <= before.Epoch || s.Pid == pid {
			t.Errorf("p1 on h2: epoch %d (was %d), VMM %d (was %d)", s.Epoch, before.Epoch, s.Pid, pid)
		}
		// And back, for what follows.
		h2.OK("sleep", "p1")
		h1.OK("move", "p1", "--to", "h1")
		n = ticks(h1)
		time.Sleep(time.Second)
		if m := ticks(h1); m <= n {
			t.Errorf("the ticking process did not go on after the move back: %d ticks, then %d", n, m)
		}
		pid, before = h1.VMMPid("p1"), h1.Info("p1")
		owner = b.Etcd("get", ownerKey, "")
		if want := fmt.Sprintf("%d {\"host\":\"h1\"}", before.Epoch); owner != want {
			t.Errorf("p1's owner key after the move back %q, want %q", owner, want)
		}
	})

	t.Run("recovery elsewhere, quarantine at rejoin", func(t *testing.T) {
		// A memory checkpoint of p1 kept on h2; then h1 is cut off from
		// etcd (its VM runs on) and p1 is recovered on h2 from it.
		h1.OK("exec", "p1", "--", "sh", "-c", "echo at-checkpoint > /workspace/state")
		out := h1.OK("checkpoint", "p1", "--memory", "--replicate", "h2")
		m := regexp.MustCompile(`checkpoint (c\d+) of p1`).FindStringSubmatch(out)
		if m == nil || !strings.Contains(out, "copied to h2 in ") {
			t.Fatalf("checkpoint --replicate h2 said %q", out)
		}
		h1.OK("exec", "p1", "--", "sh", "-c", "echo later > /workspace/later")
		recoverArgs := []string{"recover", "p1", "--from", m[1], "--on", "h2", "--force"}
		h1.Partition()
		if r := h2.Run(recoverArgs...); r.Code != 1 || !strings.Contains(r.Stderr, "still holds its etcd lease") {
			t.Fatalf("recover while etcd holds h1's lease: %+v", r)
		}
		h2.WaitHost(h1.ID, session.HostGone, 2*ttl+3*time.Second)
		gone := time.Now()
		if out := h2.OK(recoverArgs...); !strings.HasPrefix(out, "recovered p1 on h2 from checkpoint "+m[1]) {
			t.Errorf("recover --force: %q", out)
		} else {
			t.Logf("%s (the command took %s)", strings.TrimSpace(out), time.Since(gone).Round(time.Millisecond))
		}
		if got := h2.OK("exec", "p1", "--", "sh", "-c", "cat /workspace/state; if test -e /workspace/later; then echo later; fi"); got != "at-checkpoint\n" {
			t.Errorf("the recovered p1 has %q, want the checkpoint's workspace", got)
		}
		recovered := h2.VMMPid("p1")
		if !alive(pid) || recovered == 0 || !alive(recovered) {
			t.Fatalf("before h1 heals: h1's VMM %d alive %v, h2's %d alive %v", pid, alive(pid), recovered, alive(recovered))
		}
		healed := time.Now()
		h1.Heal()
		waitIsolated(t, h1, false, 3*ttl+20*time.Second)
		defer func() {
			// One VMM runs p1 in the fleet: h2's.
			if !alive(recovered) {
				t.Errorf("h2's VMM %d of the recovered p1 is gone", recovered)
			}
		}()
		// h1's copy is gone from its sessions; its door serves h2's.
		if _, err := os.Stat(filepath.Join(h1.Data, "sessions", "p1")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("h1's copy of p1 after its rejoin: %v", err)
		}
		if s := h1.Info("p1"); s.Host != "h2" || s.State != session.StateRunning {
			t.Errorf("p1 through h1's door after its rejoin: host %q, %s", s.Host, s.State)
		}
		deadline := time.Now().Add(10 * time.Second)
		for alive(pid) && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("h1's stale VMM gone and h1 ready %s after the partition healed (it stops before the host takes changes)", time.Since(healed).Round(100*time.Millisecond))
		if alive(pid) {
			t.Errorf("p1's stale VMM %d still runs after quarantine", pid)
		}
		dirs, _ := filepath.Glob(filepath.Join(h1.Data, "quarantine", "p1-*"))
		if len(dirs) != 1 {
			t.Fatalf("quarantine holds %v", dirs)
		}
		why, _ := os.ReadFile(filepath.Join(dirs[0], "why.txt"))
		if !strings.Contains(string(why), "host h2 owns session p1") {
			t.Errorf("why.txt: %q", why)
		}
		for _, f := range []string{"session/workspace.img", "records.jsonl"} {
			if _, err := os.Stat(filepath.Join(dirs[0], f)); err != nil {
				t.Errorf("quarantined copy: %v", err)
			}
		}
		recs, _ := os.ReadFile(filepath.Join(dirs[0], "records.jsonl"))
		if !strings.Contains(string(recs), `"kind":"exec"`) || !strings.Contains(string(recs), loop) || !strings.Contains(string(recs), `"kind":"output"`) {
			t.Errorf("records.jsonl lacks the loop's execution or its output: %.300s", recs)
		}
		var qs []struct{ Session, Why, Dir string }
		if err := json.Unmarshal([]byte(h1.OK("quarantine", "--json")), &qs); err != nil || len(qs) != 1 || qs[0].Session != "p1" || qs[0].Dir != dirs[0] {
			t.Errorf("berth quarantine --json: %+v %v", qs, err)
		}
		if !strings.Contains(h1.DaemonLog(), "quarantined a stale copy") {
			t.Errorf("the daemon did not log the quarantine:\n%s", h1.DaemonLog())
		}
	})
}

// fakeSession is a session of TestFleetBedMajority as it was made: its
// owner, the command going on in it, its VMM's pid and its epoch, and its
// owner key as etcd has it ("MODREV VALUE").
type fakeSession struct {
	name  string
	owner *fleetbed.Host
	loop  string
	pid   int
	epoch int64
	key   string
	seen  int64
}

// Majority loss and return (issue 25, item 7) on fake hosts (the fleet
// wired as berth serve wires it over the sessiontest fake; no VMs), with
// a session on each host and a command going on in each: losing one
// etcd member of three changes nothing (creates and execs go through);
// losing two isolates every host within the lease's TTL, and every
// change on every host is refused in one line that says why, while the
// sessions keep running on the same VMM and their commands go on; when
// the members are back every host is ready again, and no session's
// owner, epoch or VMM has changed.
func TestFleetBedMajority(t *testing.T) {
	b := fleetbed.New(t, fleetbed.Config{Fake: true})
	b.StartHosts()
	for _, h := range b.Hosts {
		waitIsolated(t, h, false, 10*time.Second)
		for _, o := range b.Hosts {
			h.WaitHost(o.ID, session.HostReady, 5*time.Second)
		}
	}
	ttl := b.TTL
	// door is a host other than h: calls go through it to h.
	door := func(h *fleetbed.Host) *fleetbed.Host {
		for i, o := range b.Hosts {
			if o == h {
				return b.Hosts[(i+1)%len(b.Hosts)]
			}
		}
		return nil
	}
	var ss []*fakeSession
	for i, h := range b.Hosts {
		s := &fakeSession{name: fmt.Sprintf("s%d", i+1), owner: h}
		door(h).OK("create", s.name, "--on", h.ID)
		s.loop = strings.TrimSpace(door(h).OK("exec", s.name, "--detach", "--", "tick"))
		info := h.Info(s.name)
		s.pid, s.epoch = info.Pid, info.Epoch
		s.key = b.Etcd("get", fleet.Prefix+"sessions/"+s.name+"/owner", "")
		if want := fmt.Sprintf("%d {\"host\":%q}", s.epoch, h.ID); info.State != session.StateRunning || s.pid == 0 || s.epoch == 0 || s.key != want {
			t.Fatalf("%s: %+v; owner key %q, want %q", s.name, info, s.key, want)
		}
		s.seen = waitGrows(t, h, s.name, s.loop, 0, 10*time.Second)
		ss = append(ss, s)
	}
	// unchanged checks every session against what it was made as: the
	// same owner key (so the same epoch), running on the same VMM at that
	// epoch, its command still going.
	unchanged := func(what string, withKey bool) {
		t.Helper()
		for _, s := range ss {
			info := s.owner.Info(s.name)
			if info.State != session.StateRunning || info.Pid != s.pid || info.Epoch != s.epoch {
				t.Errorf("%s: %s on %s is %s, VMM %d, epoch %d; want running, VMM %d, epoch %d",
					what, s.name, s.owner.ID, info.State, info.Pid, info.Epoch, s.pid, s.epoch)
			}
			s.seen = waitGrows(t, s.owner, s.name, s.loop, s.seen, 10*time.Second)
			if !withKey {
				continue
			}
			if got := b.Etcd("get", fleet.Prefix+"sessions/"+s.name+"/owner", ""); got != s.key {
				t.Errorf("%s: %s's owner key is %q, was %q", what, s.name, got, s.key)
			}
		}
	}

	t.Run("concurrent creates of the same names from every door", func(t *testing.T) {
		names := []string{"c1", "c2", "c3", "c4", "c5"}
		type result struct {
			name, door string
			r          daemontest.Result
		}
		results := make(chan result, len(names)*len(b.Hosts))
		var wg sync.WaitGroup
		for _, n := range names {
			for _, h := range b.Hosts {
				wg.Go(func() { results <- result{n, h.ID, h.Run("create", n)} })
			}
		}
		wg.Wait()
		close(results)
		made := map[string][]string{}
		for res := range results {
			switch {
			case res.r.Code == 0:
				made[res.name] = append(made[res.name], res.door)
			case !strings.Contains(res.r.Stderr, "already exists"):
				t.Errorf("create %s through %s: %+v", res.name, res.door, res.r)
			}
		}
		for _, n := range names {
			if len(made[n]) != 1 {
				t.Errorf("%s made through %v, want exactly one door", n, made[n])
			}
			owner := b.Etcd("get", fleet.Prefix+"sessions/"+n+"/owner", "")
			for _, h := range b.Hosts {
				if s := h.Info(n); s.State != session.StateRunning || !strings.Contains(owner, fmt.Sprintf("{\"host\":%q}", s.Host)) {
					t.Errorf("%s through %s: %s on %q; owner key %q", n, h.ID, s.State, s.Host, owner)
				}
			}
		}
		table := b.Hosts[0].OK("ls")
		for _, n := range names {
			if c := len(regexp.MustCompile(`(?m)^`+n+` `).FindAllString(table, -1)); c != 1 {
				t.Errorf("ls lists %s %d times:\n%s", n, c, table)
			}
			b.Hosts[0].OK("delete", n, "--yes")
		}
	})

	t.Run("minority loss", func(t *testing.T) {
		b.Members[0].Stop()
		neverIsolated(t, b, 2*ttl)
		h1, h2, h3 := b.Hosts[0], b.Hosts[1], b.Hosts[2]
		h1.OK("create", "minority", "--on", h2.ID)
		if got := h3.OK("exec", "minority", "--", "echo", "ok"); got != "ok\n" {
			t.Errorf("exec through %s with one member down: %q", h3.ID, got)
		}
		h3.OK("delete", "minority", "--yes")
		unchanged("one member down", true)
		b.Members[0].Start()
	})

	// events --follow on h1 across what follows.
	fol := h1Follow(t, b.Hosts[0])
	t.Run("majority loss and return", func(t *testing.T) {
		b.Members[1].Stop()
		b.Members[2].Stop()
		lost := time.Now() // the second member has exited: no quorum
		var all time.Duration
		for id, took := range waitAll(t, b.Hosts, true, lost, ttl+electionTimeout+2*time.Second) {
			t.Logf("majority lost: %s isolated %s after the second member exited", id, took.Round(10*time.Millisecond))
			all = max(all, took)
			// As in TestFleetBedLease: the leader left without a quorum
			// renews leases until it steps down, an election timeout later.
			if bound := ttl + electionTimeout + time.Second; took > bound {
				t.Errorf("%s isolated %s after quorum was lost, later than the TTL and an election timeout (%s)", id, took, bound)
			}
		}
		t.Logf("majority lost: every host isolated %s after the second member exited (TTL %s)", all.Round(10*time.Millisecond), ttl)
		for _, s := range ss {
			h := s.owner
			checkRefusal(t, h, "create", "newone")
			checkRefusal(t, h, "exec", s.name, "--", "true")
			checkRefusal(t, h, "stop", s.name)
			if r := h.Run("host", "ls"); r.Code == 0 || !strings.Contains(r.Stderr, "host "+h.ID+" is isolated from the fleet") || strings.Count(strings.TrimSpace(r.Stderr), "\n") != 0 {
				t.Errorf("host ls on %s without a quorum: %+v", h.ID, r)
			}
		}
		unchanged("majority lost", false)

		b.Members[1].Start()
		back := time.Now() // a quorum serves again
		b.Members[2].Start()
		all = 0
		for id, took := range waitAll(t, b.Hosts, false, back, 3*ttl+10*time.Second) {
			t.Logf("quorum back: %s ready %s after a quorum served again", id, took.Round(10*time.Millisecond))
			all = max(all, took)
		}
		t.Logf("quorum back: every host ready %s after a quorum served again", all.Round(10*time.Millisecond))
		for _, h := range b.Hosts {
			for _, o := range b.Hosts {
				h.WaitHost(o.ID, session.HostReady, 10*time.Second)
			}
		}
		unchanged("quorum back", true)
		for _, s := range ss {
			if got := door(s.owner).OK("exec", s.name, "--", "echo", "back"); got != "back\n" {
				t.Errorf("exec %s through %s after quorum came back: %q", s.name, door(s.owner).ID, got)
			}
		}
		for _, h := range b.Hosts {
			if strings.Contains(h.DaemonLog(), "QUARANTINE") {
				t.Errorf("%s set a copy aside:\n%s", h.ID, h.DaemonLog())
			}
		}
	})

	// One host partitioned from etcd only: the others see it gone, then
	// back; h1's follower follows it anew, and no event of it comes twice.
	t.Run("one host partitioned", func(t *testing.T) {
		h1, h2, h3 := b.Hosts[0], b.Hosts[1], b.Hosts[2]
		h2.Partition()
		h1.WaitHost(h2.ID, session.HostGone, 2*ttl+3*time.Second)
		h2.Heal()
		waitIsolated(t, h2, false, 3*ttl+10*time.Second)
		h1.WaitHost(h2.ID, session.HostReady, 10*time.Second)
		unchanged("h2 healed", true)
		if got := h1.OK("exec", "s2", "--", "echo", "again"); got != "again\n" {
			t.Errorf("exec s2 through h1 after the partition: %q", got)
		}
		h2.OK("create", "after", "--on", h3.ID)
		h1.OK("delete", "after", "--yes")
	})

	// The follower saw the execs made after the return and after the
	// partition, each event once; the fleet's changes in revision order,
	// each once.
	t.Run("followed", func(t *testing.T) {
		evs := fol.stop(t)
		seq := map[string]bool{}
		var fleetRev int64
		var changes []string
		for _, ev := range evs {
			switch {
			case ev.Kind == session.EventFleet:
				changes = append(changes, fmt.Sprintf("%s %s %s@%d", ev.Name, ev.Fleet.Change, ev.Fleet.Host, ev.Rev))
				if ev.Rev <= fleetRev {
					t.Errorf("fleet event %q at %d after one at %d", ev.Message, ev.Rev, fleetRev)
				}
				fleetRev = ev.Rev
			case ev.Seq != 0:
				id := fmt.Sprintf("%s#%d", ev.Name, ev.Seq)
				if seq[id] {
					t.Errorf("event %s (%s %s) shown twice", id, ev.Kind, ev.Message)
				}
				seq[id] = true
			}
		}
		t.Logf("the fleet's changes as h1 followed them: %v", changes)
		for _, s := range ss {
			n := 0
			for _, ev := range evs {
				if ev.Kind == session.EventExec && ev.Name == s.name && ev.Exec != nil && ev.Exec.State == session.ExecExited && slices.Equal(ev.Exec.Argv, []string{"echo", "back"}) {
					n++
				}
			}
			if n != 1 {
				t.Errorf("h1's follower saw %s's echo back exit %d times, want once", s.name, n)
			}
		}
		n := 0
		for _, ev := range evs {
			if ev.Kind == session.EventExec && ev.Name == "s2" && ev.Exec != nil && ev.Exec.State == session.ExecExited && slices.Equal(ev.Exec.Argv, []string{"echo", "again"}) {
				n++
			}
		}
		if n != 1 {
			t.Errorf("h1's follower saw s2's echo again exit %d times, want once", n)
		}
		var names []string
		for _, c := range changes {
			names = append(names, c[:strings.LastIndex(c, "@")])
		}
		if want := []string{" lost h2", " joined h2", "after placed h3", "after released h3"}; !slices.Equal(names, want) {
			t.Errorf("the fleet's changes as h1 followed them: %q, want %q", names, want)
		}
	})
}

// follower is `berth events --follow --json` on a host, its events kept.
type follower struct {
	cmd    *exec.Cmd
	stderr strings.Builder
	mu     sync.Mutex
	evs    []session.Event
	done   chan struct{}
}

func h1Follow(t *testing.T, h *fleetbed.Host) *follower {
	t.Helper()
	f := &follower{cmd: h.Cmd("events", "--follow", "--json"), done: make(chan struct{})}
	f.cmd.Stderr = &f.stderr
	out, err := f.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := f.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { // ends with the command's output
		defer close(f.done)
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var ev session.Event
			if json.Unmarshal(sc.Bytes(), &ev) == nil {
				f.mu.Lock()
				f.evs = append(f.evs, ev)
				f.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		if f.cmd.ProcessState == nil {
			f.cmd.Process.Kill()
			<-f.done
			f.cmd.Wait()
		}
	})
	// It prints the sessions' recorded events once its watch is made:
	// from then on it follows, whatever etcd does.
	deadline := time.Now().Add(10 * time.Second)
	for {
		f.mu.Lock()
		n := len(f.evs)
		f.mu.Unlock()
		if n > 0 {
			return f
		}
		if time.Now().After(deadline) {
			t.Fatalf("events --follow on %s printed nothing in 10s", h.ID)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop waits a moment for events in flight, ends the follower and
// returns what it printed.
func (f *follower) stop(t *testing.T) []session.Event {
	t.Helper()
	time.Sleep(time.Second)
	f.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-f.done:
	case <-time.After(10 * time.Second):
		t.Error("events --follow did not end within 10s of SIGINT")
		f.cmd.Process.Kill()
		<-f.done
	}
	f.cmd.Wait() // stderr copied whole
	if f.stderr.Len() > 0 {
		t.Errorf("events --follow said %q", f.stderr.String())
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	t.Logf("events --follow printed %d events", len(f.evs))
	return slices.Clone(f.evs)
}

package app

import (
	"bytes"
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/fleet/memberconf"
)

func TestWriteHosts(t *testing.T) {
	at := time.Date(2026, 12, 2, 17, 40, 1, 0, time.UTC)
	list := session.HostList{Fleet: true, Self: "a", Hosts: []session.HostInfo{
		{ID: "a", Addr: "127.0.0.1:7001", State: session.HostReady, CPUs: 8, MemoryMiB: 16384, DiskFree: 50 << 30,
			Images: []string{"mini", "debian"}, Used: session.HostUse{CPUs: 3, MemoryMiB: 1536, Sessions: 2}, Since: at},
		{ID: "b", State: session.HostDraining, CPUs: 2, MemoryMiB: 2048, Since: at},
		{ID: "c", Addr: "127.0.0.1:7003", State: session.HostGone, CPUs: 4, MemoryMiB: 4096, Since: at},
		{ID: "d", State: session.HostGone, Left: true, Since: at},
	}}
	var b bytes.Buffer
	if err := writeHosts(&b, list, time.UTC); err != nil {
		t.Fatal(err)
	}
	want := `HOST      STATE     ADDRESS         CPUS  MEMORY    DISK FREE  SESSIONS  IMAGES       SINCE                NOTE
a (this)  ready     127.0.0.1:7001  3/8   1.5G/16G  50G        2         mini,debian  2026-12-02 17:40:01  -
b         draining  -               0/2   0/2.0G    0          0         -            2026-12-02 17:40:01  -
c         gone      127.0.0.1:7003  0/4   0/4.0G    0          0         -            2026-12-02 17:40:01  lease expired
d         gone      -               0/0   0/0       0          0         -            2026-12-02 17:40:01  left
`
	if b.String() != want {
		t.Errorf("host ls table:\n%s\nwant:\n%s", b.String(), want)
	}
}

// TestEtcdNeedsBerthEtcd: berth etcd becomes berth-etcd, found next to
// berth; without it (this test binary has none beside it) one line says
// where it was looked for and how to build it, and a missing name is a
// usage error before that.
func TestEtcdNeedsBerthEtcd(t *testing.T) {
	code, _, errb := run(t, t.TempDir(), "", "etcd", "--name", "e1", "--data", t.TempDir())
	if code != 1 || !strings.Contains(errb, "berth-etcd is not next to berth") || !strings.Contains(errb, "make build") || strings.Count(strings.TrimSpace(errb), "\n") != 0 {
		t.Errorf("exit %d, stderr %q; want one line naming berth-etcd and make build", code, errb)
	}
	if code, _, errb := run(t, t.TempDir(), "", "etcd", "--data", t.TempDir()); code != 2 || !strings.Contains(errb, "--name and --data are needed") {
		t.Errorf("without --name: exit %d, stderr %q", code, errb)
	}
}

// TestMemberArgsRoundTrip: the flags berth hands berth-etcd parse back
// to the member berth parsed.
func TestMemberArgsRoundTrip(t *testing.T) {
	for _, c := range []memberconf.Config{
		{Name: "e1", Dir: "/d", ListenClient: "http://127.0.0.1:2379", ListenPeer: "http://127.0.0.1:2380"},
		{Name: "e2", Dir: "/x y", ListenClient: "https://10.0.0.1:2379", ListenPeer: "https://10.0.0.1:2380", InitialCluster: "e1=https://10.0.0.1:2380,e2=https://10.0.0.2:2380", CA: "/ca", Verbose: true},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		var got memberconf.Config
		got.Bind(fs)
		if err := fs.Parse(c.Args()); err != nil {
			t.Fatal(err)
		}
		if got != c {
			t.Errorf("%+v came back as %+v", c, got)
		}
	}
}

// A drain's line per session, and its last word: an exit of 1 naming
// how many sessions are still on the host when any is.
func TestDrainLines(t *testing.T) {
	for _, c := range []struct {
		step session.DrainStep
		want string
	}{
		{session.DrainStep{Session: "st", Outcome: session.DrainMoved, State: session.StateStopped, To: "h2", Took: 1234 * time.Millisecond}, "moved st to h2 in 1.2s (stopped there)"},
		{session.DrainStep{Session: "sl", Outcome: session.DrainMoved, State: session.StateSleeping, To: "h3", Took: 4567 * time.Microsecond}, "moved sl to h3 in 5ms (sleeping there)"},
		{session.DrainStep{Session: "run", Outcome: session.DrainLeft, State: session.StateRunning, Why: "it is running: do this"}, "left run on h1: it is running: do this"},
		{session.DrainStep{Session: "old", Outcome: session.DrainFailed, State: session.StateStopped, Why: "no room"}, "failed to move old: no room"},
	} {
		if got := drainLine("h1", c.step); got != c.want {
			t.Errorf("drainLine(%+v) = %q, want %q", c.step, got, c.want)
		}
	}
	moved := session.DrainStep{Outcome: session.DrainMoved}
	for _, c := range []struct {
		steps []session.DrainStep
		want  string // "": exit 0
	}{
		{nil, ""},
		{[]session.DrainStep{moved, moved}, ""},
		{[]session.DrainStep{moved, {Outcome: session.DrainLeft}, {Outcome: session.DrainFailed}}, "host h1 is draining, but 2 of its 3 sessions are still there (see above)"},
	} {
		err := drainSummary(session.DrainResult{Host: "h1", Steps: c.steps})
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%d steps all moved: %v", len(c.steps), err)
		case c.want != "" && (err == nil || err.Error() != c.want):
			t.Errorf("%d steps: %v, want %q", len(c.steps), err, c.want)
		}
	}
}

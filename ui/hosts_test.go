package ui

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/sessiontest"
	"github.com/berthvm/berth/ui/components/hosts"
	"github.com/berthvm/berth/ui/internal/uitest"
)

// fleetFake is the fixture's service as a fleet's front door serves it:
// it lists hosts too, counting the calls.
type fleetFake struct {
	*sessiontest.Fake
	mu    sync.Mutex
	list  session.HostList
	err   error
	calls int
}

func (f *fleetFake) Hosts(context.Context) (session.HostList, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	return f.list, f.err
}

func (f *fleetFake) set(list session.HostList, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.list, f.err = list, err
}

func (f *fleetFake) n() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// fixtureFleet is three hosts, one in each state; h2 answers.
func fixtureFleet() session.HostList {
	return session.HostList{Fleet: true, Self: "h2", Hosts: []session.HostInfo{
		{ID: "h1", Addr: "10.0.0.1:7443", State: session.HostReady, CPUs: 16, MemoryMiB: 65536, DiskFree: 500 << 30, Floor: 20 << 30,
			Images: []string{"mini", "debian"}, Used: session.HostUse{CPUs: 6, MemoryMiB: 12288, Sessions: 3}, Since: now.Add(-3 * time.Hour)},
		{ID: "h2", Addr: "10.0.0.2:7443", State: session.HostDraining, CPUs: 8, MemoryMiB: 16384, DiskFree: 10 << 30, Floor: 20 << 30,
			Images: []string{"mini"}, Used: session.HostUse{CPUs: 8, MemoryMiB: 4096, Sessions: 2}, Since: now.Add(-20 * time.Minute)},
		{ID: "h3", Addr: "10.0.0.3:7443", State: session.HostGone, CPUs: 4, MemoryMiB: 8192, DiskFree: 40 << 30,
			Since: now.Add(-90 * time.Second), Left: true},
	}}
}

func newFleetHarness(t *testing.T, list session.HostList, opts Options) (*harness, *fleetFake) {
	t.Helper()
	ff := &fleetFake{Fake: fixture(), list: list}
	return newHarnessOn(t, ff.Fake, ff, opts), ff
}

// waitQuiet fails unless no Hosts call starts for a while: a call
// started just before the poll stopped is let end first.
func waitQuiet(t *testing.T, h *harness, ff *fleetFake, every time.Duration) {
	t.Helper()
	time.Sleep(2 * every)
	h.d.Settle()
	n := ff.n()
	time.Sleep(10 * every)
	h.d.Settle()
	if got := ff.n(); got != n {
		t.Fatalf("%d Hosts calls after leaving the hosts page", got-n)
	}
}

// TestHostsPage: H on the sessions page shows the fleet's hosts, polled
// while shown; the help lists the page's keys; session actions do
// nothing there; esc goes back and the poll stops.
func TestHostsPage(t *testing.T) {
	t.Parallel()
	h, ff := newFleetHarness(t, fixtureFleet(), Options{})
	const every = 20 * time.Millisecond
	h.m.hosts.SetEvery(every)

	h.press("?")
	if !strings.Contains(h.screen(), "H  hosts of the fleet") {
		t.Fatalf("the sessions page's help lacks H:\n%s", h.screen())
	}
	h.press("?")
	if !strings.Contains(h.screen(), "H hosts of the fleet") {
		t.Fatalf("the footer lacks H:\n%s", h.screen())
	}

	h.press("H")
	h.waitFor("the hosts", func() bool { _, ok := h.m.hosts.List(); return ok })
	if h.m.page != pageHosts {
		t.Fatalf("H: page %v", h.m.page)
	}
	scr := h.screen()
	for _, want := range []string{"berth › hosts  3 total · 1 ready · 1 draining · 1 gone", "h2 (this)", "◌ draining", "esc back"} {
		if !strings.Contains(scr, want) {
			t.Errorf("the hosts page lacks %q:\n%s", want, scr)
		}
	}
	h.waitFor("a few polls", func() bool { return ff.n() >= 3 })

	h.press("?")
	scr = h.screen()
	for _, want := range []string{"Keys: hosts", "r  refresh now", "↑/k", "esc  back", "command line", "quit"} {
		if !strings.Contains(scr, want) {
			t.Errorf("the hosts page's help lacks %q:\n%s", want, scr)
		}
	}
	if strings.Contains(scr, "pause/resume") || strings.Contains(scr, "H  hosts") {
		t.Errorf("the hosts page's help lists keys that do not work there:\n%s", scr)
	}
	h.press("?")

	// A session action's key does nothing here: there is no session
	// under the cursor.
	for _, k := range []string{"p", "s", "d", "x", "enter", "H"} {
		h.press(k)
		if h.m.page != pageHosts || h.m.dialog != nil || len(h.m.Pending()) > 0 {
			t.Fatalf("%s on the hosts page: page %v, dialog %v, pending %v", k, h.m.page, h.m.dialog != nil, h.m.Pending())
		}
	}
	h.press("j")
	if got, _ := h.m.hosts.Selected(); got.ID != "h2" {
		t.Fatalf("j on the hosts page selected %s", got.ID)
	}
	if ff.Calls("Pause") != 0 || ff.Calls("Stop") != 0 {
		t.Fatal("a session action ran from the hosts page")
	}

	h.press("esc")
	if h.m.page != pageSessions || h.m.hosts.Polling() {
		t.Fatalf("esc: page %v, polling %v", h.m.page, h.m.hosts.Polling())
	}
	if !strings.Contains(h.screen(), "berth › sessions") {
		t.Fatalf("esc did not go back to the sessions:\n%s", h.screen())
	}
	waitQuiet(t, h, ff, every)

	// Every way out stops the poll, the command line's too.
	h.press(":")
	h.typeText("hosts")
	h.press("enter")
	if h.m.page != pageHosts || !h.m.hosts.Polling() {
		t.Fatalf(":hosts: page %v, polling %v", h.m.page, h.m.hosts.Polling())
	}
	h.press(":")
	h.typeText("open alpha")
	h.press("enter")
	if h.m.page != pageDetail || h.m.hosts.Polling() {
		t.Fatalf(":open from the hosts page: page %v, polling %v", h.m.page, h.m.hosts.Polling())
	}
	waitQuiet(t, h, ff, every)
}

// TestHostsPageStates: the page says when the berth is in no fleet and
// when etcd does not answer, and a viewer reaches it too.
func TestHostsPageStates(t *testing.T) {
	t.Parallel()
	h, ff := newFleetHarness(t, session.HostList{}, Options{ReadOnly: true, Who: "viewer"})
	h.press("H")
	h.waitFor("the answer", func() bool { return strings.Contains(h.screen(), hosts.NotInFleet) })
	ff.set(fixtureFleet(), errors.New("etcdserver: request timed out"))
	h.press("r")
	h.waitFor("the error", func() bool {
		return strings.Contains(h.screen(), "⚠ cannot list the hosts: etcdserver: request timed out")
	})
	ff.set(fixtureFleet(), nil)
	h.press("r")
	h.waitFor("the hosts", func() bool { return strings.Contains(h.screen(), "h2 (this)") })
	if strings.Contains(h.screen(), "⚠") {
		t.Fatalf("the error stayed:\n%s", h.screen())
	}
}

// TestHostsNotOffered: a service that lists no hosts has no H, in the
// help or the footer, and :hosts says so.
func TestHostsNotOffered(t *testing.T) {
	t.Parallel()
	h := newHarness(t, fixture(), Options{})
	h.press("H")
	if h.m.page != pageSessions {
		t.Fatalf("H without a host lister: page %v", h.m.page)
	}
	h.press("?")
	if strings.Contains(h.screen(), "hosts of the fleet") {
		t.Fatalf("help offers H:\n%s", h.screen())
	}
	h.press("?", ":")
	h.typeText("hosts")
	h.press("enter")
	if h.m.page != pageSessions || !strings.Contains(h.flash(), "lists no hosts") {
		t.Fatalf(":hosts without a host lister: page %v, flash %q", h.m.page, h.flash())
	}
}

// TestGoldenHosts pins the hosts page, and the sessions page's help in a
// fleet.
func TestGoldenHosts(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		w, h int
		list session.HostList
		do   func(h *harness)
	}{
		{"hosts", 100, 30, fixtureFleet(), func(h *harness) { h.press("H") }},
		{"hosts_80x24", 80, 24, fixtureFleet(), func(h *harness) { h.press("H") }},
		{"hosts_not_fleet_80x24", 80, 24, session.HostList{}, func(h *harness) { h.press("H") }},
		{"hosts_help_80x24", 80, 24, fixtureFleet(), func(h *harness) { h.press("H", "?") }},
		{"sessions_fleet_help_80x24", 80, 24, fixtureFleet(), func(h *harness) { h.press("?") }},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h, _ := newFleetHarness(t, c.list, Options{Who: "alice@host"})
			h.m.hosts.SetEvery(time.Hour) // one answer: the screen holds still
			h.resize(c.w, c.h)
			c.do(h)
			h.waitFor("the answer", func() bool { _, ok := h.m.hosts.List(); return ok || h.m.page != pageHosts })
			uitest.Golden(t, c.name, h.screen(), *update)
		})
	}
}

package fleet

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/fleet/fleettest"
)

// Which sessions a drain moves, which it leaves and with what to do,
// and which cannot move.
func TestDrainPlan(t *testing.T) {
	for _, c := range []struct {
		state session.State
		owner string
		want  session.DrainOutcome
		why   []string // what the reason must say
	}{
		{session.StateStopped, "h", session.DrainMoved, nil},
		{session.StateSleeping, "h", session.DrainMoved, nil},
		{session.StateRunning, "h", session.DrainLeft, []string{"running", "berth sleep s ", "berth stop s,", "berth host drain h again"}},
		{session.StatePaused, "h", session.DrainLeft, []string{"paused", "berth resume s", "berth stop s", "berth host drain h again"}},
		{session.StateCrashed, "h", session.DrainLeft, []string{"crashed", "berth stop s", "berth host drain h again"}},
		{session.StateCreating, "h", session.DrainLeft, []string{"creating", "wait", "berth host drain h again"}},
		{session.StateStopping, "h", session.DrainLeft, []string{"stopping", "wait"}},
		{session.StateDeleting, "h", session.DrainLeft, []string{"deleting"}},
		// Not the fleet's, or not this host's: never moved, whatever
		// its state.
		{session.StateStopped, "", session.DrainFailed, []string{"before host h joined", "cannot move"}},
		{session.StateRunning, "", session.DrainFailed, []string{"no owner"}},
		{session.StateSleeping, "other", session.DrainFailed, []string{"host other owns it", "stale"}},
	} {
		got, why := drainPlan("s", c.state, "h", c.owner)
		if got != c.want {
			t.Errorf("%s owned by %q: %s (%s), want %s", c.state, c.owner, got, why, c.want)
		}
		if c.want == session.DrainMoved && why != "" {
			t.Errorf("%s: moved with a reason %q", c.state, why)
		}
		for _, w := range c.why {
			if !strings.Contains(why, w) {
				t.Errorf("%s owned by %q: %q does not say %q", c.state, c.owner, why, w)
			}
		}
	}
}

// The draining flag is written at once, kept by refreshes and by a new
// lease, and read back by a host that joins again under the same id
// (a restarted daemon); undrained, it stays off across a restart too.
func TestDrainingFlagLasts(t *testing.T) {
	t.Parallel()
	cli := dial(t, fleettest.Etcd(t))
	h := join(t, cli, "a", big)
	setDraining(t, h, true)
	if got := states(t, cli)["a"]; got.State != session.HostDraining {
		t.Fatalf("just after SetDraining: %+v", got)
	}
	// Refreshes (every TTL, 1s here) rewrite the record: still draining.
	time.Sleep(1500 * time.Millisecond)
	if got := states(t, cli)["a"]; got.State != session.HostDraining {
		t.Fatalf("after a refresh: %+v", got)
	}
	// A lost lease: the new registration is draining.
	if rec := revokeAndWait(t, cli, h, "a"); !rec.Draining {
		t.Fatalf("registered again as %+v, want draining", rec)
	}
	// A crash and a restart: draining from seen/H.
	restart := func() *Host {
		t.Helper()
		h.crash()
		h2, err := Join(ctxT(t), cli, HostConfig{ID: "a", Addr: "a:7000", Instance: "i-a", TTL: time.Second,
			Facts: func(context.Context) (Facts, error) { return big, nil }})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h2.leaveOnce(ctxT(t)) })
		return h2
	}
	h = restart()
	if !h.Draining() || states(t, cli)["a"].State != session.HostDraining {
		t.Fatalf("after a restart: draining %v, listed %+v", h.Draining(), states(t, cli)["a"])
	}
	setDraining(t, h, false)
	if got := states(t, cli)["a"]; got.State != session.HostReady {
		t.Fatalf("undrained: %+v", got)
	}
	h = restart()
	if h.Draining() || states(t, cli)["a"].State != session.HostReady {
		t.Fatalf("undrained, after a restart: draining %v, listed %+v", h.Draining(), states(t, cli)["a"])
	}
	// A clean leave keeps it too.
	setDraining(t, h, true)
	if err := h.leaveOnce(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	h2, err := Join(ctxT(t), cli, HostConfig{ID: "a", Instance: "i-a", TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer h2.leaveOnce(ctxT(t))
	if !h2.Draining() {
		t.Errorf("after a clean leave and a join: not draining")
	}
}

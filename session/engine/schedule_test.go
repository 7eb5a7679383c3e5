package engine

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/schedule"
	"github.com/berthvm/berth/store"
)

func TestParseSpec(t *testing.T) {
	for _, tc := range []struct {
		spec string
		want string // "" accepted; else a part of the refusal
	}{
		{"*/5 * * * *", ""},
		{"@every 30s", ""},
		{"@daily", ""},
		{"0 0 29 2 *", ""}, // a leap day comes within five years
		{"0 0 30 2 *", "never comes due"},
		{"0 0 31 4 *", "never comes due"},
		{"0 0 31 2,4,6,9,11 *", "never comes due"},
		{"61 * * * *", "minute field"},
		{"* * *", "want 5 fields"},
		{"@every 500ms", "below the minimum"},
		{"@fortnightly", "unknown descriptor"},
	} {
		_, err := schedule.ParseSpec(tc.spec)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: %v", tc.spec, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, session.ErrInvalid)):
			t.Errorf("%q: %v, want an invalid-argument error saying %q", tc.spec, err, tc.want)
		}
	}
}

// The schedule loop never spins, whatever the next due time says: a past
// or zero one still waits the minimum.
func TestScheduleWait(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		next time.Time
		want time.Duration
	}{
		{now.Add(10 * time.Second), 10 * time.Second},
		{now, schedule.MinWait},
		{now.Add(-time.Hour), schedule.MinWait},
		{time.Time{}, schedule.MinWait},
		{now.Add(time.Hour), time.Minute},
	} {
		if got := schedule.Wait(now, tc.next); got != tc.want {
			t.Errorf("next %v: wait %s, want %s", tc.next, got, tc.want)
		}
	}
}

// A schedule whose next time is zero (kept from before such specs were
// refused) never fires, however often the loop looks, and does not pull
// the loop's next wake into the past.
func TestZeroNextNeverFires(t *testing.T) {
	m := newSpaceManager(t, 0)
	m.addRunning(t, "a", &stubVM{done: make(chan struct{})})
	spec, err := schedule.ParseSpec("@every 1h")
	if err != nil {
		t.Fatal(err)
	}
	st := &schedState{rec: store.Schedule{ID: "c1", Session: "a", Spec: "0 0 30 2 *", Argv: []string{"true"}, Overlap: string(session.OverlapSkip)}, spec: spec}
	m.hx.mu.Lock()
	m.hx.scheds["c1"] = st
	m.hx.mu.Unlock()
	now := time.Now()
	for i := range 100 {
		next := m.fireDue(now.Add(time.Duration(i) * time.Second))
		if !next.After(now) {
			t.Fatalf("fireDue's next wake %v is not after now", next)
		}
	}
	m.hx.mu.Lock()
	defer m.hx.mu.Unlock()
	if st.rec.Count != 0 || !st.rec.Fired.IsZero() {
		t.Fatalf("fired %d times", st.rec.Count)
	}
}

// On a fleet host isolated from etcd (Config.Allowed refusing) a due
// schedule is held, with a note saying why, and starts no command.
func TestIsolatedHostHoldsSchedules(t *testing.T) {
	m := newSpaceManager(t, 0)
	m.cfg.Allowed = func(context.Context) error { return errors.New("isolated") }
	m.addRunning(t, "a", &stubVM{done: make(chan struct{})})
	spec, err := schedule.ParseSpec("@every 1h")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	st := &schedState{rec: store.Schedule{ID: "c1", Session: "a", Spec: "@every 1h", Argv: []string{"true"}, Overlap: string(session.OverlapSkip), Next: now.Add(-time.Second)}, spec: spec}
	m.hx.mu.Lock()
	m.hx.scheds["c1"] = st
	m.hx.mu.Unlock()
	m.fireDue(now)
	m.hx.mu.Lock()
	defer m.hx.mu.Unlock()
	if st.rec.Count != 0 || !st.rec.Fired.IsZero() || !strings.Contains(st.held, "isolated from the fleet") {
		t.Fatalf("isolated: fired %d times, held %q", st.rec.Count, st.held)
	}
}

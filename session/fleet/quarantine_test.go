package fleet

import (
	"context"
	"log/slog"
	"slices"
	"testing"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/fleet/fleettest"
)

type fakeLocal struct {
	sessions    []session.Session
	quarantined []string
}

func (l *fakeLocal) List(context.Context) ([]session.Session, error) { return l.sessions, nil }

func (l *fakeLocal) Quarantine(_ context.Context, name, why string) (string, error) {
	l.quarantined = append(l.quarantined, name)
	return "/q/" + name, nil
}

// At a join, the copies whose owner key names another host, or names
// this one at a later epoch than the copy's, are quarantined; a copy at
// the owner's epoch, one of unknown epoch owned here, and one the fleet
// does not know stay.
func TestQuarantineStale(t *testing.T) {
	t.Parallel()
	cli := dial(t, fleettest.Etcd(t))
	ctx := ctxT(t)
	put := func(name, host string) int64 {
		r, err := cli.Put(ctx, ownerKey(name), mustJSON(Owner{Host: host}))
		if err != nil {
			t.Fatal(err)
		}
		return r.Header.Revision
	}
	current := put("current", "h1")
	put("elsewhere", "h2")
	old := put("retaken", "h1")
	put("retaken", "h1") // taken again (recovered, or moved back) at a later epoch
	put("unknown", "h1")
	l := &fakeLocal{sessions: []session.Session{
		{Name: "current", Epoch: current},
		{Name: "elsewhere", Epoch: current},
		{Name: "retaken", Epoch: old},
		{Name: "unknown"},
		{Name: "solo", Epoch: 0},
	}}
	if err := QuarantineStale(ctx, cli, "h1", l, nopLog()); err != nil {
		t.Fatal(err)
	}
	slices.Sort(l.quarantined)
	if !slices.Equal(l.quarantined, []string{"elsewhere", "retaken"}) {
		t.Errorf("quarantined %v, want [elsewhere retaken]", l.quarantined)
	}
	stale, err := Stale(ctx, cli, "h1", l.sessions)
	if err != nil || len(stale) != 2 {
		t.Fatalf("Stale: %v %v", stale, err)
	}
	for _, c := range stale {
		t.Log(c.Why())
	}
}

func nopLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

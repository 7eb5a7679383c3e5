package sparks

import (
	"strings"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/colorprofile"
	"github.com/charmbracelet/x/ansi"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/sessiontest"
	"github.com/berthvm/berth/ui/common"
)

func TestGraph(t *testing.T) {
	all := func(n int) []bool {
		b := make([]bool, n)
		for i := range b {
			b[i] = true
		}
		return b
	}
	for _, c := range []struct {
		name string
		vals []float64
		w    int
		top  float64
		peak bool
		want string
	}{
		{"empty", nil, 4, 100, false, "    "},
		{"fewer samples than cells grow from the right", []float64{0, 100}, 4, 100, false, "  ▁█"},
		{"one per cell", []float64{0, 50, 100, 25}, 4, 100, false, "▁▄█▂"},
		{"mean of two per cell", []float64{0, 100, 100, 100}, 2, 100, false, "▄█"},
		{"peak of two per cell", []float64{0, 100, 0, 0}, 2, 100, true, "█▁"},
		{"above the top is the top", []float64{500}, 1, 100, false, "█"},
		{"no scale", []float64{3}, 1, 0, false, "▁"},
		{"zero width", []float64{3}, 0, 100, false, ""},
	} {
		if got := graph(c.vals, all(len(c.vals)), c.w, c.top, c.peak); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

var now = time.Date(2026, 3, 14, 15, 0, 0, 0, time.UTC)

func TestHistoryThenLive(t *testing.T) {
	f := sessiontest.New(sessiontest.Options{Now: func() time.Time { return now }})
	defer f.Close()
	s := session.Session{Name: "a", State: session.StateRunning, MemoryMiB: 512}
	if err := f.AddSession(s); err != nil {
		t.Fatal(err)
	}
	var old []session.Sample
	for i := range 10 {
		old = append(old, session.Sample{Time: now.Add(-time.Duration(10-i) * 2 * time.Second), CPUPercent: 95})
	}
	old = append(old, session.Sample{Time: now.Add(-20 * time.Minute), CPUPercent: 1}) // outside the window: dropped
	f.AddSample("a", old...)
	c := &common.Common{Ctx: t.Context(), Styles: common.NewStyles(true, colorprofile.Ascii), Now: func() time.Time { return now }}
	m := New(c, f)
	m.SetWidth(100)
	cmd := m.Open(s)
	// A live sample arrives before the history does: it is kept, after it.
	s.Live = &session.Live{Time: now.Add(time.Second), CPUPercent: 50}
	m.Observe(s)
	m.Update(cmd().(tea.Msg))
	got := m.Samples()
	if len(got) != 11 || got[10].CPUPercent != 50 || got[0].CPUPercent != 95 {
		t.Fatalf("samples %+v", got)
	}
	// A stale or repeated live sample is not added again.
	m.Observe(s)
	if len(m.Samples()) != 11 {
		t.Fatalf("repeat added: %d", len(m.Samples()))
	}
	v := ansi.Strip(m.View())
	for _, want := range []string{"cpu", "mem", "disk", "dirty", "50%"} {
		if !strings.Contains(v, want) {
			t.Errorf("no %q in %q", want, v)
		}
	}
	if w := ansi.StringWidth(m.View()); w != 100 {
		t.Errorf("width %d", w)
	}
	// Another session's events are not this one's.
	m.Observe(session.Session{Name: "b", Live: &session.Live{Time: now.Add(time.Hour)}})
	if len(m.Samples()) != 11 {
		t.Fatalf("another session's sample was added")
	}
}

func TestPinned(t *testing.T) {
	mk := func(cpus ...float32) []session.Sample {
		var out []session.Sample
		for i, c := range cpus {
			out = append(out, session.Sample{Time: now.Add(-time.Duration(len(cpus)-1-i) * 30 * time.Second), CPUPercent: c})
		}
		return out
	}
	for _, c := range []struct {
		name string
		h    []session.Sample
		want bool
	}{
		{"two and a half minutes at 95", mk(95, 95, 95, 95, 95, 95), true},
		{"a dip in the last two minutes", mk(95, 95, 95, 40, 95, 95), false},
		{"a dip before them", mk(40, 95, 95, 95, 95, 95), true},
		{"only a minute of samples", mk(95, 95, 95), false},
		{"none", nil, false},
	} {
		if got := pinned(c.h, now); got != c.want {
			t.Errorf("%s: %v", c.name, got)
		}
	}
}

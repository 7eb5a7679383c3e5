package sessions

import (
	"strings"
	"testing"
	"time"

	"github.com/charmbracelet/colorprofile"
	"github.com/charmbracelet/x/ansi"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/ui/common"
)

func live(cpu float64) *session.Live { return &session.Live{CPUPercent: cpu} }

// TestCPUAndMemColumns: CPU shows the sampled share (— when not sampled)
// and sorts busiest first; MEM shows use against size and sorts by use.
func TestCPUAndMemColumns(t *testing.T) {
	ss := []session.Session{
		{Name: "idle", State: session.StateRunning, MemoryMiB: 512, MemUsedBytes: 100 << 20, Live: live(1)},
		{Name: "hot", State: session.StateRunning, MemoryMiB: 1024, MemUsedBytes: 50 << 20, Live: live(97.4)},
		{Name: "off", State: session.StateStopped, MemoryMiB: 512},
	}
	m := newTable(t, 120, 10, ss...)
	m.SortByName("cpu")
	if got := strings.Join(names(m), " "); got != "hot idle off" {
		t.Errorf("by CPU %q", got)
	}
	m.SortByName("mem")
	if got := strings.Join(names(m), " "); got != "idle hot off" {
		t.Errorf("by MEM %q", got)
	}
	v := ansi.Strip(m.View())
	for _, want := range []string{"97%", "100M/512M", "50M/1.0G", "—/512M"} {
		if !strings.Contains(v, want) {
			t.Errorf("no %q in\n%s", want, v)
		}
	}
}

// TestPinnedCPU: a CPU at 90% or more is a warning, and an error once it
// has stayed there for PinnedFor; dropping below resets it.
func TestPinnedCPU(t *testing.T) {
	clock := now
	c := &common.Common{Ctx: t.Context(), Styles: common.NewStyles(true, colorprofile.TrueColor), Now: func() time.Time { return clock }}
	m := New(c)
	m.SetSize(120, 10)
	feed := func(cpu float64) {
		s := session.Session{Name: "a", State: session.StateRunning, Live: live(cpu)}
		m.Apply([]session.Event{{Kind: session.EventStats, Name: "a", Session: &s}})
	}
	level := func() int { return m.rows["a"].cpuLevel(clock) }
	for _, step := range []struct {
		after time.Duration
		cpu   float64
		want  int
	}{
		{0, 20, 0},
		{2 * time.Second, 95, 1},
		{time.Minute, 99, 1},
		{time.Minute, 92, 2}, // two minutes pinned
		{2 * time.Second, 50, 0},
		{2 * time.Second, 95, 1}, // starts again
	} {
		clock = clock.Add(step.after)
		feed(step.cpu)
		if got := level(); got != step.want {
			t.Errorf("at %s cpu %.0f: level %d, want %d", clock.Sub(now), step.cpu, got, step.want)
		}
	}
	// The levels are coloured differently.
	m.SetSort(ColName, false)
	m.Apply([]session.Event{{Kind: session.EventState, Name: "b", Session: &session.Session{Name: "b", State: session.StateRunning, Live: live(95)}}})
	m.Select("b") // the cursor row is unstyled: look at a
	if v := m.View(); !strings.Contains(v, "95%") {
		t.Fatalf("no CPU cell:\n%s", ansi.Strip(v))
	}
}

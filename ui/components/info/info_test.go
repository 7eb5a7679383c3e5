package info

import (
	"strings"
	"testing"
	"time"

	"github.com/charmbracelet/colorprofile"
	"github.com/charmbracelet/x/ansi"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/sessiontest"
	"github.com/berthvm/berth/ui/common"
	"github.com/berthvm/berth/ui/internal/uitest"
)

var keys uitest.Coverage

func TestMain(m *testing.M) {
	uitest.Main(m, &keys, map[string]any{"info.KeyMap": DefaultKeyMap()})
}

var t0 = time.Date(2026, 3, 14, 15, 0, 0, 0, time.UTC)

func TestTimelineAndConfig(t *testing.T) {
	f := sessiontest.New(sessiontest.Options{Now: func() time.Time { return t0 }})
	t.Cleanup(func() { f.Close() })
	must(t, f.AddSession(session.Session{Name: "s", State: session.StateRunning, Pid: 77, Accel: "kvm", Image: "mini", VMM: "qemu", DirtyBytes: 4096, StartedAt: t0.Add(-time.Hour)}))
	must(t, f.Crash("s", "VMM killed by SIGKILL: oom"))
	// The service reports an accelerator only while a VM runs; put one on
	// the crashed record anyway so the row's rendering is checked.
	must(t, f.Update("s", func(s *session.Session) { s.Accel = "kvm" }))
	must(t, f.Note("s", session.EventFlush, "flushed 4096 bytes"))
	for i := range 30 {
		must(t, f.Note("s", session.EventNote, "note "+string(rune('a'+i%26))))
	}
	c := &common.Common{Ctx: t.Context(), Styles: common.NewStyles(true, colorprofile.Ascii), Now: func() time.Time { return t0 }}
	m := New(c, f)
	m.SetSize(100, 20)
	d := uitest.NewDriver(&uitest.Component{C: m})
	d.Quiet = 5 * time.Millisecond
	t.Cleanup(d.Close)
	s, _ := f.Get(t.Context(), "s")
	d.Exec(m.Open(s))
	if len(m.Events()) != 33 {
		t.Fatalf("%d events", len(m.Events()))
	}
	v := ansi.Strip(m.View())
	for _, want := range []string{"vm pid     —", "accel kvm", "note", "TIMELINE"} {
		if !strings.Contains(v, want) {
			t.Errorf("missing %q:\n%s", want, v)
		}
	}
	for _, k := range []string{"G", "g", "j", "down", "k", "up", "ctrl+d", "pgdown", "ctrl+u", "pgup", "end", "home"} {
		d.Send(keys.Key(k))
	}
	d.Send(keys.Key("G"))
	v = ansi.Strip(m.View())
	if !strings.Contains(v, "VMM killed by SIGKILL: oom") || !strings.Contains(v, "flushed 4096 bytes") {
		t.Fatalf("oldest events not reachable:\n%s", v)
	}
	// Live events: new ones are added once, snapshots and stats skipped.
	m.AddEvent(session.Event{Seq: 1000, Kind: session.EventNote, Name: "s", Message: "live"})
	m.AddEvent(session.Event{Seq: 1000, Kind: session.EventNote, Name: "s", Message: "dup"})
	m.AddEvent(session.Event{Seq: 0, Kind: session.EventState, Name: "s"})
	m.AddEvent(session.Event{Seq: 1001, Kind: session.EventStats, Name: "s"})
	m.AddEvent(session.Event{Seq: 1002, Kind: session.EventNote, Name: "other"})
	if len(m.Events()) != 34 || m.Events()[0].Message != "live" {
		t.Fatalf("live events: %d first %q", len(m.Events()), m.Events()[0].Message)
	}
	must(t, f.Note("s", session.EventNote, "after reload"))
	d.Send(keys.Key("r"))
	if m.Events()[0].Message != "live" && m.Events()[0].Message != "after reload" {
		t.Fatalf("reload: first %q", m.Events()[0].Message)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// The tab lists the newest checkpoints with what they hold, and reloads
// them when the session's count changes.
func TestCheckpointsListed(t *testing.T) {
	f := sessiontest.New(sessiontest.Options{Now: func() time.Time { return t0 }})
	t.Cleanup(func() { f.Close() })
	must(t, f.AddSession(session.Session{Name: "s", State: session.StateRunning, Image: "mini", VMM: "qemu"}))
	if _, err := f.Checkpoint(t.Context(), "s", session.CheckpointOptions{Label: "green build"}); err != nil {
		t.Fatal(err)
	}
	c := &common.Common{Ctx: t.Context(), Styles: common.NewStyles(true, colorprofile.Ascii), Now: func() time.Time { return t0 }}
	m := New(c, f)
	m.SetSize(120, 30)
	d := uitest.NewDriver(&uitest.Component{C: m})
	d.Quiet = 5 * time.Millisecond
	t.Cleanup(d.Close)
	s, _ := f.Get(t.Context(), "s")
	d.Exec(m.Open(s))
	v := ansi.Strip(m.View())
	for _, want := range []string{"CHECKPOINTS", "c1", "workspace", "green build"} {
		if !strings.Contains(v, want) {
			t.Errorf("missing %q:\n%s", want, v)
		}
	}
	if _, err := f.Checkpoint(t.Context(), "s", session.CheckpointOptions{Memory: true}); err != nil {
		t.Fatal(err)
	}
	s, _ = f.Get(t.Context(), "s")
	d.Exec(m.SetSession(s))
	if v := ansi.Strip(m.View()); !strings.Contains(v, "workspace+memory") || len(m.Checkpoints()) != 2 {
		t.Errorf("a new checkpoint is not listed:\n%s", v)
	}
}

// The workspace line: the last measured use and when, or that it was never
// measured (a stopped or sleeping session keeps its figure; a new one
// shows no 0 B).
func TestWorkspaceText(t *testing.T) {
	now := time.Date(2026, 3, 14, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name string
		s    session.Session
		want string
	}{
		{"measured", session.Session{DiskBytes: 4 << 30, WorkspaceUsed: 12 << 20, WorkspaceMeasuredAt: now.Add(-3 * time.Minute)},
			"12M used of 4.0G (/workspace volume), measured 3m ago"},
		{"not measured", session.Session{DiskBytes: 4 << 30}, "4.0G (/workspace volume), its use not measured yet"},
		{"a figure without its time", session.Session{DiskBytes: 4 << 30, WorkspaceUsed: 12 << 20}, "12M used of 4.0G (/workspace volume)"},
	} {
		if got := workspaceText(c.s, now); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

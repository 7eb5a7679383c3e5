package execs

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
	"github.com/berthvm/berth/ui/internal/uitest"
)

var keys uitest.Coverage

func TestMain(m *testing.M) {
	uitest.Main(m, &keys, map[string]any{"execs.KeyMap": DefaultKeyMap()})
}

var t0 = time.Date(2026, 3, 14, 15, 0, 0, 0, time.UTC)

func setup(t *testing.T, n int) (*Model, *sessiontest.Fake, *uitest.Driver) {
	f := sessiontest.New(sessiontest.Options{Now: func() time.Time { return t0 }})
	t.Cleanup(func() { f.Close() })
	if err := f.AddSession(session.Session{Name: "s", State: session.StateRunning}); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		code := i % 3
		if err := f.AddExecution(session.Execution{ID: "x" + string(rune('a'+i)), Session: "s", Argv: []string{"cmd", string(rune('a' + i))},
			State: session.ExecExited, ExitCode: &code, StartedAt: t0.Add(time.Duration(i) * time.Minute), EndedAt: t0.Add(time.Duration(i)*time.Minute + time.Second)}); err != nil {
			t.Fatal(err)
		}
	}
	c := &common.Common{Ctx: t.Context(), Styles: common.NewStyles(true, colorprofile.Ascii), Now: func() time.Time { return t0.Add(time.Hour) }}
	m := New(c, f)
	m.SetSize(100, 8)
	d := uitest.NewDriver(&uitest.Component{C: m})
	d.Quiet = 5 * time.Millisecond
	t.Cleanup(d.Close)
	d.Exec(m.SetSession("s"))
	return m, f, d
}

func TestNewestFirstNavigationAndOpen(t *testing.T) {
	m, f, d := setup(t, 10)
	if e, _ := m.Selected(); e.ID != "xj" || m.Len() != 10 {
		t.Fatalf("selected %s of %d", e.ID, m.Len())
	}
	for _, c := range []struct {
		key  string
		want string
	}{{"j", "xi"}, {"down", "xh"}, {"k", "xi"}, {"up", "xj"}, {"G", "xa"}, {"g", "xj"}, {"end", "xa"}, {"home", "xj"},
		{"ctrl+d", "xg"}, {"pgdown", "xd"}, {"ctrl+u", "xg"}, {"pgup", "xj"}} {
		d.Send(keys.Key(c.key))
		if e, _ := m.Selected(); e.ID != c.want {
			t.Fatalf("%s: %s, want %s", c.key, e.ID, c.want)
		}
	}
	cmd := m.Update(keys.Key("enter"))
	if msg, ok := cmd().(common.OpenOutputMsg); !ok || msg.Exec.ID != "xj" {
		t.Fatalf("enter: %#v", cmd())
	}
	// A new execution appears at the top; the cursor stays on its row.
	d.Send(keys.Key("j"))
	m.ApplyExec(session.Execution{ID: "xz", Session: "s", State: session.ExecRunning, StartedAt: t0.Add(time.Hour)})
	if e, _ := m.Selected(); e.ID != "xi" || m.list[0].ID != "xz" {
		t.Fatalf("after new exec: selected %s first %s", e.ID, m.list[0].ID)
	}
	if err := f.AddExecution(session.Execution{ID: "xy", Session: "s", State: session.ExecLost, StartedAt: t0.Add(2 * time.Hour)}); err != nil {
		t.Fatal(err)
	}
	d.Send(keys.Key("r"))
	if m.Len() != 11 || !strings.Contains(ansi.Strip(m.View()), "lost") {
		t.Fatalf("refresh: %d\n%s", m.Len(), ansi.Strip(m.View()))
	}
	m.Update(tea.MouseClickMsg{Y: 2, Button: tea.MouseLeft})
	if m.cursor != m.offset+1 {
		t.Fatalf("click: %d", m.cursor)
	}
	m.Update(tea.MouseWheelMsg{Button: tea.MouseWheelDown})
	m.Update(tea.MouseWheelMsg{Button: tea.MouseWheelUp})
}

func TestEmptyAndError(t *testing.T) {
	m, f, d := setup(t, 0)
	if !strings.Contains(ansi.Strip(m.View()), "No executions yet") {
		t.Fatal("no empty message")
	}
	f.FailNext("Executions", session.ErrUnavailable)
	d.Send(keys.Key("r"))
	if !strings.Contains(ansi.Strip(m.View()), "unavailable") {
		t.Fatalf("no error:\n%s", ansi.Strip(m.View()))
	}
}

// TestCommandKeepsItsWidth: the command is the column that says what an
// execution is; at 80 columns it keeps at least minCommand cells and the
// least useful columns give way (OUT/ERR, then BY), at 130 all show.
func TestCommandKeepsItsWidth(t *testing.T) {
	m, f, d := setup(t, 0)
	long := "go test -run TestSomethingLong ./session/... ./ui/..."
	if err := f.AddExecution(session.Execution{ID: "xlong", Session: "s", Argv: []string{"/bin/sh", "-c", long}, By: "tui",
		State: session.ExecRunning, StartedAt: t0}); err != nil {
		t.Fatal(err)
	}
	d.Send(keys.Key("r"))
	for _, c := range []struct {
		w          int
		shown, not []string
	}{
		{80, []string{"ID", "STATE", "EXIT", "STARTED", "TOOK", "COMMAND"}, []string{"OUT/ERR", "BY"}},
		{130, []string{"ID", "STATE", "EXIT", "STARTED", "TOOK", "OUT/ERR", "BY", "COMMAND", long}, nil},
	} {
		m.SetSize(c.w, 8)
		lines := strings.Split(ansi.Strip(m.View()), "\n")
		for _, s := range c.shown {
			if !strings.Contains(lines[0]+lines[1], s) {
				t.Errorf("%d columns: no %q:\n%s\n%s", c.w, s, lines[0], lines[1])
			}
		}
		for _, s := range c.not {
			if strings.Contains(lines[0], s) {
				t.Errorf("%d columns: %s still shown:\n%s", c.w, s, lines[0])
			}
		}
		at := strings.Index(lines[0], "COMMAND")
		if got := ansi.StringWidth(strings.TrimRight(ansi.Cut(lines[1], at, c.w), " ")); got < min(minCommand, len(long)) {
			t.Errorf("%d columns: the command has %d cells:\n%s\n%s", c.w, got, lines[0], lines[1])
		}
	}
}

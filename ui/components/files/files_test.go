package files

import (
	"context"
	"fmt"
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
	uitest.Main(m, &keys, map[string]any{"files.KeyMap": DefaultKeyMap()})
}

var t0 = time.Date(2026, 3, 14, 15, 0, 0, 0, time.UTC)

type env struct {
	m *Model
	f *sessiontest.Fake
	d *uitest.Driver
}

func setup(t *testing.T, st session.State) *env {
	f := sessiontest.New(sessiontest.Options{Now: func() time.Time { return t0 }})
	t.Cleanup(func() { f.Close() })
	for _, err := range []error{
		f.AddSession(session.Session{Name: "s", State: session.StateRunning}),
		f.AddFile("s", "b.txt", []byte("hello\nworld\n"), t0),
		f.AddFile("s", "a.bin", []byte("\x00\x01\x02binary"), t0),
		f.AddFile("s", "dir/inner.go", []byte("package inner\n"), t0),
		f.AddFile("s", "dir/sub/deep.txt", []byte("deep\n"), t0),
		f.AddDir("s", "zdir", t0),
		toState(f, "s", st),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	c := &common.Common{Ctx: t.Context(), Styles: common.NewStyles(true, colorprofile.Ascii), Now: func() time.Time { return t0 }}
	m := New(c, f)
	m.SetSize(100, 5) // 4 list rows: a half page is 2
	d := uitest.NewDriver(&uitest.Component{C: m})
	d.Quiet = 5 * time.Millisecond
	t.Cleanup(d.Close)
	s, _ := f.Get(t.Context(), "s")
	d.Exec(m.SetSession(s, true))
	return &env{m: m, f: f, d: d}
}

// toState moves a running session to st the way the service would (a
// crash with cause "test").
func toState(f *sessiontest.Fake, name string, st session.State) error {
	ctx := context.Background()
	var err error
	switch st {
	case session.StateRunning:
	case session.StatePaused:
		_, err = f.Pause(ctx, name)
	case session.StateStopped:
		_, err = f.Stop(ctx, name)
	case session.StateSleeping:
		_, err = f.Sleep(ctx, name)
	case session.StateCrashed:
		err = f.Crash(name, "test")
	default:
		err = fmt.Errorf("no way to %s", st)
	}
	return err
}

func (e *env) press(ks ...string) {
	for _, k := range ks {
		e.d.Send(keys.Key(k))
	}
}

func (e *env) names() string {
	var out []string
	for _, x := range e.m.Entries() {
		out = append(out, x.Name)
	}
	return strings.Join(out, " ")
}

func (e *env) sel() string { return e.m.Entries()[e.m.cursor].Name }

func TestBrowse(t *testing.T) {
	e := setup(t, session.StateRunning)
	if got := e.names(); got != "dir zdir a.bin b.txt" {
		t.Fatalf("entries %q (directories first)", got)
	}
	e.press("enter")
	if e.m.Dir() != "dir" || e.names() != "sub inner.go" {
		t.Fatalf("descend: %q %q", e.m.Dir(), e.names())
	}
	e.press("l", "backspace")
	if e.m.Dir() != "dir" {
		t.Fatalf("l/backspace: %q", e.m.Dir())
	}
	e.press("backspace")
	if e.m.Dir() != "" || e.sel() != "dir" {
		t.Fatalf("up: %q selected %q", e.m.Dir(), e.sel())
	}
	e.press("right", "left", "h")
	if e.m.Dir() != "" {
		t.Fatalf("right/left/h: %q", e.m.Dir())
	}
	for _, c := range []struct{ key, want string }{{"j", "zdir"}, {"down", "a.bin"}, {"k", "zdir"}, {"up", "dir"},
		{"G", "b.txt"}, {"g", "dir"}, {"end", "b.txt"}, {"home", "dir"}, {"ctrl+d", "a.bin"}, {"ctrl+u", "dir"}, {"pgdown", "a.bin"}, {"pgup", "dir"}} {
		e.press(c.key)
		if e.sel() != c.want {
			t.Fatalf("%s: %q, want %q", c.key, e.sel(), c.want)
		}
	}
}

func TestPreview(t *testing.T) {
	e := setup(t, session.StateRunning)
	e.press("G")
	if !e.d.WaitFor(func() bool { return strings.Contains(ansi.Strip(e.m.View()), "world") }, 2*time.Second) {
		t.Fatalf("no text preview:\n%s", ansi.Strip(e.m.View()))
	}
	e.press("k")
	if !e.d.WaitFor(func() bool { return strings.Contains(ansi.Strip(e.m.View()), "binary file: no preview") }, 2*time.Second) {
		t.Fatalf("binary not detected:\n%s", ansi.Strip(e.m.View()))
	}
	// Holding j reads only where the cursor stops (debounce).
	n := e.f.Calls("ReadFile")
	for range 5 {
		e.m.Update(keys.Key("j"))
		e.m.Update(keys.Key("k"))
	}
	e.d.Settle()
	time.Sleep(2 * previewDebounce)
	e.d.Settle()
	if got := e.f.Calls("ReadFile") - n; got > 1 {
		t.Fatalf("%d reads while moving", got)
	}
}

func TestUnavailableStatesAndRefresh(t *testing.T) {
	for st, want := range map[session.State]string{
		session.StatePaused:   "is paused",
		session.StateStopped:  "is stopped",
		session.StateCrashed:  "crashed (test)",
		session.StateSleeping: "Press r to wake it",
	} {
		e := setup(t, st)
		if v := ansi.Strip(e.m.View()); !strings.Contains(v, want) {
			t.Errorf("%s: want %q in\n%s", st, want, v)
		}
		if e.f.Calls("ListDir") != 0 {
			t.Errorf("%s: listed", st)
		}
		e.press("r")
	}
	e := setup(t, session.StateRunning)
	e.f.FailNext("ListDir", session.ErrUnavailable)
	e.press("r")
	if !strings.Contains(ansi.Strip(e.m.View()), "unavailable") {
		t.Fatalf("no error:\n%s", ansi.Strip(e.m.View()))
	}
	e.press("r")
	if e.names() == "" {
		t.Fatal("r did not reload")
	}
	e.m.Update(tea.MouseClickMsg{Y: 2, Button: tea.MouseLeft})
	if e.sel() != "zdir" {
		t.Fatalf("click: %q", e.sel())
	}
	e.m.Update(tea.MouseWheelMsg{Button: tea.MouseWheelDown})
}

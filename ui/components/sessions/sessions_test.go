package sessions

import (
	"strings"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/colorprofile"
	"github.com/charmbracelet/x/ansi"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/ui/common"
	"github.com/berthvm/berth/ui/internal/uitest"
)

var keys uitest.Coverage

func TestMain(m *testing.M) {
	uitest.Main(m, &keys, map[string]any{"sessions.KeyMap": DefaultKeyMap()})
}

var now = time.Date(2026, 3, 14, 15, 0, 0, 0, time.UTC)

func newTable(t *testing.T, w, h int, ss ...session.Session) *Model {
	t.Helper()
	c := &common.Common{Ctx: t.Context(), Styles: common.NewStyles(true, colorprofile.Ascii), Now: func() time.Time { return now }}
	m := New(c)
	m.SetSize(w, h)
	var evs []session.Event
	for i := range ss {
		evs = append(evs, session.Event{Kind: session.EventState, Name: ss[i].Name, Session: &ss[i]})
	}
	m.Apply(evs)
	return m
}

func press(m *Model, names ...string) tea.Cmd {
	var cmd tea.Cmd
	for _, n := range names {
		cmd = m.Update(keys.Key(n))
	}
	return cmd
}

func typ(m *Model, s string) {
	for _, k := range uitest.Type(s) {
		m.Update(k)
	}
}

func names(m *Model) []string {
	var out []string
	for _, r := range m.visible {
		out = append(out, r.s.Name)
	}
	return out
}

func sel(m *Model) string { s, _ := m.Selected(); return s.Name }

func some() []session.Session {
	return []session.Session{
		{Name: "web", State: session.StateRunning, CPUs: 2, DirtyBytes: 10, Image: "mini"},
		{Name: "build-cache", State: session.StatePaused, CPUs: 8, DirtyBytes: 500, Image: "big"},
		{Name: "alpha", State: session.StateStopped, CPUs: 1, Image: "mini"},
		{Name: "db", State: session.StateCrashed, CPUs: 4, DirtyBytes: 7, Image: "mini"},
	}
}

func TestSortsByNameAndKeepsSelection(t *testing.T) {
	m := newTable(t, 100, 20, some()...)
	if got := strings.Join(names(m), " "); got != "alpha build-cache db web" {
		t.Fatalf("order %q", got)
	}
	press(m, "j", "j") // db
	press(m, "o")      // state: crashed first
	if got := strings.Join(names(m), " "); got != "db web build-cache alpha" || sel(m) != "db" {
		t.Fatalf("by state %q, selected %q", got, sel(m))
	}
	press(m, "o") // vcpus, biggest first
	if got := strings.Join(names(m), " "); got != "build-cache db web alpha" {
		t.Fatalf("by vcpu %q", got)
	}
	press(m, "O")
	if got := strings.Join(names(m), " "); got != "alpha web db build-cache" || sel(m) != "db" {
		t.Fatalf("reversed %q selected %q", got, sel(m))
	}
	if !strings.Contains(ansi.Strip(m.View()), "VCPU↑") {
		t.Fatalf("no sort mark:\n%s", ansi.Strip(m.View()))
	}
}

func TestStatsEventsDoNotResortUnlessTheKeyChanged(t *testing.T) {
	m := newTable(t, 100, 20, some()...)
	n := m.rebuilds
	s := some()[0]
	s.WorkspaceUsed = 99
	m.Apply([]session.Event{{Kind: session.EventStats, Name: s.Name, Session: &s}})
	if m.rebuilds != n {
		t.Fatal("re-sorted on a stats event while sorted by name")
	}
	if got, _ := m.Get("web"); got.WorkspaceUsed != 99 {
		t.Fatal("stats not applied")
	}
	m.SetSort(ColDirty, true)
	n = m.rebuilds
	s.DirtyBytes = 1000
	// A sort key changed: the re-sort is deferred (at most every
	// resortEvery), the values show at once.
	cmd := m.Apply([]session.Event{{Kind: session.EventStats, Name: s.Name, Session: &s}})
	if m.rebuilds != n || cmd == nil {
		t.Fatalf("re-sorted at once (%d) or no deferred re-sort", m.rebuilds-n)
	}
	if cmd2 := m.Apply([]session.Event{{Kind: session.EventStats, Name: s.Name, Session: &s}}); cmd2 != nil {
		t.Fatal("a second deferred re-sort was queued")
	}
	m.Update(resortMsg{})
	if m.rebuilds != n+1 || names(m)[0] != "web" {
		t.Fatalf("dirty change: rebuilds %d order %v", m.rebuilds-n, names(m))
	}
	m.Apply([]session.Event{{Kind: session.EventDeleted, Name: "web"}})
	if _, ok := m.Get("web"); ok || m.Len() != 3 {
		t.Fatal("delete not applied")
	}
	m.Retain(map[string]bool{"alpha": true})
	if m.Len() != 1 {
		t.Fatalf("retain left %d", m.Len())
	}
}

func TestFilter(t *testing.T) {
	m := newTable(t, 100, 20, some()...)
	press(m, "/")
	if !m.Capturing() {
		t.Fatal("filter prompt not focused")
	}
	typ(m, "bld")
	if got := names(m); len(got) != 1 || got[0] != "build-cache" {
		t.Fatalf("fuzzy: %v", got)
	}
	press(m, "enter")
	if m.Capturing() || m.Filter() != "bld" {
		t.Fatal("enter did not keep the filter")
	}
	press(m, "esc")
	if m.Filter() != "" || m.Visible() != 4 {
		t.Fatal("esc did not clear")
	}
	for q, want := range map[string]string{
		"state:paused":           "build-cache",
		"state:r,c":              "db web",
		"-state:stopped image:m": "db web",
		"is:stop":                "alpha",
		"vmm:":                   "alpha build-cache db web",
		"zzz":                    "",
	} {
		m.SetFilter(q)
		if got := strings.Join(names(m), " "); got != want {
			t.Errorf("%q: %q, want %q", q, got, want)
		}
	}
	m.SetFilter("")
	press(m, "/")
	typ(m, "web")
	press(m, "esc")
	if m.Capturing() || m.Filter() != "" {
		t.Fatal("esc while typing did not cancel")
	}
	m.SetFilter("zzz")
	if !strings.Contains(ansi.Strip(m.View()), "No session matches the filter") {
		t.Fatal("no empty-filter message")
	}
}

func TestNavigationAndOpen(t *testing.T) {
	var ss []session.Session
	for i := range 50 {
		ss = append(ss, session.Session{Name: "s" + string(rune('a'+i/26)) + string(rune('a'+i%26)), State: session.StateRunning})
	}
	m := newTable(t, 100, 12, ss...) // 11 rows
	for _, c := range []struct {
		key  string
		want int
	}{{"j", 1}, {"down", 2}, {"k", 1}, {"up", 0}, {"G", 49}, {"g", 0}, {"end", 49}, {"home", 0},
		{"ctrl+d", 5}, {"pgdown", 10}, {"ctrl+u", 5}, {"pgup", 0}} {
		press(m, c.key)
		if m.cursor != c.want {
			t.Fatalf("%s: cursor %d, want %d", c.key, m.cursor, c.want)
		}
	}
	press(m, "G")
	if m.offset != 50-11 {
		t.Fatalf("offset %d", m.offset)
	}
	cmd := press(m, "enter")
	if msg, ok := cmd().(common.OpenSessionMsg); !ok || msg.Name != "sbx" {
		t.Fatalf("enter: %#v", cmd())
	}
	m.Update(tea.MouseWheelMsg{Button: tea.MouseWheelUp})
	if m.cursor != 46 {
		t.Fatalf("wheel: %d", m.cursor)
	}
	m.Update(tea.MouseClickMsg{X: 5, Y: 1, Button: tea.MouseLeft})
	if m.cursor != m.offset {
		t.Fatalf("click: cursor %d offset %d", m.cursor, m.offset)
	}
}

func TestColumnsDropWhenNarrow(t *testing.T) {
	for _, c := range []struct {
		w       int
		has, no []string
	}{
		{120, []string{"ACTIVITY", "UPTIME", "RUN"}, nil},
		{80, []string{"UPTIME", "DIRTY", "WORKSPACE"}, []string{"ACTIVITY"}},
		{60, []string{"DIRTY", "WORKSPACE", "STATE"}, []string{"ACTIVITY", "UPTIME", "MEM"}},
	} {
		m := newTable(t, c.w, 10, some()...)
		v := ansi.Strip(m.View())
		for _, h := range c.has {
			if !strings.Contains(v, h) {
				t.Errorf("%d: no %s", c.w, h)
			}
		}
		for _, h := range c.no {
			if strings.Contains(v, h) {
				t.Errorf("%d: has %s", c.w, h)
			}
		}
		for i, l := range strings.Split(m.View(), "\n") {
			if ansi.StringWidth(l) != c.w {
				t.Fatalf("%d: line %d is %d wide", c.w, i, ansi.StringWidth(l))
			}
		}
	}
}

func TestUntrustedNamesAreSanitized(t *testing.T) {
	m := newTable(t, 100, 10, session.Session{Name: "evil\x1b[2J\x1b]0;x\x07name", State: session.StateRunning})
	if v := m.View(); strings.Contains(v, "\x1b[2J") || strings.Contains(v, "\x1b]0") {
		t.Fatal("escape in view")
	}
}

func TestNaturalNameOrder(t *testing.T) {
	m := newTable(t, 100, 20, session.Session{Name: "ci-10"}, session.Session{Name: "ci-9"}, session.Session{Name: "ci-100"}, session.Session{Name: "ci-09b"}, session.Session{Name: "alpha"})
	if got := strings.Join(names(m), " "); got != "alpha ci-9 ci-09b ci-10 ci-100" {
		t.Fatalf("order %q", got)
	}
}

// A create call's answer can arrive before the events that tell the same;
// it must then show, and must never undo a newer event.
func TestCreatedAnswerRacesTheEvents(t *testing.T) {
	for _, tc := range []struct {
		name string
		have []session.Session // rows the events already brought
		want session.State
	}{
		{"answer first", nil, session.StateRunning},
		{"creating event first", []session.Session{{Name: "new", State: session.StateCreating}}, session.StateRunning},
		{"a later event first", []session.Session{{Name: "new", State: session.StateSleeping}}, session.StateSleeping},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newTable(t, 100, 20, append(some(), tc.have...)...)
			m.Created(session.Session{Name: "new", State: session.StateRunning, CPUs: 1})
			s, ok := m.Selected()
			if !ok || s.Name != "new" || s.State != tc.want {
				t.Fatalf("selected %q in state %q, want new %s", s.Name, s.State, tc.want)
			}
		})
	}
}

// TestSortKeyCyclesLeftToRight: o moves the sort to the next column as
// the header shows them, left to right, skipping the columns a narrow
// terminal dropped, and wraps to NAME.
func TestSortKeyCyclesLeftToRight(t *testing.T) {
	for _, w := range []int{100, 80, 60} {
		m := newTable(t, w, 20, some()...)
		header := strings.Fields(ansi.Strip(strings.Split(m.View(), "\n")[0]))
		var got []string
		for range len(header) {
			press(m, "o")
			c, _ := m.Sort()
			got = append(got, spec(c).title)
		}
		want := append(append([]string{}, header[1:]...), "NAME")
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("%d columns: o cycles %v, want %v (the header: %v)", w, got, want, header)
		}
	}
}

// In a fleet (sessions have hosts) a HOST column follows NAME, and an
// unreachable session is shown with its host and its whole state; alone,
// no HOST column.
func TestHostColumnInAFleet(t *testing.T) {
	m := newTable(t, 120, 20, some()...)
	if strings.Contains(ansi.Strip(m.View()), "HOST") {
		t.Errorf("a HOST column with no fleet:\n%s", ansi.Strip(m.View()))
	}
	ss := some()
	for i := range ss {
		ss[i].Host = "h1"
	}
	ss[0].Host, ss[0].State = "h2", session.StateUnreachable
	m = newTable(t, 120, 20, ss...)
	lines := strings.Split(ansi.Strip(m.View()), "\n")
	if h := strings.Fields(lines[0]); len(h) < 3 || !strings.HasPrefix(h[0], "NAME") || h[1] != "HOST" {
		t.Fatalf("header %v, want NAME HOST …", h)
	}
	view := strings.Join(lines, "\n")
	if !strings.Contains(view, "h2") || !strings.Contains(view, "? unreachable ") {
		t.Errorf("the unreachable session and its host are not shown:\n%s", view)
	}
}

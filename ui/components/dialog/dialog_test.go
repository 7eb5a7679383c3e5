package dialog

import (
	"errors"
	"strings"
	"testing"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/colorprofile"
	"github.com/charmbracelet/x/ansi"

	"github.com/berthvm/berth/ui/common"
	"github.com/berthvm/berth/ui/internal/uitest"
)

var keys uitest.Coverage

func TestMain(m *testing.M) {
	uitest.Main(m, &keys, map[string]any{"dialog.KeyMap": DefaultKeyMap()})
}

func cm(t *testing.T) *common.Common {
	return &common.Common{Ctx: t.Context(), Styles: common.NewStyles(true, colorprofile.Ascii)}
}

type doneMsg struct{}

func done() tea.Cmd { return func() tea.Msg { return doneMsg{} } }

func TestConfirm(t *testing.T) {
	for _, c := range []struct {
		key string
		ok  bool
	}{{"y", true}, {"enter", true}, {"n", false}, {"esc", false}} {
		fired := false
		d := NewConfirm(cm(t), "Stop x?", []string{"body text"}, func() tea.Cmd { fired = true; return done() })
		d.SetSize(100, 30)
		if !strings.Contains(ansi.Strip(d.View()), "body text") {
			t.Fatal("no body")
		}
		d.Update(keys.Key("j")) // ignored
		if d.Done() {
			t.Fatal("j closed the dialog")
		}
		d.Update(keys.Key(c.key))
		if !d.Done() || fired != c.ok {
			t.Errorf("%s: done %v fired %v", c.key, d.Done(), fired)
		}
	}
}

func TestTypedConfirm(t *testing.T) {
	fired := false
	d, _ := NewTypedConfirm(cm(t), "Delete alpha?", []string{"gone"}, "alpha", func() tea.Cmd { fired = true; return nil })
	d.SetSize(100, 30)
	d.Update(keys.Key("y")) // typed, not a confirmation
	d.Update(keys.Key("enter"))
	if d.Done() || fired || !strings.Contains(ansi.Strip(d.View()), "type alpha exactly") {
		t.Fatalf("confirmed with %q", "y")
	}
	d.Update(keys.Key("backspace"))
	for _, k := range uitest.Type("alpha") {
		d.Update(k)
	}
	d.Update(keys.Key("enter"))
	if !d.Done() || !fired {
		t.Fatal("typing the name did not confirm")
	}
	d, _ = NewTypedConfirm(cm(t), "Delete alpha?", nil, "alpha", func() tea.Cmd { t.Fatal("fired"); return nil })
	d.Update(keys.Key("esc"))
	if !d.Done() {
		t.Fatal("esc did not cancel")
	}
}

func TestForm(t *testing.T) {
	var got []string
	f, _ := NewForm(cm(t), "New", "a note", []Field{{Label: "name"}, {Label: "cpus", Value: "2"}, {Label: "image"}}, func(v []string) (tea.Cmd, error) {
		if v[0] == "" {
			return nil, errors.New("name is required")
		}
		got = v
		return nil, nil
	})
	f.SetSize(80, 24)
	f.Update(keys.Key("enter"))
	if f.Done() || f.Err() != "name is required" || !strings.Contains(ansi.Strip(f.View()), "name is required") {
		t.Fatalf("validation: done %v err %q", f.Done(), f.Err())
	}
	for _, k := range uitest.Type("web") {
		f.Update(k)
	}
	f.Update(keys.Key("tab"))
	f.Update(keys.Key("backspace"))
	f.Update(keys.Key("4"))
	f.Update(keys.Key("down"))
	f.Update(keys.Key("up"))
	f.Update(keys.Key("shift+tab"))
	f.Update(keys.Key("shift+tab")) // wraps to image
	for _, k := range uitest.Type("mini") {
		f.Update(k)
	}
	f.Update(keys.Key("enter"))
	if !f.Done() || strings.Join(got, ",") != "web,4,mini" {
		t.Fatalf("submitted %q", got)
	}
	f, _ = NewForm(cm(t), "Run", "", []Field{{Label: "$"}}, func([]string) (tea.Cmd, error) { t.Fatal("submitted"); return nil, nil })
	if f.Keys().Next.Enabled() {
		t.Fatal("tab enabled in a one-field form")
	}
	f.Update(keys.Key("esc"))
	if !f.Done() {
		t.Fatal("esc did not cancel")
	}
}

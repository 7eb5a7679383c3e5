// Package dialog has the modal dialogs: a yes/no confirmation, a
// confirmation that requires typing a word (the session's name, before a
// delete), and a small form (new session, run a command). A dialog holds
// the focus until it is done; its outcome is a Cmd built by the caller's
// closure, so dialogs stay independent of what they confirm.
package dialog

import (
	"strings"

	"charm.land/bubbles/v2/key"
	"charm.land/bubbles/v2/textinput"
	tea "charm.land/bubbletea/v2"
	"charm.land/lipgloss/v2"

	"github.com/berthvm/berth/ui/common"
)

// Dialog is a modal component.
type Dialog interface {
	common.Component
	// Done reports that the dialog was confirmed or cancelled and can be
	// dropped.
	Done() bool
}

// KeyMap are the dialog keys.
type KeyMap struct {
	Yes    key.Binding
	No     key.Binding
	Submit key.Binding
	Cancel key.Binding
	Next   key.Binding
	Prev   key.Binding
}

// DefaultKeyMap returns the dialog bindings.
func DefaultKeyMap() KeyMap {
	return KeyMap{
		Yes:    key.NewBinding(key.WithKeys("y", "enter"), key.WithHelp("y/enter", "confirm")),
		No:     key.NewBinding(key.WithKeys("n", "esc"), key.WithHelp("n/esc", "cancel")),
		Submit: key.NewBinding(key.WithKeys("enter"), key.WithHelp("enter", "submit")),
		Cancel: key.NewBinding(key.WithKeys("esc"), key.WithHelp("esc", "cancel")),
		Next:   key.NewBinding(key.WithKeys("tab", "down"), key.WithHelp("tab", "next field")),
		Prev:   key.NewBinding(key.WithKeys("shift+tab", "up"), key.WithHelp("shift+tab", "previous field")),
	}
}

// maxWidth bounds dialog boxes so they read as dialogs on wide terminals.
const maxWidth = 64

func boxWidth(w int) int { return common.Clamp(w-4, 20, maxWidth) }

// Confirm asks a yes/no question, or, when Word is set, requires typing
// Word (for irreversible actions: typing the name proves the operator
// means this session, not the one the cursor happened to be on).
type Confirm struct {
	c     *common.Common
	keys  KeyMap
	title string
	body  []string
	word  string
	input textinput.Model
	on    func() tea.Cmd
	done  bool
	err   string
	w, h  int
}

var _ Dialog = (*Confirm)(nil)

// NewConfirm returns a yes/no dialog; on runs when confirmed.
func NewConfirm(c *common.Common, title string, body []string, on func() tea.Cmd) *Confirm {
	return &Confirm{c: c, keys: DefaultKeyMap(), title: title, body: body, on: on}
}

// NewTypedConfirm returns a dialog that requires typing word.
func NewTypedConfirm(c *common.Common, title string, body []string, word string, on func() tea.Cmd) (*Confirm, tea.Cmd) {
	d := NewConfirm(c, title, body, on)
	d.word = word
	d.input = textinput.New()
	d.input.Prompt = "> "
	d.input.SetStyles(c.Styles.Input)
	// No placeholder: a greyed-out name reads as already typed on a
	// terminal without colour.
	return d, d.input.Focus()
}

// Keys returns the key map.
func (d *Confirm) Keys() KeyMap { return d.keys }

// Done implements Dialog.
func (d *Confirm) Done() bool { return d.done }

// Capturing implements common.Capturer.
func (d *Confirm) Capturing() bool { return true }

// SetSize implements common.Component.
func (d *Confirm) SetSize(w, h int) {
	d.w, d.h = w, h
	d.input.SetWidth(boxWidth(w) - 6)
}

// ShortHelp implements help.KeyMap.
func (d *Confirm) ShortHelp() []key.Binding {
	if d.word != "" {
		return []key.Binding{d.keys.Submit, d.keys.Cancel}
	}
	return []key.Binding{d.keys.Yes, d.keys.No}
}

// FullHelp implements help.KeyMap.
func (d *Confirm) FullHelp() [][]key.Binding { return [][]key.Binding{d.ShortHelp()} }

// Update implements common.Component.
func (d *Confirm) Update(msg tea.Msg) tea.Cmd {
	k, ok := msg.(tea.KeyPressMsg)
	if !ok {
		return nil
	}
	if d.word == "" {
		switch {
		case key.Matches(k, d.keys.Yes):
			d.done = true
			return d.on()
		case key.Matches(k, d.keys.No):
			d.done = true
		}
		return nil
	}
	switch {
	case key.Matches(k, d.keys.Submit):
		if strings.TrimSpace(d.input.Value()) != d.word {
			d.err = "type " + d.word + " exactly to confirm"
			return nil
		}
		d.done = true
		return d.on()
	case key.Matches(k, d.keys.Cancel):
		d.done = true
		return nil
	}
	var cmd tea.Cmd
	d.input, cmd = d.input.Update(k)
	d.err = ""
	return cmd
}

// View implements common.Component.
func (d *Confirm) View() string {
	st := d.c.Styles
	w := boxWidth(d.w)
	inner := w - 4
	var lines []string
	lines = append(lines, st.DialogHead.Render(d.title), "")
	for _, b := range d.body {
		lines = append(lines, lipgloss.NewStyle().Width(inner).Render(b))
	}
	lines = append(lines, "")
	if d.word != "" {
		lines = append(lines, "Type "+st.Bold.Render(d.word)+" to confirm:", d.input.View())
		if d.err != "" {
			lines = append(lines, st.FlashErr.Render(d.err))
		}
		lines = append(lines, "", st.Muted.Render("enter confirm · esc cancel"))
	} else {
		lines = append(lines, st.Key.Render("y")+" confirm   "+st.Key.Render("n")+" cancel")
	}
	return st.Dialog.Width(w).Render(strings.Join(lines, "\n"))
}

// Field is one form input.
type Field struct {
	Label       string
	Placeholder string
	Value       string
	// Hint is shown under the field.
	Hint string
}

// Form is a set of labelled inputs submitted together.
type Form struct {
	c      *common.Common
	keys   KeyMap
	title  string
	note   string
	fields []Field
	inputs []textinput.Model
	focus  int
	on     func(values []string) (tea.Cmd, error)
	done   bool
	err    string
	w, h   int
}

var _ Dialog = (*Form)(nil)

// NewForm returns a form; on validates and submits the values (in field
// order). An error keeps the form open and is shown in it.
func NewForm(c *common.Common, title, note string, fields []Field, on func([]string) (tea.Cmd, error)) (*Form, tea.Cmd) {
	f := &Form{c: c, keys: DefaultKeyMap(), title: title, note: note, fields: fields, on: on}
	for _, fl := range fields {
		in := textinput.New()
		in.Prompt = ""
		in.Placeholder = fl.Placeholder
		in.SetValue(fl.Value)
		in.SetStyles(c.Styles.Input)
		f.inputs = append(f.inputs, in)
	}
	if len(fields) == 1 {
		f.keys.Next.SetEnabled(false)
		f.keys.Prev.SetEnabled(false)
	}
	return f, f.inputs[0].Focus()
}

// Keys returns the key map.
func (f *Form) Keys() KeyMap { return f.keys }

// Done implements Dialog.
func (f *Form) Done() bool { return f.done }

// Capturing implements common.Capturer.
func (f *Form) Capturing() bool { return true }

// Values returns the current values.
func (f *Form) Values() []string {
	out := make([]string, len(f.inputs))
	for i, in := range f.inputs {
		out[i] = in.Value()
	}
	return out
}

// Err returns the shown validation error.
func (f *Form) Err() string { return f.err }

// SetSize implements common.Component.
func (f *Form) SetSize(w, h int) {
	f.w, f.h = w, h
	for i := range f.inputs {
		f.inputs[i].SetWidth(boxWidth(w) - 4 - f.labelWidth() - 2)
	}
}

func (f *Form) labelWidth() int {
	n := 0
	for _, fl := range f.fields {
		n = max(n, lipgloss.Width(fl.Label))
	}
	return n
}

// ShortHelp implements help.KeyMap.
func (f *Form) ShortHelp() []key.Binding {
	return common.Enabled(f.keys.Submit, f.keys.Next, f.keys.Cancel)
}

// FullHelp implements help.KeyMap.
func (f *Form) FullHelp() [][]key.Binding {
	return [][]key.Binding{common.Enabled(f.keys.Submit, f.keys.Next, f.keys.Prev, f.keys.Cancel)}
}

func (f *Form) setFocus(i int) tea.Cmd {
	f.inputs[f.focus].Blur()
	f.focus = (i + len(f.inputs)) % len(f.inputs)
	return f.inputs[f.focus].Focus()
}

// Update implements common.Component.
func (f *Form) Update(msg tea.Msg) tea.Cmd {
	if k, ok := msg.(tea.KeyPressMsg); ok {
		switch {
		case key.Matches(k, f.keys.Submit):
			cmd, err := f.on(f.Values())
			if err != nil {
				f.err = err.Error()
				return nil
			}
			f.done = true
			return cmd
		case key.Matches(k, f.keys.Cancel):
			f.done = true
			return nil
		case key.Matches(k, f.keys.Next):
			return f.setFocus(f.focus + 1)
		case key.Matches(k, f.keys.Prev):
			return f.setFocus(f.focus - 1)
		}
		f.err = ""
	}
	var cmd tea.Cmd
	f.inputs[f.focus], cmd = f.inputs[f.focus].Update(msg)
	return cmd
}

// View implements common.Component.
func (f *Form) View() string {
	st := f.c.Styles
	w := boxWidth(f.w)
	lw := f.labelWidth()
	lines := []string{st.DialogHead.Render(f.title), ""}
	if f.note != "" {
		lines = append(lines, st.DialogWarn.Width(w-4).Render(f.note), "")
	}
	for i, fl := range f.fields {
		label := common.Fit(fl.Label, lw)
		if i == f.focus {
			label = st.Key.Render(label)
		} else {
			label = st.Muted.Render(label)
		}
		lines = append(lines, label+"  "+f.inputs[i].View())
		if fl.Hint != "" && i == f.focus {
			lines = append(lines, strings.Repeat(" ", lw+2)+st.Muted.Render(fl.Hint))
		}
	}
	if f.err != "" {
		lines = append(lines, "", st.FlashErr.Width(w-4).Render(f.err))
	}
	help := "enter submit · esc cancel"
	if len(f.fields) > 1 {
		help = "enter submit · tab next field · esc cancel"
	}
	lines = append(lines, "", st.Muted.Render(help))
	return st.Dialog.Width(w).Render(strings.Join(lines, "\n"))
}

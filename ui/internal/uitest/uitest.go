// Package uitest has helpers for the TUI's tests: key messages from key
// names, running Cmds, and a key-coverage check that fails when a key in a
// key map (and therefore in the help) is never pressed by any test.
package uitest

import (
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
)

// named returns the key code of a named key.
func named(name string) (rune, bool) {
	m := map[string]rune{
		"enter": tea.KeyEnter, "tab": tea.KeyTab, "esc": tea.KeyEscape, "backspace": tea.KeyBackspace,
		"up": tea.KeyUp, "down": tea.KeyDown, "left": tea.KeyLeft, "right": tea.KeyRight,
		"home": tea.KeyHome, "end": tea.KeyEnd, "pgup": tea.KeyPgUp, "pgdown": tea.KeyPgDown,
		"delete": tea.KeyDelete, "space": tea.KeySpace, "f1": tea.KeyF1,
	}
	r, ok := m[name]
	return r, ok
}

// Key returns the key press whose String() is s ("j", "G", "ctrl+d",
// "shift+tab", "enter", "?").
func Key(s string) tea.KeyPressMsg {
	var mod tea.KeyMod
	name := s
	if len(s) > 1 {
		parts := strings.Split(s, "+")
		name = parts[len(parts)-1]
		if name == "" { // "ctrl++" style; not used
			name = "+"
		}
		for _, p := range parts[:len(parts)-1] {
			switch p {
			case "ctrl":
				mod |= tea.ModCtrl
			case "alt":
				mod |= tea.ModAlt
			case "shift":
				mod |= tea.ModShift
			}
		}
	}
	if code, ok := named(name); ok {
		k := tea.KeyPressMsg{Code: code, Mod: mod}
		if code == tea.KeySpace && mod == 0 {
			k.Text = " "
		}
		return k
	}
	r := []rune(name)[0]
	if mod != 0 {
		return tea.KeyPressMsg{Code: r, Mod: mod}
	}
	return tea.KeyPressMsg{Code: r, Text: name}
}

// Type returns one key press per rune of s, as a typist would send them.
func Type(s string) []tea.KeyPressMsg {
	var out []tea.KeyPressMsg
	for _, r := range s {
		if r == ' ' {
			out = append(out, Key("space"))
			continue
		}
		out = append(out, tea.KeyPressMsg{Code: r, Text: string(r)})
	}
	return out
}

// Coverage records the keys tests press, to check key maps against.
type Coverage struct {
	mu      sync.Mutex
	pressed map[string]bool
}

// Key records s as pressed and returns its message.
func (c *Coverage) Key(s string) tea.KeyPressMsg {
	k := Key(s)
	c.mu.Lock()
	if c.pressed == nil {
		c.pressed = map[string]bool{}
	}
	c.pressed[k.String()] = true
	c.mu.Unlock()
	return k
}

// Missing returns the help labels of bindings none of whose keys was
// pressed. km is a key map struct (its key.Binding fields are checked,
// enabled or not, so bindings hidden in some modes are covered too).
func (c *Coverage) Missing(km any) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, b := range Bindings(km) {
		if !slices.ContainsFunc(b.Keys(), func(k string) bool { return c.pressed[k] }) {
			out = append(out, b.Help().Key+" ("+b.Help().Desc+")")
		}
	}
	return out
}

// Bindings returns every key.Binding field of a key map struct (or
// pointer to one), in field order, including embedded key maps. A
// []key.Binding (a table's keys) is returned as it is.
func Bindings(km any) []key.Binding {
	if bs, ok := km.([]key.Binding); ok {
		return bs
	}
	v := reflect.Indirect(reflect.ValueOf(km))
	var out []key.Binding
	bt := reflect.TypeFor[key.Binding]()
	for i := range v.NumField() {
		f := v.Field(i)
		switch {
		case f.Type() == bt:
			out = append(out, f.Interface().(key.Binding))
		case f.Kind() == reflect.Struct && v.Type().Field(i).Anonymous:
			out = append(out, Bindings(f.Interface())...)
		}
	}
	return out
}

// Run runs cmd (and the Cmds of nested batches, concurrently, as Bubble
// Tea does) and returns the messages that arrive within d. Cmds that block
// longer (ticks, streams) are abandoned.
func Run(cmd tea.Cmd, d time.Duration) []tea.Msg {
	if cmd == nil {
		return nil
	}
	out := make(chan tea.Msg, 1024)
	var wg sync.WaitGroup
	var spawn func(c tea.Cmd)
	spawn = func(c tea.Cmd) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			msg := c()
			if b, ok := msg.(tea.BatchMsg); ok {
				for _, cc := range b {
					if cc != nil {
						spawn(cc)
					}
				}
				return
			}
			if msg != nil {
				out <- msg
			}
		}()
	}
	spawn(cmd)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	deadline := time.After(d)
	var msgs []tea.Msg
	for {
		select {
		case m := <-out:
			msgs = append(msgs, m)
		case <-done:
			for {
				select {
				case m := <-out:
					msgs = append(msgs, m)
				default:
					return msgs
				}
			}
		case <-deadline:
			return msgs
		}
	}
}

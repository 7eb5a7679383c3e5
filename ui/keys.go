package ui

import "charm.land/bubbles/v2/key"

// KeyMap are the root's global keys.
type KeyMap struct {
	Quit    key.Binding
	Help    key.Binding
	Command key.Binding
	Back    key.Binding
	NextTab key.Binding
	PrevTab key.Binding
	Tab1    key.Binding
	Tab2    key.Binding
	Tab3    key.Binding
	Tab4    key.Binding
}

// DefaultKeyMap returns the global bindings.
func DefaultKeyMap() KeyMap {
	return KeyMap{
		Quit:    key.NewBinding(key.WithKeys("q", "ctrl+c"), key.WithHelp("q", "quit")),
		Help:    key.NewBinding(key.WithKeys("?"), key.WithHelp("?", "help")),
		Command: key.NewBinding(key.WithKeys(":"), key.WithHelp(":", "command line")),
		Back:    key.NewBinding(key.WithKeys("esc"), key.WithHelp("esc", "back")),
		NextTab: key.NewBinding(key.WithKeys("tab"), key.WithHelp("tab", "next tab")),
		PrevTab: key.NewBinding(key.WithKeys("shift+tab"), key.WithHelp("shift+tab", "previous tab")),
		Tab1:    key.NewBinding(key.WithKeys("1"), key.WithHelp("1", "executions")),
		Tab2:    key.NewBinding(key.WithKeys("2"), key.WithHelp("2", "output")),
		Tab3:    key.NewBinding(key.WithKeys("3"), key.WithHelp("3", "workspace")),
		Tab4:    key.NewBinding(key.WithKeys("4"), key.WithHelp("4", "info")),
	}
}

// ActionKeys are the keys that change sessions. All of them are disabled
// (hidden from help and refused) in read-only mode.
type ActionKeys struct {
	PauseResume key.Binding
	Sleep       key.Binding
	Flush       key.Binding
	StopStart   key.Binding
	Delete      key.Binding
	New         key.Binding
	Exec        key.Binding
	CancelExec  key.Binding
}

// DefaultActionKeys returns the action bindings.
func DefaultActionKeys() ActionKeys {
	return ActionKeys{
		PauseResume: key.NewBinding(key.WithKeys("p"), key.WithHelp("p", "pause/resume (does not flush)")),
		Sleep:       key.NewBinding(key.WithKeys("S"), key.WithHelp("S", "sleep/wake (snapshot to disk)")),
		Flush:       key.NewBinding(key.WithKeys("f"), key.WithHelp("f", "flush workspace")),
		StopStart:   key.NewBinding(key.WithKeys("s"), key.WithHelp("s", "stop/start")),
		Delete:      key.NewBinding(key.WithKeys("d"), key.WithHelp("d", "delete session")),
		New:         key.NewBinding(key.WithKeys("n"), key.WithHelp("n", "new session")),
		Exec:        key.NewBinding(key.WithKeys("x"), key.WithHelp("x", "run command")),
		CancelExec:  key.NewBinding(key.WithKeys("K"), key.WithHelp("K", "cancel execution")),
	}
}

func (a ActionKeys) all() []key.Binding {
	return []key.Binding{a.PauseResume, a.Sleep, a.Flush, a.StopStart, a.Delete, a.New, a.Exec, a.CancelExec}
}

// CmdKeys apply while the command line is open.
type CmdKeys struct {
	Run    key.Binding
	Cancel key.Binding
}

// DefaultCmdKeys returns the command line bindings.
func DefaultCmdKeys() CmdKeys {
	return CmdKeys{
		Run:    key.NewBinding(key.WithKeys("enter"), key.WithHelp("enter", "run command")),
		Cancel: key.NewBinding(key.WithKeys("esc"), key.WithHelp("esc", "close command line")),
	}
}

package ui

import "charm.land/bubbles/v2/key"

// KeyMap are the root's global keys. The keys of actions are in the
// action table (actions.go).
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
	Tab5    key.Binding // the Runs tab, once there are runs
	// Tabs is how help shows Tab1…Tab5: one line, so help fits a
	// terminal of 24 rows.
	Tabs key.Binding
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
		Tab5:    key.NewBinding(key.WithKeys("5"), key.WithHelp("5", "runs")),
		Tabs:    key.NewBinding(key.WithKeys("1", "2", "3", "4", "5"), key.WithHelp("1-5", "executions, output, workspace, info, runs")),
	}
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

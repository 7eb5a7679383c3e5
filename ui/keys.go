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
	// Hosts opens the hosts page from the sessions page; disabled where
	// the service lists no hosts.
	Hosts key.Binding
	// Tabs is how help shows Tab1…Tab5: one short line, so the global
	// keys sit beside the others at 80 columns.
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
		Hosts:   key.NewBinding(key.WithKeys("H"), key.WithHelp("H", "hosts of the fleet")),
		Tabs:    key.NewBinding(key.WithKeys("1", "2", "3", "4", "5"), key.WithHelp("1-5", "go to tab (numbered above)")),
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

// HelpKeys apply while the help is open. Only Close closes it, so a key
// pressed to scroll never closes it, nor does anything else.
type HelpKeys struct {
	Up       key.Binding
	Down     key.Binding
	PageUp   key.Binding
	PageDown key.Binding
	HalfUp   key.Binding
	HalfDown key.Binding
	Top      key.Binding
	Bottom   key.Binding
	Close    key.Binding
}

// DefaultHelpKeys returns the help's bindings.
func DefaultHelpKeys() HelpKeys {
	return HelpKeys{
		Up:       key.NewBinding(key.WithKeys("up", "k"), key.WithHelp("↑/k", "scroll up")),
		Down:     key.NewBinding(key.WithKeys("down", "j"), key.WithHelp("↓/j", "scroll down")),
		PageUp:   key.NewBinding(key.WithKeys("pgup"), key.WithHelp("pgup", "page up")),
		PageDown: key.NewBinding(key.WithKeys("pgdown", "space"), key.WithHelp("pgdn", "page down")),
		HalfUp:   key.NewBinding(key.WithKeys("ctrl+u"), key.WithHelp("ctrl+u", "half page up")),
		HalfDown: key.NewBinding(key.WithKeys("ctrl+d"), key.WithHelp("ctrl+d", "half page down")),
		Top:      key.NewBinding(key.WithKeys("g", "home"), key.WithHelp("g", "top")),
		Bottom:   key.NewBinding(key.WithKeys("G", "end"), key.WithHelp("G", "bottom")),
		Close:    key.NewBinding(key.WithKeys("?", "esc", "q"), key.WithHelp("?/esc/q", "close help")),
	}
}

// footer is what the footer shows while the help is open.
func (k HelpKeys) footer() []key.Binding {
	scroll := key.NewBinding(key.WithKeys("up", "down"), key.WithHelp("↑/↓ pgup/pgdn", "scroll"))
	return []key.Binding{k.Close, scroll}
}

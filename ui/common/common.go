// Package common holds what every berth TUI component shares: the Component
// interface, the Common context (service, styles, clock), messages that cross
// component boundaries, and small rendering helpers.
package common

import (
	"context"
	"log/slog"
	"time"

	"charm.land/bubbles/v2/help"
	tea "charm.land/bubbletea/v2"

	"github.com/berthvm/berth/session"
)

// Component is what the root model composes (the soft-serve pattern): it
// updates in place, renders to a string of exactly the size it was given,
// and derives its help from its key map, so help cannot drift from the keys
// it handles. Only the root does layout.
type Component interface {
	help.KeyMap
	// Update handles a message. It never blocks: I/O happens in the
	// returned Cmd, whose result comes back as a typed message.
	Update(msg tea.Msg) tea.Cmd
	View() string
	SetSize(width, height int)
}

// Capturer is implemented by components that can hold text input focus
// (a filter or search prompt). While Capturing is true the root hands them
// every key except ctrl+c, so typing "q" into a filter does not quit.
type Capturer interface {
	Capturing() bool
}

// Common is shared by the root model and its components. One Common exists
// per program (per SSH connection), never per process.
type Common struct {
	// Ctx is the program's lifetime: background work (the event stream,
	// output followers, pending calls) ends when it is done. It is a
	// lifetime context owned by the root model, not a request context.
	Ctx context.Context
	// Svc is the session service (in-process Manager or socket client)
	// the root model acts with. Components do not use it: each is given
	// the part of the service it calls (session.Execer, session.Files...).
	Svc session.Service
	// Styles is replaced in place when the terminal's background or colour
	// profile becomes known; components read it at render time.
	Styles *Styles
	Logger *slog.Logger
	// Now is the clock; tests fix it so uptimes and ages are stable.
	Now func() time.Time
	// ReadOnly hides and refuses every mutating action (SSH viewer role).
	ReadOnly bool
	// CallTimeout bounds quick calls (listing, reading, browsing) so a
	// wedged VM or daemon shows an error instead of a spinner forever.
	CallTimeout time.Duration
}

// DefaultCallTimeout is used when Common.CallTimeout is zero.
const DefaultCallTimeout = 5 * time.Second

// Call returns a context for one quick service call.
func (c *Common) Call() (context.Context, context.CancelFunc) {
	d := c.CallTimeout
	if d <= 0 {
		d = DefaultCallTimeout
	}
	return context.WithTimeout(c.Ctx, d)
}

// FlashKind classifies a flash message.
type FlashKind int

const (
	FlashInfo FlashKind = iota
	FlashOK
	FlashError
)

// FlashMsg asks the root to show a transient message in the status line.
type FlashMsg struct {
	Kind FlashKind
	Text string
}

// OpenSessionMsg asks the root to open a session's detail view.
type OpenSessionMsg struct{ Name string }

// UndoRunMsg asks the root to undo a run: the paths named, or, with none,
// the whole workspace. The root asks its action table (read-only mode, the
// role, the session's state) and the typed confirmation, as for restore.
type UndoRunMsg struct {
	Session string
	Run     string
	Paths   []string
}

// RunUndoneMsg tells the components that a run was undone (whole or in
// part): what shows its changes reloads them.
type RunUndoneMsg struct{ Run string }

// OpenOutputMsg asks the root to show an execution in the Output tab. Proc
// is set when the UI itself started the execution and already holds its
// output stream; otherwise the Output view attaches to it.
type OpenOutputMsg struct {
	Exec session.Execution
	Proc session.Process
}

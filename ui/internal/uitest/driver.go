package uitest

import (
	"sync"
	"time"

	tea "charm.land/bubbletea/v2"
)

// Driver runs a model the way a Bubble Tea program does, minus the
// terminal: Cmds run in goroutines and their messages are fed back to
// Update. Settle processes messages until none arrives for a short quiet
// period, so a test sees the model after its I/O (against a fake service)
// is done. Long-running Cmds (tickers, streams) simply deliver later.
type Driver struct {
	Model tea.Model
	// Quiet is how long Settle waits for another message.
	Quiet time.Duration
	// Quit is set once a Cmd returned tea.QuitMsg.
	Quit bool

	msgs chan tea.Msg
	done chan struct{}
	once sync.Once
}

// NewDriver starts m (Init) and settles.
func NewDriver(m tea.Model) *Driver {
	d := &Driver{Model: m, Quiet: 25 * time.Millisecond, msgs: make(chan tea.Msg, 4096), done: make(chan struct{})}
	d.exec(m.Init())
	d.Settle()
	return d
}

// Close stops delivering messages from Cmds still running.
func (d *Driver) Close() { d.once.Do(func() { close(d.done) }) }

func (d *Driver) exec(cmd tea.Cmd) {
	if cmd == nil {
		return
	}
	go func() {
		msg := cmd()
		if b, ok := msg.(tea.BatchMsg); ok {
			for _, c := range b {
				d.exec(c)
			}
			return
		}
		if msg == nil {
			return
		}
		select {
		case d.msgs <- msg:
		case <-d.done:
		}
	}()
}

// Send delivers messages in order, then settles.
func (d *Driver) Send(msgs ...tea.Msg) {
	for _, msg := range msgs {
		d.update(msg)
	}
	d.Settle()
}

// SendNow delivers a message without settling and returns its Cmd's
// direct messages unprocessed (for asserting what a key returns).
func (d *Driver) update(msg tea.Msg) {
	if _, ok := msg.(tea.QuitMsg); ok {
		d.Quit = true
		return
	}
	m, cmd := d.Model.Update(msg)
	d.Model = m
	d.exec(cmd)
}

// Settle processes messages until Quiet passes without one.
func (d *Driver) Settle() {
	t := time.NewTimer(d.Quiet)
	defer t.Stop()
	for {
		select {
		case msg := <-d.msgs:
			d.update(msg)
			if !t.Stop() {
				select {
				case <-t.C:
				default:
				}
			}
			t.Reset(d.Quiet)
		case <-t.C:
			return
		}
	}
}

// WaitFor settles until cond holds or timeout passes; it reports whether
// cond held.
func (d *Driver) WaitFor(cond func() bool, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		d.Settle()
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// Component adapts a component to tea.Model, so a Driver can run it.
type Component struct {
	C interface {
		Update(tea.Msg) tea.Cmd
		View() string
	}
	Init_ tea.Cmd
}

func (c *Component) Init() tea.Cmd                           { return c.Init_ }
func (c *Component) Update(msg tea.Msg) (tea.Model, tea.Cmd) { return c, c.C.Update(msg) }
func (c *Component) View() tea.View                          { return tea.NewView(c.C.View()) }

// Exec runs a Cmd obtained by calling the model directly (between
// Sends, the model is not in use) and settles.
func (d *Driver) Exec(cmd tea.Cmd) {
	d.exec(cmd)
	d.Settle()
}

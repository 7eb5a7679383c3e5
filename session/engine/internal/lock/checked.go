//go:build lockcheck

package lock

import (
	deadlock "github.com/sasha-s/go-deadlock"
)

type mutex = deadlock.Mutex

// Checked reports whether lock orders are checked (the lockcheck tag).
const Checked = true

func init() {
	// The engine holds a session's lifecycle lock for a whole boot (a
	// minute under TCG is not a deadlock): only the order is checked here,
	// and callers bound their own waits. An inversion prints both orders'
	// stacks and exits the process with status 2 (go-deadlock's default):
	// a panic could be recovered by net/http with the checker's own lock
	// still held.
	deadlock.Opts.DeadlockTimeout = 0
}

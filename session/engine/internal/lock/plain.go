//go:build !lockcheck

package lock

import "sync"

type mutex = sync.Mutex

// Checked reports whether lock orders are checked (the lockcheck tag).
const Checked = false

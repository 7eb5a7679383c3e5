// Package lock is the mutex of berth's engine: a sync.Mutex whose lock
// order is checked in tests and whose hold time is watched in debug mode.
//
// Built with the tag lockcheck (make test builds every package so),
// every Mutex goes through github.com/sasha-s/go-deadlock, which fails the
// process as soon as two locks have been taken in both orders by any
// goroutines, whether or not the two ever collided. Without the tag it is a
// sync.Mutex and a nil check.
//
// A Mutex given a Watch reports, through the Watch's logger, every hold
// longer than the Watch's bound: once while it is still held (with the
// stack that took it, so a freeze names its holder) and once when it is
// released.
package lock

import (
	"context"
	"log/slog"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Mutex is a mutual exclusion lock. The zero value is unlocked and
// unwatched. It must not be copied after first use.
type Mutex struct {
	mu   mutex
	w    *Watch
	name string
}

// Watch makes w watch l's holds, under name. It is called before l is
// first used; a nil w leaves l unwatched.
func (l *Mutex) Watch(w *Watch, name string) {
	l.w, l.name = w, name
}

// Lock locks l.
func (l *Mutex) Lock() {
	l.mu.Lock()
	if l.w != nil {
		l.w.acquired(l)
	}
}

// TryLock tries to lock l and reports whether it did.
func (l *Mutex) TryLock() bool {
	if !l.mu.TryLock() {
		return false
	}
	if l.w != nil {
		l.w.acquired(l)
	}
	return true
}

// Unlock unlocks l.
func (l *Mutex) Unlock() {
	if l.w != nil {
		l.w.released(l)
	}
	l.mu.Unlock()
}

// Watch keeps the holders of its mutexes and reports holds longer than
// its bound. Its own lock is a leaf: nothing is locked while it is held.
type Watch struct {
	bound time.Duration
	log   *slog.Logger

	mu   sync.Mutex
	held map[*Mutex]*hold
}

type hold struct {
	since    time.Time
	pcs      []uintptr
	reported bool
}

// NewWatch returns a Watch that reports holds longer than bound to log.
// Run reports the holds that have not ended yet.
func NewWatch(bound time.Duration, log *slog.Logger) *Watch {
	return &Watch{bound: bound, log: log, held: map[*Mutex]*hold{}}
}

func (w *Watch) acquired(l *Mutex) {
	pcs := make([]uintptr, 32)
	// Skip runtime.Callers, acquired and Lock: the stack starts at the caller.
	pcs = pcs[:runtime.Callers(3, pcs)]
	w.mu.Lock()
	w.held[l] = &hold{since: time.Now(), pcs: pcs}
	w.mu.Unlock()
}

func (w *Watch) released(l *Mutex) {
	w.mu.Lock()
	h := w.held[l]
	delete(w.held, l)
	w.mu.Unlock()
	if h == nil {
		return
	}
	if d := time.Since(h.since); d > w.bound {
		w.log.Warn("lock held too long", "lock", l.name, "held", d.Round(time.Millisecond), "bound", w.bound, "taken at", stack(h.pcs))
	}
}

// Run reports, until ctx ends, each hold that has lasted longer than the
// bound and not ended yet, once a hold: a lock that is never released
// still gets its line.
func (w *Watch) Run(ctx context.Context) {
	t := time.NewTicker(max(w.bound/2, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, r := range w.Overdue() {
			w.log.Warn("lock still held", "lock", r.Lock, "held", r.Held.Round(time.Millisecond), "bound", w.bound, "taken at", r.Stack)
		}
	}
}

// Overdue is a hold over the bound.
type Overdue struct {
	Lock  string
	Held  time.Duration
	Stack string
}

// Overdue returns the holds over the bound not reported before, and marks
// them reported.
func (w *Watch) Overdue() []Overdue {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []Overdue
	for l, h := range w.held {
		if d := time.Since(h.since); d > w.bound && !h.reported {
			h.reported = true
			out = append(out, Overdue{Lock: l.name, Held: d, Stack: stack(h.pcs)})
		}
	}
	return out
}

// stack formats program counters as "func file:line" frames, innermost
// first, separated by " < ".
func stack(pcs []uintptr) string {
	var b strings.Builder
	frames := runtime.CallersFrames(pcs)
	for {
		f, more := frames.Next()
		if b.Len() > 0 {
			b.WriteString(" < ")
		}
		b.WriteString(f.Function)
		b.WriteString(" ")
		b.WriteString(shortFile(f.File))
		b.WriteString(":")
		b.WriteString(strconv.Itoa(f.Line))
		if !more {
			break
		}
	}
	return b.String()
}

func shortFile(p string) string {
	if i := strings.LastIndex(p, "/"); i >= 0 {
		if j := strings.LastIndex(p[:i], "/"); j >= 0 {
			return p[j+1:]
		}
	}
	return p
}

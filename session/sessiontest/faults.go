package sessiontest

import (
	"context"
	"time"
)

// Faults a test can inject, and a record of the calls made. Methods are
// named as on session.Service ("Pause", "ListDir").

// FailNext makes the next call of method fail with err, before it does
// anything. It replaces an earlier FailNext of the same method.
func (f *Fake) FailNext(method string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail[method] = err
}

// Hang makes every later call of the named methods block until its
// context ends (or the Fake is closed), as a wedged VM or daemon would.
func (f *Fake) Hang(methods ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range methods {
		f.hang[m] = true
	}
}

// Calls returns how often method was called, refused calls included.
func (f *Fake) Calls(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

// lifecycle are the methods Options.Delay slows down.
var lifecycle = map[string]bool{
	"Create": true, "Pause": true, "Resume": true, "Stop": true, "Start": true,
	"Sleep": true, "Delete": true, "Flush": true, "Replace": true,
}

// enter begins every Service call: it counts the call, refuses it when ctx
// is done or the Fake closed, then applies the faults for method: a hang,
// Options.Delay, an error from FailNext.
func (f *Fake) enter(ctx context.Context, method string) error {
	f.mu.Lock()
	f.calls[method]++
	hang := f.hang[method]
	f.mu.Unlock()
	if err := f.checkOpen(ctx); err != nil {
		return err
	}
	var wait <-chan time.Time
	switch {
	case hang:
		// wait stays nil: only ctx or Close end the call.
	case lifecycle[method] && f.opts.Delay > 0:
		t := time.NewTimer(f.opts.Delay)
		defer t.Stop()
		wait = t.C
	default:
		return f.injected(method)
	}
	select {
	case <-wait:
	case <-ctx.Done():
		return ctx.Err()
	case <-f.life.Done():
		return errClosed
	}
	return f.injected(method)
}

func (f *Fake) injected(method string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	err, ok := f.fail[method]
	if ok {
		delete(f.fail, method)
	}
	return err
}

package engine

import (
	"context"
	"sync"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/engine/internal/lock"
)

// hub fans events out to watchers. Publishing never blocks: each watcher
// has its own queue, and a slow watcher's pending stats events are
// coalesced per session (only the newest figures matter), so a thousand
// sessions refreshing their stats cannot make the queue grow without bound.
type hub struct {
	mu       lock.Mutex
	watchers map[*watcher]struct{}
}

type watcher struct {
	mu     lock.Mutex
	queue  []session.Event
	stats  map[string]int // session → index of its pending stats event
	wake   chan struct{}
	closed bool
}

func newHub() *hub { return &hub{watchers: map[*watcher]struct{}{}} }

func (h *hub) publish(ev session.Event) {
	h.mu.Lock()
	ws := make([]*watcher, 0, len(h.watchers))
	for w := range h.watchers {
		ws = append(ws, w)
	}
	h.mu.Unlock()
	for _, w := range ws {
		w.push(ev)
	}
}

// maxQueue bounds a watcher that does not read at all; beyond it the
// watcher is dropped (its channel closes) rather than holding memory.
const maxQueue = 100000

func (w *watcher) push(ev session.Event) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	if ev.Kind == session.EventStats {
		if i, ok := w.stats[ev.Name]; ok {
			w.queue[i] = ev
			return
		}
		w.stats[ev.Name] = len(w.queue)
	}
	if len(w.queue) >= maxQueue {
		w.closed = true
	} else {
		w.queue = append(w.queue, ev)
	}
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *watcher) pop() ([]session.Event, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	q := w.queue
	w.queue = nil
	clear(w.stats)
	return q, w.closed
}

// watch registers a watcher that first receives initial, then every
// published event, until ctx ends.
func (h *hub) watch(ctx context.Context, wg *sync.WaitGroup, initial []session.Event) <-chan session.Event {
	w := &watcher{stats: map[string]int{}, wake: make(chan struct{}, 1), queue: initial}
	for i, ev := range initial {
		if ev.Kind == session.EventStats {
			w.stats[ev.Name] = i
		}
	}
	h.mu.Lock()
	h.watchers[w] = struct{}{}
	h.mu.Unlock()
	out := make(chan session.Event, 256)
	wg.Go(func() {
		defer close(out)
		defer func() {
			h.mu.Lock()
			delete(h.watchers, w)
			h.mu.Unlock()
		}()
		for {
			evs, closed := w.pop()
			for _, ev := range evs {
				select {
				case out <- ev:
				case <-ctx.Done():
					return
				}
			}
			if closed {
				return
			}
			if len(evs) > 0 {
				continue
			}
			select {
			case <-w.wake:
			case <-ctx.Done():
				return
			}
		}
	})
	return out
}

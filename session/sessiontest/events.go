package sessiontest

import (
	"context"
	"sort"
	"sync"

	"github.com/berthvm/berth/session"
)

// watcher is one Watch subscription. The fake never blocks on a slow
// watcher: events queue up until its goroutine delivers them.
type watcher struct {
	mu     sync.Mutex
	queue  []session.Event
	wake   chan struct{} // capacity 1
	closed chan struct{} // closed by CloseWatchers
}

func (w *watcher) push(ev session.Event) {
	w.mu.Lock()
	w.queue = append(w.queue, ev)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *watcher) pop() (session.Event, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.queue) == 0 {
		return session.Event{}, false
	}
	ev := w.queue[0]
	w.queue = w.queue[1:]
	return ev, true
}

// publishLocked stamps ev (its Time only when zero), records it in the
// session's timeline (except stats) and queues it for every watcher.
func (f *Fake) publishLocked(ctx context.Context, s *fakeSession, ev session.Event) {
	f.eventSeq++
	ev.Seq = f.eventSeq
	if ev.Time.IsZero() {
		ev.Time = f.now()
	}
	ev.Name = s.info.Name
	if ev.By == "" {
		ev.By = session.Actor(ctx)
	}
	if ev.Kind == session.EventState || ev.Kind == session.EventStats {
		info := s.info
		ev.Session = &info
	}
	if ev.Kind != session.EventStats {
		s.timeline = append(s.timeline, cloneEvent(ev))
	}
	for w := range f.watchers {
		w.push(cloneEvent(ev))
	}
}

// Watch streams events: first one EventState (Seq 0) per existing session,
// sorted by name, then every change. The channel is closed when ctx ends,
// the Fake is closed or CloseWatchers is called.
func (f *Fake) Watch(ctx context.Context) (<-chan session.Event, error) {
	if err := f.enter(ctx, "Watch"); err != nil {
		return nil, err
	}
	w := &watcher{wake: make(chan struct{}, 1), closed: make(chan struct{})}
	f.mu.Lock()
	names := make([]string, 0, len(f.sessions))
	for name, s := range f.sessions {
		if s.info.State != session.StateDeleting {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		info := f.sessions[name].info
		w.queue = append(w.queue, session.Event{
			Time: f.now(), Kind: session.EventState, Name: name, Message: info.Cause, Session: &info,
		})
	}
	f.watchers[w] = struct{}{}
	f.mu.Unlock()

	ch := make(chan session.Event)
	go func() {
		defer close(ch)
		defer func() {
			f.mu.Lock()
			delete(f.watchers, w)
			f.mu.Unlock()
		}()
		for {
			ev, ok := w.pop()
			if !ok {
				select {
				case <-w.wake:
					continue
				case <-ctx.Done():
					return
				case <-f.life.Done():
					return
				case <-w.closed:
					return
				}
			}
			select {
			case ch <- ev:
			case <-ctx.Done():
				return
			case <-f.life.Done():
				return
			case <-w.closed:
				return
			}
		}
	}()
	return ch, nil
}

// CloseWatchers ends every Watch stream, as a daemon restart would; later
// Watch calls work again.
func (f *Fake) CloseWatchers() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for w := range f.watchers {
		close(w.closed)
		delete(f.watchers, w)
	}
}

// Host returns the host status SetHost last set (by default a data
// directory with room to spare).
func (f *Fake) Host(ctx context.Context) (session.HostStatus, error) {
	if err := f.enter(ctx, "Host"); err != nil {
		return session.HostStatus{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.host.DataDir == "" {
		return session.HostStatus{DataDir: "/var/lib/berth", Free: 100 << 30, Floor: 1 << 30}, nil
	}
	h := f.host
	h.DiskFullPaused = append([]string(nil), h.DiskFullPaused...)
	return h, nil
}

// SetHost changes the host status and publishes it as the daemon does
// when the data directory crosses its floor.
func (f *Fake) SetHost(h session.HostStatus) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.host = h
	f.eventSeq++
	ev := session.Event{Seq: f.eventSeq, Time: f.now(), Kind: session.EventHost, Message: h.Message(), Host: &h}
	for w := range f.watchers {
		w.push(cloneEvent(ev))
	}
}

package fakesvc

import (
	"context"
	"sync"
)

// queue is an unbounded FIFO drained into a channel by one goroutine, so
// publishing never blocks the fake's lock on a slow reader. The goroutine
// ends (closing out) when ctx is done or the queue is closed and empty.
type queue[T any] struct {
	mu     sync.Mutex
	items  []T
	closed bool
	wake   chan struct{}
	out    chan T
}

func newQueue[T any](ctx context.Context, buf int) *queue[T] {
	q := &queue[T]{wake: make(chan struct{}, 1), out: make(chan T, buf)}
	go q.run(ctx)
	return q
}

func (q *queue[T]) push(v ...T) {
	q.mu.Lock()
	if !q.closed {
		q.items = append(q.items, v...)
	}
	q.mu.Unlock()
	q.signal()
}

func (q *queue[T]) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.signal()
}

func (q *queue[T]) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *queue[T]) run(ctx context.Context) {
	defer close(q.out)
	for {
		q.mu.Lock()
		items := q.items
		q.items = nil
		closed := q.closed
		q.mu.Unlock()
		for _, v := range items {
			select {
			case q.out <- v:
			case <-ctx.Done():
				return
			}
		}
		if len(items) > 0 {
			continue
		}
		if closed {
			return
		}
		select {
		case <-q.wake:
		case <-ctx.Done():
			return
		}
	}
}

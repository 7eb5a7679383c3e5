package agent

import (
	"io"
	"sync"
	"testing"
	"time"
)

// slowWriter takes stdin slowly, as a command on a loaded guest does.
type slowWriter struct {
	mu sync.Mutex
	n  int
}

func (w *slowWriter) Write(p []byte) (int, error) {
	time.Sleep(time.Millisecond)
	w.mu.Lock()
	w.n += len(p)
	w.mu.Unlock()
	return len(p), nil
}
func (w *slowWriter) Close() error { return nil }

func (w *slowWriter) got() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

func testExecution(stdin io.WriteCloser) *execution {
	e := &execution{stdout: newOutBuf(1 << 10), stderr: newOutBuf(1 << 10), stdin: stdin}
	e.cond = sync.NewCond(&e.mu)
	return e
}

// More stdin than the queue holds, sent faster than the command takes it:
// every byte arrives (the push waits for room) instead of the stream
// being given up.
func TestStdinQueueBackPressure(t *testing.T) {
	w := &slowWriter{}
	q := newStdinQueue(testExecution(w))
	defer q.close()
	frame := make([]byte, 1<<20)
	total := 0
	for total <= 2*maxStdinQueue {
		if !q.push(frame) {
			t.Fatalf("push refused after %d bytes", total)
		}
		total += len(frame)
	}
	deadline := time.Now().Add(30 * time.Second)
	for w.got() < total && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := w.got(); got != total {
		t.Fatalf("the command got %d of %d bytes", got, total)
	}
}

// blockedWriter never takes stdin, as a command that does not read it.
type blockedWriter struct{ stop chan struct{} }

func (w blockedWriter) Write(p []byte) (int, error) { <-w.stop; return 0, io.ErrClosedPipe }
func (w blockedWriter) Close() error                { return nil }

// A full queue whose command's output waits for acknowledgements (which
// could only come after the stdin on the stream) ends the stream rather
// than wait forever; closing the queue releases a waiting push.
func TestStdinQueueGivesUp(t *testing.T) {
	w := blockedWriter{stop: make(chan struct{})}
	defer close(w.stop)
	e := testExecution(w)
	q := newStdinQueue(e)
	frame := make([]byte, 1<<20)
	for i := 0; i < maxStdinQueue>>20+1; i++ {
		if !q.push(frame) {
			t.Fatalf("push %d refused before the queue was full", i)
		}
	}
	e.mu.Lock()
	e.stdout.end = int64(len(e.stdout.data)) // a ring full of unacknowledged output
	e.mu.Unlock()
	done := make(chan bool)
	go func() { done <- q.push(frame) }()
	select {
	case ok := <-done:
		if ok {
			t.Fatal("a push into a full queue with stalled output was taken")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a push into a full queue with stalled output waited")
	}

	e.mu.Lock()
	e.stdout.end = 0
	e.mu.Unlock()
	go func() { done <- q.push(frame) }()
	select {
	case <-done:
		t.Fatal("a push into a full queue did not wait")
	case <-time.After(200 * time.Millisecond):
	}
	q.close()
	select {
	case ok := <-done:
		if ok {
			t.Fatal("a push was taken after close")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("close did not release a waiting push")
	}
}

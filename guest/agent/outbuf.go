package agent

import (
	"sync"
)

// outBuf holds one output stream of an execution: a ring of the newest
// bytes, addressed by absolute offsets. The producer (the pipe reader) blocks
// when the ring is full of bytes the host has not acknowledged, so output is
// never dropped before the host stored it; the command then blocks on its
// own write, which is the back-pressure a terminal gives too.
//
// All fields are guarded by the execution's mutex, shared by both streams
// and the exit status, so a sender can wait on one condition for any of them.
type outBuf struct {
	data   []byte
	end    int64 // bytes written so far
	acked  int64 // bytes the host stored
	closed bool  // producer reached EOF
}

func newOutBuf(size int) *outBuf { return &outBuf{data: make([]byte, size)} }

// start is the oldest offset still held.
func (b *outBuf) start() int64 {
	if s := b.end - int64(len(b.data)); s > 0 {
		return s
	}
	return 0
}

// free is how many bytes can be appended without overwriting unacked data.
func (b *outBuf) free() int {
	return len(b.data) - int(b.end-b.acked)
}

// readAt copies bytes from offset off into p. It returns 0 when nothing is
// available yet.
func (b *outBuf) readAt(off int64, p []byte) int {
	if off >= b.end {
		return 0
	}
	if avail := b.end - off; int64(len(p)) > avail {
		p = p[:avail]
	}
	i := int(off % int64(len(b.data)))
	n := copy(p, b.data[i:])
	if n < len(p) {
		n += copy(p[n:], b.data[:len(p)-n])
	}
	return n
}

func (b *outBuf) ack(off int64) {
	if off > b.end {
		off = b.end
	}
	if off > b.acked {
		b.acked = off
	}
}

// pump moves bytes from a command's pipe into an outBuf. It reads straight
// into the ring's free space: that region holds only acknowledged bytes no
// reader asks for, so it can be written without the lock.
func pump(mu *sync.Mutex, cond *sync.Cond, b *outBuf, read func([]byte) (int, error), abandoned func() bool) {
	for {
		mu.Lock()
		for b.free() == 0 && !abandoned() {
			cond.Wait()
		}
		if abandoned() {
			b.acked = b.end // nobody will read it: keep draining so the command does not hang
		}
		i := int(b.end % int64(len(b.data)))
		room := min(b.free(), len(b.data)-i, 1<<20)
		dst := b.data[i : i+room]
		mu.Unlock()
		n, err := read(dst)
		mu.Lock()
		if n > 0 {
			b.end += int64(n)
			if abandoned() {
				b.acked = b.end
			}
			cond.Broadcast()
		}
		if err != nil {
			b.closed = true
			cond.Broadcast()
			mu.Unlock()
			return
		}
		mu.Unlock()
	}
}

package lock

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// A hold over the bound is reported while it lasts, once, naming the lock
// and the function that took it; its release is logged with how long it
// was held. Holds under the bound say nothing.
func TestWatchReportsLongHolds(t *testing.T) {
	var buf bytes.Buffer
	w := NewWatch(20*time.Millisecond, slog.New(slog.NewTextHandler(&buf, nil)))
	var short, long Mutex
	short.Watch(w, "short.mu")
	long.Watch(w, "long.mu")

	short.Lock()
	short.Unlock()
	takeAndHold(&long)
	time.Sleep(40 * time.Millisecond)
	over := w.Overdue()
	if len(over) != 1 || over[0].Lock != "long.mu" || over[0].Held < 20*time.Millisecond {
		t.Fatalf("overdue holds = %+v, want long.mu alone", over)
	}
	if !strings.Contains(over[0].Stack, "lock.takeAndHold") {
		t.Errorf("stack %q does not name the function that took the lock", over[0].Stack)
	}
	if again := w.Overdue(); len(again) != 0 {
		t.Errorf("a hold was reported twice: %+v", again)
	}
	long.Unlock()
	log := buf.String()
	if !strings.Contains(log, "lock held too long") || !strings.Contains(log, "long.mu") || strings.Contains(log, "short.mu") {
		t.Errorf("log = %q, want one line for long.mu", log)
	}
}

func takeAndHold(l *Mutex) { l.Lock() }

// Run logs a lock that is never released: a freeze gets its line.
func TestWatchRunLogsAFreeze(t *testing.T) {
	var buf syncBuffer
	w := NewWatch(10*time.Millisecond, slog.New(slog.NewTextHandler(&buf, nil)))
	var l Mutex
	l.Watch(w, "frozen.mu")
	l.Lock()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(buf.String(), "lock still held") && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	l.Unlock()
	if s := buf.String(); !strings.Contains(s, "frozen.mu") || !strings.Contains(s, "TestWatchRunLogsAFreeze") {
		t.Fatalf("log = %q, want the frozen lock and its holder", s)
	}
}

// An unwatched Mutex is a plain mutex.
func TestUnwatched(t *testing.T) {
	var l Mutex
	l.Lock()
	got := make(chan bool)
	go func() { got <- l.TryLock() }() // another goroutine: no recursion
	if <-got {
		t.Fatal("TryLock succeeded on a held lock")
	}
	l.Unlock()
	if !l.TryLock() {
		t.Fatal("TryLock failed on a free lock")
	}
	l.Unlock()
}

// Built with lockcheck, two locks taken in both orders end the process
// with both stacks, though the two orders never overlapped in time.
func TestInversionIsCaught(t *testing.T) {
	if os.Getenv("LOCK_INVERT") == "1" {
		var a, b Mutex
		a.Lock()
		b.Lock()
		b.Unlock()
		a.Unlock()
		done := make(chan struct{})
		go func() {
			b.Lock()
			a.Lock()
			a.Unlock()
			b.Unlock()
			close(done)
		}()
		<-done
		return
	}
	if !Checked {
		t.Skip("lock orders are checked with -tags lockcheck (make test)")
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestInversionIsCaught$")
	cmd.Env = append(os.Environ(), "LOCK_INVERT=1")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the inversion went unnoticed:\n%s", out)
	}
	if !bytes.Contains(out, []byte("Inconsistent locking")) || !bytes.Contains(out, []byte("TestInversionIsCaught")) {
		t.Fatalf("no report naming both orders:\n%s", out)
	}
}

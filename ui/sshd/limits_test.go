package sshd

import (
	"io"
	"runtime"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/berthvm/berth/session"
)

func TestMaxConns(t *testing.T) {
	k := newKey(t, "op", Operator)
	w := newWorld(t, worldOpts{opts: Options{MaxConns: 2}}, k)
	c1 := w.dial(k)
	c2 := w.dial(k)
	if c, err := w.dialErr(k); err == nil {
		c.Close()
		t.Fatal("a third connection was admitted with MaxConns 2")
	}
	c1.Close()
	// The slot comes back once the server sees the close.
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := w.dialErr(k)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no slot after a close: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if r := run(t, c2, "ls", ""); r.code != 0 {
		t.Errorf("ls on the remaining connection: %+v", r)
	}
}

func TestRatePerIP(t *testing.T) {
	k := newKey(t, "op", Operator)
	w := newWorld(t, worldOpts{opts: Options{RatePerIP: 0.001, BurstPerIP: 3}}, k)
	for i := range 3 {
		c, err := w.dialErr(k)
		if err != nil {
			t.Fatalf("connection %d within the burst: %v", i+1, err)
		}
		c.Close()
	}
	if c, err := w.dialErr(k); err == nil {
		c.Close()
		t.Fatal("a fourth connection was admitted with a burst of 3")
	}
}

func TestRateLimiter(t *testing.T) {
	l := newRateLimiter(2, 2) // 2 at once, then 2 per second
	t0 := time.Unix(1000, 0)
	for i, tc := range []struct {
		ip   string
		at   time.Duration
		want bool
	}{
		{"a", 0, true}, {"a", 0, true}, {"a", 0, false},
		{"b", 0, true},
		{"a", 499 * time.Millisecond, false}, {"a", 500 * time.Millisecond, true}, {"a", 500 * time.Millisecond, false},
		{"a", 10 * time.Second, true}, {"a", 10 * time.Second, true}, {"a", 10 * time.Second, false},
	} {
		if got := l.allow(tc.ip, t0.Add(tc.at)); got != tc.want {
			t.Errorf("step %d: allow(%s, +%s) = %v, want %v", i, tc.ip, tc.at, got, tc.want)
		}
	}
	for i := range maxBuckets + 10 {
		l.allow(strings.Repeat("x", i%7)+string(rune('A'+i%26))+time.Duration(i).String(), t0)
	}
	l.allow("late", t0.Add(time.Hour))
	if n := len(l.buckets); n > maxBuckets+10 {
		t.Errorf("%d buckets kept, want them swept", n)
	}
}

func TestIdleTimeout(t *testing.T) {
	k := newKey(t, "op", Operator)
	w := newWorld(t, worldOpts{opts: Options{IdleTimeout: 300 * time.Millisecond, RecheckEvery: 50 * time.Millisecond}}, k)
	w.create("demo")
	c := w.dial(k)
	// A command that runs longer than the idle timeout is not cut.
	if r := run(t, c, "exec demo -- sleep 0.8", ""); r.code != 0 {
		t.Fatalf("a command longer than the idle timeout: %+v", r)
	}
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	select {
	case <-done:
		if took := time.Since(start); took < 200*time.Millisecond {
			t.Errorf("closed after %s idle, want about 300ms", took)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("an idle connection is still open")
	}
}

// TestShutdown: ending Serve's context quits TUIs at once, lets a command
// finish within ShutdownTimeout, then closes what is left, and Serve
// returns.
func TestShutdown(t *testing.T) {
	k := newKey(t, "op", Operator)
	w := newWorld(t, worldOpts{opts: Options{ShutdownTimeout: 500 * time.Millisecond}}, k)
	w.create("demo")
	c := w.dial(k)

	tui, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	if err := tui.RequestPty("xterm-256color", 24, 80, gossh.TerminalModes{}); err != nil {
		t.Fatal(err)
	}
	out, _ := tui.StdoutPipe()
	var tuiErr strings.Builder
	tui.Stderr = &tuiErr
	sc := newScreen(out)
	if err := tui.Shell(); err != nil {
		t.Fatal(err)
	}
	sc.waitFor(t, 0, "demo", 10*time.Second)

	long, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	if err := long.Start("exec demo -- sleep 60"); err != nil {
		t.Fatal(err)
	}
	waitExecs(t, w, "demo", func(xs []session.Execution) bool { return len(xs) == 1 })

	start := time.Now()
	if err := w.stop(); err != nil {
		t.Errorf("Serve: %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("shutdown took %s", took)
	}
	if err := tui.Wait(); err == nil {
		t.Error("the TUI session ended with status 0 on shutdown")
	}
	if !strings.Contains(tuiErr.String(), "shutting down") {
		t.Errorf("TUI stderr %q, want a shutdown notice", tuiErr.String())
	}
	if err := long.Wait(); err == nil {
		t.Error("the long command reported success")
	}
	waitExecs(t, w, "demo", func(xs []session.Execution) bool { return len(xs) == 1 && xs[0].State.Done() })
	if _, err := w.dialErr(k); err == nil {
		t.Error("connected after shutdown")
	}
}

// TestNoLeaks: after a server that served commands, a TUI, a shell and
// sftp shuts down, and its clients are gone, no goroutine is left.
func TestNoLeaks(t *testing.T) {
	time.Sleep(100 * time.Millisecond) // let earlier tests' goroutines end
	base := runtime.NumGoroutine()
	func() {
		op := newKey(t, "op", Operator)
		w := newWorld(t, worldOpts{opts: Options{ShutdownTimeout: 200 * time.Millisecond}}, op)
		w.create("demo")
		c, err := w.dialErr(op)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		run(t, c, "exec demo -- cat", "in")
		run(t, c, "ls", "")
		s, in, sc := tuiSession(t, c, 24, 80, nil)
		sc.waitFor(t, 0, "demo", 10*time.Second)
		io.WriteString(in, "j")
		s.WindowChange(25, 81)
		sftpc, sc2, err := w.sftpClient(op, "demo")
		if err != nil {
			t.Fatal(err)
		}
		defer sc2.Close()
		sftpc.ReadDir("/workspace")
		long, _ := c.NewSession()
		long.Start("exec demo -- sleep 60")
		waitExecs(t, w, "demo", func(xs []session.Execution) bool { return len(xs) == 2 })
		if err := w.stop(); err != nil {
			t.Fatal(err)
		}
		w.fake.Close()
	}()
	waitGoroutines(t, base, 10*time.Second)
}

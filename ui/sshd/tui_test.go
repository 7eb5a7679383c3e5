package sshd

import (
	"errors"
	"io"
	"runtime"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"
)

// tuiSession opens the TUI on c with a PTY of rows x cols and env.
func tuiSession(t testing.TB, c *gossh.Client, rows, cols int, env map[string]string) (*gossh.Session, io.WriteCloser, *screen) {
	t.Helper()
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range env {
		if err := s.Setenv(k, v); err != nil {
			t.Fatalf("setenv %s: %v", k, err)
		}
	}
	if err := s.RequestPty("xterm-256color", rows, cols, gossh.TerminalModes{}); err != nil {
		t.Fatal(err)
	}
	in, err := s.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := s.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	sc := newScreen(out)
	if err := s.Shell(); err != nil {
		t.Fatal(err)
	}
	return s, in, sc
}

// TestTUI opens the TUI over SSH with a PTY: it renders the sessions,
// reacts to a key and to a resize, and quits with status 0.
func TestTUI(t *testing.T) {
	op := newKey(t, "otto@box", Operator)
	w := newWorld(t, worldOpts{}, op)
	w.create("alpha", "beta")
	c := w.dial(op)
	s, in, sc := tuiSession(t, c, 30, 100, map[string]string{"COLORTERM": "truecolor"})

	sc.waitFor(t, 0, "alpha", 10*time.Second)
	sc.waitFor(t, 0, "beta", time.Second)
	sc.waitFor(t, 0, "ssh:otto@box (operator)", time.Second)
	if !strings.Contains(sc.since(0), "\x1b[?1049h") {
		t.Error("the TUI did not switch to the alternate screen")
	}
	if !strings.Contains(sc.since(0), "38;2;") {
		t.Error("no true colour with COLORTERM=truecolor")
	}

	mark := sc.len()
	io.WriteString(in, "?")
	sc.waitFor(t, mark, "pause/resume", 5*time.Second)
	io.WriteString(in, "?") // ? closes the help

	mark = sc.len()
	if err := s.WindowChange(8, 30); err != nil {
		t.Fatal(err)
	}
	sc.waitFor(t, mark, "berth needs at least", 5*time.Second)
	mark = sc.len()
	s.WindowChange(30, 100)
	sc.waitFor(t, mark, "alpha", 5*time.Second)

	io.WriteString(in, "q")
	done := make(chan error, 1)
	go func() { done <- s.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("TUI exit: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the TUI did not quit on q")
	}
	<-sc.eof
	if !strings.Contains(sc.since(mark), "\x1b[?1049l") {
		t.Error("the TUI did not leave the alternate screen")
	}
}

// TestTUIViewer: a viewer's TUI hides actions and the server refuses
// them anyway (the command line reaches the Service).
func TestTUIViewer(t *testing.T) {
	viewer := newKey(t, "vera", Viewer)
	w := newWorld(t, worldOpts{}, viewer)
	w.create("alpha")
	c := w.dial(viewer)
	_, in, sc := tuiSession(t, c, 30, 100, map[string]string{"NO_COLOR": "1"})
	sc.waitFor(t, 0, "alpha", 10*time.Second)
	sc.waitFor(t, 0, "(viewer)", time.Second)
	if strings.Contains(sc.since(0), "38;2;") || strings.Contains(sc.since(0), "38;5;") {
		t.Error("colours despite NO_COLOR")
	}
	mark := sc.len()
	io.WriteString(in, "?")
	sc.waitFor(t, mark, "quit", 5*time.Second)
	if strings.Contains(stripANSI(sc.since(mark)), "pause/resume") {
		t.Error("the viewer's help offers pause")
	}
	io.WriteString(in, "p") // hidden action: nothing may happen
	io.WriteString(in, ":pause alpha\r")
	time.Sleep(300 * time.Millisecond)
	if s, _ := w.fake.Get(t.Context(), "alpha"); s.State != "running" {
		t.Errorf("a viewer's TUI paused the session: %s", s.State)
	}
}

// TestTUIDisconnectLeavesNothing: a client that vanishes mid-TUI leaves
// no goroutine behind (program, input reader, window feed, watch stream).
func TestTUIDisconnectLeavesNothing(t *testing.T) {
	op := newKey(t, "op", Operator)
	w := newWorld(t, worldOpts{}, op)
	w.create("alpha")
	c0 := w.dial(op) // warm up the server's and the client's lazy goroutines
	run(t, c0, "ls", "")
	c0.Close()
	time.Sleep(100 * time.Millisecond)
	base := runtime.NumGoroutine()

	for range 3 {
		c, err := w.dialErr(op)
		if err != nil {
			t.Fatal(err)
		}
		s, in, sc := tuiSession(t, c, 24, 80, nil)
		sc.waitFor(t, 0, "alpha", 10*time.Second)
		io.WriteString(in, "j")
		s.WindowChange(30, 90)
		s.WindowChange(31, 91)
		c.Close()
	}
	waitGoroutines(t, base, 5*time.Second)
}

// TestShellPTY: ssh -t HOST shell NAME is an interactive shell on a
// terminal of the client's size, resized with the client's window.
func TestShellPTY(t *testing.T) {
	op := newKey(t, "op", Operator)
	w := newWorld(t, worldOpts{}, op)
	w.create("demo")
	c := w.dial(op)
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.RequestPty("xterm", 30, 100, gossh.TerminalModes{}); err != nil {
		t.Fatal(err)
	}
	in, _ := s.StdinPipe()
	out, _ := s.StdoutPipe()
	sc := newScreen(out)
	if err := s.Start("shell demo"); err != nil {
		t.Fatal(err)
	}
	sc.waitFor(t, 0, "$ ", 10*time.Second)
	mark := sc.len()
	io.WriteString(in, "stty\n")
	sc.waitFor(t, mark, "30 100", 5*time.Second)

	s.WindowChange(40, 120)
	deadline := time.Now().Add(5 * time.Second)
	for {
		mark = sc.len()
		io.WriteString(in, "stty\n")
		time.Sleep(50 * time.Millisecond)
		if strings.Contains(sc.since(mark), "40 120") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the shell's terminal was not resized: %q", sc.since(0))
		}
	}
	io.WriteString(in, "exit 4\n")
	var ee *gossh.ExitError
	if err := s.Wait(); !errors.As(err, &ee) || ee.ExitStatus() != 4 {
		t.Errorf("shell exit: %v, want status 4", err)
	}
	xs, _ := w.fake.Executions(t.Context(), "demo", true)
	if len(xs) != 1 || !xs[0].TTY || xs[0].By != "ssh:op" {
		t.Errorf("recorded %+v", xs)
	}
}

// TestDeletePromptPTY: over a PTY (raw on the client side), delete's
// prompt gets line editing: echo, backspace, Enter; Ctrl-C abandons it.
func TestDeletePromptPTY(t *testing.T) {
	admin := newKey(t, "ada", Admin)
	w := newWorld(t, worldOpts{}, admin)
	w.create("doomed", "kept")
	c := w.dial(admin)
	for _, tc := range []struct {
		name, typed string
		code        int
		deleted     bool
	}{
		{"kept", "kept\x03", 1, false},
		{"kept", "nope\r", 1, false},
		{"doomed", "doomde\x7f\x7fed\r", 0, true},
	} {
		s, err := c.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		if err := s.RequestPty("xterm", 24, 80, gossh.TerminalModes{}); err != nil {
			t.Fatal(err)
		}
		in, _ := s.StdinPipe()
		out, _ := s.StdoutPipe()
		errOut, _ := s.StderrPipe()
		sc, ec := newScreen(out), newScreen(errOut)
		if err := s.Start("delete " + tc.name); err != nil {
			t.Fatal(err)
		}
		ec.waitFor(t, 0, "Type the session name to confirm", 5*time.Second)
		io.WriteString(in, tc.typed)
		err = s.Wait()
		code := 0
		var ee *gossh.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitStatus()
		}
		_, gerr := w.fake.Get(t.Context(), tc.name)
		if code != tc.code || (gerr != nil) != tc.deleted {
			t.Errorf("typed %q: exit %d, deleted %v; want %d, %v (stderr %q)", tc.typed, code, gerr != nil, tc.code, tc.deleted, ec.since(0))
		}
		<-sc.eof
		if tc.deleted && !strings.HasPrefix(sc.since(0), "doomde\b \b\b \bed\r\n") {
			t.Errorf("echo: %q", sc.since(0))
		}
	}
}

// TestTUIViewerHosts: a viewer's TUI reaches the hosts page through the
// guard, which answers for a berth on its own, and esc goes back.
func TestTUIViewerHosts(t *testing.T) {
	viewer := newKey(t, "vera", Viewer)
	w := newWorld(t, worldOpts{}, viewer)
	w.create("alpha")
	c := w.dial(viewer)
	_, in, sc := tuiSession(t, c, 30, 100, map[string]string{"NO_COLOR": "1"})
	sc.waitFor(t, 0, "alpha", 10*time.Second)
	mark := sc.len()
	io.WriteString(in, "H")
	sc.waitFor(t, mark, "one host on its own", 5*time.Second)
	mark = sc.len()
	io.WriteString(in, "\x1b")
	sc.waitFor(t, mark, "sessions", 5*time.Second)
}

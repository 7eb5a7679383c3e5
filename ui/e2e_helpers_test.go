package ui_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/daemon/daemontest"
	"github.com/berthvm/berth/vmm/vmmtest"
)

// tuiEnv is the real berth TUI in a private tmux server, talking to a
// real daemon (started by the test, so the test owns its lifetime and
// log) on a fresh data directory. Keys go in with `tmux send-keys`, the
// screen comes back with `tmux capture-pane`.
type tuiEnv struct {
	*daemontest.Env

	tmux   string // tmux binary
	socket string // tmux -L name: a server of our own
	target string // the pane

	last string // the last screen read, shown when a wait fails
}

const (
	// uiWait bounds a UI reaction (a key's effect, a flash message).
	uiWait = 5 * time.Second
	// bootWait bounds a VM cold boot under TCG on a busy machine.
	bootWait = 120 * time.Second
	// tuiCols and tuiRows are the pane's size.
	tuiCols, tuiRows = 120, 36
)

// newTUIEnv builds berth, makes a data directory with the shared guest
// image and starts the daemon. Cleanup kills the tmux server first (the
// TUI with it), then the daemon, then every VM left on the data
// directory.
func newTUIEnv(t *testing.T, tmux string) *tuiEnv {
	t.Helper()
	e := &tuiEnv{
		Env:    daemontest.New(t, vmmtest.DataDir(t)),
		tmux:   tmux,
		socket: fmt.Sprintf("berth-e2e-%d-%d", os.Getpid(), time.Now().UnixNano()),
	}
	e.StartDaemon()
	return e
}

// run runs a berth CLI command.
func (e *tuiEnv) run(args ...string) (stdout, stderr string, code int) {
	r := e.Env.Run(args...)
	return r.Stdout, r.Stderr, r.Code
}

// sessions returns `berth ls --json`.
func (e *tuiEnv) sessions() []session.Session {
	e.T.Helper()
	var l []session.Session
	if err := json.Unmarshal([]byte(e.OK("ls", "--json")), &l); err != nil {
		e.T.Fatalf("ls --json: %v", err)
	}
	return l
}

// session returns one session as `berth ls --json` lists it.
func (e *tuiEnv) session(name string) (session.Session, bool) {
	e.T.Helper()
	for _, s := range e.sessions() {
		if s.Name == name {
			return s, true
		}
	}
	return session.Session{}, false
}

// wantState checks, through the CLI, that the daemon has name in state.
func (e *tuiEnv) wantState(name string, want session.State) session.Session {
	e.T.Helper()
	s, ok := e.session(name)
	if !ok {
		e.T.Fatalf("berth ls --json does not list %s", name)
	}
	if s.State != want {
		e.T.Fatalf("berth ls --json: %s is %s (cause %q), want %s", name, s.State, s.Cause, want)
	}
	return s
}

// tmuxCmd runs a tmux command on the private server.
func (e *tuiEnv) tmuxCmd(args ...string) (string, error) {
	c := exec.Command(e.tmux, append([]string{"-L", e.socket}, args...)...)
	c.Env = append(os.Environ(), "TMUX=")
	out, err := c.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("tmux %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// startTUI opens `berth` in a detached tmux session of tuiCols x tuiRows.
// A shell around it prints its exit status when it ends and keeps the
// pane open, so the status (or a start-up error) can still be read.
func (e *tuiEnv) startTUI() {
	e.T.Helper()
	name := "tui"
	e.target = name + ":0.0"
	_, err := e.tmuxCmd("-f", "/dev/null", "new-session", "-d", "-s", name,
		"-x", strconv.Itoa(tuiCols), "-y", strconv.Itoa(tuiRows), "--",
		"env", "NO_COLOR=1", "TERM=xterm-256color", "BERTH_DATA=",
		"sh", "-c", `"$@"; echo "[berth exited with status $?]"; exec sleep 3600`, "sh",
		e.Berth, "--data", e.Data, "--cache", e.Cache)
	// The server leaves its socket file behind; remove it with the server.
	sock, _ := e.tmuxCmd("display-message", "-p", "#{socket_path}")
	e.T.Cleanup(func() {
		e.tmuxCmd("kill-server")
		if p := strings.TrimSpace(sock); filepath.Base(p) == e.socket {
			os.Remove(p)
		}
	})
	if err != nil {
		e.T.Fatal(err)
	}
}

// keys sends tmux key names (Enter, Escape, Tab) to the pane.
func (e *tuiEnv) keys(keys ...string) {
	e.T.Helper()
	if _, err := e.tmuxCmd(append([]string{"send-keys", "-t", e.target}, keys...)...); err != nil {
		e.T.Fatal(err)
	}
}

// typeText sends s literally, as typed.
func (e *tuiEnv) typeText(s string) {
	e.T.Helper()
	if _, err := e.tmuxCmd("send-keys", "-t", e.target, "-l", s); err != nil {
		e.T.Fatal(err)
	}
}

// screen returns the pane's text.
func (e *tuiEnv) screen() string {
	e.T.Helper()
	out, err := e.tmuxCmd("capture-pane", "-p", "-t", e.target)
	if err != nil {
		e.T.Fatalf("%v\nlast screen:\n%s", err, e.last)
	}
	e.last = out
	return out
}

// waitFor polls the screen until it contains substr and returns it; on
// timeout it fails the test with the last screen and the daemon log.
func (e *tuiEnv) waitFor(t *testing.T, substr string, timeout time.Duration) string {
	t.Helper()
	return e.waitUntil(t, fmt.Sprintf("%q on screen", substr), timeout, func(s string) bool { return strings.Contains(s, substr) })
}

// waitUntil polls the screen until cond holds and returns that screen.
func (e *tuiEnv) waitUntil(t *testing.T, what string, timeout time.Duration, cond func(screen string) bool) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		s := e.screen()
		if cond(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s; last screen:\n%s\n%s\ndaemon log (tail):\n%s",
				timeout, what, strings.Repeat("─", tuiCols), s, e.DaemonLog())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// lines returns the screen's lines with surrounding spaces trimmed.
func lines(screen string) []string {
	l := strings.Split(screen, "\n")
	for i := range l {
		l[i] = strings.TrimSpace(l[i])
	}
	return l
}

// hasLine reports whether a screen line is exactly want (ignoring the
// padding around it): command output, not the command's own text.
func hasLine(screen, want string) bool {
	for _, l := range lines(screen) {
		if l == want {
			return true
		}
	}
	return false
}

// row returns the sessions table's row for name, "" if none.
func row(screen, name string) string {
	for _, l := range lines(screen) {
		f := strings.Fields(strings.TrimPrefix(l, "▸"))
		if len(f) > 2 && f[0] == name {
			return l
		}
	}
	return ""
}

// line returns screen line i (0-based), "" past the end.
func line(screen string, i int) string {
	l := strings.Split(screen, "\n")
	if i < len(l) {
		return l[i]
	}
	return ""
}

// alive reports whether pid is a live process (a zombie is not).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) S ...; comm may hold spaces, the state follows the last ')'.
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z' && s[i+2] != 'X'
	}
	return true
}

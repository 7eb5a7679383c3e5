package sshd

import (
	"context"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/berthvm/berth/session"
)

// TestCommands runs every command over SSH without a PTY and checks its
// exit status and what went to stdout and to stderr.
func TestCommands(t *testing.T) {
	admin := newKey(t, "alice@laptop", Admin)
	w := newWorld(t, worldOpts{}, admin)
	w.create("demo", "other")
	c := w.dial(admin)

	steps := []struct {
		cmd, stdin string
		code       int
		stdout     string // substring; "-" means must be empty
		stderr     string // substring; "-" means must be empty
	}{
		{cmd: "ls", stdout: "demo", stderr: "-"},
		{cmd: "berth ls", stdout: "other", stderr: "-"},
		{cmd: "info demo", stdout: "running", stderr: "-"},
		{cmd: "info nosuch", code: 1, stdout: "-", stderr: `berth: session "nosuch"`},
		{cmd: "create fresh", stdout: "fresh", stderr: "-"},
		{cmd: "create fresh", code: 1, stdout: "-", stderr: "already exists"},
		{cmd: "exec demo -- sh -c 'echo out; echo err >&2; exit 3'", code: 3, stdout: "out\n", stderr: "err\n"},
		{cmd: "exec demo -- cat", stdin: "piped input\n", stdout: "piped input\n", stderr: "-"},
		{cmd: "logs demo", stdout: "piped input", stderr: "-"},
		{cmd: "exec demo -- no-such-program", code: 127, stderr: "could not start"},
		{cmd: "ps demo --all", stdout: "sh", stderr: "-"},
		{cmd: "pause demo", stdout: "paused", stderr: "-"},
		{cmd: "pause demo", code: 1, stdout: "-", stderr: "berth: "},
		{cmd: "resume demo", stdout: "running", stderr: "-"},
		{cmd: "flush demo", stderr: "-"},
		{cmd: "put demo - notes.txt", stdin: "hello workspace\n", stdout: "durably", stderr: "-"},
		{cmd: "put demo /etc/passwd x", code: 2, stdout: "-", stderr: "local files are not reachable here"},
		{cmd: "files demo", stdout: "notes.txt", stderr: "-"},
		{cmd: "cat demo notes.txt", stdout: "hello workspace\n", stderr: "-"},
		{cmd: "get demo notes.txt -", stdout: "hello workspace\n", stderr: "-"},
		{cmd: "get demo notes.txt", code: 2, stdout: "-", stderr: "local files are not reachable here"},
		{cmd: "stop demo", stdout: "stopped", stderr: "-"},
		{cmd: "start demo", stdout: "running", stderr: "-"},
		{cmd: "delete other", code: 2, stdout: "-", stderr: "--yes"},
		{cmd: "delete other --yes", stderr: "-"},
		{cmd: "help", stdout: "Usage:", stderr: "-"},
		{cmd: "frobnicate", code: 2, stdout: "-", stderr: `berth: unknown command "frobnicate"`},
		{cmd: "serve", code: 2, stdout: "-", stderr: `berth: unknown command "serve"`},
		{cmd: "shell demo", code: 2, stdout: "-", stderr: "needs a terminal"},
		{cmd: "tui", code: 2, stdout: "-", stderr: "berth: the TUI needs a terminal: ssh -t"},
	}
	for _, st := range steps {
		r := run(t, c, st.cmd, st.stdin)
		if r.code != st.code {
			t.Errorf("%q: exit %d, want %d (stdout %q, stderr %q)", st.cmd, r.code, st.code, r.stdout, r.stderr)
		}
		check := func(stream, got, want string) {
			switch {
			case want == "-" && got != "":
				t.Errorf("%q: %s = %q, want nothing", st.cmd, stream, got)
			case want != "-" && !strings.Contains(got, want):
				t.Errorf("%q: %s = %q, want it to contain %q", st.cmd, stream, got, want)
			}
		}
		check("stdout", r.stdout, st.stdout)
		check("stderr", r.stderr, st.stderr)
		if lines := strings.Count(strings.TrimSuffix(r.stderr, "\n"), "\n"); r.code != 0 && st.stdout != "out\n" && lines > 0 {
			t.Errorf("%q: stderr has %d lines, want one: %q", st.cmd, lines+1, r.stderr)
		}
	}
	if _, err := w.fake.Get(context.Background(), "other"); err == nil {
		t.Error("other survived delete --yes")
	}
}

// TestShellNoCommandNoPTY: a shell request without a PTY (ssh -T HOST)
// gets the one line saying how to open the TUI.
func TestShellNoCommandNoPTY(t *testing.T) {
	k := newKey(t, "op", Operator)
	w := newWorld(t, worldOpts{}, k)
	c := w.dial(k)
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var out, errb strings.Builder
	s.Stdout, s.Stderr = &out, &errb
	if err := s.Shell(); err != nil {
		t.Fatal(err)
	}
	err = s.Wait()
	ee, ok := err.(*gossh.ExitError)
	if !ok || ee.ExitStatus() != 2 {
		t.Fatalf("shell without a PTY: %v, want exit 2", err)
	}
	want := "berth: the TUI needs a terminal: ssh -t ... (commands work without one: ssh berth@HOST help)\n"
	if errb.String() != want || out.String() != "" {
		t.Errorf("stdout %q, stderr %q; want stderr %q", out.String(), errb.String(), want)
	}
}

// TestActorRecorded: changes over SSH are recorded as the key's comment,
// or its fingerprint when it has none.
func TestActorRecorded(t *testing.T) {
	named := newKey(t, "alice@laptop", Operator)
	anon := newKey(t, "", Operator)
	w := newWorld(t, worldOpts{}, named, anon)
	w.create("demo")
	for _, tc := range []struct {
		k   testKey
		who string
	}{{named, "ssh:alice@laptop"}, {anon, "ssh:" + anon.fingerprint()}} {
		c := w.dial(tc.k)
		if r := run(t, c, "exec demo -- true", ""); r.code != 0 {
			t.Fatalf("exec: %+v", r)
		}
		if r := run(t, c, "pause demo", ""); r.code != 0 {
			t.Fatalf("pause: %+v", r)
		}
		if r := run(t, c, "resume demo", ""); r.code != 0 {
			t.Fatalf("resume: %+v", r)
		}
		evs, err := w.fake.Timeline(context.Background(), "demo", 0)
		if err != nil {
			t.Fatal(err)
		}
		var paused session.Event
		for _, ev := range evs {
			if ev.Kind == session.EventState && strings.HasPrefix(ev.Message, "paused") {
				paused = ev
			}
		}
		if paused.By != tc.who {
			t.Errorf("pause recorded by %q, want %q", paused.By, tc.who)
		}
		xs, err := w.fake.Executions(context.Background(), "demo", true)
		if err != nil || len(xs) == 0 {
			t.Fatalf("executions: %v %v", xs, err)
		}
		if by := xs[len(xs)-1].By; by != tc.who {
			t.Errorf("exec recorded by %q, want %q", by, tc.who)
		}
	}
}

// TestExecStreamsStayApart: a command writing both streams at length keeps
// them apart and in order.
func TestExecStreamsStayApart(t *testing.T) {
	k := newKey(t, "op", Operator)
	w := newWorld(t, worldOpts{}, k)
	w.create("demo")
	c := w.dial(k)
	script := strings.Repeat("echo o; echo e >&2; ", 200) + "exit 5"
	r := run(t, c, "exec demo -- sh -c '"+script+"'", "")
	if r.code != 5 {
		t.Fatalf("exit %d, want 5", r.code)
	}
	if r.stdout != strings.Repeat("o\n", 200) || r.stderr != strings.Repeat("e\n", 200) {
		t.Errorf("streams mixed: stdout %d bytes, stderr %d bytes", len(r.stdout), len(r.stderr))
	}
}

// TestExecCancelledOnDisconnect: a client that goes away cancels its
// command, like an SSH command gets SIGHUP.
func TestExecCancelledOnDisconnect(t *testing.T) {
	k := newKey(t, "op", Operator)
	w := newWorld(t, worldOpts{}, k)
	w.create("demo")
	c, err := w.dialErr(k)
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start("exec demo -- sleep 60"); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	deadline := time.Now().Add(5 * time.Second)
	for {
		xs, _ := w.fake.Executions(ctx, "demo", false)
		if len(xs) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the command did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.Close()
	for {
		xs, _ := w.fake.Executions(ctx, "demo", true)
		if len(xs) == 1 && xs[0].State.Done() {
			if xs[0].State != session.ExecCancelled {
				t.Errorf("state %s, want cancelled", xs[0].State)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the command still runs after the client left: %+v", xs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

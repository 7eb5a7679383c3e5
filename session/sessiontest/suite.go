package sessiontest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
)

// Suite checks that svc keeps the session.Service contract. It creates
// sessions named "conf-*" and deletes them again; svc must not hold
// sessions of those names. It needs the commands listed in builtins (a
// busybox guest has them). Calls are made as actor "suite".
func Suite(t *testing.T, svc session.Service) {
	ctx := session.WithActor(t.Context(), "suite")
	const name = "conf-a"

	t.Run("CreateErrors", func(t *testing.T) {
		for _, bad := range []string{"", "Upper", "-dash", "a_b", strings.Repeat("a", 64), "a/b"} {
			_, err := svc.Create(ctx, session.CreateOptions{Name: bad})
			wantClass(t, "Create "+bad, err, session.ErrInvalid)
		}
		// The contract's create limits, each refused with its class and
		// the field at fault, whichever side of the socket checks them.
		idle := -time.Second
		for _, c := range []struct {
			what  string
			opts  session.CreateOptions
			field string
		}{
			{"CPUs -1", session.CreateOptions{CPUs: -1}, session.FieldCPUs},
			{"CPUs over the most", session.CreateOptions{CPUs: session.MaxCPUs + 1}, session.FieldCPUs},
			{"memory below the minimum", session.CreateOptions{MemoryMiB: session.MinMemoryMiB - 1}, session.FieldMemory},
			{"memory of 64M", session.CreateOptions{MemoryMiB: 64}, session.FieldMemory},
			{"disk below the minimum", session.CreateOptions{DiskBytes: session.MinDiskBytes - 1}, session.FieldDisk},
			{"system disk below the minimum", session.CreateOptions{SystemBytes: session.MinSystemBytes - 1}, session.FieldSystemDisk},
			{"negative idle timeout", session.CreateOptions{IdleTimeout: &idle}, session.FieldIdleTimeout},
			{"bad policy", session.CreateOptions{Net: "allow:"}, session.FieldNet},
			{"unknown policy", session.CreateOptions{Net: "sometimes"}, session.FieldNet},
		} {
			c.opts.Name = "conf-bad"
			_, err := svc.Create(ctx, c.opts)
			wantClass(t, "Create "+c.what, err, session.ErrInvalid)
			if got := session.FieldOf(err); got != c.field {
				t.Errorf("Create %s: %v points at field %q, want %q", c.what, err, got, c.field)
			}
		}
		if _, err := svc.Get(ctx, "conf-bad"); !errors.Is(err, session.ErrNotFound) {
			t.Errorf("a refused create left session conf-bad: %v", err)
		}
	})

	events, err := svc.Watch(ctx)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}

	s, err := svc.Create(ctx, session.CreateOptions{Name: name})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if s.Name != name || s.State != session.StateRunning || s.CPUs < 1 || s.MemoryMiB < 1 || s.DiskBytes < 1 || s.Image == "" || s.VMM == "" {
		t.Fatalf("Create = %+v, want a running session with defaults filled in", s)
	}
	t.Cleanup(func() { svc.Delete(context.WithoutCancel(ctx), name) })

	t.Run("Read", func(t *testing.T) {
		_, err := svc.Create(ctx, session.CreateOptions{Name: name})
		wantClass(t, "Create duplicate", err, session.ErrExists)
		got, err := svc.Get(ctx, name)
		if err != nil || got.Name != name || got.State != session.StateRunning {
			t.Errorf("Get = %+v, %v", got, err)
		}
		_, err = svc.Get(ctx, "conf-missing")
		wantClass(t, "Get missing", err, session.ErrNotFound)
		list, err := svc.List(ctx)
		if err != nil || !slices.ContainsFunc(list, func(s session.Session) bool { return s.Name == name }) {
			t.Errorf("List = %v, %v; want it to hold %s", list, err, name)
		}
		h, err := svc.History(ctx, name)
		if err != nil {
			t.Errorf("History: %v", err)
		}
		for i := 1; i < len(h); i++ {
			if h[i].Time.Before(h[i-1].Time) {
				t.Errorf("History not oldest first: %v after %v", h[i].Time, h[i-1].Time)
			}
		}
		_, err = svc.History(ctx, "conf-missing")
		wantClass(t, "History missing", err, session.ErrNotFound)
	})

	t.Run("WatchSeesCreate", func(t *testing.T) {
		waitEvent(t, events, func(ev session.Event) bool {
			return ev.Kind == session.EventState && ev.Name == name && ev.Session != nil && ev.Session.State == session.StateRunning
		})
	})

	t.Run("PauseResume", func(t *testing.T) {
		s, err := svc.Pause(ctx, name)
		if err != nil || s.State != session.StatePaused {
			t.Fatalf("Pause = %v, %v", s.State, err)
		}
		waitEvent(t, events, func(ev session.Event) bool {
			return ev.Kind == session.EventState && ev.Name == name && ev.By == "suite" && ev.Session != nil && ev.Session.State == session.StatePaused
		})
		_, err = svc.Pause(ctx, name)
		wantClass(t, "Pause paused", err, session.ErrInvalidState)
		_, err = svc.Exec(ctx, name, session.ExecRequest{Argv: []string{"true"}})
		wantClass(t, "Exec paused", err, session.ErrInvalidState)
		_, err = svc.Flush(ctx, name)
		wantClass(t, "Flush paused", err, session.ErrInvalidState)
		_, err = svc.Start(ctx, name)
		wantClass(t, "Start paused", err, session.ErrInvalidState)
		if s, err = svc.Resume(ctx, name); err != nil || s.State != session.StateRunning {
			t.Fatalf("Resume = %v, %v", s.State, err)
		}
		_, err = svc.Resume(ctx, name)
		wantClass(t, "Resume running", err, session.ErrInvalidState)
		_, err = svc.Pause(ctx, "conf-missing")
		wantClass(t, "Pause missing", err, session.ErrNotFound)
	})

	t.Run("Exec", func(t *testing.T) { suiteExec(t, ctx, svc, name) })
	t.Run("Files", func(t *testing.T) { suiteFiles(t, ctx, svc, name) })
	t.Run("Copy", func(t *testing.T) { suiteCopy(t, ctx, svc, name) })
	t.Run("Replace", func(t *testing.T) { suiteReplace(t, ctx, svc, name) })
	t.Run("Checkpoints", func(t *testing.T) { suiteCheckpoints(t, ctx, svc, name) })
	t.Run("Net", func(t *testing.T) { suiteNet(t, ctx, svc, name) })
	t.Run("CommitRefusals", func(t *testing.T) { suiteCommitRefusals(t, ctx, svc, name) })

	t.Run("FlushStopStart", func(t *testing.T) {
		if _, err := svc.Flush(ctx, name); err != nil {
			t.Fatalf("Flush: %v", err)
		}
		s, err := svc.Stop(ctx, name)
		if err != nil || s.State != session.StateStopped || s.DirtyBytes != 0 {
			t.Fatalf("Stop = %v dirty %d, %v", s.State, s.DirtyBytes, err)
		}
		_, err = svc.Pause(ctx, name)
		wantClass(t, "Pause stopped", err, session.ErrInvalidState)
		_, err = svc.Exec(ctx, name, session.ExecRequest{Argv: []string{"true"}})
		wantClass(t, "Exec stopped", err, session.ErrInvalidState)
		_, err = svc.ListDir(ctx, name, "")
		wantClass(t, "ListDir stopped", err, session.ErrInvalidState)
		if s, err = svc.Start(ctx, name); err != nil || s.State != session.StateRunning {
			t.Fatalf("Start = %v, %v", s.State, err)
		}
		if got := readAll(t, ctx, svc, name, "kept.txt"); got != "survives" {
			t.Errorf("after Stop and Start, kept.txt = %q, want %q", got, "survives")
		}
		tl, err := svc.Timeline(ctx, name, 0)
		if err != nil {
			t.Fatalf("Timeline: %v", err)
		}
		var states []session.State
		for _, ev := range tl {
			if ev.Kind == session.EventState && ev.Session != nil {
				states = append(states, ev.Session.State)
			}
		}
		for _, want := range []session.State{session.StatePaused, session.StateStopped, session.StateRunning} {
			if !slices.Contains(states, want) {
				t.Errorf("Timeline states %v lack %s", states, want)
			}
		}
		if last, err := svc.Timeline(ctx, name, 2); err != nil || len(last) != 2 || last[1].Seq != tl[len(tl)-1].Seq {
			t.Errorf("Timeline limit 2 = %d events, %v; want the newest 2", len(last), err)
		}
		_, err = svc.Timeline(ctx, "conf-missing", 0)
		wantClass(t, "Timeline missing", err, session.ErrNotFound)
	})

	t.Run("Delete", func(t *testing.T) {
		if err := svc.Delete(ctx, name); err != nil {
			t.Fatalf("Delete: %v", err)
		}
		_, err := svc.Get(ctx, name)
		wantClass(t, "Get deleted", err, session.ErrNotFound)
		wantClass(t, "Delete deleted", svc.Delete(ctx, name), session.ErrNotFound)
		waitEvent(t, events, func(ev session.Event) bool { return ev.Kind == session.EventDeleted && ev.Name == name })
	})
}

// suiteCommitRefusals: a commit's refusals, each with its class and the
// field at fault, whichever side of the socket checks them. (A commit
// that succeeds needs a session with a system disk, which the suite's
// mini sessions have not: the engine's end-to-end tests make them.)
func suiteCommitRefusals(t *testing.T, ctx context.Context, svc session.Service, name string) {
	for _, c := range []struct {
		what  string
		req   session.CommitRequest
		class error
		field string
	}{
		{"an unknown session", session.CommitRequest{Session: "conf-missing", Image: "conf-img"}, session.ErrNotFound, session.FieldSession},
		{"no session", session.CommitRequest{Image: "conf-img"}, session.ErrInvalid, session.FieldSession},
		{"a bad session name", session.CommitRequest{Session: "Bad_Name", Image: "conf-img"}, session.ErrInvalid, session.FieldSession},
		{"no image name", session.CommitRequest{Session: name}, session.ErrInvalid, session.FieldNewImage},
		{"a bad image name", session.CommitRequest{Session: name, Image: "Bad_Name"}, session.ErrInvalid, session.FieldNewImage},
		{"a label of two lines", session.CommitRequest{Session: name, Image: "conf-img", Label: "a\nb"}, session.ErrInvalid, session.FieldLabel},
	} {
		_, err := svc.CommitImage(ctx, c.req)
		wantClass(t, "CommitImage of "+c.what, err, c.class)
		if got := session.FieldOf(err); got != c.field {
			t.Errorf("CommitImage of %s: %v points at field %q, want %q", c.what, err, got, c.field)
		}
	}
}

func suiteExec(t *testing.T, ctx context.Context, svc session.Service, name string) {
	t.Run("Streams", func(t *testing.T) {
		r := Run(t, ctx, svc, name, session.ExecRequest{Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}}, "")
		if r.Stdout != "out\n" || r.Stderr != "err\n" || r.Exec.State != session.ExecExited || r.Exec.ExitCode == nil || *r.Exec.ExitCode != 3 {
			t.Errorf("got stdout %q stderr %q %s exit %v, want out/err exited 3", r.Stdout, r.Stderr, r.Exec.State, r.Exec.ExitCode)
		}
		if r.Exec.By != "suite" || r.Exec.Cwd != "/workspace" || r.Exec.StdoutBytes != 4 || r.Exec.StderrBytes != 4 {
			t.Errorf("record = %+v, want by suite in /workspace with 4+4 bytes", r.Exec)
		}
		x, err := svc.Execution(ctx, r.Exec.ID)
		if err != nil || x.State != session.ExecExited {
			t.Errorf("Execution = %+v, %v", x, err)
		}
		page, err := svc.Output(ctx, r.Exec.ID, 0, 0)
		if err != nil || len(page.Chunks) == 0 || page.Chunks[0].Seq != 1 {
			t.Errorf("Output = %+v, %v; want chunks from seq 1", page, err)
		}
		p, err := svc.Attach(ctx, r.Exec.ID, 1)
		if err != nil {
			t.Fatalf("Attach finished: %v", err)
		}
		var replay bytes.Buffer
		for c := range p.Output() {
			replay.Write(c.Data)
		}
		if s := replay.String(); !strings.Contains(s, "out\n") || !strings.Contains(s, "err\n") {
			t.Errorf("Attach replay = %q", s)
		}
	})
	t.Run("StdinEnvCwd", func(t *testing.T) {
		r := Run(t, ctx, svc, name, session.ExecRequest{Argv: []string{"cat"}, Stdin: true}, "hello\nworld\n")
		if r.Stdout != "hello\nworld\n" || exitCode(r.Exec) != 0 {
			t.Errorf("cat: stdout %q exit %v", r.Stdout, r.Exec.ExitCode)
		}
		r = Run(t, ctx, svc, name, session.ExecRequest{Argv: []string{"printenv", "GREETING"}, Env: map[string]string{"GREETING": "hi there"}}, "")
		if r.Stdout != "hi there\n" || !slices.Equal(r.Exec.EnvNames, []string{"GREETING"}) {
			t.Errorf("printenv: %q, env names %v", r.Stdout, r.Exec.EnvNames)
		}
		r = Run(t, ctx, svc, name, session.ExecRequest{Argv: []string{"pwd"}, Cwd: "/tmp"}, "")
		if r.Stdout != "/tmp\n" {
			t.Errorf("pwd with cwd /tmp: %q", r.Stdout)
		}
		// A missing working directory is named as what is wrong, not the
		// program.
		r = Run(t, ctx, svc, name, session.ExecRequest{Argv: []string{"pwd"}, Cwd: "conf-no-such-dir"}, "")
		if want := "working directory /workspace/conf-no-such-dir does not exist"; r.Exec.State != session.ExecFailed || r.Exec.Error != want {
			t.Errorf("pwd in a missing directory: %s %q, want failed %q", r.Exec.State, r.Exec.Error, want)
		}
	})
	t.Run("User", func(t *testing.T) {
		// Root is every guest's; the record says who a command ran as.
		r := Run(t, ctx, svc, name, session.ExecRequest{Argv: []string{"pwd"}, User: "root"}, "")
		if exitCode(r.Exec) != 0 || r.Exec.User != "root" {
			t.Errorf("pwd as root: %s exit %v, user %q", r.Exec.State, r.Exec.ExitCode, r.Exec.User)
		}
		_, err := svc.Exec(ctx, name, session.ExecRequest{Argv: []string{"pwd"}, User: "root:"})
		wantClass(t, "Exec as a malformed user", err, session.ErrInvalid)
		if got := session.FieldOf(err); got != session.FieldUser {
			t.Errorf("Exec as a malformed user: %v points at field %q, want %q", err, got, session.FieldUser)
		}
		// A user the guest does not have: the command never runs, and
		// its record says why.
		r = Run(t, ctx, svc, name, session.ExecRequest{Argv: []string{"pwd"}, User: "conf-nobody"}, "")
		if r.Exec.State != session.ExecFailed || !strings.Contains(r.Exec.Error, `user "conf-nobody"`) || r.Stdout != "" {
			t.Errorf("pwd as a user the guest does not have: %s %q, stdout %q", r.Exec.State, r.Exec.Error, r.Stdout)
		}
	})
	t.Run("Signal", func(t *testing.T) {
		r := Run(t, ctx, svc, name, session.ExecRequest{Argv: []string{"sh", "-c", "kill -TERM $$"}}, "")
		if r.Exec.Signal != "SIGTERM" || r.Exec.ExitCode != nil {
			t.Errorf("kill -TERM $$: state %s signal %q exit %v", r.Exec.State, r.Exec.Signal, r.Exec.ExitCode)
		}
	})
	t.Run("Timeout", func(t *testing.T) {
		r := Run(t, ctx, svc, name, session.ExecRequest{Argv: []string{"sleep", "30"}, Timeout: 200 * time.Millisecond}, "")
		if r.Exec.State != session.ExecTimedOut {
			t.Errorf("sleep past timeout: state %s", r.Exec.State)
		}
	})
	t.Run("Failed", func(t *testing.T) {
		r := Run(t, ctx, svc, name, session.ExecRequest{Argv: []string{"/no/such/program"}}, "")
		if r.Exec.State != session.ExecFailed || r.Exec.Error == "" {
			t.Errorf("missing program: state %s error %q", r.Exec.State, r.Exec.Error)
		}
		_, err := svc.Exec(ctx, name, session.ExecRequest{})
		wantClass(t, "Exec empty argv", err, session.ErrInvalid)
		_, err = svc.Exec(ctx, "conf-missing", session.ExecRequest{Argv: []string{"true"}})
		wantClass(t, "Exec missing session", err, session.ErrNotFound)
		_, err = svc.Execution(ctx, "no-such-exec")
		wantClass(t, "Execution missing", err, session.ErrNotFound)
		_, err = svc.Output(ctx, "no-such-exec", 0, 0)
		wantClass(t, "Output missing", err, session.ErrNotFound)
		wantClass(t, "Cancel missing", svc.Cancel(ctx, "no-such-exec"), session.ErrNotFound)
		_, err = svc.Executions(ctx, "conf-missing", true)
		wantClass(t, "Executions missing", err, session.ErrNotFound)
	})
	t.Run("CancelOutlivesCaller", func(t *testing.T) {
		callCtx, hangUp := context.WithCancel(ctx)
		p, err := svc.Exec(callCtx, name, session.ExecRequest{Argv: []string{"sleep", "30"}})
		if err != nil {
			t.Fatalf("Exec: %v", err)
		}
		hangUp()
		for range p.Output() {
		}
		running, err := svc.Executions(ctx, name, false)
		if err != nil || !slices.ContainsFunc(running, func(x session.Execution) bool { return x.ID == p.ID() }) {
			t.Fatalf("after the caller hung up, running executions = %v, %v; want %s still running", running, err, p.ID())
		}
		if err := svc.Cancel(ctx, p.ID()); err != nil {
			t.Fatalf("Cancel: %v", err)
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		x, err := p.Wait(wctx)
		if err != nil || x.State != session.ExecCancelled {
			t.Fatalf("Wait after Cancel = %s, %v; want cancelled", x.State, err)
		}
		wantClass(t, "Cancel ended", svc.Cancel(ctx, p.ID()), session.ErrInvalidState)
		all, err := svc.Executions(ctx, name, true)
		if err != nil || !slices.ContainsFunc(all, func(x session.Execution) bool { return x.ID == p.ID() }) {
			t.Errorf("Executions(all) = %v, %v; want it to hold %s", all, err, p.ID())
		}
	})
	t.Run("TTY", func(t *testing.T) {
		r := Run(t, ctx, svc, name, session.ExecRequest{Argv: []string{"stty", "size"}, TTY: true, Rows: 30, Cols: 100}, "")
		if !strings.Contains(r.Stdout, "30 100") || r.Stderr != "" {
			t.Errorf("stty size: stdout %q stderr %q, want 30 100 on stdout", r.Stdout, r.Stderr)
		}
		p, err := svc.Exec(ctx, name, session.ExecRequest{Argv: []string{"sh"}, TTY: true, Rows: 24, Cols: 80, Stdin: true})
		if err != nil {
			t.Fatalf("Exec sh: %v", err)
		}
		if err := p.Resize(ctx, 40, 120); err != nil {
			t.Fatalf("Resize: %v", err)
		}
		io.WriteString(p.Stdin(), "stty size\nexit 0\n")
		var out bytes.Buffer
		for c := range p.Output() {
			out.Write(c.Data)
		}
		if !strings.Contains(out.String(), "40 120") {
			t.Errorf("after Resize, stty size printed %q", out.String())
		}
	})
}

func suiteFiles(t *testing.T, ctx context.Context, svc session.Service, name string) {
	if err := svc.Mkdir(ctx, name, "d/e"); err != nil {
		t.Fatalf("Mkdir: %v", err)
	}
	if err := svc.Mkdir(ctx, name, "d/e"); err != nil {
		t.Errorf("Mkdir existing: %v, want nil", err)
	}
	n, err := svc.WriteFile(ctx, name, "/workspace/d/e/f.txt", strings.NewReader("content"))
	if err != nil || n != 7 {
		t.Fatalf("WriteFile = %d, %v", n, err)
	}
	fi, err := svc.Stat(ctx, name, "d/e/f.txt")
	if err != nil || fi.Name != "f.txt" || fi.Size != 7 || fi.IsDir() {
		t.Errorf("Stat = %+v, %v", fi, err)
	}
	if fi, err = svc.Stat(ctx, name, ""); err != nil || !fi.IsDir() {
		t.Errorf("Stat root = %+v, %v", fi, err)
	}
	list, err := svc.ListDir(ctx, name, "d/e")
	if err != nil || len(list) != 1 || list[0].Name != "f.txt" {
		t.Errorf("ListDir = %+v, %v", list, err)
	}
	if got := readAll(t, ctx, svc, name, "d/e/f.txt"); got != "content" {
		t.Errorf("ReadFile = %q", got)
	}
	if err := svc.Rename(ctx, name, "d/e/f.txt", "kept.txt"); err != nil {
		t.Fatalf("Rename: %v", err)
	}
	if _, err := svc.WriteFile(ctx, name, "kept.txt", strings.NewReader("survives")); err != nil {
		t.Fatalf("WriteFile over: %v", err)
	}
	if err := svc.Remove(ctx, name, "d"); err != nil {
		t.Fatalf("Remove dir: %v", err)
	}
	_, err = svc.Stat(ctx, name, "d")
	wantClass(t, "Stat removed", err, session.ErrNotFound)
	_, err = svc.ReadFile(ctx, name, "missing")
	wantClass(t, "ReadFile missing", err, session.ErrNotFound)
	_, err = svc.WriteFile(ctx, name, "no/parent/f", strings.NewReader("x"))
	wantClass(t, "WriteFile without parent", err, session.ErrNotFound)
	_, err = svc.ListDir(ctx, name, "kept.txt")
	wantClass(t, "ListDir file", err, session.ErrInvalid)
	for _, escape := range []string{"../etc/passwd", "/etc/passwd", "a/../../x"} {
		_, err = svc.Stat(ctx, name, escape)
		wantClass(t, "Stat "+escape, err, session.ErrInvalid)
	}
	wantClass(t, "Remove missing", svc.Remove(ctx, name, "missing"), session.ErrNotFound)
	wantClass(t, "Rename missing", svc.Rename(ctx, name, "missing", "x"), session.ErrNotFound)
}

// Result is what Run collected from one execution.
type Result struct {
	Stdout, Stderr string
	Exec           session.Execution
}

// Run executes req in the named session, sends stdin (and EOF) when
// req.Stdin is set, and returns the output and the final record.
func Run(t testing.TB, ctx context.Context, svc session.Service, name string, req session.ExecRequest, stdin string) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	p, err := svc.Exec(ctx, name, req)
	if err != nil {
		t.Fatalf("Exec %v: %v", req.Argv, err)
	}
	if req.Stdin {
		go func() { // ends when the command has read stdin or ended
			w := p.Stdin()
			io.WriteString(w, stdin)
			w.Close()
		}()
	}
	var out, errOut bytes.Buffer
	for c := range p.Output() {
		switch c.Stream {
		case session.Notice: // berth's word, not the command's
		case session.Stderr:
			errOut.Write(c.Data)
		default:
			out.Write(c.Data)
		}
	}
	x, err := p.Wait(ctx)
	if err != nil {
		t.Fatalf("Wait %v: %v", req.Argv, err)
	}
	return Result{Stdout: out.String(), Stderr: errOut.String(), Exec: x}
}

func readAll(t *testing.T, ctx context.Context, svc session.Service, name, p string) string {
	t.Helper()
	rc, err := svc.ReadFile(ctx, name, p)
	if err != nil {
		t.Fatalf("ReadFile %s: %v", p, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("ReadFile %s: %v", p, err)
	}
	return string(b)
}

func exitCode(x session.Execution) int {
	if x.ExitCode == nil {
		return -1
	}
	return *x.ExitCode
}

func wantClass(t *testing.T, what string, err, class error) {
	t.Helper()
	if !errors.Is(err, class) {
		t.Errorf("%s: err = %v, want %v", what, err, class)
	}
}

// waitEvent reads events until match accepts one, failing after 10 s.
func waitEvent(t *testing.T, events <-chan session.Event, match func(session.Event) bool) session.Event {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatal("watch channel closed early")
			}
			if match(ev) {
				return ev
			}
		case <-timeout:
			t.Fatal("timed out waiting for an event")
		}
	}
}

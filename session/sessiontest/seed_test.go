package sessiontest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
)

var t0 = time.Date(2026, 3, 14, 15, 0, 0, 0, time.UTC)

// seeded returns a fake holding sessions in several states, a running and
// a finished recorded execution, a generated one and workspace files.
func seeded(t *testing.T, opts Options) *Fake {
	t.Helper()
	opts.Now = func() time.Time { return t0 }
	f := New(opts)
	t.Cleanup(func() { f.Close() })
	code := 0
	for _, err := range []error{
		f.AddSession(session.Session{Name: "run", State: session.StateRunning, Cause: "booted", Pid: 42, Accel: "kvm", DiskBytes: 1 << 30, Running: 7}),
		f.AddSession(session.Session{Name: "paused", State: session.StatePaused}),
		f.AddSession(session.Session{Name: "asleep", State: session.StateSleeping}),
		f.AddExecution(session.Execution{ID: "x-done", Session: "run", State: session.ExecExited, ExitCode: &code, StartedAt: t0},
			session.Chunk{Data: []byte("one\n")}, session.Chunk{Stream: session.Stderr, Data: []byte("two\n")}),
		f.AddExecution(session.Execution{ID: "x-live", Session: "run", State: session.ExecRunning, StartedAt: t0}),
		f.AddGenerated(session.Execution{ID: "x-gen", Session: "run", State: session.ExecRunning, StartedAt: t0}, 1000, Lines("x-gen", 2, 0, t0)),
		f.AddFile("run", "a/b/c.txt", []byte("deep"), t0.Add(-time.Hour)),
		f.AddDir("run", "empty", t0.Add(-time.Hour)),
		f.Note("run", session.EventNote, "seeded"),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// The seeds keep the contract: the suite passes beside them, with and
// without a delay on the lifecycle.
func TestSuiteBesideSeeds(t *testing.T) {
	for _, d := range []time.Duration{0, time.Millisecond} {
		t.Run(d.String(), func(t *testing.T) { Suite(t, seeded(t, Options{Delay: d})) })
	}
}

func TestSeeds(t *testing.T) {
	ctx := t.Context()
	f := seeded(t, Options{})
	s, err := f.Get(ctx, "run")
	if err != nil || s.Pid != 42 || s.Accel != "kvm" || s.Running != 2 || !s.CreatedAt.Equal(t0) {
		t.Fatalf("seeded session = %+v, %v; want it as given, 2 running (counted), created now", s, err)
	}
	if tl, _ := f.Timeline(ctx, "run", 0); len(tl) != 2 || tl[0].Message != "booted" || tl[1].Message != "seeded" {
		t.Errorf("timeline %+v, want the seeded state and the note", tl)
	}
	page, err := f.Output(ctx, "x-done", 0, 0)
	if err != nil || len(page.Chunks) != 2 || page.Chunks[1].Seq != 2 || page.Chunks[1].Exec != "x-done" ||
		page.Chunks[1].Stream != session.Stderr || !page.Chunks[0].Time.Equal(t0) || page.Next != 3 {
		t.Errorf("recorded output = %+v, %v", page, err)
	}
	page, err = f.Output(ctx, "x-gen", 999, 10)
	if err != nil || len(page.Chunks) != 2 || string(page.Chunks[1].Data) != LineText(1998)+"\n"+LineText(1999)+"\n" || page.Next != 1001 {
		t.Errorf("generated output from 999 = %+v, %v", page, err)
	}
	if fi, err := f.Stat(ctx, "run", "a/b"); err != nil || !fi.IsDir() || !fi.ModTime.Equal(t0.Add(-time.Hour)) {
		t.Errorf("parent of an added file = %+v, %v", fi, err)
	}
	if got := readAll(t, ctx, f, "run", "a/b/c.txt"); got != "deep" {
		t.Errorf("added file = %q", got)
	}
	if s, _ := f.Get(ctx, "run"); s.WorkspaceUsed != 0 {
		t.Errorf("AddFile changed WorkspaceUsed to %d", s.WorkspaceUsed)
	}

	// A seeded running execution ends by the service's calls.
	p, err := f.Attach(ctx, "x-live", 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Cancel(ctx, "x-live"); err != nil {
		t.Fatalf("Cancel seeded: %v", err)
	}
	if x, err := p.Wait(ctx); err != nil || x.State != session.ExecCancelled {
		t.Errorf("seeded after Cancel: %s, %v", x.State, err)
	}
	wantClass(t, "Cancel again", f.Cancel(ctx, "x-live"), session.ErrInvalidState)
	if err := f.Crash("run", "oom"); err != nil {
		t.Fatal(err)
	}
	if x, _ := f.Execution(ctx, "x-gen"); x.State != session.ExecLost {
		t.Errorf("generated after Crash: %s, want lost", x.State)
	}
	if s, _ := f.Get(ctx, "run"); s.Running != 0 || s.Accel != "" || s.Pid != 0 {
		t.Errorf("after Crash: %+v", s)
	}
	wantClass(t, "Grow ended", f.Grow("x-gen", 1), session.ErrInvalidState)
	wantClass(t, "Grow recorded", f.Grow("x-done", 1), session.ErrInvalid)
}

func TestSeedErrors(t *testing.T) {
	f := seeded(t, Options{})
	for _, c := range []struct {
		name  string
		err   error
		class error
	}{
		{"AddSession bad name", f.AddSession(session.Session{Name: "Bad"}), session.ErrInvalid},
		{"AddSession twice", f.AddSession(session.Session{Name: "run"}), session.ErrExists},
		{"AddExecution no ID", f.AddExecution(session.Execution{Session: "run"}), session.ErrInvalid},
		{"AddExecution twice", f.AddExecution(session.Execution{ID: "x-done", Session: "run"}), session.ErrExists},
		{"AddExecution no session", f.AddExecution(session.Execution{ID: "x-new", Session: "nope"}), session.ErrNotFound},
		{"AddFile over a dir", f.AddFile("run", "a/b", nil, t0), session.ErrExists},
		{"AddFile under a file", f.AddFile("run", "a/b/c.txt/d", nil, t0), session.ErrExists},
		{"AddFile outside", f.AddFile("run", "../x", nil, t0), session.ErrInvalid},
		{"AddDir root", f.AddDir("run", "/workspace", t0), session.ErrInvalid},
		{"Update missing", f.Update("nope", func(*session.Session) {}), session.ErrNotFound},
		{"Note missing", f.Note("nope", session.EventNote, "x"), session.ErrNotFound},
	} {
		wantClass(t, c.name, c.err, c.class)
	}
}

func TestUpdateKeepsNameAndState(t *testing.T) {
	ctx := t.Context()
	f := seeded(t, Options{})
	events, err := f.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	f.Update("run", func(s *session.Session) { s.Name, s.State, s.DirtyBytes = "other", session.StateStopped, 99 })
	if s, _ := f.Get(ctx, "run"); s.State != session.StateRunning || s.DirtyBytes != 99 {
		t.Errorf("after Update: %s dirty %d", s.State, s.DirtyBytes)
	}
	waitEvent(t, events, func(ev session.Event) bool {
		return ev.Kind == session.EventStats && ev.Name == "run" && ev.Session.DirtyBytes == 99
	})
}

func TestFaults(t *testing.T) {
	boom := errors.New("qmp: stop: device busy")
	tests := []struct {
		name   string
		method string
		setup  func(f *Fake)
		call   func(ctx context.Context, f *Fake) error
		want   error // matched with errors.Is
	}{
		{"FailNext", "Pause", func(f *Fake) { f.FailNext("Pause", boom) },
			func(ctx context.Context, f *Fake) error { _, err := f.Pause(ctx, "run"); return err }, boom},
		{"FailNext once", "Pause", func(f *Fake) { f.FailNext("Pause", boom); f.Pause(context.Background(), "run") },
			func(ctx context.Context, f *Fake) error { _, err := f.Pause(ctx, "run"); return err }, nil},
		{"FailNext other method", "Flush", func(f *Fake) { f.FailNext("Pause", boom) },
			func(ctx context.Context, f *Fake) error { _, err := f.Flush(ctx, "run"); return err }, nil},
		{"Hang", "ListDir", func(f *Fake) { f.Hang("ListDir") },
			func(ctx context.Context, f *Fake) error { _, err := f.ListDir(ctx, "run", ""); return err }, context.DeadlineExceeded},
		{"Hang other method", "Stat", func(f *Fake) { f.Hang("ListDir") },
			func(ctx context.Context, f *Fake) error { _, err := f.Stat(ctx, "run", ""); return err }, nil},
		{"Hang then FailNext", "Get", func(f *Fake) { f.Hang("Get"); f.FailNext("Get", boom) },
			func(ctx context.Context, f *Fake) error { _, err := f.Get(ctx, "run"); return err }, context.DeadlineExceeded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := seeded(t, Options{})
			tt.setup(f)
			before := f.Calls(tt.method)
			ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
			defer cancel()
			err := tt.call(ctx, f)
			if (tt.want == nil && err != nil) || !errors.Is(err, tt.want) {
				t.Errorf("err = %v, want %v", err, tt.want)
			}
			if n := f.Calls(tt.method) - before; n != 1 {
				t.Errorf("Calls(%s) grew by %d, want 1", tt.method, n)
			}
		})
	}
}

func TestDelay(t *testing.T) {
	f := seeded(t, Options{Delay: 100 * time.Millisecond})
	ctx := t.Context()
	start := time.Now()
	if _, err := f.Pause(ctx, "run"); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 100*time.Millisecond {
		t.Errorf("Pause took %s, want the delay", took)
	}
	start = time.Now()
	f.List(ctx)
	if took := time.Since(start); took >= 100*time.Millisecond {
		t.Errorf("List took %s: reads are not delayed", took)
	}
	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	_, err := f.Resume(short, "run")
	wantClass(t, "Resume past its deadline", err, context.DeadlineExceeded)
	if s, _ := f.Get(ctx, "run"); s.State != session.StatePaused {
		t.Errorf("a call ended during its delay changed the session: %s", s.State)
	}
}

func TestCloseWatchers(t *testing.T) {
	f := seeded(t, Options{})
	ctx := t.Context()
	ch, err := f.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	f.CloseWatchers()
	timeout := time.After(5 * time.Second)
	for open := true; open; {
		select {
		case _, open = <-ch:
		case <-timeout:
			t.Fatal("watch stream not closed")
		}
	}
	ch, err = f.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waitEvent(t, ch, func(ev session.Event) bool { return ev.Name == "run" })
}

func TestFlushReportsItsTime(t *testing.T) {
	for _, c := range []struct {
		opt, want time.Duration
	}{{0, 3 * time.Millisecond}, {120 * time.Millisecond, 120 * time.Millisecond}} {
		f := seeded(t, Options{FlushTook: c.opt})
		f.SetDirty("run", 4096)
		r, err := f.Flush(t.Context(), "run")
		if err != nil || r.Took != c.want || r.DirtyBefore != 4096 {
			t.Errorf("FlushTook %s: Flush = %+v, %v; want took %s", c.opt, r, err, c.want)
		}
	}
}

func TestSleepRefusesWhileCommandsRun(t *testing.T) {
	f := seeded(t, Options{})
	_, err := f.Sleep(t.Context(), "run")
	wantClass(t, "Sleep with a running command", err, session.ErrInvalidState)
	f.Cancel(t.Context(), "x-live")
	f.Cancel(t.Context(), "x-gen")
	if s, err := f.Sleep(t.Context(), "run"); err != nil || s.State != session.StateSleeping {
		t.Errorf("Sleep idle = %s, %v", s.State, err)
	}
}

func TestLines(t *testing.T) {
	gen := Lines("x", 3, 2, t0)
	for _, c := range []struct {
		seq    uint64
		first  string
		stream session.Stream
	}{{1, LineText(0), session.Stdout}, {2, LineText(3), session.Stderr}, {3, LineText(6), session.Stdout}} {
		ch := gen(c.seq)
		if got := string(ch.Data[:len(c.first)]); got != c.first || ch.Stream != c.stream || ch.Seq != c.seq {
			t.Errorf("chunk %d starts %q on %s, want %q on %s", c.seq, got, ch.Stream, c.first, c.stream)
		}
	}
	if got := LineText(42); got != "line 0000042 the quick brown fox jumps" {
		t.Errorf("LineText(42) = %q", got)
	}
}

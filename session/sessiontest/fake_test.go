package sessiontest

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/berthvm/berth/session"
)

func TestSuite(t *testing.T) {
	f := New(Options{})
	defer f.Close()
	Suite(t, f)
}

// TestTransitions checks every lifecycle call from every reachable state.
func TestTransitions(t *testing.T) {
	ctx := t.Context()
	type op func(f *Fake, name string) (session.State, error)
	state := func(s session.Session, err error) (session.State, error) { return s.State, err }
	ops := map[string]op{
		"pause":  func(f *Fake, n string) (session.State, error) { return state(f.Pause(ctx, n)) },
		"resume": func(f *Fake, n string) (session.State, error) { return state(f.Resume(ctx, n)) },
		"stop":   func(f *Fake, n string) (session.State, error) { return state(f.Stop(ctx, n)) },
		"start":  func(f *Fake, n string) (session.State, error) { return state(f.Start(ctx, n)) },
		"flush": func(f *Fake, n string) (session.State, error) {
			if _, err := f.Flush(ctx, n); err != nil {
				return "", err
			}
			return state(f.Get(ctx, n))
		},
		"replace": func(f *Fake, n string) (session.State, error) {
			r, err := f.Replace(ctx, n, session.ReplaceOptions{})
			return r.Session.State, err
		},
	}
	setup := map[session.State]func(f *Fake, n string) error{
		session.StateRunning:  func(*Fake, string) error { return nil },
		session.StatePaused:   func(f *Fake, n string) error { _, err := f.Pause(ctx, n); return err },
		session.StateStopped:  func(f *Fake, n string) error { _, err := f.Stop(ctx, n); return err },
		session.StateCrashed:  func(f *Fake, n string) error { return f.Crash(n, "test") },
		session.StateSleeping: func(f *Fake, n string) error { _, err := f.Sleep(context.Background(), n); return err },
	}
	const bad = session.State("ErrInvalidState")
	tests := []struct {
		from session.State
		op   string
		want session.State
	}{
		{session.StateRunning, "pause", session.StatePaused},
		{session.StateRunning, "resume", bad},
		{session.StateRunning, "stop", session.StateStopped},
		{session.StateRunning, "start", bad},
		{session.StateRunning, "flush", session.StateRunning},
		{session.StatePaused, "pause", bad},
		{session.StatePaused, "resume", session.StateRunning},
		{session.StatePaused, "stop", session.StateStopped},
		{session.StatePaused, "start", bad},
		{session.StatePaused, "flush", bad},
		{session.StateStopped, "pause", bad},
		{session.StateStopped, "resume", bad},
		{session.StateStopped, "stop", bad},
		{session.StateStopped, "start", session.StateRunning},
		{session.StateStopped, "flush", bad},
		{session.StateCrashed, "pause", bad},
		{session.StateCrashed, "resume", bad},
		{session.StateCrashed, "stop", session.StateStopped},
		{session.StateCrashed, "start", session.StateRunning},
		{session.StateCrashed, "flush", bad},
		{session.StateSleeping, "pause", bad},
		{session.StateSleeping, "resume", session.StateRunning},
		{session.StateSleeping, "stop", session.StateStopped},
		{session.StateSleeping, "start", session.StateRunning},
		{session.StateSleeping, "flush", session.StateRunning},
		{session.StateRunning, "replace", session.StateRunning},
		{session.StatePaused, "replace", session.StateRunning},
		{session.StateStopped, "replace", session.StateRunning},
		{session.StateCrashed, "replace", session.StateRunning},
		{session.StateSleeping, "replace", session.StateRunning},
	}
	for _, tt := range tests {
		t.Run(string(tt.from)+"/"+tt.op, func(t *testing.T) {
			f := New(Options{})
			defer f.Close()
			if _, err := f.Create(ctx, session.CreateOptions{Name: "s"}); err != nil {
				t.Fatal(err)
			}
			if err := setup[tt.from](f, "s"); err != nil {
				t.Fatal(err)
			}
			got, err := ops[tt.op](f, "s")
			if tt.want == bad {
				if !errors.Is(err, session.ErrInvalidState) {
					t.Errorf("%s from %s = %s, %v; want ErrInvalidState", tt.op, tt.from, got, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("%s from %s = %s, %v; want %s", tt.op, tt.from, got, err, tt.want)
			}
		})
	}
}

func TestCrashLosesRunningExecs(t *testing.T) {
	ctx := t.Context()
	f := New(Options{})
	defer f.Close()
	f.Create(ctx, session.CreateOptions{Name: "s"})
	p, err := f.Exec(ctx, "s", session.ExecRequest{Argv: []string{"sleep", "30"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Crash("s", "VMM killed by SIGKILL"); err != nil {
		t.Fatal(err)
	}
	x, err := p.Wait(ctx)
	if err != nil || x.State != session.ExecLost {
		t.Errorf("after crash: %s, %v; want lost", x.State, err)
	}
}

func TestRetentionGap(t *testing.T) {
	ctx := t.Context()
	f := New(Options{OutputRetention: 64 << 10})
	defer f.Close()
	f.Create(ctx, session.CreateOptions{Name: "s"})
	r := Run(t, ctx, f, "s", session.ExecRequest{Argv: []string{"head", "-c", "200000", "/dev/zero"}}, "")
	page, err := f.Output(ctx, r.Exec.ID, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var kept int64
	for _, c := range page.Chunks {
		kept += int64(len(c.Data))
	}
	if page.Gap == 0 || page.Gap+kept != 200000 || page.Chunks[0].Seq == 1 {
		t.Errorf("gap %d + kept %d, first seq %d; want a gap and 200000 in all", page.Gap, kept, page.Chunks[0].Seq)
	}
	next, err := f.Output(ctx, r.Exec.ID, page.Next, 0)
	if err != nil || len(next.Chunks) != 0 || next.Gap != 0 || next.Next != page.Next {
		t.Errorf("Output past the end = %+v, %v", next, err)
	}
}

func TestWatchEndsWithContext(t *testing.T) {
	f := New(Options{})
	defer f.Close()
	ctx, cancel := context.WithCancel(t.Context())
	ch, err := f.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	for range ch {
	}
}

func TestHarnessSuite(t *testing.T) {
	f := New(Options{})
	defer f.Close()
	HarnessSuite(t, f)
}

// A fork keeps its source's schedules, under ids of its own.
func TestFakeForkKeepsSchedules(t *testing.T) {
	ctx := t.Context()
	f := New(Options{})
	defer f.Close()
	if _, err := f.Create(ctx, session.CreateOptions{Name: "src"}); err != nil {
		t.Fatal(err)
	}
	sc, err := f.AddSchedule(ctx, "src", session.ScheduleRequest{Spec: "@every 1h", Argv: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Fork(ctx, "src", "dst"); err != nil {
		t.Fatal(err)
	}
	got, err := f.Schedules(ctx, "dst")
	if err != nil || len(got) != 1 || got[0].Spec != "@every 1h" || got[0].ID == sc.ID || got[0].Session != "dst" {
		t.Fatalf("the fork's schedules: %+v, %v", got, err)
	}
}

// The fake refuses checkpoints by the contract's own rules: a memory
// snapshot of a stopped session, and one over the checkpoint limit, each
// with its class and field.
func TestFakeCheckpointRules(t *testing.T) {
	f := New(Options{CheckpointLimit: 2})
	defer f.Close()
	ctx := t.Context()
	if _, err := f.Create(ctx, session.CreateOptions{Name: "a"}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := f.Checkpoint(ctx, "a", session.CheckpointOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := f.Checkpoint(ctx, "a", session.CheckpointOptions{})
	if !errors.Is(err, session.ErrConflict) || session.FieldOf(err) != session.FieldCheckpoint || !strings.Contains(err.Error(), "checkpoint_limit") {
		t.Errorf("third checkpoint over a limit of 2: %v", err)
	}
	if _, err := f.Stop(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	f2 := New(Options{})
	defer f2.Close()
	f2.Create(ctx, session.CreateOptions{Name: "b"})
	f2.Stop(ctx, "b")
	_, err = f2.Checkpoint(ctx, "b", session.CheckpointOptions{Memory: true})
	if !errors.Is(err, session.ErrInvalidState) || session.FieldOf(err) != session.FieldKeepMemory {
		t.Errorf("memory checkpoint of a stopped session: %v", err)
	}
}

// The fake exports no image: one it knows is unsupported (it has no
// bytes), one it does not is not found, and open is never called.
func TestFakeExportImage(t *testing.T) {
	f := New(Options{})
	defer f.Close()
	open := func(session.ImageExport) (io.Writer, error) {
		t.Error("the fake opened an output")
		return io.Discard, nil
	}
	if _, err := f.ExportImage(t.Context(), session.ExportRequest{Name: session.DefaultImage}, open, nil); !errors.Is(err, session.ErrUnsupported) {
		t.Errorf("export of %s: %v, want ErrUnsupported", session.DefaultImage, err)
	}
	if _, err := f.ExportImage(t.Context(), session.ExportRequest{Name: "nosuch"}, open, nil); !errors.Is(err, session.ErrNotFound) {
		t.Errorf("export of an unknown image: %v, want ErrNotFound", err)
	}
	if _, err := f.ExportImage(t.Context(), session.ExportRequest{}, open, nil); !errors.Is(err, session.ErrInvalid) {
		t.Errorf("export without a name: %v, want ErrInvalid", err)
	}
}

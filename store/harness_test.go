package store

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestRunsAndSchedules(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir)
	if err := s.PutRun(Run{ID: "r1", Session: "nosuch", Status: "open"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("PutRun on a missing session: %v, want ErrNotFound", err)
	}
	if err := s.PutSession(Session{Name: "s", State: "running"}); err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1000, 0).UTC()
	for _, r := range []Run{{ID: "r2", Session: "s", Status: "open", StartedAt: t0.Add(time.Second)}, {ID: "r1", Session: "s", Status: "open", StartedAt: t0}} {
		if err := s.PutRun(r); err != nil {
			t.Fatal(err)
		}
	}
	for _, x := range []string{"x1", "x2"} {
		if _, err := s.AddRunExec("s", "r1", x, t0.Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.AddRunExec("s", "r9", "x3", t0); !errors.Is(err, ErrNotFound) {
		t.Errorf("AddRunExec to a missing run: %v, want ErrNotFound", err)
	}
	if err := s.PutSchedule(Schedule{ID: "c1", Session: "s", Spec: "@every 2s", Overlap: "skip", Argv: []string{"true"}}); err != nil {
		t.Fatal(err)
	}

	// Everything survives a reopen.
	s.Close()
	s = openTest(t, dir)
	runs, err := s.ListRuns("s")
	if err != nil || len(runs) != 2 || runs[0].ID != "r1" || runs[1].ID != "r2" {
		t.Fatalf("ListRuns = %+v, %v; want r1, r2 (by start) and no exec entries", runs, err)
	}
	if runs[0].Executions != 2 || !runs[0].LastActive.Equal(t0.Add(time.Minute)) {
		t.Errorf("r1 = %+v, want 2 executions, last active at the exec", runs[0])
	}
	xs, err := s.RunExecs("s", "r1")
	if err != nil || !slices.Equal(xs, []string{"x1", "x2"}) {
		t.Errorf("RunExecs = %v, %v", xs, err)
	}
	if _, err := s.GetRun("s", "r9"); !errors.Is(err, ErrNotFound) {
		t.Errorf("GetRun missing: %v", err)
	}
	// A run removed goes with its list of execs; the other stays.
	if err := s.DeleteRun("s", "r1"); err != nil {
		t.Fatalf("DeleteRun: %v", err)
	}
	if err := s.DeleteRun("s", "r1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("DeleteRun twice: %v, want ErrNotFound", err)
	}
	if xs, err := s.RunExecs("s", "r1"); err != nil || len(xs) != 0 {
		t.Errorf("RunExecs of a removed run = %v, %v", xs, err)
	}
	if runs, err := s.ListRuns("s"); err != nil || len(runs) != 1 || runs[0].ID != "r2" {
		t.Errorf("ListRuns after DeleteRun = %+v, %v; want r2", runs, err)
	}
	scs, err := s.ListSchedules("s")
	if err != nil || len(scs) != 1 || scs[0].Spec != "@every 2s" {
		t.Fatalf("ListSchedules = %+v, %v", scs, err)
	}
	if err := s.DeleteSchedule("s", "c9"); !errors.Is(err, ErrNotFound) {
		t.Errorf("DeleteSchedule missing: %v", err)
	}

	// They go with the session.
	if err := s.DeleteSession("s"); err != nil {
		t.Fatal(err)
	}
	for _, k := range allKeys(t, s) {
		if !strings.HasPrefix(k, "meta/") {
			t.Errorf("key left after DeleteSession: %q", k)
		}
	}
}

package sessiontest

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
)

// HarnessService is a Service that also keeps agent runs and schedules.
type HarnessService interface {
	session.Service
	session.Harness
}

// HarnessSuite checks the session.Harness contract: runs group the
// executions and file writes made in them and refuse calls on another
// session or after their end; schedules validate their timetable. It
// creates sessions "conf-h1" and "conf-h2" and deletes them again.
func HarnessSuite(t *testing.T, svc HarnessService) {
	ctx := session.WithActor(t.Context(), "suite")
	for _, name := range []string{"conf-h1", "conf-h2"} {
		if _, err := svc.Create(ctx, session.CreateOptions{Name: name}); err != nil {
			t.Fatalf("Create %s: %v", name, err)
		}
		t.Cleanup(func() { svc.Delete(context.WithoutCancel(ctx), name) })
	}

	t.Run("Runs", func(t *testing.T) {
		run, err := svc.StartRun(ctx, "conf-h1", session.RunOptions{Title: "task one"})
		if err != nil {
			t.Fatalf("StartRun: %v", err)
		}
		if run.Status != session.RunOpen || run.Session != "conf-h1" || run.Title != "task one" || run.By != "suite" || session.ValidateRunID(run.ID) != nil {
			t.Fatalf("StartRun = %+v", run)
		}
		_, err = svc.StartRun(ctx, "conf-missing", session.RunOptions{})
		wantClass(t, "StartRun on a missing session", err, session.ErrNotFound)

		rctx := session.WithRun(ctx, run.ID)
		p, err := svc.Exec(rctx, "conf-h1", session.ExecRequest{Argv: []string{"echo", "hi"}})
		if err != nil {
			t.Fatalf("Exec in run: %v", err)
		}
		if _, err := p.Wait(ctx); err != nil {
			t.Fatalf("Wait: %v", err)
		}
		if _, err := svc.WriteFile(rctx, "conf-h1", "run.txt", strings.NewReader("12345")); err != nil {
			t.Fatalf("WriteFile in run: %v", err)
		}
		// Calls outside the run do not count in it.
		if p, err := svc.Exec(ctx, "conf-h1", session.ExecRequest{Argv: []string{"true"}}); err == nil {
			p.Wait(ctx)
		}

		_, err = svc.Exec(rctx, "conf-h2", session.ExecRequest{Argv: []string{"true"}})
		wantClass(t, "Exec in another session's run", err, session.ErrInvalid)
		_, err = svc.WriteFile(rctx, "conf-h2", "x", strings.NewReader("x"))
		wantClass(t, "WriteFile in another session's run", err, session.ErrInvalid)
		_, err = svc.Exec(session.WithRun(ctx, "r000000000000"), "conf-h1", session.ExecRequest{Argv: []string{"true"}})
		wantClass(t, "Exec in an unknown run", err, session.ErrNotFound)
		_, err = svc.Exec(session.WithRun(ctx, "bogus"), "conf-h1", session.ExecRequest{Argv: []string{"true"}})
		wantClass(t, "Exec in a malformed run id", err, session.ErrInvalid)

		got, err := svc.GetRun(ctx, run.ID)
		if err != nil || got.Executions != 1 || len(got.ExecIDs) != 1 || got.ExecIDs[0] != p.ID() || got.BytesWritten != 5 {
			t.Errorf("GetRun = %+v, %v; want 1 execution (%s) and 5 bytes written", got, err, p.ID())
		}

		_, err = svc.EndRun(ctx, run.ID, "abandoned")
		wantClass(t, "EndRun as abandoned", err, session.ErrInvalid)
		ended, err := svc.EndRun(ctx, run.ID, session.RunFailed)
		if err != nil || ended.Status != session.RunFailed || ended.EndedAt.IsZero() {
			t.Fatalf("EndRun = %+v, %v", ended, err)
		}
		_, err = svc.EndRun(ctx, run.ID, session.RunOK)
		wantClass(t, "EndRun twice", err, session.ErrInvalidState)
		_, err = svc.Exec(rctx, "conf-h1", session.ExecRequest{Argv: []string{"true"}})
		wantClass(t, "Exec in an ended run", err, session.ErrInvalidState)

		list, err := svc.Runs(ctx, "conf-h1")
		if err != nil || !slices.ContainsFunc(list, func(r session.Run) bool { return r.ID == run.ID && r.Status == session.RunFailed && r.Executions == 1 }) {
			t.Errorf("Runs = %+v, %v; want the ended run", list, err)
		}
		if list, err := svc.Runs(ctx, "conf-h2"); err != nil || len(list) != 0 {
			t.Errorf("Runs of the other session = %+v, %v; want none", list, err)
		}
	})

	t.Run("RemoveRun", func(t *testing.T) {
		run, err := svc.StartRun(ctx, "conf-h1", session.RunOptions{Title: "to remove", Keep: session.KeepRun(true)})
		if err != nil {
			t.Fatalf("StartRun: %v", err)
		}
		rctx := session.WithRun(ctx, run.ID)
		p, err := svc.Exec(rctx, "conf-h1", session.ExecRequest{Argv: []string{"sleep", "30"}})
		if err != nil {
			t.Fatalf("Exec in run: %v", err)
		}
		// Refused while its command runs, ended or not; the run is as it
		// was after.
		_, err = svc.RemoveRun(ctx, run.ID)
		wantClass(t, "RemoveRun with a command running", err, session.ErrInvalidState)
		if _, err := svc.EndRun(ctx, run.ID, session.RunOK); err != nil {
			t.Fatalf("EndRun after a refused removal: %v", err)
		}
		_, err = svc.RemoveRun(ctx, run.ID)
		wantClass(t, "RemoveRun of an ended run with a command running", err, session.ErrInvalidState)
		if err := svc.Cancel(ctx, p.ID()); err != nil {
			t.Fatalf("Cancel: %v", err)
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		p.Wait(wctx)

		res, err := svc.RemoveRun(ctx, run.ID)
		if err != nil || res.Run != run.ID || res.Checkpoint != run.Checkpoint {
			t.Fatalf("RemoveRun = %+v, %v; want %s and its checkpoint %q", res, err, run.ID, run.Checkpoint)
		}
		_, err = svc.GetRun(ctx, run.ID)
		wantClass(t, "GetRun of a removed run", err, session.ErrNotFound)
		if list, err := svc.Runs(ctx, "conf-h1"); err != nil || slices.ContainsFunc(list, func(r session.Run) bool { return r.ID == run.ID }) {
			t.Errorf("Runs = %+v, %v; the removed run is listed", list, err)
		}
		if cks, err := svc.Checkpoints(ctx, "conf-h1"); err != nil || slices.ContainsFunc(cks, func(c session.Checkpoint) bool { return c.ID == run.Checkpoint && c.ID != "" }) {
			t.Errorf("Checkpoints = %+v, %v; the removed run's starting point is listed", cks, err)
		}
		// Its execution stays, with the session.
		if x, err := svc.Execution(ctx, p.ID()); err != nil || x.ID != p.ID() {
			t.Errorf("Execution of the removed run's command = %+v, %v", x, err)
		}
		_, err = svc.RemoveRun(ctx, run.ID)
		wantClass(t, "RemoveRun twice", err, session.ErrNotFound)
		_, err = svc.RemoveRun(ctx, "bogus")
		wantClass(t, "RemoveRun of a malformed id", err, session.ErrInvalid)
	})

	t.Run("Schedules", func(t *testing.T) {
		for _, bad := range []struct{ spec, says string }{
			{"* * *", "5 fields"},
			{"61 * * * *", "minute field"},
			{"* 25 * * *", "hour field"},
			{"* * 0 * *", "day-of-month field"},
			{"* * * 13 *", "month field"},
			{"* * * * 8", "day-of-week field"},
			{"@every 0s", "below the minimum"},
			{"@every 500ms", "below the minimum"},
			{"@every soon", "duration"},
			{"@sometimes", "descriptor"},
		} {
			_, err := svc.AddSchedule(ctx, "conf-h1", session.ScheduleRequest{Spec: bad.spec, Argv: []string{"true"}})
			wantClass(t, "AddSchedule "+bad.spec, err, session.ErrInvalid)
			if err != nil && !strings.Contains(err.Error(), bad.says) {
				t.Errorf("AddSchedule %q: %q does not say %q", bad.spec, err, bad.says)
			}
		}
		_, err := svc.AddSchedule(ctx, "conf-h1", session.ScheduleRequest{Spec: "@every 1h", Overlap: "sometimes", Argv: []string{"true"}})
		wantClass(t, "AddSchedule bad overlap", err, session.ErrInvalid)
		_, err = svc.AddSchedule(ctx, "conf-h1", session.ScheduleRequest{Spec: "@every 1h"})
		wantClass(t, "AddSchedule without a command", err, session.ErrInvalid)

		sc, err := svc.AddSchedule(ctx, "conf-h1", session.ScheduleRequest{Spec: "*/5 * * * *", Argv: []string{"true"}})
		if err != nil || sc.Overlap != session.OverlapSkip || sc.Next.IsZero() || sc.Session != "conf-h1" {
			t.Fatalf("AddSchedule = %+v, %v; want overlap skip and a next time", sc, err)
		}
		list, err := svc.Schedules(ctx, "conf-h1")
		if err != nil || len(list) != 1 || list[0].ID != sc.ID {
			t.Errorf("Schedules = %+v, %v", list, err)
		}
		wantClass(t, "RemoveSchedule of another session", svc.RemoveSchedule(ctx, "conf-h2", sc.ID), session.ErrNotFound)
		if err := svc.RemoveSchedule(ctx, "conf-h1", sc.ID); err != nil {
			t.Errorf("RemoveSchedule: %v", err)
		}
		wantClass(t, "RemoveSchedule twice", svc.RemoveSchedule(ctx, "conf-h1", sc.ID), session.ErrNotFound)
		if list, _ := svc.Schedules(ctx, "conf-h1"); len(list) != 0 {
			t.Errorf("Schedules after remove = %+v", list)
		}
	})
}

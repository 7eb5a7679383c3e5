package cli_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/sessiontest"
	"github.com/berthvm/berth/ui/cli"
)

func TestRunsAndSchedules(t *testing.T) {
	w := newWorld(t, sessiontest.Options{})
	ctx := t.Context()
	w.sh(t, "create", "demo")
	w.sh(t, "create", "other")

	id := strings.TrimSpace(w.sh(t, "run", "start", "demo", "--title", "fix the build"))
	if err := session.ValidateRunID(id); err != nil {
		t.Fatalf("run start printed %q: %v", id, err)
	}
	if r := w.run(ctx, cli.Env{}, "exec", "--run", id, "demo", "--", "echo", "hi"); r.code != 0 || r.stdout != "hi\n" {
		t.Errorf("exec --run = %+v", r)
	}
	w.run(ctx, cli.Env{Stdin: strings.NewReader("hello")}, "put", "--run", id, "demo", "-", "a.txt")
	if r := w.run(ctx, cli.Env{}, "exec", "--run", id, "other", "--", "true"); r.code != 1 || !strings.Contains(r.stderr, "belongs to session \"demo\"") {
		t.Errorf("exec --run of another session's run = %+v", r)
	}
	if r := w.run(ctx, cli.Env{}, "exec", "--run", "nope", "demo", "--", "true"); r.code != cli.ExitUsage || !strings.Contains(r.stderr, "--run") {
		t.Errorf("exec --run nope = %+v", r)
	}

	var runs []session.Run
	if err := json.Unmarshal([]byte(w.sh(t, "runs", "demo", "--json")), &runs); err != nil || len(runs) != 1 {
		t.Fatalf("runs --json = %v, %v", runs, err)
	}
	if r := runs[0]; r.ID != id || r.Title != "fix the build" || r.By != "cli" || r.Executions != 1 || r.BytesWritten != 5 || r.Status != session.RunOpen {
		t.Errorf("run = %+v", r)
	}
	table := w.sh(t, "runs", "demo")
	for _, s := range []string{"STATUS", id, "open", "fix the build", "5 B"} {
		if !strings.Contains(table, s) {
			t.Errorf("runs table lacks %q:\n%s", s, table)
		}
	}
	if out := w.sh(t, "run", "end", id, "--status", "failed"); !strings.Contains(out, "ended failed: 1 execution") {
		t.Errorf("run end = %q", out)
	}
	if r := w.run(ctx, cli.Env{}, "run", "end", id); r.code != 1 || !strings.Contains(r.stderr, "already ended") {
		t.Errorf("run end twice = %+v", r)
	}
	if r := w.run(ctx, cli.Env{}, "run", "end", id, "--status", "abandoned"); r.code != cli.ExitUsage {
		t.Errorf("run end --status abandoned = %+v, want a usage error", r)
	}

	// run rm: the run goes, with its starting point.
	kept := strings.TrimSpace(w.sh(t, "run", "start", "demo", "--keep"))
	if out := w.sh(t, "run", "rm", kept); !strings.Contains(out, "removed run "+kept+" and its starting point, checkpoint c") {
		t.Errorf("run rm = %q", out)
	}
	if out := w.sh(t, "run", "rm", id); out != "removed run "+id+"\n" {
		t.Errorf("run rm of a run that kept nothing = %q", out)
	}
	if r := w.run(ctx, cli.Env{}, "run", "rm", id); r.code != 1 || !strings.Contains(r.stderr, "not found") {
		t.Errorf("run rm twice = %+v", r)
	}
	if r := w.run(ctx, cli.Env{}, "run", "rm", "nope"); r.code != cli.ExitUsage {
		t.Errorf("run rm nope = %+v, want a usage error", r)
	}
	if out := w.sh(t, "runs", "demo"); strings.Contains(out, id) || strings.Contains(out, kept) {
		t.Errorf("removed runs listed:\n%s", out)
	}

	sid := strings.TrimSpace(w.sh(t, "schedule", "add", "demo", "@every 30s", "--overlap", "queue", "--", "echo", "tick"))
	if sid == "" {
		t.Fatal("schedule add printed no id")
	}
	ls := w.sh(t, "schedule", "ls", "demo")
	for _, s := range []string{sid, "@every 30s", "queue", "echo tick"} {
		if !strings.Contains(ls, s) {
			t.Errorf("schedule ls lacks %q:\n%s", s, ls)
		}
	}
	for _, bad := range []struct{ spec, says string }{
		{"* * * * 9", "day-of-week field"},
		{"@every 0s", "below the minimum"},
		{"every day", "want 5 fields"},
	} {
		r := w.run(ctx, cli.Env{}, "schedule", "add", "demo", bad.spec, "--", "true")
		if r.code != cli.ExitUsage || !strings.Contains(r.stderr, bad.says) || strings.Count(r.stderr, "\n") != 1 {
			t.Errorf("schedule add %q = %+v, want a one-line usage error saying %q", bad.spec, r, bad.says)
		}
	}
	w.sh(t, "stop", "demo")
	if ls := w.sh(t, "schedule", "ls", "demo"); !strings.Contains(ls, "held: session is stopped") {
		t.Errorf("schedule ls of a stopped session:\n%s", ls)
	}
	if info := w.sh(t, "info", "demo"); !strings.Contains(info, "Schedules:    1 schedule (held: session is stopped)") {
		t.Errorf("info of a stopped session with a schedule:\n%s", info)
	}
	w.sh(t, "schedule", "rm", "demo", sid)
	if r := w.run(ctx, cli.Env{}, "schedule", "rm", "demo", sid); r.code != 1 || !strings.Contains(r.stderr, "not found") {
		t.Errorf("schedule rm twice = %+v", r)
	}
}

package session

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// RunStatus is an agent run's status: open until it ends.
type RunStatus string

const (
	RunOpen      RunStatus = "open"
	RunOK        RunStatus = "ok"
	RunFailed    RunStatus = "failed"
	RunCancelled RunStatus = "cancelled"
	// RunAbandoned: the caller went away and left the run open; berth
	// ended it after the run timeout. Never set by a caller.
	RunAbandoned RunStatus = "abandoned"
)

// ParseRunStatus parses a status a caller may end a run with.
func ParseRunStatus(s string) (RunStatus, error) {
	switch st := RunStatus(s); st {
	case RunOK, RunFailed, RunCancelled:
		return st, nil
	}
	return "", fmt.Errorf("run status %q: use ok, failed or cancelled: %w", s, ErrInvalid)
}

// Run is one task a harness (a coding agent, a CI driver, a schedule)
// performs on an existing session. It groups the executions it started and
// the files it wrote; ending it leaves the session and its files as they
// are for the next task.
type Run struct {
	ID      string    `json:"id"`
	Session string    `json:"session"`
	Title   string    `json:"title,omitempty"`
	By      string    `json:"by,omitempty"`
	Status  RunStatus `json:"status"`
	// Note says why it ended as it did, when berth ended it.
	Note      string    `json:"note,omitempty"`
	StartedAt time.Time `json:"started_at"`
	EndedAt   time.Time `json:"ended_at,omitzero"`
	// LastActive is the run's last use; an open run idle for the run
	// timeout with nothing running in it is ended as abandoned.
	LastActive time.Time `json:"last_active,omitzero"`
	Executions int       `json:"executions"`
	// BytesWritten counts bytes written through the file API in the run.
	BytesWritten int64 `json:"bytes_written"`
	// Schedule is the schedule that started the run, if one did.
	Schedule string `json:"schedule,omitempty"`
	// ExecIDs are the run's executions, oldest first (Run only; Runs
	// leaves them out).
	ExecIDs []string `json:"exec_ids,omitempty"`
	// Checkpoint is the checkpoint of the run's starting point, when it
	// kept one (RunOptions.Keep): what run diff and run undo compare
	// with. It may since have been removed.
	Checkpoint string `json:"checkpoint,omitempty"`
	// Changes counts what the run changed against its starting point, as
	// last compared (a diff of the run sets it); nil until then.
	Changes *RunChanges `json:"changes,omitempty"`
}

// RunOptions are the settings of a new run.
type RunOptions struct {
	Title string `json:"title,omitempty"`
	// Keep takes a checkpoint of the workspace when the run starts, so
	// what the run changed can be compared and undone; nil leaves it to
	// the daemon's run_checkpoint setting.
	Keep *bool `json:"keep,omitempty"`
	// System keeps the system disk in that checkpoint too.
	System bool `json:"system,omitempty"`
}

// RemovedRun reports a run's removal.
type RemovedRun struct {
	Run string `json:"run"`
	// Checkpoint is the starting point removed with it, "" if it kept
	// none or it was gone already.
	Checkpoint string `json:"checkpoint,omitempty"`
	Freed      int64  `json:"freed,omitempty"` // bytes, of the checkpoint
}

// RunRunning is the refusal of a run's removal while n of its commands
// run.
func RunRunning(runID string, n int) error {
	return &Error{Class: ErrInvalidState, Field: FieldRun, Msg: fmt.Sprintf("%q has %d running %s: its record is theirs too", runID, n, plural(n, "command", "commands")),
		Hint: "wait for them to end, or cancel them"}
}

// KeepRun is a RunOptions.Keep value.
func KeepRun(v bool) *bool { return &v }

// Overlap says what a schedule does when it falls due while its previous
// command still runs.
type Overlap string

const (
	OverlapSkip  Overlap = "skip"  // skip this tick (the default)
	OverlapQueue Overlap = "queue" // run once the previous one ends (one waits at most)
	OverlapAllow Overlap = "allow" // run alongside
)

// ParseOverlap parses skip, queue or allow ("" is skip).
func ParseOverlap(s string) (Overlap, error) {
	switch o := Overlap(s); o {
	case "":
		return OverlapSkip, nil
	case OverlapSkip, OverlapQueue, OverlapAllow:
		return o, nil
	}
	return "", fmt.Errorf("overlap %q: use skip, queue or allow: %w", s, ErrInvalid)
}

// ScheduleRequest describes a new schedule.
type ScheduleRequest struct {
	// Spec is a five-field cron expression ("*/5 * * * *", minute hour
	// day-of-month month day-of-week, in the daemon's local time), a
	// descriptor (@hourly, @daily...) or "@every D" with D ≥ 1s.
	Spec    string            `json:"spec"`
	Overlap Overlap           `json:"overlap,omitempty"`
	Argv    []string          `json:"argv"`
	Cwd     string            `json:"cwd,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
}

// Schedule is a command that runs in a session on a timetable. Each
// firing is a recorded execution in a run of its own, titled for the
// schedule; a sleeping session is woken for it, a stopped one holds it.
type Schedule struct {
	ID       string    `json:"id"`
	Session  string    `json:"session"`
	Spec     string    `json:"spec"`
	Overlap  Overlap   `json:"overlap"`
	Argv     []string  `json:"argv"`
	Cwd      string    `json:"cwd,omitempty"`
	EnvNames []string  `json:"env_names,omitempty"`
	By       string    `json:"by,omitempty"`
	Created  time.Time `json:"created"`
	Next     time.Time `json:"next,omitzero"`  // when it is due next
	Fired    time.Time `json:"fired,omitzero"` // the due time it last fired for
	Count    int       `json:"count"`          // times fired
	Skipped  int       `json:"skipped,omitempty"`
	LastRun  string    `json:"last_run,omitempty"`
	LastExec string    `json:"last_exec,omitempty"`
	// Held says why it does not fire now ("held: session is stopped").
	Held string `json:"held,omitempty"`
}

// Harness is what harnesses use besides the Service: agent runs and
// schedules. The Manager, the socket client and the fake implement it.
type Harness interface {
	// StartRun opens a run on a session. Calls made with WithRun(ctx, id)
	// then count in it.
	StartRun(ctx context.Context, name string, opts RunOptions) (Run, error)
	// EndRun ends an open run with ok, failed or cancelled.
	EndRun(ctx context.Context, runID string, status RunStatus) (Run, error)
	// Runs lists a session's runs, oldest first.
	Runs(ctx context.Context, name string) ([]Run, error)
	// GetRun returns one run with its executions' ids.
	GetRun(ctx context.Context, runID string) (Run, error)
	// RemoveRun removes a run's record and its starting point's
	// checkpoint (its executions stay, with the session). Refused while
	// commands of the run are running; an open run with none is ended
	// first.
	RemoveRun(ctx context.Context, runID string) (RemovedRun, error)

	AddSchedule(ctx context.Context, name string, req ScheduleRequest) (Schedule, error)
	Schedules(ctx context.Context, name string) ([]Schedule, error)
	RemoveSchedule(ctx context.Context, name, id string) error
}

type runKey struct{}

// WithRun returns a context whose calls (Exec, WriteFile, CopyIn...) count
// in the given agent run. Like the actor, it says on whose behalf a call is
// made; a run of another session, or one that has ended, refuses the call.
func WithRun(ctx context.Context, runID string) context.Context {
	return context.WithValue(ctx, runKey{}, runID)
}

// RunOf returns the run ctx's calls count in, or "".
func RunOf(ctx context.Context) string {
	id, _ := ctx.Value(runKey{}).(string)
	return id
}

// ValidateRunID checks the form of a run id: "r" and 12 hex digits.
func ValidateRunID(id string) error {
	if len(id) != 13 || id[0] != 'r' || strings.Trim(id[1:], "0123456789abcdef") != "" {
		return &Error{Class: ErrInvalid, Field: FieldRun, Msg: fmt.Sprintf("id %q: want r and 12 hex digits", id), Hint: "use the id a run's start gave"}
	}
	return nil
}

// ValidateSchedule checks what of a schedule request needs no timetable
// parser (package engine/schedule parses the spec), filling in the default
// overlap.
func ValidateSchedule(req *ScheduleRequest) error {
	if strings.TrimSpace(req.Spec) == "" {
		return &Error{Class: ErrInvalid, Field: FieldSpec, Msg: "missing", Hint: "a cron expression such as '*/5 * * * *', or @every D"}
	}
	o, err := ParseOverlap(string(req.Overlap))
	if err != nil {
		return err
	}
	req.Overlap = o
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return &Error{Class: ErrInvalid, Field: FieldCommand, Msg: "missing: a schedule runs a command", Hint: "give the command after the timetable"}
	}
	return nil
}

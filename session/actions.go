package session

import "fmt"

// An Action is one verb of the contract: something a caller does to a
// session or its parts. The action table (verbs) says of each, once, the
// states it is allowed in, the least role that may do it, whether it
// changes anything, and how a refusal names it. The SSH server's guard,
// the TUI's read-only mode, MCP's tool hints and the CLI's help derive
// from it; the engine and the fake check transitions with it.
type Action string

// The actions. Those with states are the lifecycle's transitions.
const (
	ActionRead    Action = "read" // sessions, events, executions, output, files
	ActionCreate  Action = "create"
	ActionPause   Action = "pause"
	ActionResume  Action = "resume" // also wakes a sleeping session
	ActionStop    Action = "stop"
	ActionStart   Action = "start"
	ActionDelete  Action = "delete"
	ActionFlush   Action = "flush"
	ActionExec    Action = "exec"
	ActionFiles   Action = "files" // using a session's files needs its VM
	ActionSleep   Action = "sleep"
	ActionReplace Action = "replace" // a new VM with a fresh system disk
	ActionCancel  Action = "cancel"
	ActionStdin   Action = "stdin"
	ActionResize  Action = "resize"
	// File changes.
	ActionWriteFile  Action = "write-file"
	ActionMkdir      Action = "mkdir"
	ActionRemoveFile Action = "remove-file"
	ActionRename     Action = "rename"
	ActionSetattr    Action = "setattr"
	ActionLink       Action = "link"
	// Agent runs and schedules.
	ActionRun Action = "run"
	// ActionRemoveRun removes a run's record and its starting point.
	ActionRemoveRun Action = "remove-run"
	ActionSchedule  Action = "schedule"
	// Checkpoints.
	ActionCheckpoint       Action = "checkpoint"
	ActionDeleteCheckpoint Action = "delete-checkpoint"
	ActionRestore          Action = "restore"
	ActionFork             Action = "fork"
	// What runs changed, and taking it back.
	ActionDiff Action = "diff"
	ActionUndo Action = "undo"
	// Networks and forwarded ports.
	ActionNet Action = "net"
	// Images (the daemon's host).
	ActionImage Action = "image"
	// ActionCommitImage makes a session's system disk an image.
	ActionCommitImage Action = "commit-image"
	// ActionImageExport writes an image out as a tarball: it changes
	// nothing on the host (the caller says where the bytes go), so it is
	// a read, and every read is a viewer's, as reading sessions' files is.
	ActionImageExport Action = "image-export"
	// ActionMove moves a stopped or sleeping session to another host.
	ActionMove Action = "move"
	// ActionRecover starts a session of a gone host on another, from a
	// replica of one of its checkpoints.
	ActionRecover Action = "recover"
	// ActionHosts reads a fleet's hosts (berth host ls).
	ActionHosts Action = "hosts"
	// ActionDrain drains a fleet's host or ends its drain.
	ActionDrain Action = "drain"
)

// Role is what a caller may do; roles are ordered, each allowed all the
// one before it is. The SSH server gives each key one; a caller on the
// daemon's socket is its host's user, an Admin.
type Role int

const (
	// Viewer reads everything and changes nothing.
	Viewer Role = iota + 1
	// Operator also runs the lifecycle, commands, files, runs,
	// schedules, checkpoints, forks and networks; it may not delete
	// sessions or checkpoints, replace VMs or restore.
	Operator
	// Admin may do everything.
	Admin
)

func (r Role) String() string {
	switch r {
	case Viewer:
		return "viewer"
	case Operator:
		return "operator"
	case Admin:
		return "admin"
	}
	return fmt.Sprintf("role(%d)", int(r))
}

// ParseRole parses "viewer", "operator" or "admin".
func ParseRole(s string) (Role, error) {
	for r := Viewer; r <= Admin; r++ {
		if r.String() == s {
			return r, nil
		}
	}
	return 0, fmt.Errorf("unknown role %q: use viewer, operator or admin: %w", s, ErrInvalid)
}

// A Verb is one row of the action table.
type Verb struct {
	Action Action
	// States are the session states it is allowed in; nil: any.
	States []State
	// Role is the least role that may do it.
	Role Role
	// Mutates: it changes something (read-only front ends hide it).
	Mutates bool
	// What completes "role viewer may not …".
	What string
	// Refusal names it in a refused transition where the bare verb does
	// not read ("cannot exec in session …"); "" is the verb.
	Refusal string
}

var (
	settled = []State{StateRunning, StatePaused, StateStopped, StateCrashed, StateSleeping}
	live    = []State{StateRunning, StateSleeping}
)

// verbs is the action table.
var verbs = []Verb{
	{Action: ActionRead, Role: Viewer, What: "read sessions"},
	{Action: ActionCreate, Role: Operator, Mutates: true, What: "create sessions"},
	{Action: ActionPause, States: []State{StateRunning}, Role: Operator, Mutates: true, What: "pause sessions"},
	{Action: ActionResume, States: []State{StatePaused, StateSleeping}, Role: Operator, Mutates: true, What: "resume sessions"},
	{Action: ActionStop, States: []State{StateRunning, StatePaused, StateCrashed, StateSleeping}, Role: Operator, Mutates: true, What: "stop sessions"},
	{Action: ActionStart, States: []State{StateStopped, StateCrashed, StateSleeping}, Role: Operator, Mutates: true, What: "start sessions"},
	{Action: ActionSleep, States: []State{StateRunning}, Role: Operator, Mutates: true, What: "put sessions to sleep"},
	{Action: ActionFlush, States: live, Role: Operator, Mutates: true, What: "flush sessions"},
	{Action: ActionDelete, States: settled, Role: Admin, Mutates: true, What: "delete sessions"},
	// replace works from any settled state: a VM that cannot start is
	// what it is for.
	{Action: ActionReplace, States: settled, Role: Admin, Mutates: true, What: "replace session VMs"},
	{Action: ActionExec, States: live, Role: Operator, Mutates: true, What: "run commands", Refusal: "exec in"},
	// Using files is reading them too: every role may, in the states
	// that have a VM to ask.
	{Action: ActionFiles, States: live, Role: Viewer, What: "use files", Refusal: "use files of"},
	{Action: ActionCancel, Role: Operator, Mutates: true, What: "cancel commands"},
	{Action: ActionStdin, Role: Operator, Mutates: true, What: "send input to commands"},
	{Action: ActionResize, Role: Operator, Mutates: true, What: "resize command terminals"},
	{Action: ActionWriteFile, Role: Operator, Mutates: true, What: "write files"},
	{Action: ActionMkdir, Role: Operator, Mutates: true, What: "create directories"},
	{Action: ActionRemoveFile, Role: Operator, Mutates: true, What: "remove files"},
	{Action: ActionRename, Role: Operator, Mutates: true, What: "rename files"},
	{Action: ActionSetattr, Role: Operator, Mutates: true, What: "change file attributes"},
	{Action: ActionLink, Role: Operator, Mutates: true, What: "create links"},
	{Action: ActionRun, Role: Operator, Mutates: true, What: "start or end agent runs"},
	// Removing a run removes its starting point, a checkpoint: a
	// checkpoint's removal's role. The host's copies go in any state.
	{Action: ActionRemoveRun, Role: Admin, Mutates: true, What: "remove runs"},
	{Action: ActionSchedule, Role: Operator, Mutates: true, What: "add or remove schedules"},
	// a paused VM cannot flush and freeze its disks; a stopped or
	// crashed one has disks nothing writes to.
	{Action: ActionCheckpoint, States: []State{StateRunning, StateStopped, StateCrashed, StateSleeping}, Role: Operator, Mutates: true, What: "checkpoint sessions"},
	{Action: ActionDeleteCheckpoint, Role: Admin, Mutates: true, What: "remove checkpoints"},
	{Action: ActionRestore, States: []State{StateRunning, StateStopped, StateCrashed, StateSleeping}, Role: Admin, Mutates: true, What: "restore sessions to checkpoints"},
	{Action: ActionFork, States: live, Role: Operator, Mutates: true, What: "fork sessions"},
	// A diff of two checkpoints reads the host's copies in any state; one
	// with the workspace now asks the VM, as reading files does.
	{Action: ActionDiff, Role: Viewer, What: "compare checkpoints"},
	// An undo restores (the whole workspace) or writes the paths named:
	// a restore's role, in a restore's states.
	{Action: ActionUndo, States: []State{StateRunning, StateStopped, StateCrashed, StateSleeping}, Role: Admin, Mutates: true, What: "undo runs"},
	{Action: ActionNet, Role: Operator, Mutates: true, What: "change networks or forward ports"},
	{Action: ActionImage, Role: Admin, Mutates: true, What: "build, import or remove images"},
	// As a checkpoint: a paused VM cannot flush and freeze its disks.
	{Action: ActionCommitImage, States: []State{StateRunning, StateStopped, StateCrashed, StateSleeping}, Role: Admin, Mutates: true,
		What: "commit sessions as images", Refusal: "commit"},
	{Action: ActionImageExport, Role: Viewer, What: "export images"},
	{Action: ActionHosts, Role: Viewer, What: "list fleet hosts"},
	// Only what has no VM moves: its disks are still, its memory (if any)
	// in a snapshot file.
	{Action: ActionMove, States: []State{StateStopped, StateSleeping}, Role: Admin, Mutates: true, What: "move sessions between hosts"},
	// A drain moves sessions off a host: a move's role.
	{Action: ActionDrain, Role: Admin, Mutates: true, What: "drain fleet hosts"},
	// The session's host is gone: its state there is not known.
	{Action: ActionRecover, Role: Admin, Mutates: true, What: "recover sessions of gone hosts"},
}

// Lookup returns the row of action.
func Lookup(action Action) (Verb, bool) {
	for _, v := range verbs {
		if v.Action == action {
			return v, true
		}
	}
	return Verb{}, false
}

// Verbs returns the action table, in its order.
func Verbs() []Verb { return append([]Verb(nil), verbs...) }

// Mutates reports whether action changes anything; an unknown action
// counts as one that does.
func Mutates(action Action) bool {
	v, ok := Lookup(action)
	return !ok || v.Mutates
}

// Permit returns nil when role may do action, or an error wrapping
// ErrPermission that says which role may: "role viewer may not pause
// sessions (needs operator)".
func Permit(role Role, action Action) error {
	v, ok := Lookup(action)
	if !ok {
		v = Verb{Action: action, Role: Admin, What: string(action)}
	}
	if role >= v.Role {
		return nil
	}
	return &Error{Class: ErrPermission, Msg: fmt.Sprintf("role %s may not %s", role, v.What), Hint: "needs " + v.Role.String()}
}

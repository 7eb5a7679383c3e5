// Package session is berth's contract: what a session is, what can be done
// to it and by whom, and every rule that decides whether a request is
// allowed — names, state transitions (the action table in validate.go),
// create limits, checkpoint preconditions, network policy, sizes — with
// the Service interfaces that every front end codes against (the TUI, the
// CLI, the SSH server, MCP) and the error classes that travel across the
// daemon's socket. It imports only the standard library.
//
// The engine that keeps the promises is package session/engine (the
// Manager, with the mechanisms beneath it in packages of their own); the
// socket API is session/api; sessiontest has a fake that runs these same
// rules.
package session

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"time"
)

// Error classes. Every error the Service returns wraps at most one of these,
// and the socket API carries them across, so errors.Is works for clients.
var (
	ErrNotFound     = errors.New("not found")
	ErrExists       = errors.New("already exists")
	ErrInvalid      = errors.New("invalid argument")
	ErrInvalidState = errors.New("invalid state")
	ErrConflict     = errors.New("conflict") // e.g. workspace in use by another writer
	ErrPermission   = errors.New("permission denied")
	ErrUnavailable  = errors.New("unavailable") // daemon or VM cannot be reached
)

// State is a session's lifecycle state.
type State string

const (
	StateCreating State = "creating"
	StateRunning  State = "running"
	StatePaused   State = "paused"
	StateStopping State = "stopping"
	StateStopped  State = "stopped"
	StateCrashed  State = "crashed"
	StateDeleting State = "deleting"
	StateSleeping State = "sleeping"
	// StateUnreachable is a fleet's session whose host does not answer
	// (its lease expired, or it did not answer the list): what it is
	// doing there is unknown, and nothing is started elsewhere on its own.
	StateUnreachable State = "unreachable"
)

// Session is a snapshot of one session's record and live figures.
type Session struct {
	Name  string `json:"name"`
	State State  `json:"state"`
	// Cause says why the session entered State ("created", "paused by
	// admin", "VMM killed by SIGKILL: <log tail>").
	Cause string `json:"cause,omitempty"`

	CPUs      int    `json:"cpus"`
	MemoryMiB int    `json:"memory_mib"`
	DiskBytes int64  `json:"disk_bytes"` // workspace volume size
	Image     string `json:"image"`
	// ImageDigest is the build of Image the session runs.
	ImageDigest string `json:"image_digest,omitempty"`
	// SystemBytes is the system disk's size (0: the image's root is its
	// initramfs, in memory); SystemUsed what is written on it, as the
	// guest sees it while running, else as allocated on the host.
	SystemBytes int64 `json:"system_bytes,omitempty"`
	SystemUsed  int64 `json:"system_used,omitempty"`
	// RootDirectory is where commands start and the file API works;
	// HomeDirectory is HOME of managed commands (on the system disk where
	// there is one: kept with the VM; in memory otherwise).
	RootDirectory string `json:"root_directory"`
	HomeDirectory string `json:"home_directory"`
	VMM           string `json:"vmm"`             // driver name
	Accel         string `json:"accel,omitempty"` // accelerator in use while running
	Pid           int    `json:"pid,omitempty"`   // VMM pid while running or paused

	CreatedAt    time.Time `json:"created_at"`
	StartedAt    time.Time `json:"started_at,omitzero"` // current VM's start
	LastActivity time.Time `json:"last_activity,omitzero"`

	// WorkspaceUsed is the workspace's use as last measured by the guest,
	// at WorkspaceMeasuredAt: every few seconds while it runs, and kept
	// with the session's record, so it holds while stopped or asleep and
	// across daemon restarts. Zero time and zero bytes: not measured yet
	// (WorkspaceKnown).
	WorkspaceUsed       int64     `json:"workspace_used"`
	WorkspaceMeasuredAt time.Time `json:"workspace_measured_at,omitzero"`
	// Live figures from the guest, refreshed every few seconds while running.
	DirtyBytes   int64 `json:"dirty_bytes"` // what a crash of the VM would lose now
	MemUsedBytes int64 `json:"mem_used_bytes,omitempty"`
	Running      int   `json:"running"` // executions in starting/running state
	// OutputHeld counts the session's commands whose output is held for
	// lack of room on the host (they block on their pipe; nothing is lost).
	OutputHeld int `json:"output_held,omitempty"`
	// Live holds the sampled CPU, memory and I/O figures while running.
	Live *Live `json:"live,omitempty"`

	// While sleeping: the memory snapshot's size on disk. LastWake is how
	// long the session's last wake took.
	SnapshotBytes int64         `json:"snapshot_bytes,omitempty"`
	LastWake      time.Duration `json:"last_wake,omitempty"`
	// IdleTimeout is how long the session may idle before it sleeps by
	// itself; 0 means never.
	IdleTimeout time.Duration `json:"idle_timeout"`
	// Checkpoints counts the session's checkpoints; CheckpointBytes is
	// their size on disk.
	Checkpoints     int   `json:"checkpoints,omitempty"`
	CheckpointBytes int64 `json:"checkpoint_bytes,omitempty"`
	// Net is the session's network policy (see ParsePolicy).
	Net string `json:"net,omitempty"`
	// Host is the fleet host that owns the session ("" outside a fleet).
	Host string `json:"host,omitempty"`
	// Epoch is the fleet's fencing token this host holds the session
	// at: the mod revision of its owner key when it took it; 0 outside
	// a fleet.
	Epoch int64 `json:"epoch,omitempty"`
}

// WorkspaceKnown reports whether WorkspaceUsed is a measurement, to show
// "not measured yet" rather than 0 B. A filesystem's use is never 0
// bytes, so a figure above zero is one even without its time.
func (s Session) WorkspaceKnown() bool {
	return s.WorkspaceUsed > 0 || !s.WorkspaceMeasuredAt.IsZero()
}

// ExecState is an execution's state.
type ExecState string

const (
	ExecStarting  ExecState = "starting"
	ExecRunning   ExecState = "running"
	ExecExited    ExecState = "exited"
	ExecFailed    ExecState = "failed" // could not start
	ExecCancelled ExecState = "cancelled"
	ExecTimedOut  ExecState = "timed-out"
	ExecLost      ExecState = "lost" // VM died or the agent no longer knows it
)

// Done reports whether s is final.
func (s ExecState) Done() bool {
	switch s {
	case ExecStarting, ExecRunning:
		return false
	}
	return true
}

// Execution is the record of one command run in a session.
type Execution struct {
	ID       string   `json:"id"`
	Session  string   `json:"session"`
	Argv     []string `json:"argv"`
	EnvNames []string `json:"env_names,omitempty"` // values are never recorded
	Cwd      string   `json:"cwd"`
	TTY      bool     `json:"tty,omitempty"`
	By       string   `json:"by"` // who started it: "cli", "tui", "ssh:<key comment>"
	// Outside marks a process outside berth's coordination (an SSH shell).
	Outside bool `json:"outside,omitempty"`
	// User is who it ran as, as asked or as its image's config says (""
	// is root).
	User string `json:"user,omitempty"`

	State     ExecState `json:"state"`
	ExitCode  *int      `json:"exit_code,omitempty"`
	Signal    string    `json:"signal,omitempty"`
	Error     string    `json:"error,omitempty"`
	StartedAt time.Time `json:"started_at"`
	EndedAt   time.Time `json:"ended_at,omitzero"`

	StdoutBytes int64 `json:"stdout_bytes"`
	StderrBytes int64 `json:"stderr_bytes"`
	// Held says why the command's output is not being stored now ("output
	// held: host disk full"): it waits in the guest, and the command
	// blocks on its pipe, until it can be.
	Held string `json:"held,omitempty"`
}

// Stream names an output stream.
type Stream uint8

const (
	Stdout Stream = 1
	Stderr Stream = 2
	// Notice is berth's word about the execution to whoever follows it
	// live (Seq 0, never stored): its output held for lack of room, or
	// stored again. Clients show it apart from the command's output.
	Notice Stream = 3
)

func (s Stream) String() string {
	switch s {
	case Stderr:
		return "stderr"
	case Notice:
		return "notice"
	}
	return "stdout"
}

// Chunk is one recorded piece of an execution's output. Seq numbers start at
// 1 and have no holes except where retention trimmed output.
type Chunk struct {
	Exec   string    `json:"exec"`
	Seq    uint64    `json:"seq"`
	Stream Stream    `json:"stream"`
	Time   time.Time `json:"time"`
	Data   []byte    `json:"data"`
}

// EventKind names what an Event reports.
type EventKind string

const (
	EventState   EventKind = "state"   // Session set: a lifecycle change
	EventStats   EventKind = "stats"   // Session set: live figures refreshed
	EventDeleted EventKind = "deleted" // the session is gone
	EventExec    EventKind = "exec"    // Exec set: an execution started or changed state
	EventFlush   EventKind = "flush"   // Message says how many bytes
	EventNote    EventKind = "note"    // anything else for the timeline
	EventHost    EventKind = "host"    // Host set: the data directory's space crossed the floor
	EventFleet   EventKind = "fleet"   // Fleet set: a fleet's key changed (a placement, a move, a host); Rev says when
)

// Event is one change, as published to watchers and kept in a session's
// timeline.
type Event struct {
	Seq     uint64      `json:"seq"`
	Time    time.Time   `json:"time"`
	Kind    EventKind   `json:"kind"`
	Name    string      `json:"session"`
	Message string      `json:"message,omitempty"`
	By      string      `json:"by,omitempty"`
	Session *Session    `json:"info,omitempty"`
	Exec    *Execution  `json:"exec,omitempty"`
	Host    *HostStatus `json:"host,omitempty"`
	// Fleet and Rev are set on an EventFleet: what changed and the
	// fleet's etcd revision it changed at, after which a follower that
	// reconnects resumes (FleetWatcher).
	Fleet *FleetChange `json:"fleet,omitempty"`
	Rev   int64        `json:"rev,omitempty"`
}

// CreateOptions are the settings of a new session. Zero values take the
// configured defaults.
type CreateOptions struct {
	Name      string `json:"name"`
	CPUs      int    `json:"cpus,omitempty"`
	MemoryMiB int    `json:"memory_mib,omitempty"`
	DiskBytes int64  `json:"disk_bytes,omitempty"`
	Image     string `json:"image,omitempty"`
	VMM       string `json:"vmm,omitempty"`
	// IdleTimeout overrides the configured idle timeout for this session
	// (nil: the configured one; 0: never sleep by itself).
	IdleTimeout *time.Duration `json:"idle_timeout,omitempty"`
	// SystemBytes sizes the system disk of an image with a root
	// filesystem (packages, /etc, /root); it is allocated as written.
	SystemBytes int64 `json:"system_bytes,omitempty"`
	// Net is the network policy ("": the configured default).
	Net string `json:"net,omitempty"`
	// From makes the session from a checkpoint of another: "NAME@ID", or
	// "NAME" for NAME's newest checkpoint (ParseCheckpointRef). Its
	// workspace, system disk and image are the checkpoint's, so DiskBytes,
	// SystemBytes and Image are left out; CPUs, MemoryMiB, VMM, Net and
	// IdleTimeout left out are the source session's. A memory checkpoint
	// resumes its processes, on a VM of its size. The new session has an
	// identity of its own, as a fork has. See CheckCreateFrom.
	From string `json:"from,omitempty"`
	// On pins the session to a fleet's host (create --on H); a berth not
	// in a fleet refuses it. The host that makes the session never sees
	// it: placement takes it out.
	On string `json:"on,omitempty"`
}

// ExecRequest describes a command to run.
type ExecRequest struct {
	Argv    []string          `json:"argv"`
	Env     map[string]string `json:"env,omitempty"`
	Cwd     string            `json:"cwd,omitempty"` // default /workspace
	TTY     bool              `json:"tty,omitempty"`
	Rows    int               `json:"rows,omitempty"`
	Cols    int               `json:"cols,omitempty"`
	Timeout time.Duration     `json:"timeout,omitempty"`
	Stdin   bool              `json:"stdin,omitempty"` // the caller will send stdin
	// Outside marks an interactive process outside berth's coordination
	// (a shell over SSH): recorded, but shown as such.
	Outside bool `json:"outside,omitempty"`
	// User is who the command runs as in the guest: NAME or UID, with an
	// optional :GROUP or :GID (ValidateUser), resolved against the
	// guest's own /etc/passwd and /etc/group. "" is the image's user (an
	// imported image's config User), else root.
	User string `json:"user,omitempty"`
}

// Process is a running execution the caller started or attached to.
// Output arrives on Output until the execution ends; then Wait returns.
type Process interface {
	ID() string
	// Output yields output chunks in order; it is closed when the execution
	// ends or the caller's context is done.
	Output() <-chan Chunk
	// Stdin returns a writer to the command's stdin; Close sends EOF.
	Stdin() io.WriteCloser
	Resize(ctx context.Context, rows, cols int) error
	// Cancel kills the command's whole process group in the guest.
	Cancel(ctx context.Context) error
	// Wait blocks until the execution is final and returns its record.
	Wait(ctx context.Context) (Execution, error)
}

// FlushResult reports a flush.
type FlushResult struct {
	DirtyBefore int64         `json:"dirty_before"`
	DirtyAfter  int64         `json:"dirty_after"`
	Took        time.Duration `json:"took"`
}

// FileInfo describes a file in a workspace.
type FileInfo struct {
	Name    string      `json:"name"`
	Size    int64       `json:"size"`
	Mode    fs.FileMode `json:"mode"`
	ModTime time.Time   `json:"mtime"`
	Link    string      `json:"link,omitempty"` // symlink target
}

// IsDir reports whether fi describes a directory.
func (fi FileInfo) IsDir() bool { return fi.Mode.IsDir() }

// OutputPage is a page of recorded output. Gap counts bytes trimmed by
// retention before the first chunk returned.
type OutputPage struct {
	Chunks []Chunk `json:"chunks"`
	Gap    int64   `json:"gap,omitempty"`
	Next   uint64  `json:"next"` // seq to ask for next
}

// Lister reads sessions.
type Lister interface {
	List(ctx context.Context) ([]Session, error)
	Get(ctx context.Context, name string) (Session, error)
	// Host reports the data directory's free space against the floor
	// below which what needs space is refused.
	Host(ctx context.Context) (HostStatus, error)
}

// Watcher streams changes. The channel starts with one EventState per
// existing session, then carries changes; it is closed when ctx ends.
type Watcher interface {
	Watch(ctx context.Context) (<-chan Event, error)
	// Timeline returns a session's recorded events, oldest first.
	Timeline(ctx context.Context, name string, limit int) ([]Event, error)
}

// Lifecycle changes sessions. Each call returns the session as it is after
// the change, or a wrapped ErrInvalidState when the session's state does not
// allow it.
type Lifecycle interface {
	Create(ctx context.Context, opts CreateOptions) (Session, error)
	Pause(ctx context.Context, name string) (Session, error) // does not flush
	Resume(ctx context.Context, name string) (Session, error)
	Stop(ctx context.Context, name string) (Session, error) // stop writers, flush, unmount, power off
	Start(ctx context.Context, name string) (Session, error)
	// Sleep snapshots an idle session's VM to disk and releases it; the
	// next action on the session wakes it.
	Sleep(ctx context.Context, name string) (Session, error)
	Delete(ctx context.Context, name string) error // VM and all storage, permanently
	Flush(ctx context.Context, name string) (FlushResult, error)
	// Replace gives the session a new VM with a fresh system disk from its
	// image (or opts.Image) on the same workspace: commands end as a stop
	// ends them, the disks are flushed, the old system disk is dropped.
	Replace(ctx context.Context, name string, opts ReplaceOptions) (ReplaceResult, error)
}

// Execer runs and records commands.
type Execer interface {
	Exec(ctx context.Context, name string, req ExecRequest) (Process, error)
	// Attach follows a running execution's output from seq (0 = live only).
	Attach(ctx context.Context, execID string, fromSeq uint64) (Process, error)
	Executions(ctx context.Context, name string, all bool) ([]Execution, error)
	Execution(ctx context.Context, execID string) (Execution, error)
	// Output reads recorded output from seq, at most limit chunks.
	Output(ctx context.Context, execID string, fromSeq uint64, limit int) (OutputPage, error)
	Cancel(ctx context.Context, execID string) error
}

// Files works on a session's /workspace. Paths are relative to /workspace
// (or absolute under it); escapes are refused.
type Files interface {
	ListDir(ctx context.Context, name, path string) ([]FileInfo, error)
	Stat(ctx context.Context, name, path string) (FileInfo, error)
	ReadFile(ctx context.Context, name, path string) (io.ReadCloser, error)
	// WriteFile returns once the file is durable (temp, fsync, rename, fsync dir).
	WriteFile(ctx context.Context, name, path string, r io.Reader) (int64, error)
	Mkdir(ctx context.Context, name, path string) error
	Remove(ctx context.Context, name, path string) error
	Rename(ctx context.Context, name, from, to string) error
	// CopyIn writes the tar stream r into directory dir (created if
	// missing) and returns once every file is durable: written under
	// temporary names, synced (in batches, one filesystem sync each), and
	// only then renamed into place; the renames synced too. Entries and
	// symlinks must stay inside the tree; an interrupted copy leaves no
	// partial file under a final name.
	CopyIn(ctx context.Context, name, dir string, r io.Reader) (CopyResult, error)
	// CopyOut streams the file or tree at path as a tar: a directory's
	// entries relative to it, a file under its own name. Symlinks are sent
	// as they are, never followed; one pointing out of the tree ends the
	// stream with an error.
	CopyOut(ctx context.Context, name, path string) (io.ReadCloser, error)
}

// Service is everything the UI and CLI use.
//
// Every capability is part of it: a side that does not do one (the socket
// client has no file handles, the fake builds no images) says so with an
// error wrapping ErrUnsupported, never by lacking the method.
type Service interface {
	Lister
	Watcher
	Lifecycle
	Execer
	Files
	Checkpointer
	Differ
	Sampler
	Networker
	Harness
	Handles
	Imager
}

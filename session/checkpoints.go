package session

import (
	"context"
	"strings"
	"time"
)

// Checkpointer keeps saved states of a session, restores them, and forks
// a session into a new one.
type Checkpointer interface {
	// Checkpoint saves the session's disks (and with opts.Memory its
	// memory). Commands keep running; they are frozen for the copy.
	Checkpoint(ctx context.Context, name string, opts CheckpointOptions) (Checkpoint, error)
	// Checkpoints lists a session's checkpoints, oldest first.
	Checkpoints(ctx context.Context, name string) ([]Checkpoint, error)
	DeleteCheckpoint(ctx context.Context, name, id string) error
	// Restore puts the session back on a checkpoint's disks (a new VM;
	// with a memory checkpoint its processes too), after taking an
	// automatic checkpoint of its current state.
	Restore(ctx context.Context, name, id string) (RestoreResult, error)
	// Fork makes a new session from a running or sleeping one: its
	// memory and a copy of its disks, with an identity of its own.
	Fork(ctx context.Context, name, newName string) (ForkResult, error)
}

// CheckpointOptions configure Checkpoint.
type CheckpointOptions struct {
	Label string `json:"label,omitempty"`
	// Memory keeps a memory snapshot too (the session must be running or
	// sleeping): a restore resumes the processes.
	Memory bool `json:"memory,omitempty"`
}

// Checkpoint describes one saved state.
type Checkpoint struct {
	ID      string `json:"id"`
	Session string `json:"session"`
	Label   string `json:"label,omitempty"`
	Auto    bool   `json:"auto,omitempty"` // taken by a restore
	// Run is the run whose starting point it is (RunOptions.Keep).
	Run       string    `json:"run,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	// What it holds: always the workspace.
	System bool `json:"system,omitempty"` // the system disk
	Memory bool `json:"memory,omitempty"` // a memory snapshot
	// Bytes is its size on disk (blocks allocated; reflinked blocks are
	// shared with the session's disks and counted in full).
	Bytes int64 `json:"bytes"`
	// Copy says how the disks were copied: "reflink" or "sparse copy".
	Copy string `json:"copy"`
	// Frozen is how long the session's filesystems were frozen (writers
	// held; with Memory the VM was also paused, for the memory save at the
	// end); 0 when the session had no running VM.
	Frozen time.Duration `json:"frozen,omitempty"`
	Took   time.Duration `json:"took"`
	State  State         `json:"state"` // the session's state when taken
	// Replicas are the hosts of a fleet that keep a copy of it (berth
	// checkpoint replicate), as the fleet's keys say.
	Replicas []string `json:"replicas,omitempty"`
}

// Holds says what the checkpoint holds, for listings.
func (c Checkpoint) Holds() string {
	parts := []string{"workspace"}
	if c.System {
		parts = append(parts, "system disk")
	}
	if c.Memory {
		parts = append(parts, "memory")
	}
	return strings.Join(parts, "+")
}

// RestoreResult reports a restore.
type RestoreResult struct {
	Session Session `json:"session"`
	// Restored is the checkpoint the session is on now; Auto the one
	// taken of the state before, which restores it.
	Restored Checkpoint `json:"restored"`
	Auto     Checkpoint `json:"auto"`
}

// ForkResult reports a fork.
type ForkResult struct {
	Session Session       `json:"session"`
	Source  string        `json:"source"`
	Frozen  time.Duration `json:"frozen"` // how long the source's filesystems were frozen
	Took    time.Duration `json:"took"`
	Copy    string        `json:"copy"` // "reflink" or "sparse copy"
	// Inherited counts the commands that were running in the source and
	// run on in the fork as processes (unrecorded).
	Inherited int `json:"inherited"`
	// Warnings are identity fix-ups that could not be made.
	Warnings []string `json:"warnings,omitempty"`
}

package store

import "time"

// The JSON tags are the on-disk schema: renaming a Go field must not change
// them, and changing them needs a migration (see migrate.go).

// Session is one session's record.
type Session struct {
	Name      string `json:"name"`
	State     string `json:"state"`
	Cause     string `json:"cause,omitempty"`
	Image     string `json:"image,omitempty"`
	VMM       string `json:"vmm,omitempty"`
	Accel     string `json:"accel,omitempty"`
	CPUs      int    `json:"cpus,omitempty"`
	MemoryMiB int    `json:"memory_mib,omitempty"`
	DiskBytes int64  `json:"disk_bytes,omitempty"`
	Pid       int    `json:"pid,omitempty"`

	CreatedAt    time.Time `json:"created_at,omitzero"`
	StartedAt    time.Time `json:"started_at,omitzero"`
	LastActivity time.Time `json:"last_activity,omitzero"`

	// Retention is the bytes of output kept for the session's execs
	// together; 0 means DefaultRetention. Lowering it trims at once.
	Retention int64 `json:"retention,omitempty"`

	// WorkspaceUUID is the filesystem UUID of the session's workspace
	// volume, by which the guest finds and mounts it.
	WorkspaceUUID string `json:"workspace_uuid,omitempty"`
	// IdleTimeout is the session's own idle timeout: nil means the
	// configured one, 0 never. Durations are stored as nanoseconds.
	IdleTimeout *time.Duration `json:"idle_timeout,omitempty"`
	// While sleeping: the memory snapshot's path and size.
	SnapshotPath  string `json:"snapshot_path,omitempty"`
	SnapshotBytes int64  `json:"snapshot_bytes,omitempty"`
	// LastWake is how long the session's last wake took.
	LastWake time.Duration `json:"last_wake,omitempty"`
	// ImageDigest pins the build of Image the session's system disk was
	// made on ("" for sessions made before builds were pinned).
	ImageDigest string `json:"image_digest,omitempty"`
	// SystemUUID is the system disk's ext4 UUID; "" for images whose root
	// is their initramfs. SystemBytes is its size.
	SystemUUID  string `json:"system_uuid,omitempty"`
	SystemBytes int64  `json:"system_bytes,omitempty"`
	// MachineID is the VM's /etc/machine-id (32 hex digits).
	MachineID string `json:"machine_id,omitempty"`
	// NICMAC is the MAC of the session's NIC, its own (a fork's differs
	// from its source's); "" for sessions made before, whose NICs have
	// guest.NICMAC.
	NICMAC string `json:"nic_mac,omitempty"`
	// PauseReason says who paused a paused session when it was not a
	// person: "host-disk-full" when its VMM stopped it on a write the host
	// could not store.
	PauseReason string `json:"pause_reason,omitempty"`
	// Net is the session's network policy ("" is none).
	Net string `json:"net,omitempty"`
	// WorkspaceUsed is the workspace's use as the guest last measured it,
	// at WorkspaceMeasuredAt (zero: never measured; records from before
	// these fields decode so).
	WorkspaceUsed       int64     `json:"workspace_used,omitempty"`
	WorkspaceMeasuredAt time.Time `json:"workspace_measured_at,omitzero"`
	// Epoch is the fleet's fencing token for this copy: the mod revision
	// of the session's owner key when this host last took it (0: not in
	// a fleet, or made before epochs were kept).
	Epoch int64 `json:"epoch,omitempty"`
}

// clone returns a copy of sess that shares no memory with it, so a record
// handed out cannot change the store's mirror.
func (sess Session) clone() Session {
	if sess.IdleTimeout != nil {
		t := *sess.IdleTimeout
		sess.IdleTimeout = &t
	}
	return sess
}

// Exec is one execution's record.
type Exec struct {
	ID       string   `json:"id"`
	Session  string   `json:"session"`
	Argv     []string `json:"argv"`
	EnvNames []string `json:"env_names,omitempty"` // names only: values may be secrets
	Cwd      string   `json:"cwd,omitempty"`
	TTY      bool     `json:"tty,omitempty"`
	Outside  bool     `json:"outside,omitempty"`
	By       string   `json:"by,omitempty"`
	User     string   `json:"user,omitempty"` // who it ran as in the guest ("": root)
	State    string   `json:"state"`
	ExitCode *int     `json:"exit_code,omitempty"`
	Signal   string   `json:"signal,omitempty"`
	Error    string   `json:"error,omitempty"`

	StartedAt time.Time `json:"started_at,omitzero"`
	EndedAt   time.Time `json:"ended_at,omitzero"`

	// AgentID is the guest agent's id for the process, to reattach after a
	// daemon restart.
	AgentID string `json:"agent_id,omitempty"`

	// The fields below are owned by AppendOutput and stored apart from the
	// record, so a PutExec from a stale copy cannot roll them back (which
	// would make the next append overwrite chunks). PutExec ignores them.

	StdoutBytes int64 `json:"-"` // stored so far, including bytes since trimmed
	StderrBytes int64 `json:"-"`
	// StdoutOffset and StderrOffset are the agent's stream offsets that the
	// stored output reaches: where to resume reading after a restart.
	StdoutOffset int64  `json:"-"`
	StderrOffset int64  `json:"-"`
	NextSeq      uint64 `json:"-"` // Seq the next chunk will get
	// Chunks with Seq < TrimmedSeq were dropped by retention; TrimmedBytes
	// is their total size.
	TrimmedSeq   uint64 `json:"-"`
	TrimmedBytes int64  `json:"-"`
}

// Output streams.
const (
	Stdout uint8 = 1
	Stderr uint8 = 2
)

// Chunk is a piece of an execution's output.
type Chunk struct {
	Exec   string
	Seq    uint64
	Stream uint8 // Stdout or Stderr
	Time   time.Time
	Data   []byte
}

// Event is an entry in a session's event log.
type Event struct {
	Seq     uint64    `json:"seq"`
	Time    time.Time `json:"time"`
	Session string    `json:"session"` // empty for daemon-wide events
	Kind    string    `json:"kind"`
	Message string    `json:"message,omitempty"`
	By      string    `json:"by,omitempty"`
}

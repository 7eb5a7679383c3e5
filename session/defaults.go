package session

import "time"

// The defaults of new sessions and of the daemon, used when neither
// Create nor the config file sets them. assets/config.toml documents the
// same values; a test keeps the two equal.
const (
	DefaultImage     = "mini"
	DefaultCPUs      = 1
	DefaultMemoryMiB = 512
	DefaultDiskBytes = 4 << 30
	// DefaultSystemBytes sizes the system disk of an image with a root
	// filesystem; it is allocated as it is written.
	DefaultSystemBytes = 8 << 30
	DefaultVMM         = "qemu"
	// DefaultIdleTimeout is how long an idle session runs before it is
	// put to sleep, unless the config file says otherwise.
	DefaultIdleTimeout = 15 * time.Minute
	// DefaultFloor is the free space on the data directory below which
	// what needs space is refused.
	DefaultFloor = 1 << 30
	// DefaultOutputBudget bounds all sessions' recorded output together.
	DefaultOutputBudget = 8 << 30
)

// The defaults of the checkpoint limits (config.toml checkpoint_limit,
// checkpoint_bytes).
const (
	DefaultCheckpointLimit = 20
	DefaultCheckpointBytes = 64 << 30
)

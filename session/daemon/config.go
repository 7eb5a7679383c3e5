package daemon

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/berthvm/berth/assets"
	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/engine"
	"github.com/berthvm/berth/session/engine/egress"
	"github.com/berthvm/berth/session/fleet"
	"github.com/berthvm/berth/vmm"
)

// File is the configuration file, <data>/config.toml. Every key is
// optional; assets/config.toml documents them with their defaults.
type File struct {
	Image       string `toml:"image"`
	CPUs        int    `toml:"cpus"`
	Memory      string `toml:"memory"`
	Disk        string `toml:"disk"`
	SystemDisk  string `toml:"system_disk"`
	VMM         string `toml:"vmm"`
	Accel       string `toml:"accel"`
	Retention   string `toml:"retention"`
	IdleTimeout string `toml:"idle_timeout"`
	Floor       string `toml:"free_space_floor"`
	Budget      string `toml:"output_budget"`
	RunTimeout  string `toml:"run_timeout"`
	// RunCheckpoint: runs that do not say keep their starting point.
	RunCheckpoint *bool `toml:"run_checkpoint"`
	// Checkpoints per session: how many, and their size on disk together.
	CheckpointLimit int    `toml:"checkpoint_limit"`
	CheckpointBytes string `toml:"checkpoint_bytes"`
	// RunRecordLimit bounds the guest's record of a run's changed paths.
	RunRecordLimit int    `toml:"run_record_limit"`
	Net            string `toml:"net"`
	NetMaxConns    int    `toml:"net_max_conns"`
	NetNIC         *bool  `toml:"net_nic"`
	// The fleet this host joins (serve's --fleet, --host-id, --listen,
	// --fleet-ttl); no fleet: a berth of its own.
	Fleet    string `toml:"fleet"`
	HostID   string `toml:"host_id"`
	Listen   string `toml:"listen"`
	FleetTTL string `toml:"fleet_ttl"`
	FleetCA  string `toml:"fleet_ca"`
}

// Config is the parsed configuration. Sizes are read by session.ParseSize
// (a bare number is bytes); unset keys take session's defaults.
type Config struct {
	Defaults    engine.Defaults
	IdleTimeout time.Duration
	// Floor is the free space on the data directory below which what
	// needs space is refused; OutputBudget bounds all sessions' recorded
	// output together (0: no bound).
	Floor        int64
	OutputBudget int64
	// RunTimeout ends agent runs left open and unused as abandoned.
	RunTimeout time.Duration
	// RunCheckpoint makes runs that do not say (MCP's) keep their
	// starting point; default true.
	RunCheckpoint bool
	// CheckpointLimit and CheckpointBytes bound each session's checkpoints.
	CheckpointLimit int
	CheckpointBytes int64
	// RunRecordLimit bounds the guest's record of a run's changed paths
	// (the agent's bound when the file says 0 or nothing).
	RunRecordLimit int
	// Net is the network policy of new sessions; NetMaxConns bounds one
	// session's open egress connections.
	Net         string
	NetMaxConns int
	// NetNIC gives guests a NIC served by berth's network stack
	// (engine.Config.NIC).
	NetNIC bool
	// Fleet is the fleet to join; its Endpoints "" means none.
	Fleet FleetConfig
}

// FleetConfig is how a host joins a fleet (see session/fleet).
type FleetConfig struct {
	// Endpoints are etcd's client URLs, comma-separated.
	Endpoints string
	// HostID names this host in the fleet; Listen is the address the
	// daemon serves its API on for other hosts and operators (mutual TLS
	// with CA; plain text on loopback only), recorded for them to reach.
	HostID, Listen string
	// TTL is the host lease's time to live (default fleet.DefaultTTL).
	TTL time.Duration
	// CA is the fleet CA's directory (berth fleet init): the host's
	// certificate is issued from it (or loaded) and etcd is reached over
	// mutual TLS. "": plain text.
	CA string
}

// LoadConfig reads <data>/config.toml, writing the documented defaults
// there first if it does not exist.
func LoadConfig(dataDir string) (Config, error) {
	path := filepath.Join(dataDir, "config.toml")
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		b = []byte(assets.DefaultConfig())
		os.WriteFile(path, b, 0o644)
	} else if err != nil {
		return Config{}, err
	}
	return ParseConfig(path, b)
}

// ParseConfig parses a config file's content; path is for messages.
func ParseConfig(path string, b []byte) (Config, error) {
	var f File
	md, err := toml.Decode(string(b), &f)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		return Config{}, fmt.Errorf("%s: unknown key %q (see the comments in a fresh config.toml)", path, und[0].String())
	}
	var c Config
	d := &c.Defaults
	d.Image, d.CPUs, d.VMM = f.Image, f.CPUs, f.VMM
	size := func(key, v string) (int64, error) {
		if v == "" {
			return 0, nil
		}
		n, err := session.ParseSize(v)
		if err != nil {
			return 0, fmt.Errorf("%s: %s = %q: %v", path, key, v, err)
		}
		return n, nil
	}
	if f.Memory != "" {
		if d.MemoryMiB, err = session.ParseMemory(f.Memory); err != nil {
			return c, fmt.Errorf("%s: memory = %q: %v", path, f.Memory, err)
		}
	}
	if d.DiskBytes, err = size("disk", f.Disk); err != nil {
		return c, err
	}
	if d.SystemBytes, err = size("system_disk", f.SystemDisk); err != nil {
		return c, err
	}
	if d.Retention, err = size("retention", f.Retention); err != nil {
		return c, err
	}
	switch vmm.Accel(f.Accel) {
	case "", vmm.AccelAuto, vmm.AccelKVM, vmm.AccelTCG:
		d.Accel = vmm.Accel(f.Accel)
	default:
		return c, fmt.Errorf("%s: accel = %q: use auto, kvm or tcg", path, f.Accel)
	}
	switch f.VMM {
	case "", "qemu", "cloud-hypervisor":
	default:
		return c, fmt.Errorf("%s: vmm = %q: use qemu or cloud-hypervisor", path, f.VMM)
	}
	c.Floor, c.OutputBudget = session.DefaultFloor, session.DefaultOutputBudget
	if f.Floor != "" {
		if f.Floor == "0" {
			c.Floor = 0
		} else if c.Floor, err = size("free_space_floor", f.Floor); err != nil {
			return c, err
		}
	}
	if f.Budget != "" {
		if f.Budget == "0" {
			c.OutputBudget = 0
		} else if c.OutputBudget, err = size("output_budget", f.Budget); err != nil {
			return c, err
		}
	}
	c.CheckpointLimit, c.CheckpointBytes = session.DefaultCheckpointLimit, session.DefaultCheckpointBytes
	if f.CheckpointLimit < 0 {
		return c, fmt.Errorf("%s: checkpoint_limit = %d: want a positive number", path, f.CheckpointLimit)
	} else if f.CheckpointLimit > 0 {
		c.CheckpointLimit = f.CheckpointLimit
	}
	if f.CheckpointBytes != "" {
		if c.CheckpointBytes, err = size("checkpoint_bytes", f.CheckpointBytes); err != nil {
			return c, err
		}
	}
	c.Net, c.NetMaxConns, c.NetNIC = session.DefaultNet, egress.DefaultMaxConns, f.NetNIC == nil || *f.NetNIC
	if f.Net != "" {
		p, err := session.ParsePolicy(f.Net)
		if err != nil {
			return c, fmt.Errorf("%s: net = %q: %v", path, f.Net, err)
		}
		c.Net = p.String()
	}
	if f.NetMaxConns < 0 || f.NetMaxConns > 1<<16 {
		return c, fmt.Errorf("%s: net_max_conns = %d: use 1 to 65536", path, f.NetMaxConns)
	} else if f.NetMaxConns > 0 {
		c.NetMaxConns = f.NetMaxConns
	}
	if f.IdleTimeout != "" {
		if c.IdleTimeout, err = time.ParseDuration(f.IdleTimeout); err != nil {
			return c, fmt.Errorf("%s: idle_timeout = %q: %v", path, f.IdleTimeout, err)
		}
	} else {
		c.IdleTimeout = session.DefaultIdleTimeout
	}
	c.Fleet = FleetConfig{Endpoints: f.Fleet, HostID: f.HostID, Listen: f.Listen, CA: f.FleetCA}
	c.Fleet.TTL = fleet.DefaultTTL
	if f.FleetTTL != "" {
		if c.Fleet.TTL, err = time.ParseDuration(f.FleetTTL); err != nil || c.Fleet.TTL < time.Second {
			return c, fmt.Errorf("%s: fleet_ttl = %q: want a duration of at least 1s, such as 10s", path, f.FleetTTL)
		}
	}
	c.RunCheckpoint = f.RunCheckpoint == nil || *f.RunCheckpoint
	if f.RunRecordLimit < 0 || f.RunRecordLimit > engine.DefaultRunRecordLimit {
		return c, fmt.Errorf("%s: run_record_limit = %d: use 1 to %d (0 or unset: the most)", path, f.RunRecordLimit, engine.DefaultRunRecordLimit)
	}
	c.RunRecordLimit = f.RunRecordLimit
	if c.RunRecordLimit == 0 {
		c.RunRecordLimit = engine.DefaultRunRecordLimit
	}
	c.RunTimeout = engine.DefaultRunTimeout
	if f.RunTimeout != "" {
		if c.RunTimeout, err = time.ParseDuration(f.RunTimeout); err != nil || c.RunTimeout < time.Second {
			return c, fmt.Errorf("%s: run_timeout = %q: want a duration of at least 1s, such as 30m", path, f.RunTimeout)
		}
	}
	return c, nil
}

package session

import (
	"context"
	"time"
)

// Live are a running session's sampled figures: the VMM process as the
// host sees it, and the guest's own view. Rates are per second over the
// last sampling interval; counters count from the current VM's start (a new
// VM starts them again, as Prometheus counters may).
type Live struct {
	Time time.Time `json:"time"`
	// CPUPercent is the VMM process's CPU on the host as a share of the
	// session's vCPUs: 100 means every vCPU busy all the time.
	CPUPercent float64 `json:"cpu_percent"`
	// GuestCPUPercent is the guest's own view of its CPUs' busy share.
	GuestCPUPercent float64 `json:"guest_cpu_percent"`
	RSSBytes        int64   `json:"rss_bytes"` // the VMM's resident memory on the host
	// Workspace and system disk traffic as the guest sees it, and the
	// storage I/O the VMM process caused on the host.
	WorkspaceReadBps  float64 `json:"workspace_read_bps"`
	WorkspaceWriteBps float64 `json:"workspace_write_bps"`
	SystemReadBps     float64 `json:"system_read_bps,omitempty"`
	SystemWriteBps    float64 `json:"system_write_bps,omitempty"`
	HostReadBps       float64 `json:"host_read_bps"`
	HostWriteBps      float64 `json:"host_write_bps"`

	CPUSeconds          float64 `json:"cpu_seconds"` // the VMM's user+system time
	WorkspaceReadBytes  int64   `json:"workspace_read_bytes"`
	WorkspaceWriteBytes int64   `json:"workspace_write_bytes"`
	SystemReadBytes     int64   `json:"system_read_bytes,omitempty"`
	SystemWriteBytes    int64   `json:"system_write_bytes,omitempty"`
	HostReadBytes       int64   `json:"host_read_bytes"`
	HostWriteBytes      int64   `json:"host_write_bytes"`
	// Egress through the daemon's proxy since the daemon started: bytes
	// received from the network for the guest, and sent for it.
	NetReceivedBytes int64 `json:"net_received_bytes"`
	NetSentBytes     int64 `json:"net_sent_bytes"`
}

// Sample is one point of a session's recent history, for graphs.
type Sample struct {
	Time         time.Time `json:"t"`
	CPUPercent   float32   `json:"cpu"`
	MemUsedBytes int64     `json:"mem"`
	RSSBytes     int64     `json:"rss"`
	// DiskBps is workspace and system disk reads and writes together.
	DiskBps    float32 `json:"disk"`
	DirtyBytes int64   `json:"dirty"`
}

// Observer learns of what metrics count. Its methods are called on the
// Manager's paths and must not block.
type Observer interface {
	// Created reports a create that succeeded and how long it took.
	Created(took time.Duration)
	// Woke reports a wake from sleep and how long it took.
	Woke(took time.Duration)
	// ExecEnded reports an execution's final state.
	ExecEnded(state ExecState)
}

// HistoryWindow is how far back History reaches.
const HistoryWindow = 10 * time.Minute

// Sampler reads a session's recent figures.
type Sampler interface {
	// History returns the session's samples of the last HistoryWindow,
	// oldest first; a session that has not run in that time has none.
	History(ctx context.Context, name string) ([]Sample, error)
}

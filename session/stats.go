package session

import (
	"context"
	"time"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/vmm"
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

type noObserver struct{}

func (noObserver) Created(time.Duration) {}
func (noObserver) Woke(time.Duration)    {}
func (noObserver) ExecEnded(ExecState)   {}

// HistoryWindow is how far back History reaches.
const HistoryWindow = 10 * time.Minute

// Sampler reads a session's recent figures.
type Sampler interface {
	// History returns the session's samples of the last HistoryWindow,
	// oldest first; a session that has not run in that time has none.
	History(ctx context.Context, name string) ([]Sample, error)
}

// sampler is one session's sampling state: the previous readings the
// rates are computed from, and the ring of recent samples. Guarded by
// sess.mu.
type sampler struct {
	pid       int
	startTime string // of the VMM process: a reused pid is not the VMM
	prevAt    time.Time
	prevProc  vmm.ProcStat
	prevGuest guest.Stats
	live      *Live

	ring []Sample // at most ringCap, oldest at head
	head int
}

// ringCap is how many samples HistoryWindow holds at interval.
func ringCap(interval time.Duration) int {
	if interval <= 0 {
		interval = 2 * time.Second
	}
	return max(1, int(HistoryWindow/interval))
}

// reset forgets the previous readings (a new VM): the next sample starts
// the rates again. The history stays.
func (sm *sampler) reset() {
	sm.pid, sm.startTime, sm.prevAt, sm.live = 0, "", time.Time{}, nil
	sm.prevProc, sm.prevGuest = vmm.ProcStat{}, guest.Stats{}
}

// add computes the figures of a new reading of the VMM (pid, ps) and the
// guest (gs) taken at now, and records them.
func (sm *sampler) add(now time.Time, pid, cpus int, ps vmm.ProcStat, gs guest.Stats, capacity int) *Live {
	if sm.pid != pid || sm.startTime != ps.StartTime {
		sm.reset()
		sm.pid, sm.startTime = pid, ps.StartTime
	}
	lv := &Live{
		Time: now, RSSBytes: ps.RSSBytes, CPUSeconds: ps.CPU.Seconds(),
		WorkspaceReadBytes: gs.WorkspaceIO.ReadBytes, WorkspaceWriteBytes: gs.WorkspaceIO.WriteBytes,
		SystemReadBytes: gs.SystemIO.ReadBytes, SystemWriteBytes: gs.SystemIO.WriteBytes,
		HostReadBytes: ps.ReadBytes, HostWriteBytes: ps.WriteBytes,
	}
	if dt := now.Sub(sm.prevAt).Seconds(); !sm.prevAt.IsZero() && dt > 0 {
		rate := func(a, b int64) float64 {
			if b < a { // the guest rebooted or a counter wrapped
				return 0
			}
			return float64(b-a) / dt
		}
		if cpus < 1 {
			cpus = 1
		}
		if d := ps.CPU - sm.prevProc.CPU; d > 0 {
			lv.CPUPercent = min(100, d.Seconds()/dt/float64(cpus)*100)
		}
		if dt, db := gs.CPUTotalTicks-sm.prevGuest.CPUTotalTicks, gs.CPUBusyTicks-sm.prevGuest.CPUBusyTicks; gs.CPUTotalTicks > sm.prevGuest.CPUTotalTicks && gs.CPUBusyTicks >= sm.prevGuest.CPUBusyTicks {
			lv.GuestCPUPercent = min(100, float64(db)/float64(dt)*100)
		}
		lv.WorkspaceReadBps = rate(sm.prevGuest.WorkspaceIO.ReadBytes, gs.WorkspaceIO.ReadBytes)
		lv.WorkspaceWriteBps = rate(sm.prevGuest.WorkspaceIO.WriteBytes, gs.WorkspaceIO.WriteBytes)
		lv.SystemReadBps = rate(sm.prevGuest.SystemIO.ReadBytes, gs.SystemIO.ReadBytes)
		lv.SystemWriteBps = rate(sm.prevGuest.SystemIO.WriteBytes, gs.SystemIO.WriteBytes)
		lv.HostReadBps = rate(sm.prevProc.ReadBytes, ps.ReadBytes)
		lv.HostWriteBps = rate(sm.prevProc.WriteBytes, ps.WriteBytes)
	}
	sm.prevAt, sm.prevProc, sm.prevGuest, sm.live = now, ps, gs, lv
	sm.push(Sample{
		Time: now, CPUPercent: float32(lv.CPUPercent), MemUsedBytes: gs.MemTotal - gs.MemAvailable, RSSBytes: ps.RSSBytes,
		DiskBps:    float32(lv.WorkspaceReadBps + lv.WorkspaceWriteBps + lv.SystemReadBps + lv.SystemWriteBps),
		DirtyBytes: gs.Dirty + gs.Writeback,
	}, capacity)
	return lv
}

func (sm *sampler) push(s Sample, capacity int) {
	if len(sm.ring) < capacity {
		sm.ring = append(sm.ring, s)
		return
	}
	sm.ring[sm.head] = s
	sm.head = (sm.head + 1) % len(sm.ring)
}

// history returns the samples newer than since, oldest first.
func (sm *sampler) history(since time.Time) []Sample {
	out := make([]Sample, 0, len(sm.ring))
	for i := range sm.ring {
		s := sm.ring[(sm.head+i)%len(sm.ring)]
		if s.Time.After(since) {
			out = append(out, s)
		}
	}
	return out
}

// History returns the session's samples of the last HistoryWindow.
func (m *Manager) History(ctx context.Context, name string) ([]Sample, error) {
	s, err := m.get(name)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sampler.history(time.Now().Add(-HistoryWindow)), nil
}

// sample reads the VMM process on the host; a VMM that is gone, or whose
// pid now names another process, yields ok false and no figures.
func (s *sess) sampleHost() (pid int, ps vmm.ProcStat, ok bool) {
	s.mu.Lock()
	vm := s.vm
	s.mu.Unlock()
	if vm == nil {
		return 0, ps, false
	}
	select {
	case <-vm.Done():
		return 0, ps, false
	default:
	}
	pid = vm.Pid()
	ps, err := vmm.ReadProcStat(pid)
	if err != nil {
		return 0, ps, false
	}
	return pid, ps, true
}

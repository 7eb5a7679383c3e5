package metrics

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/berthvm/berth/session"
)

// sessionCollector turns a List of the sessions into series at scrape
// time: nothing is kept between scrapes, so a session that is deleted, or
// whose VMM is gone, has no series from then on. Session names are
// validated (lowercase letters, digits, dashes), so they are safe label
// values.
type sessionCollector struct {
	svc session.Lister
}

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, labels, nil)
}

var (
	// Of every session.
	dSessions      = desc("berth_sessions", "Sessions by state.", "state")
	dWSUsed        = desc("berth_session_workspace_used_bytes", "Bytes used on the session's workspace (last known).", "session")
	dWSSize        = desc("berth_session_workspace_size_bytes", "Size of the session's workspace volume.", "session")
	dMemLimit      = desc("berth_session_memory_limit_bytes", "Memory the session's VM is given.", "session")
	dVCPUs         = desc("berth_session_vcpus", "vCPUs the session's VM is given.", "session")
	dRunning       = desc("berth_session_running_executions", "Executions starting or running in the session.", "session")
	dDirty         = desc("berth_session_dirty_bytes", "Bytes written in the guest and not yet on the host disk (what a crash of the VM would lose).", "session")
	dMemUsed       = desc("berth_session_memory_used_bytes", "Guest memory in use (total less available), as the guest sees it.", "session")
	dLastWake      = desc("berth_session_last_wake_seconds", "How long the session's last wake from sleep took.", "session")
	dSnapshotBytes = desc("berth_session_snapshot_bytes", "Size of a sleeping session's memory snapshot.", "session")
	// Of running sessions with a sample.
	dCPU        = desc("berth_session_cpu_seconds_total", "CPU time of the session's VMM process on the host (user and system) since its VM started.", "session")
	dGuestCPU   = desc("berth_session_guest_cpu_ratio", "Busy share of the guest's CPUs over the last sampling interval, as the guest sees it (0 to 1).", "session")
	dRSS        = desc("berth_session_memory_rss_bytes", "Resident memory of the session's VMM process on the host.", "session")
	dDiskRead   = desc("berth_session_disk_read_bytes_total", "Bytes the guest read from the disk since its VM started.", "session", "disk")
	dDiskWrite  = desc("berth_session_disk_written_bytes_total", "Bytes the guest wrote to the disk since its VM started.", "session", "disk")
	dHostRead   = desc("berth_session_host_read_bytes_total", "Bytes the session's VMM process made the host's storage read since it started.", "session")
	dHostWrite  = desc("berth_session_host_written_bytes_total", "Bytes the session's VMM process made the host's storage write since it started.", "session")
	dNetRx      = desc("berth_session_network_received_bytes_total", "Bytes the session's egress received from the network through the daemon's proxy since the daemon started.", "session")
	dNetTx      = desc("berth_session_network_sent_bytes_total", "Bytes the session's egress sent to the network through the daemon's proxy since the daemon started.", "session")
	dSampleTime = desc("berth_session_sample_timestamp_seconds", "When the session's figures were last sampled (Unix time).", "session")
)

var allDescs = []*prometheus.Desc{dSessions, dWSUsed, dWSSize, dMemLimit, dVCPUs, dRunning, dDirty, dMemUsed, dLastWake,
	dSnapshotBytes, dCPU, dGuestCPU, dRSS, dDiskRead, dDiskWrite, dHostRead, dHostWrite, dNetRx, dNetTx, dSampleTime}

func (c *sessionCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range allDescs {
		ch <- d
	}
}

var allStates = []session.State{session.StateCreating, session.StateRunning, session.StatePaused, session.StateStopping,
	session.StateStopped, session.StateCrashed, session.StateDeleting, session.StateSleeping}

func (c *sessionCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	list, err := c.svc.List(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(dSessions, err)
		return
	}
	byState := make(map[session.State]int, len(allStates))
	for _, st := range allStates {
		byState[st] = 0
	}
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	cnt := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	for i := range list {
		s := &list[i]
		byState[s.State]++
		n := s.Name
		g(dWSSize, float64(s.DiskBytes), n)
		if s.WorkspaceKnown() { // a workspace never measured has no figure, not 0
			g(dWSUsed, float64(s.WorkspaceUsed), n)
		}
		g(dMemLimit, float64(s.MemoryMiB)*(1<<20), n)
		g(dVCPUs, float64(s.CPUs), n)
		g(dRunning, float64(s.Running), n)
		g(dDirty, float64(s.DirtyBytes), n)
		if s.LastWake > 0 {
			g(dLastWake, s.LastWake.Seconds(), n)
		}
		if s.State == session.StateSleeping {
			g(dSnapshotBytes, float64(s.SnapshotBytes), n)
		}
		if s.State == session.StateRunning || s.State == session.StatePaused {
			g(dMemUsed, float64(s.MemUsedBytes), n)
		}
		lv := s.Live
		if lv == nil {
			continue
		}
		cnt(dCPU, lv.CPUSeconds, n)
		g(dGuestCPU, lv.GuestCPUPercent/100, n)
		g(dRSS, float64(lv.RSSBytes), n)
		cnt(dDiskRead, float64(lv.WorkspaceReadBytes), n, "workspace")
		cnt(dDiskWrite, float64(lv.WorkspaceWriteBytes), n, "workspace")
		if s.SystemBytes > 0 {
			cnt(dDiskRead, float64(lv.SystemReadBytes), n, "system")
			cnt(dDiskWrite, float64(lv.SystemWriteBytes), n, "system")
		}
		cnt(dHostRead, float64(lv.HostReadBytes), n)
		cnt(dHostWrite, float64(lv.HostWriteBytes), n)
		cnt(dNetRx, float64(lv.NetReceivedBytes), n)
		cnt(dNetTx, float64(lv.NetSentBytes), n)
		g(dSampleTime, float64(lv.Time.UnixMilli())/1000, n)
	}
	for st, k := range byState {
		g(dSessions, float64(k), string(st))
	}
}

package engine

import (
	"context"
	"time"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/vmm"
)

type noObserver struct{}

func (noObserver) Created(time.Duration)       {}
func (noObserver) Woke(time.Duration)          {}
func (noObserver) ExecEnded(session.ExecState) {}

// sampler is one session's sampling state: the previous readings the
// rates are computed from, and the ring of recent samples. Guarded by
// sess.mu.
type sampler struct {
	pid       int
	startTime string // of the VMM process: a reused pid is not the VMM
	prevAt    time.Time
	prevProc  vmm.ProcStat
	prevGuest guest.Stats
	live      *session.Live

	ring []session.Sample // at most ringCap, oldest at head
	head int
}

// ringCap is how many samples HistoryWindow holds at interval.
func ringCap(interval time.Duration) int {
	if interval <= 0 {
		interval = 2 * time.Second
	}
	return max(1, int(session.HistoryWindow/interval))
}

// reset forgets the previous readings (a new VM): the next sample starts
// the rates again. The history stays.
func (sm *sampler) reset() {
	sm.pid, sm.startTime, sm.prevAt, sm.live = 0, "", time.Time{}, nil
	sm.prevProc, sm.prevGuest = vmm.ProcStat{}, guest.Stats{}
}

// add computes the figures of a new reading of the VMM (pid, ps) and the
// guest (gs) taken at now, and records them.
func (sm *sampler) add(now time.Time, pid, cpus int, ps vmm.ProcStat, gs guest.Stats, capacity int) *session.Live {
	if sm.pid != pid || sm.startTime != ps.StartTime {
		sm.reset()
		sm.pid, sm.startTime = pid, ps.StartTime
	}
	lv := &session.Live{
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
	sm.push(session.Sample{
		Time: now, CPUPercent: float32(lv.CPUPercent), MemUsedBytes: gs.MemTotal - gs.MemAvailable, RSSBytes: ps.RSSBytes,
		DiskBps:    float32(lv.WorkspaceReadBps + lv.WorkspaceWriteBps + lv.SystemReadBps + lv.SystemWriteBps),
		DirtyBytes: gs.Dirty + gs.Writeback,
	}, capacity)
	return lv
}

func (sm *sampler) push(s session.Sample, capacity int) {
	if len(sm.ring) < capacity {
		sm.ring = append(sm.ring, s)
		return
	}
	sm.ring[sm.head] = s
	sm.head = (sm.head + 1) % len(sm.ring)
}

// history returns the samples newer than since, oldest first.
func (sm *sampler) history(since time.Time) []session.Sample {
	out := make([]session.Sample, 0, len(sm.ring))
	for i := range sm.ring {
		s := sm.ring[(sm.head+i)%len(sm.ring)]
		if s.Time.After(since) {
			out = append(out, s)
		}
	}
	return out
}

// History returns the session's samples of the last HistoryWindow.
func (m *Manager) History(ctx context.Context, name string) ([]session.Sample, error) {
	s, err := m.get(name)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sampler.history(time.Now().Add(-session.HistoryWindow)), nil
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

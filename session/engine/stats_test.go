package engine

import (
	"testing"
	"time"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/vmm"
)

func TestSamplerRates(t *testing.T) {
	t0 := time.Unix(1000, 0)
	type reading struct {
		at  time.Duration
		pid int
		ps  vmm.ProcStat
		gs  guest.Stats
	}
	ps := func(start string, cpu time.Duration, rd, wr int64) vmm.ProcStat {
		return vmm.ProcStat{StartTime: start, CPU: cpu, RSSBytes: 100 << 20, ReadBytes: rd, WriteBytes: wr}
	}
	gs := func(busy, total uint64, wsW int64) guest.Stats {
		return guest.Stats{CPUBusyTicks: busy, CPUTotalTicks: total, MemTotal: 512 << 20, MemAvailable: 412 << 20, WorkspaceIO: guest.DiskIO{WriteBytes: wsW}}
	}
	for _, tc := range []struct {
		name     string
		cpus     int
		readings []reading
		want     session.Live // of the last reading (Time, RSS ignored)
	}{
		{"first reading has no rates", 1, []reading{{0, 7, ps("s", time.Second, 0, 0), gs(10, 100, 0)}},
			session.Live{CPUSeconds: 1}},
		{"half of two vCPUs", 2, []reading{
			{0, 7, ps("s", time.Second, 0, 0), gs(10, 100, 0)},
			{2 * time.Second, 7, ps("s", 3*time.Second, 4096, 8192), gs(60, 200, 2<<20)}},
			session.Live{CPUPercent: 50, GuestCPUPercent: 50, CPUSeconds: 3, WorkspaceWriteBps: 1 << 20, WorkspaceWriteBytes: 2 << 20,
				HostReadBps: 2048, HostWriteBps: 4096, HostReadBytes: 4096, HostWriteBytes: 8192}},
		{"capped at 100", 1, []reading{
			{0, 7, ps("s", 0, 0, 0), gs(0, 0, 0)},
			{time.Second, 7, ps("s", 3*time.Second, 0, 0), gs(0, 0, 0)}},
			session.Live{CPUPercent: 100, CPUSeconds: 3}},
		{"a new VMM (pid reused) restarts the rates", 1, []reading{
			{0, 7, ps("s", 50*time.Second, 0, 0), gs(10, 100, 5<<20)},
			{time.Second, 7, ps("t", time.Second, 0, 0), gs(1, 10, 0)}},
			session.Live{CPUSeconds: 1}},
		{"counters going back give no rate", 1, []reading{
			{0, 7, ps("s", time.Second, 100, 100), gs(10, 100, 5<<20)},
			{time.Second, 7, ps("s", time.Second, 50, 50), gs(5, 50, 1<<20)}},
			session.Live{CPUSeconds: 1, HostReadBytes: 50, HostWriteBytes: 50, WorkspaceWriteBytes: 1 << 20}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var sm sampler
			var got *session.Live
			for _, r := range tc.readings {
				got = sm.add(t0.Add(r.at), r.pid, tc.cpus, r.ps, r.gs, 10)
			}
			g := *got
			g.Time, g.RSSBytes = time.Time{}, 0
			if g != tc.want {
				t.Errorf("got  %+v\nwant %+v", g, tc.want)
			}
			if h := sm.history(time.Time{}); len(h) != len(tc.readings) || h[len(h)-1].MemUsedBytes != 100<<20 {
				t.Errorf("history = %+v", h)
			}
		})
	}
}

func TestSamplerRing(t *testing.T) {
	var sm sampler
	t0 := time.Unix(1000, 0)
	for i := range 25 {
		sm.add(t0.Add(time.Duration(i)*time.Second), 1, 1, vmm.ProcStat{StartTime: "s"}, guest.Stats{}, 10)
	}
	h := sm.history(time.Time{})
	if len(h) != 10 || !h[0].Time.Equal(t0.Add(15*time.Second)) || !h[9].Time.Equal(t0.Add(24*time.Second)) {
		t.Fatalf("ring kept %d: %v .. %v", len(h), h[0].Time, h[len(h)-1].Time)
	}
	if h := sm.history(t0.Add(20 * time.Second)); len(h) != 4 {
		t.Fatalf("history since 20s: %d samples, want 4", len(h))
	}
	if got := ringCap(2 * time.Second); got != 300 {
		t.Fatalf("ringCap(2s) = %d, want 300", got)
	}
}

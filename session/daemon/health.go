package daemon

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/berthvm/berth/session"
)

// HealthReport is what /healthz answers: the daemon answers calls, with
// its sessions by state and the data directory's space.
type HealthReport struct {
	Status   string                `json:"status"` // "ok", or "degraded" below the space floor
	Version  string                `json:"version,omitempty"`
	Pid      int                   `json:"pid"`
	Time     time.Time             `json:"time"`
	Sessions map[session.State]int `json:"sessions"`
	Host     session.HostStatus    `json:"host"`
	Message  string                `json:"message,omitempty"`
}

// Health checks that svc answers within ctx and reports it.
func Health(ctx context.Context, svc session.Lister, version string) (HealthReport, error) {
	rep := HealthReport{Status: "ok", Version: version, Pid: os.Getpid(), Time: time.Now(), Sessions: map[session.State]int{}}
	list, err := svc.List(ctx)
	if err != nil {
		return rep, fmt.Errorf("list sessions: %w", err)
	}
	for _, s := range list {
		rep.Sessions[s.State]++
	}
	if rep.Host, err = svc.Host(ctx); err != nil {
		return rep, fmt.Errorf("host status: %w", err)
	}
	if msg := rep.Host.Message(); msg != "" {
		rep.Status, rep.Message = "degraded", msg
	}
	return rep, nil
}

package daemon

import (
	"context"
	"fmt"
	"os"
	"sync"
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

// ManagerBound is how long /healthz and berth doctor wait for the session
// manager before they call the daemon frozen.
const ManagerBound = 5 * time.Second

// Prober runs Health with a bound. At most one check is in flight: callers
// that come while it runs share its answer, so a frozen Manager holds one
// goroutine however often /healthz is polled, and it is released if the
// Manager ever answers.
type Prober struct {
	svc     session.Lister
	version string
	bound   time.Duration

	mu  sync.Mutex
	cur *probe // the check in flight, or nil
}

type probe struct {
	started time.Time
	done    chan struct{} // closed once rep and err are set
	rep     HealthReport
	err     error
}

// NewProber returns a Prober that calls svc frozen once a check has waited
// longer than bound.
func NewProber(svc session.Lister, version string, bound time.Duration) *Prober {
	return &Prober{svc: svc, version: version, bound: bound}
}

// Check reports the daemon's health, or an error when the Manager has not
// answered a check within the bound or ctx ended first.
func (p *Prober) Check(ctx context.Context) (HealthReport, error) {
	p.mu.Lock()
	pr := p.cur
	if pr == nil {
		pr = &probe{started: time.Now(), done: make(chan struct{})}
		p.cur = pr
		go func() {
			pr.rep, pr.err = Health(context.Background(), p.svc, p.version)
			close(pr.done)
			p.mu.Lock()
			if p.cur == pr {
				p.cur = nil
			}
			p.mu.Unlock()
		}()
	}
	p.mu.Unlock()
	t := time.NewTimer(p.bound - time.Since(pr.started))
	defer t.Stop()
	select {
	case <-pr.done:
		return pr.rep, pr.err
	case <-t.C:
		return HealthReport{}, FrozenError(time.Since(pr.started))
	case <-ctx.Done():
		return HealthReport{}, ctx.Err()
	}
}

// FrozenError says the Manager has not answered for d, and what to do.
func FrozenError(d time.Duration) error {
	return fmt.Errorf("the session manager has not answered for %s: the daemon may be frozen; `kill -QUIT <pid of berth serve>` writes every goroutine to its log (daemon.log in the data directory when the TUI started it): attach that to a bug report, then restart berth serve (VMs keep running): %w",
		d.Round(time.Second), session.ErrUnavailable)
}

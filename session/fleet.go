package session

import (
	"context"
	"errors"
	"time"
)

// ErrIsolated is the class of a change refused because the host that
// holds the session has lost (or cannot confirm) its fleet lease: its VMs
// and running commands go on, but it changes nothing until it rejoins,
// since another host may by then own what it holds.
var ErrIsolated = errors.New("isolated from the fleet")

// HostState is a fleet host's state as `berth host ls` shows it.
type HostState string

const (
	// HostReady: registered under a live lease, taking new sessions.
	HostReady HostState = "ready"
	// HostDraining: registered, but placement puts nothing new there.
	HostDraining HostState = "draining"
	// HostGone: remembered from its last registration, its lease gone
	// (expired, or revoked by a clean stop: see HostInfo.Left).
	HostGone HostState = "gone"
	// HostIsolated: the host itself (the one answering) cannot confirm
	// its lease by its own clock; its registration may still be in
	// etcd, but it refuses every change until it rejoins.
	HostIsolated HostState = "isolated"
)

// HostInfo is one host of a fleet: what it registered and what
// placement has promised of it.
type HostInfo struct {
	ID    string    `json:"id"`
	Addr  string    `json:"addr"`
	State HostState `json:"state"`
	// Capacity as the host registered it.
	CPUs      int   `json:"cpus"`
	MemoryMiB int64 `json:"memory_mib"`
	DiskFree  int64 `json:"disk_free"`
	Floor     int64 `json:"floor"`
	// Images are the names of the images the host has.
	Images []string `json:"images,omitempty"`
	// Used is what placement has promised of it.
	Used HostUse `json:"used"`
	// Since is when it registered (ready, draining), or when it was last
	// heard of (gone).
	Since time.Time `json:"since"`
	// Left: it deregistered in a clean stop rather than losing its lease.
	Left bool `json:"left,omitempty"`
}

// HostUse is what placement promised a host: the sum of the sessions
// placed there.
type HostUse struct {
	CPUs      int   `json:"cpus"`
	MemoryMiB int64 `json:"memory_mib"`
	Sessions  int   `json:"sessions"`
}

// HostList answers `berth host ls`. Fleet is false where the daemon is
// one host on its own (no --fleet): then there are no hosts to list.
type HostList struct {
	Fleet bool `json:"fleet"`
	// Self is the answering host's id.
	Self  string     `json:"self,omitempty"`
	Hosts []HostInfo `json:"hosts"`
}

// HostLister lists a fleet's hosts. The socket client implements it;
// the daemon answers from etcd.
type HostLister interface {
	Hosts(ctx context.Context) (HostList, error)
}

// FleetChangeKind names what a FleetChange reports.
type FleetChangeKind string

const (
	FleetPlaced   FleetChangeKind = "placed"   // a session got its first owner (Host) at Epoch
	FleetMoved    FleetChangeKind = "moved"    // its owner went from From to Host at Epoch (a move or a recovery)
	FleetOwner    FleetChangeKind = "owner"    // its owner key was written again, same Host, new Epoch
	FleetReleased FleetChangeKind = "released" // its owner key went: the session was deleted
	FleetJoined   FleetChangeKind = "joined"   // Host registered under a lease
	FleetLost     FleetChangeKind = "lost"     // Host's registration went: its lease expired (isolated or down) or it left
	FleetLeft     FleetChangeKind = "left"     // Host recorded a clean stop
	FleetDraining FleetChangeKind = "draining" // Host takes no new sessions
	FleetReady    FleetChangeKind = "ready"    // Host takes new sessions again (draining lifted)
)

// FleetChange is a change of a fleet's keys as `events --follow` shows
// it. Relisted says it was found by listing the keys again after etcd
// compacted the revisions a follower needed: changes between the last
// one reported and it were folded into it.
type FleetChange struct {
	Change FleetChangeKind `json:"change"`
	Host   string          `json:"host"`
	From   string          `json:"from,omitempty"`
	Epoch  int64           `json:"epoch,omitempty"`
	// Relisted: see FleetChange.
	Relisted bool `json:"relisted,omitempty"`
}

// FleetWatcher follows a fleet: Watch's events, with the fleet's changes
// (EventFleet) from the one after revision since on (0: from now), in
// revision order, each once. A follower that reconnects, to any front
// door, passes the Rev of the last EventFleet it saw.
type FleetWatcher interface {
	WatchSince(ctx context.Context, since int64) (<-chan Event, error)
}

type forwardKey struct{}

// WithForwarded returns a context for a call a fleet's front door
// forwards to the host that owns the session, at the session's epoch
// (the owner key's revision as the front door read it; 0 for a call on
// no one session). The host that gets it serves it itself, never
// forwards it again, and refuses a stale epoch (CodeStaleEpoch).
func WithForwarded(ctx context.Context, epoch int64) context.Context {
	return context.WithValue(ctx, forwardKey{}, epoch)
}

// ForwardedOf returns the epoch a forwarded call carries, and whether
// ctx's calls were forwarded at all.
func ForwardedOf(ctx context.Context) (epoch int64, ok bool) {
	epoch, ok = ctx.Value(forwardKey{}).(int64)
	return epoch, ok
}

// Draining a host (berth host drain H): placement puts nothing new on
// it, and its stopped and sleeping sessions move to other hosts; what
// runs is left where it is, with what to do about it.

// DrainOutcome is what a drain did with one session.
type DrainOutcome string

const (
	// DrainMoved: the session moved to another host (DrainStep.To).
	DrainMoved DrainOutcome = "moved"
	// DrainLeft: the session runs (or is busy) and was left on the
	// host; DrainStep.Why says what to do.
	DrainLeft DrainOutcome = "left"
	// DrainFailed: the session could not move; DrainStep.Why says why.
	DrainFailed DrainOutcome = "failed"
)

// DrainStep is one session of a drained host.
type DrainStep struct {
	Session string       `json:"session"`
	Outcome DrainOutcome `json:"outcome"`
	// State is what the session was when the drain came to it.
	State State `json:"state"`
	// To and Took: where a moved session went, and how long it took.
	To   string        `json:"to,omitempty"`
	Took time.Duration `json:"took,omitempty"`
	// Why is what to do about a session left, or why one failed.
	Why string `json:"why,omitempty"`
}

// DrainResult is a whole drain: one step per session of the host.
type DrainResult struct {
	Host  string      `json:"host"`
	Steps []DrainStep `json:"steps"`
}

// Moved reports whether every session of the host moved: nothing is
// left on it.
func (r DrainResult) Moved() bool {
	for _, s := range r.Steps {
		if s.Outcome != DrainMoved {
			return false
		}
	}
	return true
}

// A Drainer drains a fleet's hosts: the fleet's Router (which has the
// host itself do it), its fence, and the socket and TLS client.
type Drainer interface {
	// Drain marks host draining, a mark that lasts until Undrain (across
	// its restarts), then moves its stopped and sleeping sessions, one at
	// a time, each to a host placement picks; progress (if not nil) is
	// told of each session as the drain is done with it. A host that is
	// gone or isolated is refused (nothing is marked).
	Drain(ctx context.Context, host string, progress func(DrainStep)) (DrainResult, error)
	// Undrain lets placement pick host again.
	Undrain(ctx context.Context, host string) error
}

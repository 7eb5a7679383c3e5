package fleet

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/berthvm/berth/session"
)

// fleetLog turns changes of the fleet's keys into the events `events
// --follow` shows (EventFleet): it keeps what it last saw of each
// owner key and host registration, so a change says what it changed
// from. Keys other than owners, hosts and seen records are ignored.
type fleetLog struct {
	owners map[string]ownerSeen  // by session
	hosts  map[string]HostRecord // live registrations, by host
	left   map[string]bool       // seen/H says H left
	now    func() time.Time
}

type ownerSeen struct {
	host string
	rev  int64
}

func newFleetLog() *fleetLog {
	return &fleetLog{owners: map[string]ownerSeen{}, hosts: map[string]HostRecord{}, left: map[string]bool{}, now: time.Now}
}

// load takes the keys as they were at one revision, reporting nothing.
func (l *fleetLog) load(kvs []*mvccpb.KeyValue) {
	for _, kv := range kvs {
		l.apply(Change{Key: string(kv.Key), Value: kv.Value, Rev: kv.ModRevision})
	}
}

// fleetEvent is what one change of the fleet's keys means: an
// EventFleet to show (ev; nil when nothing shown changed, as in a
// host's periodic refresh), and for a host's registration, the host
// and its record (rec; nil when the registration went), from which the
// follower follows the host's own events.
type fleetEvent struct {
	ev   *session.Event
	host string
	rec  *HostRecord
	gone bool // the host's registration went
	rev  int64
}

// apply takes one change and returns what it means for the fleet: no
// event for a change that changes nothing shown (a host's periodic
// refresh, an allocation, a spec).
func (l *fleetLog) apply(c Change) []fleetEvent {
	key := c.Key
	switch {
	case strings.HasPrefix(key, sessionsDir):
		name, field, ok := strings.Cut(idOf(sessionsDir, key), "/")
		if !ok || field != "owner" || session.ValidateName(name) != nil {
			return nil
		}
		return l.owner(name, c)
	case strings.HasPrefix(key, hostsDir):
		return l.host(idOf(hostsDir, key), c)
	case strings.HasPrefix(key, seenDir):
		id := idOf(seenDir, key)
		if c.Deleted {
			delete(l.left, id)
			return nil
		}
		rec, err := ParseHostRecord(id, c.Value)
		if err != nil {
			return nil
		}
		was := l.left[id]
		l.left[id] = rec.Left
		if rec.Left && !was {
			return l.event(c, "", session.FleetChange{Change: session.FleetLeft, Host: id}, fmt.Sprintf("host %s left the fleet", id))
		}
	}
	return nil
}

func (l *fleetLog) owner(name string, c Change) []fleetEvent {
	prev, had := l.owners[name]
	if c.Deleted {
		if !had {
			return nil
		}
		delete(l.owners, name)
		return l.event(c, name, session.FleetChange{Change: session.FleetReleased, Host: prev.host},
			fmt.Sprintf("released by host %s: the session was deleted", prev.host))
	}
	o, err := ParseOwner(c.Value)
	if err != nil {
		return nil
	}
	if had && prev.rev == c.Rev {
		return nil
	}
	l.owners[name] = ownerSeen{host: o.Host, rev: c.Rev}
	fc := session.FleetChange{Host: o.Host, Epoch: c.Rev}
	var msg string
	switch {
	case !had:
		fc.Change = session.FleetPlaced
		msg = fmt.Sprintf("placed on host %s at epoch %d", o.Host, c.Rev)
	case prev.host != o.Host:
		fc.Change, fc.From = session.FleetMoved, prev.host
		msg = fmt.Sprintf("moved from host %s to host %s at epoch %d", prev.host, o.Host, c.Rev)
	default:
		fc.Change = session.FleetOwner
		msg = fmt.Sprintf("owner host %s again at epoch %d (was %d)", o.Host, c.Rev, prev.rev)
	}
	return l.event(c, name, fc, msg)
}

func (l *fleetLog) host(id string, c Change) []fleetEvent {
	prev, had := l.hosts[id]
	if c.Deleted {
		if !had {
			return nil
		}
		delete(l.hosts, id)
		out := l.event(c, "", session.FleetChange{Change: session.FleetLost, Host: id},
			fmt.Sprintf("host %s is gone: its lease expired (isolated or down) or it left", id))
		out[0].gone = true
		return out
	}
	rec, err := ParseHostRecord(id, c.Value)
	if err != nil {
		return nil
	}
	l.hosts[id] = rec
	out := []fleetEvent{{host: id, rev: c.Rev}}
	switch {
	case !had:
		l.left[id] = false
		msg := fmt.Sprintf("host %s joined at %s", id, rec.Addr)
		if rec.Draining {
			msg += ", draining"
		}
		out = l.event(c, "", session.FleetChange{Change: session.FleetJoined, Host: id}, msg)
	case rec.Draining && !prev.Draining:
		out = l.event(c, "", session.FleetChange{Change: session.FleetDraining, Host: id}, fmt.Sprintf("host %s is draining: no new sessions are placed there", id))
	case !rec.Draining && prev.Draining:
		out = l.event(c, "", session.FleetChange{Change: session.FleetReady, Host: id}, fmt.Sprintf("host %s takes new sessions again", id))
	}
	out[0].rec = &rec
	return out
}

func (l *fleetLog) event(c Change, name string, fc session.FleetChange, msg string) []fleetEvent {
	fc.Relisted = c.Relisted
	if c.Relisted {
		msg += " (found by listing again: earlier changes were compacted away)"
	}
	ev := session.Event{Time: l.now(), Kind: session.EventFleet, Name: name, Message: msg, Fleet: &fc, Rev: c.Rev}
	fe := fleetEvent{ev: &ev, rev: c.Rev}
	if name == "" {
		fe.host = fc.Host
	}
	return []fleetEvent{fe}
}

// followFleet reports the fleet's changes after revision since (0: from
// now) as fleetEvents, in revision order, each once, across lost
// connections and compactions (Watcher), until ctx ends; then the
// channel closes. A since that etcd has compacted away begins with
// every key as it is now, each event marked Relisted: what changed in
// the gap is folded into them, and what went in it is simply absent.
func (r *Router) followFleet(ctx context.Context, since int64) (<-chan fleetEvent, error) {
	rctx, cancel := context.WithTimeout(ctx, r.etcdWait())
	defer cancel()
	opts := []clientv3.OpOption{clientv3.WithPrefix()}
	if since > 0 {
		opts = append(opts, clientv3.WithRev(since))
	}
	l := newFleetLog()
	var w *Watcher
	resp, err := r.cli.Get(rctx, Prefix, opts...)
	switch {
	case errors.Is(err, rpctypes.ErrCompacted):
		w = NewWatcher(r.cli, Prefix, 0, r.log)
	case errors.Is(err, rpctypes.ErrFutureRev):
		return nil, &session.Error{Class: session.ErrInvalid, Msg: fmt.Sprintf("revision %d is ahead of the fleet's etcd", since),
			Hint: "pass the rev of an event this fleet showed", Err: err}
	case err != nil:
		return nil, unavailable(err)
	default:
		if since == 0 {
			since = resp.Header.Revision
		}
		l.load(resp.Kvs)
		w = NewWatcher(r.cli, Prefix, since+1, r.log)
		for _, kv := range resp.Kvs {
			w.know(string(kv.Key), kv.ModRevision)
		}
	}
	changes := w.Watch(ctx)
	out := make(chan fleetEvent)
	go func() { // ends with changes, which ends with ctx
		defer close(out)
		for c := range changes {
			for _, fe := range l.apply(c) {
				select {
				case out <- fe:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out, nil
}

package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/berthvm/berth/session"
)

const eventTime = "2006-01-02 15:04:05"

// followOpts are events --follow's flags.
type followOpts struct {
	limit             int
	asJSON, withStats bool
	// since resumes a fleet's follow after its change at this revision.
	since int64
}

// followEvents prints the recorded events (the last limit of them) of the
// named session, or of every session without a name, then every new event
// until ctx ends. The watch starts first, so nothing falls between the
// timelines and the stream; events a timeline printed are not printed
// again. Resumed (since), it prints no timeline: the follower it resumes
// printed them.
func followEvents(ctx context.Context, c *Call, svc session.Service, names []string, o followOpts) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var evs <-chan session.Event
	var err error
	if o.since > 0 {
		fw, ok := svc.(session.FleetWatcher)
		if !ok {
			return usageErrorf("--since-rev: this berth does not follow a fleet")
		}
		evs, err = fw.WatchSince(ctx, o.since)
	} else {
		evs, err = svc.Watch(ctx)
	}
	if err != nil {
		return err
	}
	printed := map[string]uint64{} // per session (seqs are), the newest recorded event printed
	out := newEventPrinter(c, o.asJSON)
	var backlog []session.Event
	if o.since == 0 {
		backlog, err = timelines(ctx, svc, names, o.limit)
	}
	if err != nil {
		return err
	}
	for _, ev := range backlog {
		if err := out.print(ev); err != nil {
			return err
		}
		printed[ev.Name] = max(printed[ev.Name], ev.Seq)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-evs:
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("the daemon ended the event stream: %w", session.ErrUnavailable)
			}
			switch {
			case len(names) > 0 && !slices.Contains(names, ev.Name):
				continue
			case ev.Seq == 0 && ev.Kind == session.EventState:
				continue // the watch's opening snapshot of each session, not an event
			case ev.Seq != 0 && ev.Seq <= printed[ev.Name]:
				continue // already printed from the timeline
			case ev.Kind == session.EventStats && !o.withStats:
				continue
			}
			if err := out.print(ev); err != nil {
				return err
			}
		}
	}
}

// timelines returns the recorded events of the named session, or of every
// session merged in time order, the last limit of them (all for 0). A
// session deleted since the list is left out.
func timelines(ctx context.Context, svc session.Service, names []string, limit int) ([]session.Event, error) {
	if len(names) > 0 {
		return svc.Timeline(ctx, names[0], limit)
	}
	list, err := svc.List(ctx)
	if err != nil {
		return nil, err
	}
	var all []session.Event
	for _, s := range list {
		tl, err := svc.Timeline(ctx, s.Name, limit)
		if errors.Is(err, session.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		all = append(all, tl...)
	}
	// Each timeline is in order already; stable, so same-time events keep it.
	slices.SortStableFunc(all, func(a, b session.Event) int { return a.Time.Compare(b.Time) })
	if limit > 0 && len(all) > limit {
		all = all[len(all)-limit:]
	}
	return all, nil
}

// eventPrinter prints events one a line, as JSON or text, flushing each:
// a reader at the other end of a pipe gets every event as it happens.
type eventPrinter struct {
	c      *Call
	asJSON bool
}

func newEventPrinter(c *Call, asJSON bool) *eventPrinter { return &eventPrinter{c: c, asJSON: asJSON} }

func (p *eventPrinter) print(ev session.Event) error {
	w := p.c.env.Stdout
	if p.asJSON {
		b, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	}
	loc := p.c.env.Now().Location()
	_, err := fmt.Fprintf(w, "%s  %-8s %-8s %-12s %s\n", ev.Time.In(loc).Format(eventTime), ev.Name, ev.Kind, dash(ev.By), describeEvent(ev))
	return err
}

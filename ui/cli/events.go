package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/berthvm/berth/session"
)

const eventTime = "2006-01-02 15:04:05"

// followEvents prints the recorded events of the named session (the last
// limit of them), then every new event until ctx ends: of that session,
// or of all without a name. The watch starts first, so nothing falls
// between the timeline and the stream; events the timeline printed are
// not printed again.
func followEvents(ctx context.Context, c *Call, svc session.Service, names []string, limit int, asJSON, withStats bool) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	evs, err := svc.Watch(ctx)
	if err != nil {
		return err
	}
	var printed uint64 // the newest recorded event printed
	out := newEventPrinter(c, asJSON)
	if len(names) > 0 {
		tl, err := svc.Timeline(ctx, names[0], limit)
		if err != nil {
			return err
		}
		for _, ev := range tl {
			if err := out.print(ev); err != nil {
				return err
			}
			printed = max(printed, ev.Seq)
		}
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
			case ev.Seq != 0 && ev.Seq <= printed:
				continue // already printed from the timeline
			case ev.Kind == session.EventStats && !withStats:
				continue
			}
			if err := out.print(ev); err != nil {
				return err
			}
		}
	}
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

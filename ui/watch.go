package ui

import (
	"context"
	"strings"
	"time"

	tea "charm.land/bubbletea/v2"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/ui/common"
)

// The event stream is consumed by one Cmd at a time: waitEvents blocks for
// the next event, gathers whatever follows within one frame, and returns
// the batch; Update re-arms it. A burst (stats for a thousand sessions,
// the initial snapshot of ten thousand) is then one Update and one render.

type watchStartedMsg struct {
	gen   int
	ch    <-chan session.Event
	names map[string]bool // sessions that exist, for reconciling after a reconnect
	err   error
	host  *session.HostStatus
}

type eventsMsg struct {
	gen    int
	events []session.Event
	closed bool
}

type reconnectMsg struct{ gen int }

// connect (re)subscribes to the event stream. A new generation makes
// messages from an older stream harmless.
func (m *Model) connect() tea.Cmd {
	m.watchGen++
	if m.watchCancel != nil {
		m.watchCancel()
	}
	ctx, cancel := context.WithCancel(m.c.Ctx)
	m.watchCancel = cancel
	gen, svc, reconcile := m.watchGen, m.c.Svc, m.everConnected
	call := m.c.CallTimeout
	if call <= 0 {
		call = common.DefaultCallTimeout
	}
	return func() tea.Msg {
		ch, err := svc.Watch(ctx)
		if err != nil {
			return watchStartedMsg{gen: gen, err: err}
		}
		msg := watchStartedMsg{gen: gen, ch: ch}
		hctx, hcancel := context.WithTimeout(ctx, call)
		if h, err := svc.Host(hctx); err == nil {
			msg.host = &h
		}
		hcancel()
		if reconcile {
			// Sessions deleted while the stream was down sent no event.
			lctx, lcancel := context.WithTimeout(ctx, call)
			defer lcancel()
			if list, err := svc.List(lctx); err == nil {
				msg.names = make(map[string]bool, len(list))
				for _, s := range list {
					msg.names[s.Name] = true
				}
			}
		}
		return msg
	}
}

func waitEvents(gen int, ch <-chan session.Event) tea.Cmd {
	return func() tea.Msg {
		ev, ok := <-ch
		if !ok {
			return eventsMsg{gen: gen, closed: true}
		}
		batch := []session.Event{ev}
		timer := time.NewTimer(eventLinger)
		defer timer.Stop()
		for len(batch) < maxEventsBatch {
			// Events already queued are taken before the timer is looked
			// at: a burst that arrived together goes out together, even
			// when this goroutine ran later than the linger.
			var ev session.Event
			var ok bool
			select {
			case ev, ok = <-ch:
			default:
				select {
				case ev, ok = <-ch:
				case <-timer.C:
					return eventsMsg{gen: gen, events: batch}
				}
			}
			if !ok {
				return eventsMsg{gen: gen, events: batch, closed: true}
			}
			batch = append(batch, ev)
		}
		return eventsMsg{gen: gen, events: batch}
	}
}

func (m *Model) handleWatchStarted(msg watchStartedMsg) tea.Cmd {
	if msg.gen != m.watchGen {
		return nil
	}
	if msg.err != nil {
		m.connected = false
		m.watchErr = common.ErrorText(msg.err)
		m.c.Logger.Warn("event stream", "err", msg.err)
		return m.scheduleReconnect()
	}
	m.connected, m.watchErr, m.retry = true, "", 0
	if msg.host != nil {
		m.host = *msg.host
	}
	if msg.names != nil {
		m.sessions.Retain(msg.names)
	}
	m.everConnected = true
	m.watchCh = msg.ch
	return waitEvents(msg.gen, msg.ch)
}

func (m *Model) scheduleReconnect() tea.Cmd {
	if m.c.Ctx.Err() != nil {
		return nil
	}
	if m.retry == 0 {
		m.retry = firstRetry
	} else {
		m.retry = min(2*m.retry, maxRetry)
	}
	gen := m.watchGen
	return tea.Tick(m.retry, func(time.Time) tea.Msg { return reconnectMsg{gen: gen} })
}

func (m *Model) handleEvents(msg eventsMsg) tea.Cmd {
	if msg.gen != m.watchGen {
		return nil
	}
	cmd := m.applyEvents(msg.events)
	if msg.closed {
		m.connected = false
		m.watchErr = "event stream closed"
		m.c.Logger.Info("event stream closed; reconnecting")
		return tea.Batch(cmd, m.scheduleReconnect())
	}
	return tea.Batch(cmd, waitEvents(msg.gen, m.watchCh))
}

// applyEvents folds a batch into the table and the open detail view.
func (m *Model) applyEvents(evs []session.Event) tea.Cmd {
	for i := range evs {
		if evs[i].Kind == session.EventHost && evs[i].Host != nil {
			m.host = *evs[i].Host
			m.footerKey = ""
		}
	}
	resort := m.sessions.Apply(evs)
	if m.page != pageDetail {
		return resort
	}
	deleted, runsChanged := false, false
	for i := range evs {
		ev := &evs[i]
		if ev.Name != m.detail {
			continue
		}
		switch ev.Kind {
		case session.EventExec:
			runsChanged = runsChanged || m.runs.Has()
			if ev.Exec != nil {
				m.execs.ApplyExec(*ev.Exec)
				m.output.ApplyExec(*ev.Exec)
			}
		case session.EventNote:
			runsChanged = runsChanged || strings.HasPrefix(ev.Message, "run ")
		case session.EventDeleted:
			deleted = true
		}
		m.info.AddEvent(*ev)
	}
	if deleted {
		name := m.detail
		m.page = pageSessions
		m.detail = ""
		return tea.Batch(resort, m.output.Clear(), m.setFlash(common.FlashInfo, "session "+name+" was deleted"))
	}
	s, ok := m.detailSession()
	if !ok {
		return resort
	}
	m.sparks.Observe(s)
	var reload tea.Cmd
	if runsChanged {
		reload = m.runs.Reload()
	}
	return tea.Batch(resort, m.files.SetSession(s, m.tab == tabFiles), m.info.SetSession(s), reload)
}

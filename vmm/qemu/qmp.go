package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"
)

// QMPError is an error QEMU returned for a command.
type QMPError struct {
	Command string
	Class   string
	Desc    string
}

func (e *QMPError) Error() string { return fmt.Sprintf("qmp %s: %s (%s)", e.Command, e.Desc, e.Class) }

// Event is an asynchronous QMP event.
type Event struct {
	Event     string          `json:"event"`
	Data      json.RawMessage `json:"data"`
	Timestamp struct {
		Seconds      int64 `json:"seconds"`
		Microseconds int64 `json:"microseconds"`
	} `json:"timestamp"`
}

// Monitor is a QMP connection. Commands run one at a time, in order; QEMU
// answers them in order too (no out-of-band execution is used). A reader
// goroutine, stopped by Close or the socket's end, routes replies and
// events. Each command carries an id and only the reply with that id
// answers it: the late reply of a command whose caller gave up is dropped,
// never taken for the next command's.
type Monitor struct {
	conn   net.Conn
	events chan Event

	// turn serialises commands: a one-slot semaphore, so that waiting for
	// it honours the caller's ctx (a wedged QEMU must not hold up a Kill).
	turn    chan struct{}
	next    uint64        // the last id sent; guarded by turn
	want    atomic.Uint64 // the id whose reply is awaited; 0: none
	replies chan reply
	done    chan struct{}
	err     error // why the reader stopped; set before done closes
}

type reply struct {
	ID     uint64          `json:"id"`
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error"`
}

// maxQMPLine bounds one message from QEMU.
const maxQMPLine = 4 << 20

// NewMonitor negotiates QMP on conn: it reads the greeting and sends
// qmp_capabilities, bounded by ctx.
func NewMonitor(ctx context.Context, conn net.Conn) (*Monitor, error) {
	m := &Monitor{conn: conn, events: make(chan Event, 64), turn: make(chan struct{}, 1), replies: make(chan reply, 1), done: make(chan struct{})}
	sc := bufio.NewScanner(conn)
	sc.Buffer(make([]byte, 64<<10), maxQMPLine)
	if d, ok := ctx.Deadline(); ok {
		conn.SetReadDeadline(d)
	}
	if !sc.Scan() {
		conn.Close()
		return nil, fmt.Errorf("qmp: no greeting: %v", sc.Err())
	}
	var greet struct {
		QMP *struct {
			Version json.RawMessage `json:"version"`
		} `json:"QMP"`
	}
	if err := json.Unmarshal(sc.Bytes(), &greet); err != nil || greet.QMP == nil {
		conn.Close()
		return nil, fmt.Errorf("qmp: unexpected greeting %.100q", sc.Bytes())
	}
	conn.SetReadDeadline(time.Time{})
	go m.read(sc)
	if err := m.Execute(ctx, "qmp_capabilities", nil, nil); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

func (m *Monitor) read(sc *bufio.Scanner) {
	defer close(m.done)
	defer close(m.events)
	for sc.Scan() {
		line := sc.Bytes()
		var probe struct {
			Event string `json:"event"`
		}
		if json.Unmarshal(line, &probe) == nil && probe.Event != "" {
			var ev Event
			json.Unmarshal(line, &ev)
			select {
			case m.events <- ev:
			default: // nobody listens closely enough; events are advisory
			}
			continue
		}
		var r reply
		if err := json.Unmarshal(line, &r); err != nil {
			continue
		}
		if r.ID == 0 || r.ID != m.want.Load() {
			continue // a reply to a command whose caller gave up
		}
		select {
		case m.replies <- r:
		default: // a duplicate: the awaited reply is already queued
		}
	}
	m.err = sc.Err()
	if m.err == nil {
		m.err = errors.New("QMP connection closed")
	}
}

// Events yields QMP events until the connection ends.
func (m *Monitor) Events() <-chan Event { return m.events }

// Done is closed when the connection ends (QEMU exited).
func (m *Monitor) Done() <-chan struct{} { return m.done }

// Execute runs a command and decodes its return value into out. ctx
// bounds the wait for the previous command as well as for the reply.
func (m *Monitor) Execute(ctx context.Context, cmd string, args, out any) error {
	select {
	case m.turn <- struct{}{}:
	case <-m.done:
		return fmt.Errorf("qmp %s: %w", cmd, m.err)
	case <-ctx.Done():
		return fmt.Errorf("qmp %s: waiting for the previous command: %w", cmd, ctx.Err())
	}
	defer func() { <-m.turn }()
	m.next++
	id := m.next
	m.want.Store(id)
	defer m.want.Store(0)
	select { // a reply queued for an earlier id just before want moved on
	case <-m.replies:
	default:
	}
	msg := map[string]any{"execute": cmd, "id": id}
	if args != nil {
		msg["arguments"] = args
	}
	b, _ := json.Marshal(msg)
	m.conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := m.conn.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("qmp %s: %w", cmd, err)
	}
	for {
		select {
		case r := <-m.replies:
			if r.ID != id {
				continue
			}
			if r.Error != nil {
				return &QMPError{Command: cmd, Class: r.Error.Class, Desc: r.Error.Desc}
			}
			if out != nil && len(r.Return) > 0 {
				return json.Unmarshal(r.Return, out)
			}
			return nil
		case <-m.done:
			return fmt.Errorf("qmp %s: %w", cmd, m.err)
		case <-ctx.Done():
			return fmt.Errorf("qmp %s: %w", cmd, ctx.Err())
		}
	}
}

// Close ends the connection.
func (m *Monitor) Close() error { return m.conn.Close() }

package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/vmm"
)

// fakeQEMU answers QMP on one end of a pipe: the greeting, then each
// command to handle, which may answer later, out of turn or never.
type fakeQEMU struct {
	conn net.Conn
	cmds chan qmpCmd
}

type qmpCmd struct {
	Execute string          `json:"execute"`
	ID      json.RawMessage `json:"id"`
}

func newFakeQEMU(t *testing.T) (*fakeQEMU, *Monitor) {
	t.Helper()
	host, qemu := net.Pipe()
	f := &fakeQEMU{conn: qemu, cmds: make(chan qmpCmd, 16)}
	go func() {
		fmt.Fprintln(qemu, `{"QMP": {"version": {"qemu": {"major": 7}}, "capabilities": []}}`)
		sc := bufio.NewScanner(qemu)
		for sc.Scan() {
			var c qmpCmd
			json.Unmarshal(sc.Bytes(), &c)
			if c.Execute == "qmp_capabilities" {
				f.reply(c, `{}`)
				continue
			}
			f.cmds <- c
		}
		close(f.cmds)
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	m, err := NewMonitor(ctx, host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close(); qemu.Close() })
	return f, m
}

func (f *fakeQEMU) reply(c qmpCmd, ret string) {
	fmt.Fprintf(f.conn, `{"return": %s, "id": %s}`+"\n", ret, c.ID)
}

func (f *fakeQEMU) next(t *testing.T) qmpCmd {
	t.Helper()
	select {
	case c := <-f.cmds:
		return c
	case <-time.After(5 * time.Second):
		t.Fatal("no command reached QEMU")
		return qmpCmd{}
	}
}

// A reply that comes after its caller gave up never answers the next
// command: query-status after a timed-out query-status gets its own.
func TestQMPLateReplyIsDropped(t *testing.T) {
	f, m := newFakeQEMU(t)
	first := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel()
		first <- m.Execute(ctx, "query-status", nil, nil)
	}()
	late := f.next(t)
	if err := <-first; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("first command: %v, want its deadline", err)
	}
	var got struct{ Status string }
	second := make(chan error, 1)
	go func() { second <- m.Execute(t.Context(), "query-status", nil, &got) }()
	now := f.next(t)
	if string(now.ID) == string(late.ID) {
		t.Fatalf("two commands share id %s", now.ID)
	}
	f.reply(late, `{"status": "paused"}`) // the first command's, late
	f.reply(now, `{"status": "running"}`)
	if err := <-second; err != nil || got.Status != "running" {
		t.Fatalf("second command: %v, status %q; want its own reply, running", err, got.Status)
	}
}

// Waiting for the command before honours ctx: a wedged QEMU does not
// hold up a caller with a deadline (a Kill's QMP quit).
func TestQMPWaitHonoursContext(t *testing.T) {
	f, m := newFakeQEMU(t)
	go m.Execute(t.Context(), "stop", nil, nil) // never answered
	f.next(t)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := m.Execute(ctx, "quit", nil, nil)
	if err == nil || !strings.Contains(err.Error(), "waiting for the previous command") {
		t.Fatalf("quit behind a wedged command: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("quit waited %s past its 100ms deadline", d)
	}
}

// QEMU's errors come back typed, for the command that caused them.
func TestQMPError(t *testing.T) {
	f, m := newFakeQEMU(t)
	errc := make(chan error, 1)
	go func() { errc <- m.Execute(t.Context(), "cont", nil, nil) }()
	c := f.next(t)
	fmt.Fprintf(f.conn, `{"error": {"class": "GenericError", "desc": "no"}, "id": %s}`+"\n", c.ID)
	var qe *QMPError
	if err := <-errc; !errors.As(err, &qe) || qe.Command != "cont" || qe.Desc != "no" {
		t.Fatalf("%v", err)
	}
}

// A snapshot returns only once QEMU has left finish-migrate: it reports
// the migration completed a moment before, and refuses cont until then
// ("Migration is not finalized yet"), which failed a memory checkpoint's
// resume in the soak.
func TestSnapshotWaitsOutFinishMigrate(t *testing.T) {
	f, m := newFakeQEMU(t)
	v := &VM{proc: &vmm.Process{}, mon: m}
	done := make(chan error, 1)
	go func() { done <- v.Snapshot(t.Context(), "/nonexistent/memory.snap") }()
	for _, step := range []struct{ cmd, ret string }{
		{"query-status", `{"status": "paused", "running": false}`},
		{"migrate-set-parameters", `{}`},
		{"migrate", `{}`},
		{"query-migrate", `{"status": "completed"}`},
		{"query-status", `{"status": "finish-migrate", "running": false}`},
		{"query-status", `{"status": "finish-migrate", "running": false}`},
		{"query-status", `{"status": "postmigrate", "running": false}`},
	} {
		c := f.next(t)
		if c.Execute != step.cmd {
			t.Fatalf("QEMU got %s, want %s", c.Execute, step.cmd)
		}
		select {
		case err := <-done:
			t.Fatalf("the snapshot returned (%v) before QEMU answered %s", err, step.cmd)
		default:
		}
		f.reply(c, step.ret)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/vmm"
)

func TestDefaults(t *testing.T) {
	got := Defaults{}.WithFallbacks()
	want := Defaults{Image: "mini", CPUs: 1, MemoryMiB: 512, DiskBytes: 4 << 30, SystemBytes: session.DefaultSystemBytes, VMM: "qemu", Accel: "auto", Retention: 256 << 20}
	if got != want {
		t.Errorf("zero Defaults become %+v, want %+v", got, want)
	}
	set := Defaults{Image: "big", CPUs: 4, MemoryMiB: 2048, DiskBytes: 1 << 30, SystemBytes: 2 << 30, VMM: "cloud-hypervisor", Accel: "tcg", Retention: 1 << 20}
	if got := set.WithFallbacks(); got != set {
		t.Errorf("set Defaults become %+v, want them kept", got)
	}
	if session.DefaultIdleTimeout != 15*time.Minute {
		t.Errorf("DefaultIdleTimeout %v", session.DefaultIdleTimeout)
	}
}

func TestAgentErrClasses(t *testing.T) {
	tests := []struct {
		err   error
		class error
		errno error
	}{
		{&guest.Error{Code: "ENOENT", Message: "no such file"}, session.ErrNotFound, syscall.ENOENT},
		{&guest.Error{Code: "EEXIST"}, session.ErrExists, syscall.EEXIST},
		{&guest.Error{Code: guest.CodeEscape}, session.ErrInvalid, guest.ErrEscape},
		{&guest.Error{Code: "ENOSPC"}, session.ErrConflict, syscall.ENOSPC},
		{&guest.Error{Code: "EISDIR"}, session.ErrInvalid, syscall.EISDIR},
		{&guest.Error{Code: guest.CodeNoWorkspace}, session.ErrUnavailable, guest.ErrNoWorkspace},
		{fmt.Errorf("x: %w", vmm.ErrNotRunning), session.ErrUnavailable, vmm.ErrNotRunning},
	}
	for _, tt := range tests {
		err := agentErr("alpha", tt.err)
		if !errors.Is(err, tt.class) || !errors.Is(err, tt.errno) {
			t.Errorf("agentErr(%v) = %v: want class %v and %v", tt.err, err, tt.class, tt.errno)
		}
	}
	if err := agentErr("alpha", &guest.Error{Code: "ENOSPC", Message: "no space left on device"}); err.Error() == "" || !strings.Contains(err.Error(), "workspace of \"alpha\" is full") {
		t.Errorf("ENOSPC message %q", err)
	}
}

// A thousand sessions refreshing stats while a watcher reads slowly: the
// watcher's queue stays bounded by the number of sessions, and it ends up
// with every session's newest figures and every state change.
func TestHubCoalescesStats(t *testing.T) {
	h := newHub()
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	ch := h.watch(ctx, &wg, nil)
	const sessions, rounds = 1000, 20
	for r := 0; r < rounds; r++ {
		for i := 0; i < sessions; i++ {
			h.publish(session.Event{Kind: session.EventStats, Name: fmt.Sprint(i), Message: fmt.Sprint(r)})
		}
	}
	h.publish(session.Event{Kind: session.EventState, Name: "7", Message: "paused"})
	h.mu.Lock()
	var queued int
	for w := range h.watchers {
		w.mu.Lock()
		queued = len(w.queue)
		w.mu.Unlock()
	}
	h.mu.Unlock()
	if queued > sessions+1+256 {
		t.Fatalf("%d events queued for %d sessions", queued, sessions)
	}
	latest := map[string]string{}
	sawState := false
	timeout := time.After(5 * time.Second)
	for len(latest) < sessions || !sawState || latest["999"] != fmt.Sprint(rounds-1) {
		select {
		case ev := <-ch:
			if ev.Kind == session.EventState {
				sawState = true
			} else {
				latest[ev.Name] = ev.Message
			}
		case <-timeout:
			t.Fatalf("have %d sessions, state %v", len(latest), sawState)
		}
	}
	cancel()
	wg.Wait()
}

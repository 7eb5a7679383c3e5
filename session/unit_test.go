package session

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
	"github.com/berthvm/berth/vmm"
)

func TestTransitions(t *testing.T) {
	all := []State{StateCreating, StateRunning, StatePaused, StateStopping, StateStopped, StateCrashed, StateDeleting, StateSleeping}
	allowed := map[Action][]State{
		"pause":  {StateRunning},
		"resume": {StatePaused, StateSleeping},
		"stop":   {StateRunning, StatePaused, StateCrashed, StateSleeping},
		"start":  {StateStopped, StateCrashed, StateSleeping},
		"flush":  {StateRunning, StateSleeping},
		"exec":   {StateRunning, StateSleeping},
		"files":  {StateRunning, StateSleeping},
		"sleep":  {StateRunning},
		"bogus":  {},
		"delete": {StateRunning, StatePaused, StateStopped, StateCrashed, StateSleeping},
	}
	for action, ok := range allowed {
		for _, st := range all {
			err := CheckTransition("a", action, st)
			want := false
			for _, s := range ok {
				want = want || s == st
			}
			if Allowed(action, st) != want {
				t.Errorf("Allowed(%s, %s) = %v, want %v", action, st, !want, want)
			}
			if want && err != nil {
				t.Errorf("%s from %s: %v, want allowed", action, st, err)
			}
			if !want && !errors.Is(err, ErrInvalidState) {
				t.Errorf("%s from %s: %v, want ErrInvalidState", action, st, err)
			}
		}
	}
	err := CheckTransition("alpha", ActionPause, StateStopped)
	if got := err.Error(); got != `cannot pause session "alpha": it is stopped (start it first): invalid state` {
		t.Errorf("message %q", got)
	}
}

func TestValidateName(t *testing.T) {
	for name, ok := range map[string]bool{
		"a": true, "alpha-2": true, "0x": true, "": false, "-a": false, "A": false, "a_b": false,
		"a/b": false, "a.b": false, string(make([]byte, 64)): false,
		"abcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcdefghij123": true,
	} {
		if err := ValidateName(name); (err == nil) != ok {
			t.Errorf("ValidateName(%q) = %v, want ok=%v", name, err, ok)
		}
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"512M": 512 << 20, "4G": 4 << 30, "1.5G": 3 << 29, "1024K": 1 << 20, "4GiB": 4 << 30, "100": 100, "2t": 2 << 40,
		"10G": 10 << 30, "1.5GiB": 3 << 29, "2048": 2048} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "x", "4Q", "-1G", "0", "1.5", "1e9", "lots"} {
		if _, err := ParseSize(bad); err == nil {
			t.Errorf("ParseSize(%q) succeeded", bad)
		}
	}
}

func TestAgentErrClasses(t *testing.T) {
	tests := []struct {
		err   error
		class error
		errno error
	}{
		{&guest.Error{Code: "ENOENT", Message: "no such file"}, ErrNotFound, syscall.ENOENT},
		{&guest.Error{Code: "EEXIST"}, ErrExists, syscall.EEXIST},
		{&guest.Error{Code: guest.CodeEscape}, ErrInvalid, guest.ErrEscape},
		{&guest.Error{Code: "ENOSPC"}, ErrConflict, syscall.ENOSPC},
		{&guest.Error{Code: "EISDIR"}, ErrInvalid, syscall.EISDIR},
		{&guest.Error{Code: guest.CodeNoWorkspace}, ErrUnavailable, guest.ErrNoWorkspace},
		{fmt.Errorf("x: %w", vmm.ErrNotRunning), ErrUnavailable, vmm.ErrNotRunning},
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
			h.publish(Event{Kind: EventStats, Name: fmt.Sprint(i), Message: fmt.Sprint(r)})
		}
	}
	h.publish(Event{Kind: EventState, Name: "7", Message: "paused"})
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
			if ev.Kind == EventState {
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

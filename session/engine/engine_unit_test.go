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

	"github.com/BurntSushi/toml"
	"github.com/berthvm/berth/assets"
	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/engine/egress"
	"github.com/berthvm/berth/vmm"
)

func TestDefaults(t *testing.T) {
	got := Defaults{}.withFallbacks()
	want := Defaults{Image: "mini", CPUs: 1, MemoryMiB: 512, DiskBytes: 4 << 30, SystemBytes: session.DefaultSystemBytes, VMM: "qemu", Accel: "auto", Retention: 256 << 20}
	if got != want {
		t.Errorf("zero Defaults become %+v, want %+v", got, want)
	}
	set := Defaults{Image: "big", CPUs: 4, MemoryMiB: 2048, DiskBytes: 1 << 30, SystemBytes: 2 << 30, VMM: "cloud-hypervisor", Accel: "tcg", Retention: 1 << 20}
	if got := set.withFallbacks(); got != set {
		t.Errorf("set Defaults become %+v, want them kept", got)
	}
	if session.DefaultIdleTimeout != 15*time.Minute {
		t.Errorf("DefaultIdleTimeout %v", session.DefaultIdleTimeout)
	}
}

// TestDefaultConfigDocumentsDefaults: assets/config.toml, written into a
// new data directory, documents the defaults; its values must be these.
func TestDefaultConfigDocumentsDefaults(t *testing.T) {
	var f struct {
		Image       string `toml:"image"`
		CPUs        int    `toml:"cpus"`
		Memory      string `toml:"memory"`
		Disk        string `toml:"disk"`
		SystemDisk  string `toml:"system_disk"`
		VMM         string `toml:"vmm"`
		Accel       string `toml:"accel"`
		Retention   string `toml:"retention"`
		IdleTimeout string `toml:"idle_timeout"`
		Floor       string `toml:"free_space_floor"`
		Budget      string `toml:"output_budget"`
		RunTimeout  string `toml:"run_timeout"`
		RunCkpt     bool   `toml:"run_checkpoint"`
		CkptLimit   int    `toml:"checkpoint_limit"`
		CkptBytes   string `toml:"checkpoint_bytes"`
		Net         string `toml:"net"`
		NetMaxConns int    `toml:"net_max_conns"`
		NetNIC      bool   `toml:"net_nic"`
	}
	md, err := toml.Decode(assets.DefaultConfig(), &f)
	if err != nil {
		t.Fatal(err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		t.Fatalf("config.toml has keys this test does not check: %v", und)
	}
	mem, err := session.ParseMemory(f.Memory)
	if err != nil {
		t.Fatal(err)
	}
	disk, err := session.ParseSize(f.Disk)
	if err != nil {
		t.Fatal(err)
	}
	sys, err := session.ParseSize(f.SystemDisk)
	if err != nil {
		t.Fatal(err)
	}
	ret, err := session.ParseSize(f.Retention)
	if err != nil {
		t.Fatal(err)
	}
	idle, err := time.ParseDuration(f.IdleTimeout)
	if err != nil {
		t.Fatal(err)
	}
	runTimeout, err := time.ParseDuration(f.RunTimeout)
	if err != nil {
		t.Fatal(err)
	}
	floor, err := session.ParseSize(f.Floor)
	if err != nil {
		t.Fatal(err)
	}
	budget, err := session.ParseSize(f.Budget)
	if err != nil {
		t.Fatal(err)
	}
	ckptBytes, err := session.ParseSize(f.CkptBytes)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		key       string
		doc, code any
	}{
		{"checkpoint_limit", f.CkptLimit, session.DefaultCheckpointLimit},
		{"checkpoint_bytes", ckptBytes, int64(session.DefaultCheckpointBytes)},
		{"image", f.Image, session.DefaultImage},
		{"cpus", f.CPUs, session.DefaultCPUs},
		{"memory", mem, session.DefaultMemoryMiB},
		{"disk", disk, int64(session.DefaultDiskBytes)},
		{"system_disk", sys, int64(session.DefaultSystemBytes)},
		{"vmm", f.VMM, session.DefaultVMM},
		{"accel", f.Accel, string(DefaultAccel)},
		{"retention", ret, DefaultRetention},
		{"idle_timeout", idle, session.DefaultIdleTimeout},
		{"run_timeout", runTimeout, DefaultRunTimeout},
		{"run_checkpoint", f.RunCkpt, true},
		{"free_space_floor", floor, int64(session.DefaultFloor)},
		{"output_budget", budget, int64(session.DefaultOutputBudget)},
		{"net", f.Net, session.DefaultNet},
		{"net_max_conns", f.NetMaxConns, egress.DefaultMaxConns},
		{"net_nic", f.NetNIC, Config{}.NIC},
	} {
		if c.doc != c.code {
			t.Errorf("config.toml documents %s = %v (%T), session defaults to %v (%T)", c.key, c.doc, c.doc, c.code, c.code)
		}
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

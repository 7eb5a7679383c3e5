package cloudhypervisor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/berthvm/berth/vmm"
	"github.com/berthvm/berth/vmm/cloudhypervisor/chfake"
	"github.com/berthvm/berth/vmm/cloudhypervisor/internal/chapi"
)

// inProcessVM boots a VM on an in-process fake, with a stand-in process
// that "exits" when the fake's VMM would. It exercises the API layer and
// the vm.info rule without launching anything.
func inProcessVM(t *testing.T) (*VM, *chfake.Server) {
	t.Helper()
	cfg := testConfig(t)
	os.MkdirAll(cfg.Dir, 0o700)
	p := pathsIn(cfg.Dir)
	srv := chfake.New(chfake.Options{Logf: t.Logf})
	if err := srv.Serve(p.api); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	proc := &process{pid: os.Getpid(), logPath: p.log, done: make(chan struct{})}
	var once sync.Once
	exit := func(e vmm.Exit) { once.Do(func() { proc.exit = e; close(proc.done) }) }
	proc.signal = func(syscall.Signal) error {
		srv.Close()
		exit(vmm.Exit{Code: -1, Signal: "SIGKILL"})
		return nil
	}
	go func() {
		<-srv.Exited()
		exit(vmm.Exit{Code: srv.ExitCode()})
	}()
	ctx := context.Background()
	api := newAPIClient(p.api)
	if err := api.create(ctx, vmConfig(cfg, p)); err != nil {
		t.Fatal(err)
	}
	if err := api.boot(ctx); err != nil {
		t.Fatal(err)
	}
	d := New(Options{Logger: testLogger(t)})
	return d.newVM(p, api, proc, d.log), srv
}

// TestActionRule checks the vm.info rule: the status code decides
// nothing, the state read afterwards does.
func TestActionRule(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		setup   func(v *VM, s *chfake.Server)
		action  func(v *VM) error
		want    chapi.VmState
		wantErr string // "" for success
	}{
		{
			name:   "pause",
			action: func(v *VM) error { return v.Pause(ctx) },
			want:   chapi.Paused,
		},
		{
			name:   "pause a paused VM",
			setup:  func(v *VM, _ *chfake.Server) { v.api.pause(ctx) },
			action: func(v *VM) error { return v.Pause(ctx) },
			want:   chapi.Paused,
		},
		{
			name:   "resume a running VM",
			action: func(v *VM) error { return v.Resume(ctx) },
			want:   chapi.Running,
		},
		{
			name:   "500 but the pause happened",
			setup:  func(_ *VM, s *chfake.Server) { s.Inject("vm.pause", chfake.Fault{After: true}) },
			action: func(v *VM) error { return v.Pause(ctx) },
			want:   chapi.Paused,
		},
		{
			name:    "500 and the pause did not happen",
			setup:   func(_ *VM, s *chfake.Server) { s.Inject("vm.pause", chfake.Fault{}) },
			action:  func(v *VM) error { return v.Pause(ctx) },
			want:    chapi.Running,
			wantErr: "injected failure of vm.pause (HTTP 500) (VM is Running)",
		},
		{
			name: "404 but the resume happened",
			setup: func(v *VM, s *chfake.Server) {
				v.api.pause(ctx)
				s.Inject("vm.resume", chfake.Fault{Status: 404, After: true})
			},
			action: func(v *VM) error { return v.Resume(ctx) },
			want:   chapi.Running,
		},
		{
			name:    "no VM in the VMM",
			setup:   func(v *VM, _ *chfake.Server) { v.api.c.DeleteVM(ctx) },
			action:  func(v *VM) error { return v.Pause(ctx) },
			wantErr: "holds no VM",
		},
		{
			name: "vm.info fails too",
			setup: func(_ *VM, s *chfake.Server) {
				s.Inject("vm.pause", chfake.Fault{})
				s.Inject("vm.info", chfake.Fault{})
			},
			action:  func(v *VM) error { return v.Pause(ctx) },
			want:    chapi.Running,
			wantErr: "vm.info failed too",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, s := inProcessVM(t)
			if tc.setup != nil {
				tc.setup(v, s)
			}
			err := tc.action(v)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("= %v, want nil", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("= %v, want an error containing %q", err, tc.wantErr)
			}
			if err != nil {
				var ae *APIError
				if !errors.As(err, &ae) {
					t.Errorf("%v does not carry an *APIError", err)
				}
			}
			if tc.want != "" {
				if got := s.State(); got != tc.want {
					t.Errorf("state = %s, want %s", got, tc.want)
				}
			}
		})
	}
}

func TestStatusMapping(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		setup   func(v *VM, s *chfake.Server)
		want    vmm.State
		wantErr bool
	}{
		{"running", nil, vmm.StateRunning, false},
		{"paused", func(v *VM, _ *chfake.Server) { v.api.pause(ctx) }, vmm.StatePaused, false},
		{"shut down (Created)", func(v *VM, _ *chfake.Server) { v.api.c.ShutdownVM(ctx) }, vmm.StateStopped, false},
		{"deleted", func(v *VM, _ *chfake.Server) { v.api.c.DeleteVM(ctx) }, vmm.StateStopped, false},
		{"powered off", func(v *VM, s *chfake.Server) { s.PowerOff(); <-v.Done() }, vmm.StateStopped, false},
		{"vm.info fails", func(_ *VM, s *chfake.Server) { s.Inject("vm.info", chfake.Fault{}) }, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, s := inProcessVM(t)
			if tc.setup != nil {
				tc.setup(v, s)
			}
			got, err := v.Status(ctx)
			if got != tc.want || (err != nil) != tc.wantErr {
				t.Errorf("Status = %q, %v; want %q (error %v)", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestExitedVMM(t *testing.T) {
	ctx := context.Background()
	v, s := inProcessVM(t)
	s.PowerOff()
	<-v.Done()
	if e := v.Exit(); e.Code != 0 {
		t.Errorf("Exit = %+v", e)
	}
	for name, f := range map[string]func() error{
		"Pause":    func() error { return v.Pause(ctx) },
		"Resume":   func() error { return v.Resume(ctx) },
		"Snapshot": func() error { return v.Snapshot(ctx, t.TempDir()) },
		"DialAgent": func() error {
			_, err := v.DialAgent(ctx)
			return err
		},
	} {
		if err := f(); !errors.Is(err, vmm.ErrNotRunning) {
			t.Errorf("%s after exit = %v, want ErrNotRunning", name, err)
		}
	}
	if err := v.Kill(ctx); err != nil {
		t.Errorf("Kill after exit = %v", err)
	}
}

// TestVMMDiesMidCall: the API connection breaks because the VMM died;
// the driver reports ErrNotRunning, not a transport error.
func TestVMMDiesMidCall(t *testing.T) {
	v, s := inProcessVM(t)
	s.Close()
	go v.proc.signal(syscall.SIGKILL)
	if err := v.Pause(context.Background()); !errors.Is(err, vmm.ErrNotRunning) {
		t.Errorf("Pause = %v, want ErrNotRunning", err)
	}
}

func TestSnapshotInProcess(t *testing.T) {
	ctx := context.Background()
	v, s := inProcessVM(t)

	existing := t.TempDir()
	os.WriteFile(filepath.Join(existing, "keep"), nil, 0o600)
	if err := v.Snapshot(ctx, existing); err == nil || !strings.Contains(err.Error(), "pause it first") {
		t.Errorf("Snapshot while running = %v", err)
	}
	if _, err := os.Stat(filepath.Join(existing, "keep")); err != nil {
		t.Error("a failed snapshot removed a directory it did not create")
	}
	if err := v.Snapshot(ctx, "relative/dir"); err == nil {
		t.Error("relative snapshot path accepted")
	}
	v.Pause(ctx)
	s.Inject("vm.snapshot", chfake.Fault{Messages: []string{"Error from API", "disk full"}})
	err := v.Snapshot(ctx, existing)
	if err == nil || !strings.Contains(err.Error(), "disk full") || strings.Contains(err.Error(), "pause it first") {
		t.Errorf("failed snapshot of a paused VM = %v", err)
	}
	if err := v.Snapshot(ctx, existing); err != nil {
		t.Fatal(err)
	}
	if s.State() != chapi.Paused {
		t.Errorf("state after snapshot = %s, want Paused", s.State())
	}
}

func TestParseErrorBody(t *testing.T) {
	long := strings.Repeat("x", 2000)
	many := make([]string, 20)
	for i := range many {
		many[i] = fmt.Sprint(i)
	}
	manyJSON := `["` + strings.Join(many, `","`) + `"]`
	for _, tc := range []struct {
		body string
		want []string
	}{
		{`["Error from API","The VM could not be paused","VM is not running"]`, []string{"Error from API", "The VM could not be paused", "VM is not running"}},
		{"", nil},
		{"  plain text\n", []string{"plain text"}},
		{`{"error":"x"}`, []string{`{"error":"x"}`}},
		{manyJSON, many[:maxErrorMessages]},
		{`["` + long + `"]`, []string{long[:maxErrorMessageLen] + "…"}},
	} {
		if got := parseErrorBody([]byte(tc.body)); !slices.Equal(got, tc.want) {
			t.Errorf("parseErrorBody(%.40q) = %.80q, want %.80q", tc.body, got, tc.want)
		}
	}
	e := &APIError{Op: "vm.pause", Status: 500, Messages: []string{"a", "b"}}
	if got := e.Error(); got != "cloud-hypervisor vm.pause: a: b (HTTP 500)" {
		t.Errorf("Error() = %q", got)
	}
	if got := (&APIError{Op: "vm.boot", Status: 400}).Error(); got != "cloud-hypervisor vm.boot: Bad Request (HTTP 400)" {
		t.Errorf("Error() = %q", got)
	}
}

// TestInfoWithoutJSONContentType: answers are decoded whatever their
// Content-Type, which the generated parser would otherwise require.
func TestInfoWithoutJSONContentType(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "api.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		switch r.URL.Path {
		case "/api/v1/vm.info":
			fmt.Fprint(w, `{"config":{"payload":{}},"state":"Paused"}`)
		case "/api/v1/vmm.ping":
			fmt.Fprint(w, `{"version":"v53.0","pid":7}`)
		}
	})}
	go srv.Serve(ln)
	defer srv.Close()
	api := newAPIClient(sock)
	st, err := api.stateAfter(context.Background())
	if err != nil || st != chapi.Paused {
		t.Errorf("stateAfter = %q, %v", st, err)
	}
	ping, err := api.ping(context.Background())
	if err != nil || *ping.Pid != 7 {
		t.Errorf("ping = %+v, %v", ping, err)
	}
}

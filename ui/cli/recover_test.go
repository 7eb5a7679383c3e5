package cli_test

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/api"
	"github.com/berthvm/berth/session/sessiontest"
	"github.com/berthvm/berth/ui/cli"
)

// fleetStub is a fleet's front door as far as the CLI sees one: the fake,
// with replication and recovery answered as a router would.
type fleetStub struct {
	*sessiontest.Fake
	recovered []session.RecoverOptions
}

func (f *fleetStub) ReplicateCheckpoint(ctx context.Context, name, id, to string) (session.Replica, error) {
	if to == "nowhere" {
		return session.Replica{}, &session.Error{Class: session.ErrNotFound, Msg: "no live host nowhere in the fleet"}
	}
	return session.Replica{Session: name, Checkpoint: id, Host: to, Files: 3, Bytes: 4096, Took: 1200 * time.Millisecond}, nil
}

func (f *fleetStub) Recover(ctx context.Context, name string, opts session.RecoverOptions) (session.RecoverResult, error) {
	switch {
	case opts.On == "alive":
		return session.RecoverResult{}, &session.Error{Class: session.ErrInvalidState,
			Msg: "host h1, which owns session " + name + ", still holds its etcd lease (it expires in 7s unless renewed)"}
	case !opts.Force:
		return session.RecoverResult{}, &session.Error{Class: session.ErrInvalid, Msg: "this would start session " + name + " on host " + opts.On,
			Hint: "ask again with force to do it"}
	}
	f.recovered = append(f.recovered, opts)
	return session.RecoverResult{Session: session.Session{Name: name, State: session.StateRunning}, From: "h1", Checkpoint: opts.From, Epoch: 42,
		Took: 300 * time.Millisecond}, nil
}

func (f *fleetStub) Checkpoints(ctx context.Context, name string) ([]session.Checkpoint, error) {
	cks, err := f.Fake.Checkpoints(ctx, name)
	for i := range cks {
		if cks[i].ID == "c1" {
			cks[i].Replicas = []string{"h2", "h3"}
		}
	}
	return cks, err
}

func TestRecoverCommands(t *testing.T) {
	stub := &fleetStub{Fake: sessiontest.New(sessiontest.Options{})}
	dir, err := os.MkdirTemp("", "berth-cli")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ln, err := api.Listen(filepath.Join(dir, "berth.sock"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: api.NewServer(stub, nil), BaseContext: func(net.Listener) context.Context { return context.Background() }}
	go srv.Serve(ln)
	defer srv.Close()
	w := &world{fake: stub.Fake, client: api.Dial(filepath.Join(dir, "berth.sock"))}
	defer w.client.Close()
	w.sh(t, "create", "demo")
	for _, tt := range []struct {
		args         []string
		code         int
		stdout       []string
		stderr       string
		stderrPrefix bool
	}{
		{args: []string{"checkpoint", "demo", "--replicate", "h2"}, stdout: []string{"checkpoint c1 of demo: workspace", "checkpoint c1 of demo copied to h2 in 1.2s (3 files, 4.0 KiB of data)\n"}},
		{args: []string{"checkpoint", "demo", "--replicate", "nowhere"}, code: 1,
			stderr: "berth: checkpoint c2 was taken, but its copy to nowhere failed ('berth checkpoint replicate demo c2 --to nowhere' tries again): no live host nowhere in the fleet\n"},
		{args: []string{"checkpoint", "replicate", "demo", "c1", "--to", "h3"}, stdout: []string{"checkpoint c1 of demo copied to h3 in 1.2s"}},
		{args: []string{"checkpoint", "replicate", "demo", "c1"}, code: 2, stderr: "berth: checkpoint replicate: --to HOST is needed", stderrPrefix: true},
		{args: []string{"checkpoints", "demo"}, stdout: []string{"REPLICAS", "h2,h3", "c2 "}},
		{args: []string{"recover", "demo", "--from", "c1"}, code: 2, stderr: "berth: recover: --from ID and --on HOST are needed", stderrPrefix: true},
		{args: []string{"recover", "demo", "--from", "c1", "--on", "alive", "--force"}, code: 1,
			stderr: "berth: host h1, which owns session demo, still holds its etcd lease (it expires in 7s unless renewed)\n"},
		{args: []string{"recover", "demo", "--from", "c1", "--on", "h2"}, code: 1,
			stderr: "berth: this would start session demo on host h2; add --force to do it\n"},
		{args: []string{"recover", "demo", "--from", "c1", "--on", "h2", "--force"},
			stdout: []string{"recovered demo on h2 from checkpoint c1 in 300ms, at epoch 42 (host h1 was gone); it is running\n"}},
	} {
		r := w.run(t.Context(), cli.Env{}, tt.args...)
		name := strings.Join(tt.args, " ")
		if r.code != tt.code {
			t.Errorf("%s: exit %d, want %d (stderr %q)", name, r.code, tt.code, r.stderr)
		}
		for _, s := range tt.stdout {
			if !strings.Contains(r.stdout, s) {
				t.Errorf("%s: stdout %q lacks %q", name, r.stdout, s)
			}
		}
		if tt.stderrPrefix && !strings.HasPrefix(r.stderr, tt.stderr) || !tt.stderrPrefix && r.stderr != tt.stderr {
			t.Errorf("%s: stderr %q, want %q", name, r.stderr, tt.stderr)
		}
	}
	if len(stub.recovered) != 1 || stub.recovered[0] != (session.RecoverOptions{From: "c1", On: "h2", Force: true}) {
		t.Errorf("recoveries asked: %+v", stub.recovered)
	}
}

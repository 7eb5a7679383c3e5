package sshd

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/sessiontest"
)

// TestRestrict calls every Service method through Restrict for each role
// and checks which are refused with ErrPermission.
func TestRestrict(t *testing.T) {
	type call struct {
		name string
		min  Role // least role allowed
		do   func(ctx context.Context, svc session.Service) error
	}
	calls := []call{
		{"List", Viewer, func(ctx context.Context, s session.Service) error { _, err := s.List(ctx); return err }},
		{"Get", Viewer, func(ctx context.Context, s session.Service) error { _, err := s.Get(ctx, "demo"); return err }},
		{"Timeline", Viewer, func(ctx context.Context, s session.Service) error { _, err := s.Timeline(ctx, "demo", 0); return err }},
		{"History", Viewer, func(ctx context.Context, s session.Service) error { _, err := s.History(ctx, "demo"); return err }},
		{"Watch", Viewer, func(ctx context.Context, s session.Service) error { _, err := s.Watch(ctx); return err }},
		{"Executions", Viewer, func(ctx context.Context, s session.Service) error {
			_, err := s.Executions(ctx, "demo", true)
			return err
		}},
		{"Execution", Viewer, func(ctx context.Context, s session.Service) error {
			_, err := s.Execution(ctx, "x-none")
			return ignoreNotFound(err)
		}},
		{"Output", Viewer, func(ctx context.Context, s session.Service) error {
			_, err := s.Output(ctx, "x-none", 0, 10)
			return ignoreNotFound(err)
		}},
		{"ListDir", Viewer, func(ctx context.Context, s session.Service) error { _, err := s.ListDir(ctx, "demo", "."); return err }},
		{"Stat", Viewer, func(ctx context.Context, s session.Service) error { _, err := s.Stat(ctx, "demo", "f"); return err }},
		{"ReadFile", Viewer, func(ctx context.Context, s session.Service) error {
			rc, err := s.ReadFile(ctx, "demo", "f")
			if err == nil {
				rc.Close()
			}
			return err
		}},
		{"CopyOut", Viewer, func(ctx context.Context, s session.Service) error {
			rc, err := s.CopyOut(ctx, "demo", "f")
			if err == nil {
				rc.Close()
			}
			return err
		}},
		{"ExportImage", Viewer, func(ctx context.Context, s session.Service) error {
			_, err := s.ExportImage(ctx, session.ExportRequest{Name: session.DefaultImage}, func(session.ImageExport) (io.Writer, error) { return io.Discard, nil }, nil)
			if errors.Is(err, session.ErrUnsupported) { // the fake has no image bytes
				return nil
			}
			return err
		}},
		{"Create", Operator, func(ctx context.Context, s session.Service) error {
			_, err := s.Create(ctx, session.CreateOptions{Name: "new-one"})
			return err
		}},
		{"Pause", Operator, func(ctx context.Context, s session.Service) error { _, err := s.Pause(ctx, "demo"); return err }},
		{"Resume", Operator, func(ctx context.Context, s session.Service) error { _, err := s.Resume(ctx, "demo"); return err }},
		{"Flush", Operator, func(ctx context.Context, s session.Service) error { _, err := s.Flush(ctx, "demo"); return err }},
		{"Stop", Operator, func(ctx context.Context, s session.Service) error { _, err := s.Stop(ctx, "demo"); return err }},
		{"Start", Operator, func(ctx context.Context, s session.Service) error { _, err := s.Start(ctx, "demo"); return err }},
		{"Sleep", Operator, func(ctx context.Context, s session.Service) error { _, err := s.Sleep(ctx, "demo"); return err }},
		{"Exec", Operator, func(ctx context.Context, s session.Service) error {
			p, err := s.Exec(ctx, "demo", session.ExecRequest{Argv: []string{"true"}})
			if err == nil {
				_, err = p.Wait(ctx)
			}
			return err
		}},
		{"Cancel", Operator, func(ctx context.Context, s session.Service) error { return ignoreNotFound(s.Cancel(ctx, "x-none")) }},
		{"WriteFile", Operator, func(ctx context.Context, s session.Service) error {
			_, err := s.WriteFile(ctx, "demo", "g", strings.NewReader("x"))
			return err
		}},
		{"CopyIn", Operator, func(ctx context.Context, s session.Service) error {
			_, err := s.CopyIn(ctx, "demo", "t", bytes.NewReader(sessiontest.Tar(t, sessiontest.TarEntry{Name: "x", Data: "x"})))
			return err
		}},
		{"Mkdir", Operator, func(ctx context.Context, s session.Service) error { return s.Mkdir(ctx, "demo", "d") }},
		{"Rename", Operator, func(ctx context.Context, s session.Service) error { return s.Rename(ctx, "demo", "g", "h") }},
		{"Remove", Operator, func(ctx context.Context, s session.Service) error { return s.Remove(ctx, "demo", "h") }},
		{"Checkpoints", Viewer, func(ctx context.Context, s session.Service) error { _, err := s.Checkpoints(ctx, "demo"); return err }},
		{"Checkpoint", Operator, func(ctx context.Context, s session.Service) error {
			_, err := s.Checkpoint(ctx, "demo", session.CheckpointOptions{})
			return err
		}},
		{"Fork", Operator, func(ctx context.Context, s session.Service) error {
			_, err := s.Fork(ctx, "demo", "demo-fork")
			return err
		}},
		{"Restore", Admin, func(ctx context.Context, s session.Service) error { _, err := s.Restore(ctx, "demo", "c1"); return err }},
		{"DeleteCheckpoint", Admin, func(ctx context.Context, s session.Service) error { return s.DeleteCheckpoint(ctx, "demo", "c1") }},
		{"Replace", Admin, func(ctx context.Context, s session.Service) error {
			_, err := s.Replace(ctx, "demo", session.ReplaceOptions{})
			return err
		}},
		{"CommitImage", Admin, func(ctx context.Context, s session.Service) error {
			_, err := s.CommitImage(ctx, session.CommitRequest{Session: "demo", Image: "demo-image"})
			return err
		}},
		{"RemoveImage", Admin, func(ctx context.Context, s session.Service) error { return s.RemoveImage(ctx, "demo-image") }},
		{"Delete", Admin, func(ctx context.Context, s session.Service) error { return s.Delete(ctx, "new-one") }},
	}
	for _, role := range []Role{Viewer, Operator, Admin} {
		t.Run(role.String(), func(t *testing.T) {
			fake := sessiontest.New(sessiontest.Options{})
			defer fake.Close()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			fake.Create(ctx, session.CreateOptions{Name: "demo"})
			fake.WriteFile(ctx, "demo", "f", strings.NewReader("content"))
			svc := Restrict(fake, role)
			for _, c := range calls {
				err := c.do(ctx, svc)
				if role >= c.min {
					if errors.Is(err, session.ErrPermission) {
						t.Errorf("%s as %s: %v", c.name, role, err)
					}
					continue
				}
				if !errors.Is(err, session.ErrPermission) {
					t.Errorf("%s as %s: %v, want ErrPermission", c.name, role, err)
					continue
				}
				if want := "role " + role.String() + " may not "; !strings.HasPrefix(err.Error(), want) {
					t.Errorf("%s as %s: %q, want it to start %q", c.name, role, err, want)
				}
			}
		})
	}
}

func ignoreNotFound(err error) error {
	if errors.Is(err, session.ErrNotFound) {
		return nil
	}
	return err
}

// TestRestrictAttachedProcess: a viewer may follow a running command's
// output but not type into it, resize it or cancel it.
func TestRestrictAttachedProcess(t *testing.T) {
	fake := sessiontest.New(sessiontest.Options{})
	defer fake.Close()
	ctx := context.Background()
	fake.Create(ctx, session.CreateOptions{Name: "demo"})
	p, err := fake.Exec(ctx, "demo", session.ExecRequest{Argv: []string{"cat"}, Stdin: true, TTY: true, Rows: 24, Cols: 80})
	if err != nil {
		t.Fatal(err)
	}
	viewer := Restrict(fake, Viewer)
	vp, err := viewer.Attach(ctx, p.ID(), 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(vp.Stdin(), "typed\n"); !errors.Is(err, session.ErrPermission) {
		t.Errorf("viewer stdin: %v", err)
	}
	if err := vp.Resize(ctx, 30, 100); !errors.Is(err, session.ErrPermission) {
		t.Errorf("viewer resize: %v", err)
	}
	if err := vp.Cancel(ctx); !errors.Is(err, session.ErrPermission) {
		t.Errorf("viewer cancel: %v", err)
	}
	op := Restrict(fake, Operator)
	opp, err := op.Attach(ctx, p.ID(), 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(opp.Stdin(), "typed\n"); err != nil {
		t.Errorf("operator stdin: %v", err)
	}
	if err := opp.Cancel(ctx); err != nil {
		t.Errorf("operator cancel: %v", err)
	}
}

// TestRolesOverSSH: each role, over SSH commands.
func TestRolesOverSSH(t *testing.T) {
	viewer := newKey(t, "vera", Viewer)
	operator := newKey(t, "otto", Operator)
	admin := newKey(t, "ada", Admin)
	w := newWorld(t, worldOpts{}, viewer, operator, admin)
	w.create("demo", "gone1", "gone2")
	steps := []struct {
		k      testKey
		cmd    string
		code   int
		stderr string
	}{
		{viewer, "ls", 0, ""},
		{viewer, "cat demo nothing", 1, "not found"},
		{viewer, "pause demo", 1, "berth: role viewer may not pause sessions (needs operator)\n"},
		{viewer, "exec demo -- true", 1, "berth: role viewer may not run commands (needs operator)\n"},
		{viewer, "put demo - f", 1, "berth: role viewer may not write files (needs operator)\n"},
		{viewer, "create v1", 1, "berth: role viewer may not create sessions (needs operator)\n"},
		{viewer, "delete gone1 --yes", 1, "berth: role viewer may not delete sessions (needs admin)\n"},
		{operator, "pause demo", 0, ""},
		{operator, "resume demo", 0, ""},
		{operator, "exec demo -- true", 0, ""},
		{operator, "put demo - f", 0, ""},
		{operator, "rm demo f", 0, ""},
		{operator, "delete gone1 --yes", 1, "berth: role operator may not delete sessions (needs admin)\n"},
		{admin, "delete gone1 --yes", 0, ""},
		{admin, "pause demo", 0, ""},
	}
	for _, st := range steps {
		c := w.dial(st.k)
		stdin := ""
		if strings.HasPrefix(st.cmd, "put") {
			stdin = "data"
		}
		r := run(t, c, st.cmd, stdin)
		c.Close()
		if r.code != st.code || (st.stderr != "" && !strings.Contains(r.stderr, st.stderr)) || (st.stderr == "" && r.code == 0 && r.stderr != "") {
			t.Errorf("%s: %q: exit %d stderr %q; want exit %d stderr %q", st.k.role, st.cmd, r.code, r.stderr, st.code, st.stderr)
		}
	}
	if s, _ := w.fake.Get(context.Background(), "demo"); s.State != session.StatePaused {
		t.Errorf("demo is %s, want paused by the admin", s.State)
	}
}

// TestGuardActsAsTheKey: every call through the guard is made as the key
// whatever the caller's context says, checked against the key's role at
// that moment, and an interactive command is recorded as outside berth's
// coordination.
func TestGuardActsAsTheKey(t *testing.T) {
	fake := sessiontest.New(sessiontest.Options{})
	defer fake.Close()
	ctx := session.WithActor(context.Background(), "spoofed")
	fake.Create(ctx, session.CreateOptions{Name: "demo"})
	role, gone := Operator, error(nil)
	g := &guard{svc: fake, who: "ssh:otto", role: func(context.Context) (Role, error) { return role, gone }}

	for _, c := range []struct {
		req     session.ExecRequest
		outside bool
	}{
		{session.ExecRequest{Argv: []string{"true"}}, false},
		{session.ExecRequest{Argv: []string{"true"}, TTY: true}, true},
	} {
		r := sessiontest.Run(t, ctx, g, "demo", c.req, "")
		if r.Exec.By != "ssh:otto" || r.Exec.Outside != c.outside {
			t.Errorf("exec TTY %v: by %q outside %v, want ssh:otto, %v", c.req.TTY, r.Exec.By, r.Exec.Outside, c.outside)
		}
	}
	if s, err := g.Pause(ctx, "demo"); err != nil || s.Cause != "paused by ssh:otto" {
		t.Errorf("Pause = %q, %v; want it made as ssh:otto", s.Cause, err)
	}
	if _, err := g.Resume(ctx, "demo"); err != nil {
		t.Fatal(err)
	}

	// The role is looked up on every call.
	own, err := g.Exec(ctx, "demo", session.ExecRequest{Argv: []string{"sleep", "30"}})
	if err != nil {
		t.Fatal(err)
	}
	attached, err := g.Attach(ctx, own.ID(), 0)
	if err != nil {
		t.Fatal(err)
	}
	role = Viewer
	if _, err := g.Pause(ctx, "demo"); !errors.Is(err, session.ErrPermission) {
		t.Errorf("Pause after the role dropped to viewer: %v", err)
	}
	if err := attached.Cancel(ctx); !errors.Is(err, session.ErrPermission) {
		t.Errorf("viewer cancelling an attached command: %v", err)
	}
	if err := own.Cancel(ctx); err != nil {
		t.Errorf("cancelling its own command after the role dropped: %v", err)
	}
	gone = errors.New("key removed")
	if _, err := g.List(ctx); !errors.Is(err, gone) {
		t.Errorf("List after the key was removed: %v, want its error", err)
	}
}

// TestPermit: what the TUI asks before a confirmation matches what the
// guard then enforces, for every transition-table action and role.
func TestPermit(t *testing.T) {
	fake := sessiontest.New(sessiontest.Options{})
	defer fake.Close()
	ctx := context.Background()
	acts := []session.Action{session.ActionPause, session.ActionResume, session.ActionStop, session.ActionStart,
		session.ActionDelete, session.ActionFlush, session.ActionExec, session.ActionFiles, session.ActionSleep,
		session.ActionReplace, session.ActionCheckpoint, session.ActionRestore, session.ActionFork}
	least := map[session.Action]Role{session.ActionDelete: Admin, session.ActionReplace: Admin, session.ActionRestore: Admin, session.ActionFiles: Viewer}
	for role := Viewer; role <= Admin; role++ {
		g := Restrict(fake, role).(*guard)
		for _, a := range acts {
			want, ok := least[a]
			if !ok {
				want = Operator
			}
			err := g.permit(ctx, a)
			if (err == nil) != (role >= want) || (err != nil && !errors.Is(err, session.ErrPermission)) {
				t.Errorf("%s %s: %v; want allowed %v", role, a, err, role >= want)
			}
		}
	}
	g := Restrict(fake, Operator).(*guard)
	if err := g.permit(ctx, session.ActionDelete); err == nil || err.Error() != "role operator may not delete sessions (needs admin)" {
		t.Errorf("operator delete: %v", err)
	}
}

// fleetService is a service that lists a fleet's hosts, as the fleet's
// router does.
type fleetService struct {
	*sessiontest.Fake
	list session.HostList
}

func (f fleetService) Hosts(context.Context) (session.HostList, error) { return f.list, nil }

// TestGuardHosts: a viewer may list the hosts (the TUI's hosts page over
// SSH); a berth on its own answers not in a fleet, as its API does; a key
// whose role cannot be looked up is refused.
func TestGuardHosts(t *testing.T) {
	fake := sessiontest.New(sessiontest.Options{})
	defer fake.Close()
	ctx := context.Background()
	want := session.HostList{Fleet: true, Self: "h1", Hosts: []session.HostInfo{{ID: "h1", State: session.HostReady}}}
	g := &guard{svc: fleetService{fake, want}, role: func(context.Context) (Role, error) { return Viewer, nil }}
	if got, err := g.Hosts(ctx); err != nil || !got.Fleet || len(got.Hosts) != 1 || got.Hosts[0].ID != "h1" {
		t.Errorf("a viewer's Hosts = %+v, %v; want the fleet's", got, err)
	}
	g.svc = fake
	if got, err := g.Hosts(ctx); err != nil || got.Fleet || len(got.Hosts) != 0 {
		t.Errorf("Hosts of a berth on its own = %+v, %v; want not in a fleet", got, err)
	}
	removed := errors.New("key removed")
	g.role = func(context.Context) (Role, error) { return Viewer, removed }
	if _, err := g.Hosts(ctx); !errors.Is(err, removed) {
		t.Errorf("Hosts of a removed key = %v, want refused", err)
	}
}

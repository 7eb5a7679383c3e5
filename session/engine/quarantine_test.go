package engine

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/store"
)

// Quarantine moves a session's directory aside with its records (the
// session at its epoch, its executions and their output) and why, and
// forgets the session here; nothing of it is deleted.
func TestQuarantineSetsCopyAside(t *testing.T) {
	m := newSpaceManager(t, 0)
	ctx := context.Background()
	s := m.newSess(store.Session{Name: "a", State: string(session.StateStopped), VMM: "qemu", Image: "mini"})
	if err := m.st.PutSession(s.rec); err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	m.sessions["a"] = s
	m.mu.Unlock()
	if err := os.MkdirAll(s.dir(), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.wsPath(), []byte("the workspace"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := m.SetEpoch(ctx, "a", 41); err != nil {
		t.Fatal(err)
	}
	if got, _ := m.Get(ctx, "a"); got.Epoch != 41 {
		t.Errorf("epoch %d after SetEpoch(41)", got.Epoch)
	}
	if err := m.st.PutExec(store.Exec{ID: "e1", Session: "a", Argv: []string{"echo", "hi"}, State: string(session.ExecExited), StartedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.st.AppendOutput("e1", []store.Chunk{{Exec: "e1", Seq: 1, Stream: 1, Time: time.Now(), Data: []byte("hi\n")}}, 3, 0); err != nil {
		t.Fatal(err)
	}

	dir, err := m.Quarantine(ctx, "a", "host h2 owns session a at epoch 50 (this copy is at epoch 41)")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(dir, QuarantineDir(m.cfg.DataDir)+string(filepath.Separator)+"a-") {
		t.Errorf("quarantined in %s", dir)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "session", "workspace.img")); err != nil || string(b) != "the workspace" {
		t.Errorf("the quarantined workspace: %q %v", b, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "why.txt")); !strings.Contains(string(b), "host h2 owns session a") {
		t.Errorf("why.txt: %q", b)
	}
	recs, _ := os.ReadFile(filepath.Join(dir, "records.jsonl"))
	for _, want := range []string{`"kind":"session"`, `"epoch":41`, `"kind":"exec"`, `"kind":"output"`, `"Data":"aGkK"`} {
		if !strings.Contains(string(recs), want) {
			t.Errorf("records.jsonl lacks %s:\n%s", want, recs)
		}
	}
	if _, err := m.Get(ctx, "a"); !errors.Is(err, session.ErrNotFound) {
		t.Errorf("the session after quarantine: %v", err)
	}
	if _, err := m.st.GetSession("a"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("its record after quarantine: %v", err)
	}
	if _, err := os.Stat(m.sessionDir("a")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("sessions/a after quarantine: %v", err)
	}
}

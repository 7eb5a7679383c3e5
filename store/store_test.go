package store

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
)

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func openTest(t testing.TB, dir string) *Store {
	t.Helper()
	s, err := Open(dir, testLogger(t))
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func intp(i int) *int { return &i }

func durationp(d time.Duration) *time.Duration { return &d }

// allKeys lists every key in the store, to prove deletions leave nothing.
func allKeys(t testing.TB, s *Store) []string {
	t.Helper()
	var keys []string
	err := s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			keys = append(keys, string(it.Item().Key()))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

func TestSessions(t *testing.T) {
	s := openTest(t, t.TempDir())
	sessions := []Session{
		{Name: "alpha", State: "running", Image: "debian", VMM: "qemu", Accel: "kvm", CPUs: 2, MemoryMiB: 2048,
			DiskBytes: 10 << 30, Pid: 4242, CreatedAt: t0, StartedAt: t0.Add(time.Second),
			LastActivity: t0.Add(time.Minute), Retention: 1 << 20, WorkspaceUUID: "0b8e3a52-6f7c-4c1e-9a43-2d1f0e5b7c99",
			IdleTimeout: durationp(0), LastWake: 412 * time.Millisecond,
			WorkspaceUsed: 12 << 20, WorkspaceMeasuredAt: t0.Add(2 * time.Minute)},
		{Name: "beta", State: "stopped", Cause: "crashed", CreatedAt: t0},
		{Name: "gamma-1.x", State: "sleeping", IdleTimeout: durationp(time.Hour),
			SnapshotPath: "/data/gamma-1.x/snapshot/memory.snap", SnapshotBytes: 512 << 20},
	}
	for _, sess := range sessions {
		if err := s.PutSession(sess); err != nil {
			t.Fatalf("PutSession(%q): %v", sess.Name, err)
		}
	}
	for _, want := range sessions {
		got, err := s.GetSession(want.Name)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("GetSession(%q) = %+v, %v; want %+v", want.Name, got, err, want)
		}
	}
	list, err := s.ListSessions()
	if err != nil || !reflect.DeepEqual(list, sessions) {
		t.Errorf("ListSessions() = %+v, %v; want %+v", list, err, sessions)
	}

	// A record handed out shares nothing with the stored one.
	got, _ := s.GetSession("alpha")
	*got.IdleTimeout = time.Hour
	*list[0].IdleTimeout = time.Minute
	if again, _ := s.GetSession("alpha"); again.IdleTimeout == nil || *again.IdleTimeout != 0 {
		t.Errorf("changing a returned record changed the stored one: IdleTimeout = %v", again.IdleTimeout)
	}

	// Replace, then delete.
	sessions[1].State = "running"
	if err := s.PutSession(sessions[1]); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.GetSession("beta"); got.State != "running" {
		t.Errorf("after replace, State = %q, want running", got.State)
	}
	if err := s.DeleteSession("beta"); err != nil {
		t.Fatalf("DeleteSession: %v", err)
	}
	if list, _ := s.ListSessions(); len(list) != 2 || list[0].Name != "alpha" || list[1].Name != "gamma-1.x" {
		t.Errorf("after delete, ListSessions() = %+v", list)
	}

	errCases := []struct {
		name string
		op   func() error
		want error
	}{
		{"get missing", func() error { _, err := s.GetSession("beta"); return err }, ErrNotFound},
		{"delete missing", func() error { return s.DeleteSession("nope") }, ErrNotFound},
		{"empty name", func() error { return s.PutSession(Session{}) }, ErrInvalid},
		{"slash in name", func() error { return s.PutSession(Session{Name: "a/b"}) }, ErrInvalid},
		{"get slash", func() error { _, err := s.GetSession("a/b"); return err }, ErrInvalid},
		{"exec without session", func() error { return s.PutExec(Exec{ID: "x"}) }, ErrInvalid},
		{"exec slash", func() error { return s.PutExec(Exec{ID: "x/y", Session: "alpha"}) }, ErrInvalid},
		{"get exec missing", func() error { _, err := s.GetExec("nope"); return err }, ErrNotFound},
		{"read output missing", func() error { _, _, _, err := s.ReadOutput("nope", 0, 0); return err }, ErrNotFound},
		{"append missing", func() error { _, err := s.AppendOutput("nope", nil, 0, 0); return err }, ErrNotFound},
	}
	for _, c := range errCases {
		t.Run(c.name, func(t *testing.T) {
			if err := c.op(); !errors.Is(err, c.want) {
				t.Errorf("err = %v, want %v", err, c.want)
			}
		})
	}
	// Operators read these errors: they must name their subject.
	if _, err := s.GetSession("ghost"); err == nil || !strings.Contains(err.Error(), `session "ghost"`) {
		t.Errorf("GetSession(ghost) error %v does not name the session", err)
	}
}

func TestExecs(t *testing.T) {
	s := openTest(t, t.TempDir())
	for _, name := range []string{"a", "b"} {
		if err := s.PutSession(Session{Name: name, State: "running"}); err != nil {
			t.Fatal(err)
		}
	}
	execs := []Exec{
		{ID: "e1", Session: "a", Argv: []string{"make", "test"}, EnvNames: []string{"PATH"}, Cwd: "/workspace",
			By: "cli", State: "exited", ExitCode: intp(0), StartedAt: t0, EndedAt: t0.Add(time.Second), AgentID: "7"},
		{ID: "e2", Session: "a", Argv: []string{"sleep", "9"}, TTY: true, By: "tui", State: "running", StartedAt: t0.Add(time.Hour)},
		{ID: "e3", Session: "a", Argv: []string{"bash"}, Outside: true, State: "killed", Signal: "KILL", Error: "boom", StartedAt: t0.Add(time.Hour)},
		{ID: "e4", Session: "b", Argv: []string{"true"}, State: "lost", StartedAt: t0.Add(2 * time.Hour)},
	}
	for _, e := range execs {
		if err := s.PutExec(e); err != nil {
			t.Fatalf("PutExec(%q): %v", e.ID, err)
		}
	}
	for _, want := range execs {
		got, err := s.GetExec(want.ID)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("GetExec(%q) = %+v, %v; want %+v", want.ID, got, err, want)
		}
	}

	cases := []struct {
		session string
		want    []string
	}{
		{"a", []string{"e3", "e2", "e1"}}, // newest first; equal start times by id, descending
		{"b", []string{"e4"}},
		{"c", nil},
	}
	for _, c := range cases {
		list, err := s.ListExecs(c.session)
		if err != nil {
			t.Fatalf("ListExecs(%q): %v", c.session, err)
		}
		var ids []string
		for _, e := range list {
			ids = append(ids, e.ID)
		}
		if !reflect.DeepEqual(ids, c.want) {
			t.Errorf("ListExecs(%q) = %v, want %v", c.session, ids, c.want)
		}
	}

	// A PutExec from a copy taken before output arrived must not roll the
	// output progress back, or the next append would overwrite chunks.
	stale := execs[1]
	got, err := s.AppendOutput("e2", []Chunk{{Stream: Stdout, Data: []byte("hi")}}, 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	stale.State = "exited"
	if err := s.PutExec(stale); err != nil {
		t.Fatal(err)
	}
	after, _ := s.GetExec("e2")
	if after.NextSeq != got.NextSeq || after.StdoutOffset != 2 || after.StdoutBytes != 2 || after.State != "exited" {
		t.Errorf("after stale PutExec: %+v; want NextSeq %d, offset 2, State exited", after, got.NextSeq)
	}

	moved := execs[3]
	moved.Session = "a"
	if err := s.PutExec(moved); !errors.Is(err, ErrInvalid) {
		t.Errorf("PutExec moving exec to another session: err = %v, want ErrInvalid", err)
	}
}

func TestDeleteSessionRemovesEverything(t *testing.T) {
	s := openTest(t, t.TempDir())
	// The doomed session holds more keys than one badger transaction can
	// delete (~50k entries), so DeleteSession must batch.
	for _, c := range []struct {
		name         string
		execs, calls int
	}{{"doomed", 4, 4}, {"kept", 2, 1}} {
		if err := s.PutSession(Session{Name: c.name, State: "running"}); err != nil {
			t.Fatal(err)
		}
		for i := range c.execs {
			id := fmt.Sprintf("%s-e%d", c.name, i)
			if err := s.PutExec(Exec{ID: id, Session: c.name, State: "running", StartedAt: t0.Add(time.Duration(i))}); err != nil {
				t.Fatal(err)
			}
			var off int64
			for range c.calls {
				chunks := make([]Chunk, maxAppendChunks)
				for j := range chunks {
					chunks[j] = Chunk{Stream: Stdout, Data: []byte{byte(j)}}
				}
				off += int64(len(chunks))
				if _, err := s.AppendOutput(id, chunks, off, 0); err != nil {
					t.Fatal(err)
				}
			}
		}
		for range 3 {
			if _, err := s.AppendEvent(Event{Session: c.name, Kind: "started"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Trim part of the output too, so the trim log and order index exist.
	if err := s.PutSession(Session{Name: "doomed", State: "running", Retention: 60000}); err != nil {
		t.Fatal(err)
	}
	if e, _ := s.GetExec("doomed-e0"); e.TrimmedSeq == 0 {
		t.Fatal("nothing trimmed; the test needs a trim log")
	}
	var others []string
	doomed := 0
	for _, k := range allKeys(t, s) {
		if strings.Contains(k, "doomed") {
			doomed++
		} else {
			others = append(others, k)
		}
	}
	if doomed <= int(s.db.MaxBatchCount()) {
		t.Fatalf("doomed session has %d keys, fewer than one transaction holds (%d)", doomed, s.db.MaxBatchCount())
	}

	if err := s.DeleteSession("doomed"); err != nil {
		t.Fatalf("DeleteSession: %v", err)
	}
	if left := allKeys(t, s); !reflect.DeepEqual(left, others) {
		t.Errorf("after DeleteSession %d keys are left, want the %d of the other session", len(left), len(others))
		for _, k := range left {
			if strings.Contains(k, "doomed") {
				t.Errorf("key %q survived DeleteSession", k)
			}
		}
	}
	if _, err := s.GetSession("doomed"); !errors.Is(err, ErrNotFound) {
		t.Errorf("GetSession after delete: %v", err)
	}
	for _, id := range []string{"doomed-e0", "doomed-e1"} {
		if _, err := s.GetExec(id); !errors.Is(err, ErrNotFound) {
			t.Errorf("GetExec(%q) after delete: %v", id, err)
		}
		if _, _, _, err := s.ReadOutput(id, 0, 1); !errors.Is(err, ErrNotFound) {
			t.Errorf("ReadOutput(%q) after delete: %v", id, err)
		}
		if _, err := s.AppendOutput(id, nil, 0, 0); !errors.Is(err, ErrNotFound) {
			t.Errorf("AppendOutput(%q) after delete: %v", id, err)
		}
	}
	if evs, err := s.Events("doomed", 0); err != nil || len(evs) != 0 {
		t.Errorf("Events after delete = %v, %v", evs, err)
	}
	if execs, err := s.ListExecs("doomed"); err != nil || len(execs) != 0 {
		t.Errorf("ListExecs after delete = %v, %v", execs, err)
	}

	// The other session is untouched.
	chunks, gap, next, err := s.ReadOutput("kept-e1", 0, 0)
	if err != nil || len(chunks) != maxAppendChunks || gap != 0 || next != uint64(len(chunks)) {
		t.Errorf("ReadOutput(kept-e1) = %d chunks, gap %d, next %d, %v", len(chunks), gap, next, err)
	}
	if evs, _ := s.Events("kept", 0); len(evs) != 3 {
		t.Errorf("Events(kept) = %d events, want 3", len(evs))
	}

	// Reusing the name starts afresh.
	if err := s.PutSession(Session{Name: "doomed"}); err != nil {
		t.Fatal(err)
	}
	if ev, err := s.AppendEvent(Event{Session: "doomed", Kind: "created"}); err != nil || ev.Seq != 1 {
		t.Errorf("AppendEvent on recreated session = %+v, %v; want Seq 1", ev, err)
	}
}

func TestEvents(t *testing.T) {
	s := openTest(t, t.TempDir())
	for i := range 10 {
		for _, sess := range []string{"a", "b", ""} {
			ev, err := s.AppendEvent(Event{Session: sess, Kind: "tick", Message: fmt.Sprint(i), By: "test"})
			if err != nil {
				t.Fatal(err)
			}
			if ev.Seq != uint64(i+1) || ev.Time.IsZero() {
				t.Fatalf("AppendEvent(%q) #%d = %+v", sess, i, ev)
			}
		}
	}
	cases := []struct {
		session string
		limit   int
		first   uint64
		n       int
	}{
		{"a", 0, 1, 10},
		{"a", 3, 8, 3},
		{"b", 1, 10, 1},
		{"", 20, 1, 10},
		{"none", 5, 0, 0},
	}
	for _, c := range cases {
		evs, err := s.Events(c.session, c.limit)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) != c.n {
			t.Errorf("Events(%q, %d): %d events, want %d", c.session, c.limit, len(evs), c.n)
			continue
		}
		for i, ev := range evs {
			if ev.Seq != c.first+uint64(i) || ev.Session != c.session || ev.Message != fmt.Sprint(ev.Seq-1) {
				t.Errorf("Events(%q, %d)[%d] = %+v", c.session, c.limit, i, ev)
			}
		}
	}
}

func TestConcurrentAppendEvent(t *testing.T) {
	s := openTest(t, t.TempDir())
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 50 {
				if _, err := s.AppendEvent(Event{Session: "a", Kind: "k"}); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	evs, err := s.Events("a", 0)
	if err != nil || len(evs) != 200 {
		t.Fatalf("Events = %d, %v; want 200", len(evs), err)
	}
	for i, ev := range evs {
		if ev.Seq != uint64(i+1) {
			t.Fatalf("event %d has Seq %d", i, ev.Seq)
		}
	}
}

func TestReopenKeepsEverything(t *testing.T) {
	dir := t.TempDir()
	goroutines := runtime.NumGoroutine()
	s, err := Open(dir, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	sess := Session{Name: "s", State: "running", CreatedAt: t0, Retention: 1 << 20}
	ex := Exec{ID: "e", Session: "s", Argv: []string{"echo"}, State: "running", StartedAt: t0, AgentID: "9"}
	if err := s.PutSession(sess); err != nil {
		t.Fatal(err)
	}
	if err := s.PutExec(ex); err != nil {
		t.Fatal(err)
	}
	var want []Chunk
	for i := range 5 {
		c := Chunk{Exec: "e", Seq: uint64(i), Stream: uint8(1 + i%2), Time: t0.Add(time.Duration(i)), Data: bytes.Repeat([]byte{byte(i)}, 100*i)}
		want = append(want, c)
		if _, err := s.AppendOutput("e", []Chunk{c}, int64(100*i), 0); err != nil {
			t.Fatal(err)
		}
	}
	ev, err := s.AppendEvent(Event{Session: "s", Kind: "started", Time: t0})
	if err != nil {
		t.Fatal(err)
	}
	before, _ := s.GetExec("e")
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := s.GetSession("s"); !errors.Is(err, ErrClosed) {
		t.Errorf("GetSession after Close: %v, want ErrClosed", err)
	}
	// Close stops everything Open started (badger's goroutines included).
	for deadline := time.Now().Add(time.Second); runtime.NumGoroutine() > goroutines; {
		if time.Now().After(deadline) {
			t.Errorf("%d goroutines after Close, %d before Open", runtime.NumGoroutine(), goroutines)
			break
		}
		time.Sleep(10 * time.Millisecond)
	}

	s = openTest(t, dir)
	if got, err := s.GetSession("s"); err != nil || !reflect.DeepEqual(got, sess) {
		t.Errorf("GetSession after reopen = %+v, %v", got, err)
	}
	if got, err := s.GetExec("e"); err != nil || !reflect.DeepEqual(got, before) {
		t.Errorf("GetExec after reopen = %+v, %v; want %+v", got, err, before)
	}
	chunks, _, _, err := s.ReadOutput("e", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := sameChunks(chunks, want); err != nil {
		t.Errorf("ReadOutput after reopen: %v", err)
	}
	if evs, err := s.Events("s", 0); err != nil || len(evs) != 1 || !reflect.DeepEqual(evs[0], ev) {
		t.Errorf("Events after reopen = %+v, %v; want [%+v]", evs, err, ev)
	}
	// Sequences continue where they were.
	got, err := s.AppendOutput("e", []Chunk{{Stream: Stdout, Data: []byte("x")}}, 1001, 0)
	if err != nil || got.NextSeq != 6 {
		t.Errorf("AppendOutput after reopen: NextSeq %d, %v; want 6", got.NextSeq, err)
	}
	if ev, err := s.AppendEvent(Event{Session: "s", Kind: "k"}); err != nil || ev.Seq != 2 {
		t.Errorf("AppendEvent after reopen: Seq %d, %v; want 2", ev.Seq, err)
	}
	if err := s.Sync(); err != nil {
		t.Errorf("Sync: %v", err)
	}
	if err := s.GC(); err != nil {
		t.Errorf("GC: %v", err)
	}
}

func TestSecondOpenIsRefused(t *testing.T) {
	dir := t.TempDir()
	openTest(t, dir)
	if s, err := Open(dir, nil); !errors.Is(err, ErrLocked) {
		if err == nil {
			s.Close()
		}
		t.Fatalf("second Open: %v, want ErrLocked", err)
	}
}

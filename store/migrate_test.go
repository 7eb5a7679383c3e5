package store

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// writeRaw writes keys straight into a badger store at dir, the way an
// older berth left them.
func writeRaw(t *testing.T, dir string, kv map[string]string) {
	t.Helper()
	db, err := badger.Open(badgerOptions(dir, testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.Update(func(txn *badger.Txn) error {
		for k, v := range kv {
			if err := txn.Set([]byte(k), []byte(v)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func readRaw(t *testing.T, s *Store, k string) string {
	t.Helper()
	var v []byte
	err := s.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get([]byte(k))
		if err != nil {
			return err
		}
		v, err = item.ValueCopy(nil)
		return err
	})
	if err != nil {
		t.Fatalf("read %s: %v", k, err)
	}
	return string(v)
}

func TestMigrateFromV1(t *testing.T) {
	dir := t.TempDir()
	writeRaw(t, dir, map[string]string{
		"meta/session/schema": "1",
		"meta/exec/schema":    "1",
		"meta/out/schema":     "1",
		"meta/event/schema":   "1",
		"session/s":           `{"name":"s","state":"running"}`,
		"exec/e1": `{"id":"e1","session":"s","argv":["make"],"env":["TOKEN=hunter2","PATH=/bin","EMPTY="],` +
			`"state":"exited","exit_code":2,"started_at":"2025-03-01T12:00:00Z"}`,
		"exec/e2":    `{"id":"e2","session":"s","argv":["ls"],"state":"running","by":"tui"}`,
		"sexec/s/e1": "",
		"sexec/s/e2": "",
		// Output is unchanged by the migration and must stay readable.
		"out/e1/\x00\x00\x00\x00\x00\x00\x00\x00": "\x01\x00\x00\x00\x00\x00\x00\x00\x01hello",
		"outstate/e1": `{"stdout_bytes":5,"stdout_offset":5,"next_seq":1,"order":1,"indexed":true}`,
		"outuse/s":    "\x00\x00\x00\x00\x00\x00\x00\x05",
		"outorder/s/\x00\x00\x00\x00\x00\x00\x00\x01/e1": "",
	})

	s := openTest(t, dir)
	cases := []struct {
		id   string
		want Exec
	}{
		{"e1", Exec{ID: "e1", Session: "s", Argv: []string{"make"}, EnvNames: []string{"TOKEN", "PATH", "EMPTY"},
			By: "unknown", State: "exited", ExitCode: intp(2), StartedAt: t0,
			StdoutBytes: 5, StdoutOffset: 5, NextSeq: 1}},
		{"e2", Exec{ID: "e2", Session: "s", Argv: []string{"ls"}, By: "tui", State: "running"}},
	}
	for _, c := range cases {
		got, err := s.GetExec(c.id)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("GetExec(%q) = %+v, %v\nwant %+v", c.id, got, err, c.want)
		}
	}
	if raw := readRaw(t, s, "exec/e1"); strings.Contains(raw, "hunter2") || strings.Contains(raw, `"env"`) {
		t.Errorf("migrated record still holds environment values: %s", raw)
	}
	for owner, want := range map[string]string{"session": "2", "exec": "2", "out": "2", "event": "1"} {
		if got := readRaw(t, s, "meta/"+owner+"/schema"); got != want {
			t.Errorf("schema of %s = %q, want %q", owner, got, want)
		}
	}
	chunks, _, _, err := s.ReadOutput("e1", 0, 0)
	if err != nil || len(chunks) != 1 || string(chunks[0].Data) != "hello" {
		t.Errorf("ReadOutput after migration = %+v, %v", chunks, err)
	}
	if execs, err := s.ListExecs("s"); err != nil || len(execs) != 2 {
		t.Errorf("ListExecs after migration = %+v, %v", execs, err)
	}

	// Reopening a current store migrates nothing and changes nothing.
	before := readRaw(t, s, "exec/e1")
	s.Close()
	s = openTest(t, dir)
	if after := readRaw(t, s, "exec/e1"); after != before {
		t.Errorf("reopen rewrote exec/e1:\n%s\n%s", before, after)
	}
}

// TestMigrateSessionsFromV1 opens session records as v1 berth wrote them,
// with the typed fields' values as strings in "extra".
func TestMigrateSessionsFromV1(t *testing.T) {
	dir := t.TempDir()
	writeRaw(t, dir, map[string]string{
		"meta/session/schema": "1",
		"meta/exec/schema":    "2",
		"meta/out/schema":     "1",
		"meta/event/schema":   "1",
		// Every key, as a sleeping session recorded them.
		"session/sleepy": `{"name":"sleepy","state":"sleeping","cause":"asleep: 512.0 MiB snapshot written in 1.2s",` +
			`"image":"debian-13","vmm":"qemu","accel":"kvm","cpus":2,"memory_mib":2048,"disk_bytes":10737418240,` +
			`"created_at":"2025-03-01T12:00:00Z","started_at":"2025-03-01T12:00:00Z","last_activity":"2025-03-01T12:00:00Z",` +
			`"extra":{"idle_timeout":"30m0s","snapshot":"/var/lib/berth/sessions/sleepy/snapshot/memory.snap",` +
			`"snapshot_bytes":"536870912","uuid":"0b8e3a52-6f7c-4c1e-9a43-2d1f0e5b7c99","wake_ms":"412"}}`,
		// Some keys missing; an explicit 0 idle timeout (never) stays set.
		"session/never": `{"name":"never","state":"running","extra":{"idle_timeout":"0s","uuid":"8d1c"}}`,
		// Values v1 could not parse either: dropped, as v1 ignored them.
		"session/odd": `{"name":"odd","state":"stopped","extra":{"idle_timeout":"forever","snapshot_bytes":"12 KiB",` +
			`"wake_ms":"99999999999999999999","uuid":"5e2f","snapshot":7,"owner":"ci"}}`,
		// No extra at all (a record from before any key existed).
		"session/bare": `{"name":"bare","state":"stopped","retention":1048576}`,
	})

	s := openTest(t, dir)
	cases := []Session{
		{Name: "bare", State: "stopped", Retention: 1 << 20},
		{Name: "never", State: "running", WorkspaceUUID: "8d1c", IdleTimeout: durationp(0)},
		{Name: "odd", State: "stopped", WorkspaceUUID: "5e2f"},
		{Name: "sleepy", State: "sleeping", Cause: "asleep: 512.0 MiB snapshot written in 1.2s", Image: "debian-13",
			VMM: "qemu", Accel: "kvm", CPUs: 2, MemoryMiB: 2048, DiskBytes: 10 << 30,
			CreatedAt: t0, StartedAt: t0, LastActivity: t0,
			WorkspaceUUID: "0b8e3a52-6f7c-4c1e-9a43-2d1f0e5b7c99", IdleTimeout: durationp(30 * time.Minute),
			SnapshotPath: "/var/lib/berth/sessions/sleepy/snapshot/memory.snap", SnapshotBytes: 512 << 20,
			LastWake: 412 * time.Millisecond},
	}
	check := func(when string) {
		t.Helper()
		for _, want := range cases {
			got, err := s.GetSession(want.Name)
			if err != nil || !reflect.DeepEqual(got, want) {
				t.Errorf("%s: GetSession(%q) = %+v, %v\nwant %+v", when, want.Name, got, err, want)
			}
			if raw := readRaw(t, s, "session/"+want.Name); strings.Contains(raw, `"extra"`) {
				t.Errorf("%s: migrated record still has extra: %s", when, raw)
			}
		}
		if list, err := s.ListSessions(); err != nil || !reflect.DeepEqual(list, cases) {
			t.Errorf("%s: ListSessions() = %+v, %v\nwant %+v", when, list, err, cases)
		}
		if got := readRaw(t, s, "meta/session/schema"); got != "2" {
			t.Errorf("%s: schema of session = %q, want 2", when, got)
		}
	}
	check("after migration")

	// Reopening a current store migrates nothing and changes nothing.
	before := readRaw(t, s, "session/sleepy")
	s.Close()
	s = openTest(t, dir)
	check("after reopen")
	if after := readRaw(t, s, "session/sleepy"); after != before {
		t.Errorf("reopen rewrote session/sleepy:\n%s\n%s", before, after)
	}
}

// A session record from before the workspace's use was kept decodes
// with it unmeasured (no migration: the fields are new and optional), and
// one with it keeps it across a reopen.
func TestSessionWorkspaceUse(t *testing.T) {
	dir := t.TempDir()
	writeRaw(t, dir, map[string]string{
		"meta/session/schema": "2", "meta/exec/schema": "2", "meta/out/schema": "2", "meta/event/schema": "1",
		"session/old": `{"name":"old","state":"stopped","disk_bytes":4294967296}`,
		"session/new": `{"name":"new","state":"sleeping","workspace_used":12582912,"workspace_measured_at":"2025-03-01T12:03:00Z"}`,
	})
	s := openTest(t, dir)
	check := func(when string) {
		t.Helper()
		if got, err := s.GetSession("old"); err != nil || got.WorkspaceUsed != 0 || !got.WorkspaceMeasuredAt.IsZero() {
			t.Errorf("%s: old record: %d bytes at %s, %v; want unmeasured", when, got.WorkspaceUsed, got.WorkspaceMeasuredAt, err)
		}
		if got, err := s.GetSession("new"); err != nil || got.WorkspaceUsed != 12<<20 || !got.WorkspaceMeasuredAt.Equal(t0.Add(3*time.Minute)) {
			t.Errorf("%s: new record: %d bytes at %s, %v; want 12 MiB at %s", when, got.WorkspaceUsed, got.WorkspaceMeasuredAt, err, t0.Add(3*time.Minute))
		}
	}
	check("open")
	s.Close()
	s = openTest(t, dir)
	check("reopen")
}

func TestMigrationIsOneTransaction(t *testing.T) {
	cases := []struct {
		name string
		good map[string]string // left as written when the open fails
		bad  map[string]string
	}{
		{"corrupt v1 exec",
			map[string]string{"exec/good": `{"id":"good","session":"s","env":["A=1"]}`, "meta/exec/schema": "1"},
			map[string]string{"exec/bad": `{not json`}},
		{"v1 session whose extra is not an object",
			map[string]string{"session/a-good": `{"name":"a-good","state":"stopped","extra":{"uuid":"5e2f"}}`,
				"meta/session/schema": "1"},
			map[string]string{"session/b-bad": `{"name":"b-bad","state":"stopped","extra":["uuid"]}`}},
		{"migrated sessions and a later owner's corrupt record",
			map[string]string{"session/s": `{"name":"s","state":"stopped","extra":{"uuid":"5e2f"}}`,
				"meta/session/schema": "1", "meta/exec/schema": "1"},
			map[string]string{"exec/bad": `{not json`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			writeRaw(t, dir, c.good)
			writeRaw(t, dir, c.bad)
			if s, err := Open(dir, testLogger(t)); err == nil {
				s.Close()
				t.Fatal("Open succeeded on a store with a corrupt v1 record")
			}
			// The good records were not half-migrated.
			db, err := badger.Open(badgerOptions(dir, testLogger(t)))
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			db.View(func(txn *badger.Txn) error {
				for k, want := range c.good {
					item, err := txn.Get([]byte(k))
					if err != nil {
						t.Fatalf("%s: %v", k, err)
					}
					if v, _ := item.ValueCopy(nil); string(v) != want {
						t.Errorf("%s = %s after failed migration, want %s", k, v, want)
					}
				}
				return nil
			})
		})
	}
}

func TestNewerSchemaRefused(t *testing.T) {
	cases := []struct {
		owner   string
		version string
		want    SchemaError
		message string
	}{
		{"exec", "3", SchemaError{"exec", 3, 2}, "store schema for exec is v3, this berth knows v2: upgrade berth"},
		{"session", "3", SchemaError{"session", 3, 2}, "store schema for session is v3, this berth knows v2: upgrade berth"},
		{"out", "9", SchemaError{"out", 9, 2}, "store schema for out is v9, this berth knows v2: upgrade berth"},
	}
	for _, c := range cases {
		t.Run(c.owner, func(t *testing.T) {
			dir := t.TempDir()
			writeRaw(t, dir, map[string]string{
				"meta/exec/schema":            "1", // would migrate, if the newer owner allowed it
				"meta/" + c.owner + "/schema": c.version,
				"exec/e":                      `{"id":"e","session":"s","env":["A=1"]}`,
			})
			s, err := Open(dir, nil)
			if err == nil {
				s.Close()
				t.Fatal("Open succeeded")
			}
			var se *SchemaError
			if !errors.As(err, &se) || *se != c.want {
				t.Fatalf("Open: %v, want %+v", err, c.want)
			}
			if !strings.Contains(err.Error(), c.message) {
				t.Errorf("Open: %q does not say %q", err, c.message)
			}
			// Refusing must not touch the store, and must release it.
			s2, err := Open(dir, nil)
			if !errors.As(err, &se) {
				t.Fatalf("second Open: %v", err)
			}
			if s2 != nil {
				s2.Close()
			}
		})
	}
	// An untouched newer store keeps its records as written.
	dir := t.TempDir()
	raw := `{"id":"e","session":"s","env":["A=1"]}`
	writeRaw(t, dir, map[string]string{"meta/exec/schema": "3", "exec/e": raw})
	Open(dir, nil)
	db, err := badger.Open(badgerOptions(dir, testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.View(func(txn *badger.Txn) error {
		item, err := txn.Get([]byte("exec/e"))
		if err != nil {
			t.Fatal(err)
		}
		if v, _ := item.ValueCopy(nil); string(v) != raw {
			t.Errorf("refused store was modified: %s", v)
		}
		return nil
	})
}

// The migration runs in one transaction; it must still fit a store that
// has run tens of thousands of commands.
func TestMigrateManyExecs(t *testing.T) {
	const n = 30000
	dir := t.TempDir()
	db, err := badger.Open(badgerOptions(dir, testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	wb := db.NewWriteBatch()
	wb.Set([]byte("meta/exec/schema"), []byte("1"))
	for i := range n {
		id := fmt.Sprintf("exec-%08d", i)
		rec := fmt.Sprintf(`{"id":%q,"session":"s","argv":["bash","-lc","make -j8 test && ./scripts/check --all"],`+
			`"env":["PATH=/usr/bin:/bin","HOME=/root","TOKEN=secret-%d"],"state":"exited","exit_code":0,`+
			`"started_at":"2025-03-01T12:00:00Z","ended_at":"2025-03-01T12:00:01Z","agent_id":"%d"}`, id, i, i)
		wb.Set([]byte("exec/"+id), []byte(rec))
		wb.Set([]byte("sexec/s/"+id), nil)
	}
	if err := wb.Flush(); err != nil {
		t.Fatal(err)
	}
	db.Close()

	s := openTest(t, dir)
	e, err := s.GetExec(fmt.Sprintf("exec-%08d", n-1))
	if err != nil || e.By != "unknown" || len(e.EnvNames) != 3 {
		t.Errorf("last exec after migration = %+v, %v", e, err)
	}
}

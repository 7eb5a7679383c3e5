package store

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// fillSession gives a session every kind of record: execs with output
// (some of it trimmed by retention, so segments have holes), events, a
// run listing execs, a schedule.
func fillSession(t testing.TB, s *Store, name string) {
	t.Helper()
	if err := s.PutSession(Session{Name: name, State: "sleeping", Image: "mini", ImageDigest: "sha256:ab", Retention: 96 << 10, SnapshotPath: "/old/sessions/" + name + "/snapshot/memory.snap"}); err != nil {
		t.Fatal(err)
	}
	m := newModel(s)
	rng := rand.New(rand.NewPCG(1, uint64(len(name))))
	for i := range 3 {
		id := fmt.Sprintf("%s-x%d", name, i)
		m.exec(t, id, name, t0.Add(time.Duration(i)*time.Second))
		for range 5 {
			m.append(t, rng, id, 4096, 9001, 33)
		}
	}
	for i := range 4 {
		if _, err := s.AppendEvent(Event{Session: name, Kind: "state", Message: fmt.Sprint("event ", i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.PutRun(Run{ID: "r1", Session: name, Status: "open", StartedAt: t0}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddRunExec(name, "r1", name+"-x1", t0); err != nil {
		t.Fatal(err)
	}
	if err := s.PutSchedule(Schedule{ID: "c1", Session: name, Spec: "@every 2s", Overlap: "skip", Argv: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
}

// sessionKeys returns the store's records other than schema versions,
// key → value.
func sessionKeys(t testing.TB, s *Store) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			k := string(it.Item().Key())
			if strings.HasPrefix(k, "meta/") && strings.HasSuffix(k, "/schema") {
				continue
			}
			v, err := it.Item().ValueCopy(nil)
			if err != nil {
				return err
			}
			out[k] = string(v)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// replay reads every exec's stored output of the session.
func replay(t testing.TB, s *Store, name string) map[string][]Chunk {
	t.Helper()
	execs, err := s.ListExecs(name)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]Chunk{}
	for _, e := range execs {
		var all []Chunk
		for from := uint64(0); ; {
			cs, gap, next, err := s.ReadOutput(e.ID, from, 1000)
			if err != nil {
				t.Fatalf("ReadOutput(%s): %v", e.ID, err)
			}
			all = append(all, Chunk{Exec: fmt.Sprint("gap ", gap)})
			all = append(all, cs...)
			if len(cs) == 0 || next == from {
				break
			}
			from = next
		}
		out[e.ID] = all
	}
	return out
}

func exportOf(t testing.TB, s *Store, name string) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := s.ExportSession(name, &b); err != nil {
		t.Fatalf("ExportSession(%s): %v", name, err)
	}
	return b.Bytes()
}

func segFiles(t testing.TB, s *Store) []string {
	t.Helper()
	ents, _ := os.ReadDir(filepath.Join(s.dir, "output"))
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func TestExportImportSession(t *testing.T) {
	src := openTest(t, t.TempDir())
	fillSession(t, src, "s")
	fillSession(t, src, "other") // not part of the stream
	stream := exportOf(t, src, "s")

	dstDir := t.TempDir()
	dst := openTest(t, dstDir)
	fillSession(t, dst, "resident")
	before := sessionKeys(t, dst)
	var seen string
	rec, err := dst.ImportSession(bytes.NewReader(stream), func(r *Session) error {
		seen = r.SnapshotPath
		r.SnapshotPath = "/new/memory.snap"
		return nil
	})
	if err != nil {
		t.Fatalf("ImportSession: %v", err)
	}
	if seen != "/old/sessions/s/snapshot/memory.snap" || rec.SnapshotPath != "/new/memory.snap" {
		t.Errorf("fix saw %q, record has %q", seen, rec.SnapshotPath)
	}

	// Every record of s is in dst, byte for byte (the session record
	// as fixed); nothing of "other" came along; the resident is untouched.
	want := sessionKeys(t, src)
	got := sessionKeys(t, dst)
	for k, v := range want {
		if strings.Contains(k, "other") {
			if _, ok := got[k]; ok {
				t.Errorf("record %q of another session imported", k)
			}
			continue
		}
		if k == "session/s" {
			continue
		}
		if got[k] != v {
			t.Errorf("record %q: got %q, want %q", k, got[k], v)
		}
	}
	for k, v := range before {
		if got[k] != v {
			t.Errorf("resident record %q changed", k)
		}
	}
	if len(got) != len(before)+countWithout(want, "other") {
		t.Errorf("dst has %d records, want %d", len(got), len(before)+countWithout(want, "other"))
	}
	wantOut := replay(t, src, "s")
	check := func(st *Store) {
		t.Helper()
		if gotOut := replay(t, st, "s"); !equalOutput(gotOut, wantOut) {
			t.Errorf("replayed output differs after import")
		}
		g, err := st.GetSession("s")
		if err != nil || g.SnapshotPath != "/new/memory.snap" {
			t.Errorf("GetSession = %+v, %v", g, err)
		}
		if runs, _ := st.ListRuns("s"); len(runs) != 1 {
			t.Errorf("runs = %+v", runs)
		}
		if scs, _ := st.ListSchedules("s"); len(scs) != 1 {
			t.Errorf("schedules = %+v", scs)
		}
	}
	check(dst)
	if dst.OutputTotal() != src.OutputTotal() {
		t.Errorf("output total %d, want %d (two sessions of the same size)", dst.OutputTotal(), src.OutputTotal())
	}
	// New events and output continue the sequences.
	ev, err := dst.AppendEvent(Event{Session: "s", Kind: "moved"})
	if err != nil || ev.Seq != 5 {
		t.Errorf("AppendEvent after import = %+v, %v; want seq 5", ev, err)
	}
	dst.Close()
	dst = openTest(t, dstDir)
	check(dst)

	// A second import of the same session is refused, and changes nothing.
	now := sessionKeys(t, dst)
	if _, err := dst.ImportSession(bytes.NewReader(stream), nil); !errors.Is(err, ErrExists) {
		t.Errorf("second import: %v, want ErrExists", err)
	}
	if !mapsEqual(now, sessionKeys(t, dst)) {
		t.Errorf("a refused import changed the store")
	}
	// Deleting it afterwards leaves only the resident.
	if err := dst.DeleteSession("s"); err != nil {
		t.Fatal(err)
	}
	if !mapsEqual(before, sessionKeys(t, dst)) {
		t.Errorf("after deleting the imported session, the store is not as before")
	}
}

func countWithout(m map[string]string, sub string) int {
	n := 0
	for k := range m {
		if !strings.Contains(k, sub) {
			n++
		}
	}
	return n
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func equalOutput(a, b map[string][]Chunk) bool {
	if len(a) != len(b) {
		return false
	}
	for id, x := range a {
		y := b[id]
		if len(x) != len(y) {
			return false
		}
		for i := range x {
			if x[i].Exec != y[i].Exec || x[i].Seq != y[i].Seq || x[i].Stream != y[i].Stream || !x[i].Time.Equal(y[i].Time) || !bytes.Equal(x[i].Data, y[i].Data) {
				return false
			}
		}
	}
	return true
}

// A truncated or corrupted stream is refused with nothing left behind.
func TestImportSessionRefusesDamage(t *testing.T) {
	src := openTest(t, t.TempDir())
	fillSession(t, src, "s")
	stream := exportOf(t, src, "s")
	dst := openTest(t, t.TempDir())
	fillSession(t, dst, "resident")
	before := sessionKeys(t, dst)
	segsBefore := segFiles(t, dst)
	rng := rand.New(rand.NewPCG(7, 7))
	cases := map[string][]byte{"empty": nil, "magic only": stream[:8]}
	for i := range 20 {
		n := rng.IntN(len(stream))
		cases[fmt.Sprintf("cut at %d", n)] = stream[:n]
		bad := bytes.Clone(stream)
		j := rng.IntN(len(bad))
		bad[j] ^= 1 << rng.IntN(8)
		cases[fmt.Sprintf("bit %d flipped", j)] = bad
		_ = i
	}
	cases["cut before end"] = stream[:len(stream)-1]
	cases["trailing byte"] = append(bytes.Clone(stream), 0)
	for name, b := range cases {
		_, err := dst.ImportSession(bytes.NewReader(b), nil)
		if err == nil {
			t.Errorf("%s: imported", name)
			dst.DeleteSession("s")
			continue
		}
		if !errors.Is(err, ErrBadStream) && !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrBadStream or ErrInvalid", name, err)
		}
		if !mapsEqual(before, sessionKeys(t, dst)) {
			t.Fatalf("%s: the refused import left records", name)
		}
		if got := segFiles(t, dst); !slices.Equal(got, segsBefore) {
			t.Fatalf("%s: output files %v, want %v", name, got, segsBefore)
		}
	}
	// The undamaged stream still imports.
	if _, err := dst.ImportSession(bytes.NewReader(stream), nil); err != nil {
		t.Fatalf("import after refusals: %v", err)
	}
}

// An import a crash interrupted (its marker written, its records partly)
// is removed at the next Open, output files too.
func TestInterruptedImportRemovedAtOpen(t *testing.T) {
	src := openTest(t, t.TempDir())
	fillSession(t, src, "s")
	stream := exportOf(t, src, "s")
	dir := t.TempDir()
	dst := openTest(t, dir)
	fillSession(t, dst, "resident")
	before := sessionKeys(t, dst)
	segsBefore := segFiles(t, dst)
	if _, err := dst.ImportSession(bytes.NewReader(stream), nil); err != nil {
		t.Fatal(err)
	}
	// Put the store back into the state of a crash just before the last
	// transaction: everything written but the session's record, under
	// the marker; and a staged segment nothing renamed.
	ids := []string{"s-x0", "s-x1", "s-x2"}
	err := dst.db.Update(func(txn *badger.Txn) error {
		if err := txn.Delete(sessionKey("s")); err != nil {
			return err
		}
		return txn.Set(importMarkerKey("s"), []byte(`["s-x0","s-x1","s-x2"]`))
	})
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "output", "s-x9.import.seg"), []byte("x"), 0o600)
	dst.Close()
	dst = openTest(t, dir)
	if !mapsEqual(before, sessionKeys(t, dst)) {
		t.Errorf("records of the interrupted import remain: %v", keysNotIn(sessionKeys(t, dst), before))
	}
	if got := segFiles(t, dst); !slices.Equal(got, segsBefore) {
		t.Errorf("output files %v, want %v", got, segsBefore)
	}
	for _, id := range ids {
		if _, err := dst.GetExec(id); !errors.Is(err, ErrNotFound) {
			t.Errorf("exec %s: %v", id, err)
		}
	}
	if _, err := dst.ImportSession(bytes.NewReader(stream), nil); err != nil {
		t.Fatalf("import again: %v", err)
	}
}

func keysNotIn(a, b map[string]string) []string {
	var out []string
	for k := range a {
		if _, ok := b[k]; !ok {
			out = append(out, k)
		}
	}
	return out
}

// The stream's parser meets a network peer's bytes: it must refuse, not
// crash or allocate without bound, and leave nothing of a refusal.
func FuzzImportSession(f *testing.F) {
	src := openTest(f, f.TempDir())
	fillSession(f, src, "s")
	f.Add(exportOf(f, src, "s"))
	small := openTest(f, f.TempDir())
	if err := small.PutSession(Session{Name: "t", State: "stopped"}); err != nil {
		f.Fatal(err)
	}
	f.Add(exportOf(f, small, "t"))
	f.Add([]byte(recMagic + "\x00\x01"))
	dst := openTest(f, f.TempDir())
	base := sessionKeys(f, dst)
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, err := dst.ImportSession(bytes.NewReader(b), nil)
		if err == nil {
			if err := dst.DeleteSession(rec.Name); err != nil {
				t.Fatalf("delete the imported session: %v", err)
			}
		}
		if got := sessionKeys(t, dst); len(got) != len(base) {
			t.Fatalf("after import (err %v): records %v left", err, keysNotIn(got, base))
		}
		if fs := segFiles(t, dst); len(fs) != 0 {
			t.Fatalf("after import (err %v): output files %v left", err, fs)
		}
	})
}

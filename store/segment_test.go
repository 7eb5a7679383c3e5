package store

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestChunkRecords(t *testing.T) {
	inline := func(stream uint8, ns int64, data string) []byte {
		b := []byte{stream}
		b = binary.BigEndian.AppendUint64(b, uint64(ns))
		return append(b, data...)
	}
	at := t0.Add(1500 * time.Nanosecond)
	cases := []struct {
		name    string
		v       []byte
		want    chunkRec
		wantErr bool
	}{
		{"segment stdout", appendSegRecord(nil, Stdout, at, 0, 65536),
			chunkRec{stream: Stdout, time: at.UnixNano(), seg: true, off: 0, n: 65536}, false},
		{"segment stderr far in", appendSegRecord(nil, Stderr, at, 1<<40, 3),
			chunkRec{stream: Stderr, time: at.UnixNano(), seg: true, off: 1 << 40, n: 3}, false},
		{"segment empty chunk", appendSegRecord(nil, Stdout, at, 7, 0),
			chunkRec{stream: Stdout, time: at.UnixNano(), seg: true, off: 7}, false},
		{"inline", inline(Stdout, 42, "hello"), chunkRec{stream: Stdout, time: 42, n: 5, data: []byte("hello")}, false},
		{"inline empty", inline(Stderr, 42, ""), chunkRec{stream: Stderr, time: 42, data: []byte{}}, false},
		// An inline chunk of 17 bytes has a segment record's length: the
		// first byte (its stream) tells them apart.
		{"inline of a segment record's length", inline(Stdout, 9, "0123456789abcdefg"),
			chunkRec{stream: Stdout, time: 9, n: 17, data: []byte("0123456789abcdefg")}, false},
		{"segment record truncated", appendSegRecord(nil, Stdout, at, 0, 1)[:segRecordLen-1], chunkRec{}, true},
		{"segment record too long", append(appendSegRecord(nil, Stdout, at, 0, 1), 0), chunkRec{}, true},
		{"segment record past 2^63", appendSegRecord(nil, Stdout, at, 1<<62, 1<<62|1<<61), chunkRec{}, true},
		{"inline shorter than its header", []byte{Stdout, 0, 0}, chunkRec{}, true},
		{"empty", nil, chunkRec{}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := decodeChunk(c.v)
			if (err != nil) != c.wantErr {
				t.Fatalf("decodeChunk(%x) err = %v, want error %v", c.v, err, c.wantErr)
			}
			if err != nil {
				return
			}
			if got.stream != c.want.stream || got.time != c.want.time || got.seg != c.want.seg ||
				got.off != c.want.off || got.n != c.want.n || string(got.data) != string(c.want.data) {
				t.Errorf("decodeChunk(%x) = %+v, want %+v", c.v, got, c.want)
			}
			if c.want.seg && len(c.v) != segRecordLen {
				t.Errorf("segment record is %d bytes, want %d", len(c.v), segRecordLen)
			}
		})
	}
}

// writeOldStore writes, straight into badger, a session with execs whose
// output is inline chunks, as the berth before segments stored it (out
// schema v1), and returns the chunks per exec.
func writeOldStore(t *testing.T, dir string, rng *rand.Rand) map[string][]Chunk {
	t.Helper()
	kv := map[string]string{
		"meta/session/schema": "2", "meta/exec/schema": "2", "meta/out/schema": "1", "meta/event/schema": "1",
		"session/s": `{"name":"s","state":"running","retention":1000000}`,
	}
	out := make(map[string][]Chunk)
	var use int64
	for i, id := range []string{"old", "older"} {
		started := t0.Add(time.Duration(1-i) * time.Second) // "older" started first
		rec, _ := json.Marshal(Exec{ID: id, Session: "s", Argv: []string{"x"}, State: "running", StartedAt: started})
		kv["exec/"+id] = string(rec)
		kv["sexec/s/"+id] = ""
		var st outState
		// Small chunks stay in the LSM, large ones go to the value log.
		for seq, n := range []int{0, 17, 30, 70 << 10, 1, 100, 5000} {
			c := Chunk{Exec: id, Seq: uint64(seq), Stream: uint8(1 + seq%2), Time: t0.Add(time.Duration(seq) * time.Millisecond),
				Data: make([]byte, n)}
			for j := range c.Data {
				c.Data[j] = byte(rng.Uint32())
			}
			v := []byte{c.Stream}
			v = binary.BigEndian.AppendUint64(v, uint64(c.Time.UnixNano()))
			kv[string(chunkKey(id, uint64(seq)))] = string(append(v, c.Data...))
			if c.Stream == Stdout {
				st.StdoutBytes += int64(n)
			} else {
				st.StderrBytes += int64(n)
			}
			st.NextSeq++
			use += int64(n)
			out[id] = append(out[id], c)
		}
		st.StdoutOffset, st.StderrOffset = st.StdoutBytes, st.StderrBytes
		st.Order, st.Indexed = orderOf(started), true
		b, _ := json.Marshal(st)
		kv[string(outStateKey(id))] = string(b)
		kv[string(outOrderKey("s", st.Order, id))] = ""
	}
	kv[string(outUseKey("s"))] = string(binary.BigEndian.AppendUint64(nil, uint64(use)))
	writeRaw(t, dir, kv)
	return out
}

// A store written before segments opens without rewriting its output,
// replays byte-exact, and goes on with segments: mixed replays, trims
// across both formats and deletion all work.
func TestOldFormatOutput(t *testing.T) {
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(5, 5))
	old := writeOldStore(t, dir, rng)

	s := openTest(t, dir)
	m := newModel(s)
	for id, chunks := range old {
		e, err := s.GetExec(id)
		if err != nil {
			t.Fatal(err)
		}
		m.execs[id] = e
		m.chunks[id] = chunks
	}
	if got := readRaw(t, s, "meta/out/schema"); got != "2" {
		t.Errorf("out schema after open = %q, want 2", got)
	}
	if raw := readRaw(t, s, string(chunkKey("old", 3))); len(raw) != chunkHeader+70<<10 {
		t.Errorf("open rewrote an inline chunk: %d bytes", len(raw))
	}
	m.check(t, "s", 1000000)
	if n := s.OutputTotal(); n != 2*(17+30+70<<10+1+100+5000) {
		t.Errorf("OutputTotal() = %d after open", n)
	}

	// New output goes to segments, after the inline chunks.
	m.append(t, rng, "old", 300, 0, 4000)
	m.append(t, rng, "older", 2000)
	m.check(t, "s", 1000000)
	if v := readRaw(t, s, string(chunkKey("old", 7))); len(v) != segRecordLen || v[0] != segMarker {
		t.Errorf("new chunk stored as %d bytes starting %x, want a segment record", len(v), v[:1])
	}

	// Trimming goes through the inline chunks of the older exec into its
	// segment chunks; the gaps are reported as before.
	for _, limit := range []int64{80000, 20000, 3000} {
		if err := s.PutSession(Session{Name: "s", State: "running", Retention: limit}); err != nil {
			t.Fatal(err)
		}
		m.check(t, "s", limit)
	}
	if e, _ := s.GetExec("older"); e.TrimmedSeq != 8 {
		t.Errorf("older: TrimmedSeq %d, want all 8 chunks trimmed", e.TrimmedSeq)
	}
	if _, err := os.Stat(s.seg.path("older")); !os.IsNotExist(err) {
		t.Errorf("segment of a fully trimmed exec: %v, want it removed", err)
	}

	// After a reopen everything reads the same.
	s.Close()
	s = openTest(t, dir)
	m.s = s
	m.check(t, "s", 3000)
	if err := s.DeleteSession("s"); err != nil {
		t.Fatal(err)
	}
	for _, k := range allKeys(t, s) { // only the schema versions are left
		if !strings.HasPrefix(k, "meta/") || !strings.HasSuffix(k, "/schema") {
			t.Errorf("key left after delete: %q", k)
		}
	}
	if ents, _ := os.ReadDir(s.seg.dir); len(ents) != 0 {
		t.Errorf("segments left after delete: %v", ents)
	}
}

// allocated returns the bytes of disk a file takes.
func allocated(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Blocks * 512
}

func TestTrimFreesSegmentSpace(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir)
	const limit = 1 << 20
	if err := s.PutSession(Session{Name: "s", Retention: limit}); err != nil {
		t.Fatal(err)
	}
	m := newModel(s)
	m.exec(t, "e", "s", t0)
	m.exec(t, "later", "s", t0.Add(time.Second))
	rng := rand.New(rand.NewPCG(8, 8))
	for range 64 {
		m.append(t, rng, "e", 64<<10) // 4 MiB through a 1 MiB retention
	}
	m.check(t, "s", limit)
	path := s.seg.path("e")
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != 4<<20 {
		t.Errorf("segment size %d, want %d (holes keep offsets)", fi.Size(), 4<<20)
	}
	if s.seg.noPunch {
		t.Skip("the filesystem under", dir, "cannot punch holes")
	}
	if a := allocated(t, path); a > limit+64<<10 {
		t.Errorf("segment takes %d bytes of disk, want at most the retention %d (and a block)", a, limit)
	}

	// Output of a newer exec pushes all of e's out: its segment goes.
	m.append(t, rng, "later", 16<<10, 16<<10, 16<<10, 16<<10)
	for range 16 {
		m.append(t, rng, "later", 64<<10)
	}
	m.check(t, "s", limit)
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("segment of a fully trimmed exec: %v, want it removed", err)
	}
	// e writes again: a fresh (sparse) segment at the old offsets.
	if err := s.PutSession(Session{Name: "s", Retention: 2 * limit}); err != nil {
		t.Fatal(err)
	}
	m.append(t, rng, "e", 100)
	m.check(t, "s", 2*limit)
	if a := allocated(t, path); a > 64<<10 {
		t.Errorf("new segment of e takes %d bytes of disk", a)
	}
}

// AppendOutput writes the data before it commits the index; a crash in
// between leaves bytes past the segment's end that nothing indexes. The
// next append overwrites them, and an Open cuts them off.
func TestCrashBetweenSegmentWriteAndCommit(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir)
	m := newModel(s)
	m.exec(t, "e", "s", t0)
	rng := rand.New(rand.NewPCG(9, 9))
	m.append(t, rng, "e", 1000, 2001)
	end := int64(3001)

	// The crashed append: its data is in the segment, its index is not.
	orphan := make([]byte, 5000)
	for i := range orphan {
		orphan[i] = 0xee
	}
	writeAt(t, s.seg.path("e"), orphan, end)
	m.check(t, "s", DefaultRetention)

	// The agent resends from the stored offsets: no duplicate, no orphan.
	m.append(t, rng, "e", 700)
	m.check(t, "s", DefaultRetention)
	if fi, _ := os.Stat(s.seg.path("e")); fi.Size() != end+5000 {
		t.Fatalf("segment size %d before reopen", fi.Size())
	}
	s.Close()
	s = openTest(t, dir)
	m.s = s
	if fi, _ := os.Stat(s.seg.path("e")); fi.Size() != end+700 {
		t.Errorf("segment size %d after reopen, want the indexed %d", fi.Size(), end+700)
	}
	m.check(t, "s", DefaultRetention)
	m.append(t, rng, "e", 10)
	m.check(t, "s", DefaultRetention)
}

// A crash between a trim's commit and its hole punch or removal leaves
// disk space that nothing indexes; Open frees it.
func TestOpenFreesLeakedSegmentSpace(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir)
	const limit = 256 << 10
	if err := s.PutSession(Session{Name: "s", Retention: limit}); err != nil {
		t.Fatal(err)
	}
	m := newModel(s)
	m.exec(t, "e", "s", t0)
	rng := rand.New(rand.NewPCG(10, 10))
	for range 32 {
		m.append(t, rng, "e", 64<<10)
	}
	if s.seg.noPunch {
		t.Skip("the filesystem under", dir, "cannot punch holes")
	}
	s.Close()
	// As if the punches never happened, and a trim removed an exec's index
	// without its segment.
	path := filepath.Join(dir, "output", "e.seg")
	writeAt(t, path, make([]byte, 1<<20), 0)
	writeAt(t, filepath.Join(dir, "output", "gone.seg"), make([]byte, 1<<20), 0)
	if a := allocated(t, path); a < 1<<20 {
		t.Fatalf("the test's refill did not allocate: %d", a)
	}

	s = openTest(t, dir)
	m.s = s
	if a := allocated(t, path); a > limit+64<<10 {
		t.Errorf("after Open the segment takes %d bytes of disk, want at most %d", a, limit)
	}
	if _, err := os.Stat(filepath.Join(dir, "output", "gone.seg")); !os.IsNotExist(err) {
		t.Errorf("segment of no exec: %v, want it removed", err)
	}
	m.check(t, "s", limit)
}

func writeAt(t *testing.T, path string, b []byte, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func TestDeleteSessionRemovesSegments(t *testing.T) {
	s := openTest(t, t.TempDir())
	m := newModel(s)
	rng := rand.New(rand.NewPCG(11, 11))
	for _, sess := range []string{"doomed", "kept"} {
		if err := s.PutSession(Session{Name: sess}); err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			id := fmt.Sprintf("%s-%d", sess, i)
			m.exec(t, id, sess, t0.Add(time.Duration(i)))
			m.append(t, rng, id, 1000, 2000)
		}
	}
	if err := s.DeleteSession("doomed"); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := os.Stat(s.seg.path(fmt.Sprintf("doomed-%d", i))); !os.IsNotExist(err) {
			t.Errorf("segment doomed-%d: %v, want it removed", i, err)
		}
		if _, err := os.Stat(s.seg.path(fmt.Sprintf("kept-%d", i))); err != nil {
			t.Errorf("segment kept-%d: %v", i, err)
		}
	}
	if n := s.OutputTotal(); n != 3*3000 {
		t.Errorf("OutputTotal() = %d after deleting a session, want %d", n, 3*3000)
	}
	m.check(t, "kept", DefaultRetention)
}

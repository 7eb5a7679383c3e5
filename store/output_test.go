package store

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// model remembers everything appended, to check the store against it.
type model struct {
	s      *Store
	mu     sync.Mutex
	execs  map[string]Exec
	chunks map[string][]Chunk // every chunk appended, trimmed or not
}

func newModel(s *Store) *model {
	return &model{s: s, execs: make(map[string]Exec), chunks: make(map[string][]Chunk)}
}

func (m *model) exec(t testing.TB, id, session string, started time.Time) {
	t.Helper()
	e := Exec{ID: id, Session: session, Argv: []string{"x"}, State: "running", StartedAt: started}
	if err := m.s.PutExec(e); err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	m.execs[id] = e
	m.mu.Unlock()
}

// append stores one chunk per size, with random data; odd sizes go to stderr.
func (m *model) append(t testing.TB, rng *rand.Rand, id string, sizes ...int) {
	t.Helper()
	m.mu.Lock()
	prev := m.chunks[id]
	m.mu.Unlock()
	var outOff, errOff int64
	for _, c := range prev {
		if c.Stream == Stdout {
			outOff += int64(len(c.Data))
		} else {
			errOff += int64(len(c.Data))
		}
	}
	chunks := make([]Chunk, len(sizes))
	for i, n := range sizes {
		data := make([]byte, n)
		for j := range data {
			data[j] = byte(rng.Uint32())
		}
		c := Chunk{Exec: id, Seq: uint64(len(prev) + i), Stream: Stdout, Time: t0.Add(time.Duration(rng.Int64N(1e12))), Data: data}
		if n%2 == 1 {
			c.Stream = Stderr
			errOff += int64(n)
		} else {
			outOff += int64(n)
		}
		chunks[i] = c
	}
	// Errorf, not Fatalf: append also runs on goroutines other than the test's.
	e, err := m.s.AppendOutput(id, chunks, outOff, errOff)
	if err != nil {
		t.Errorf("AppendOutput(%q): %v", id, err)
		return
	}
	if e.NextSeq != uint64(len(prev)+len(sizes)) || e.StdoutOffset != outOff || e.StderrOffset != errOff {
		t.Errorf("AppendOutput(%q) returned NextSeq %d, offsets %d %d; want %d, %d %d",
			id, e.NextSeq, e.StdoutOffset, e.StderrOffset, len(prev)+len(sizes), outOff, errOff)
	}
	m.mu.Lock()
	m.chunks[id] = append(m.chunks[id], chunks...)
	m.mu.Unlock()
}

func size(cs []Chunk) int64 {
	var n int64
	for _, c := range cs {
		n += int64(len(c.Data))
	}
	return n
}

func sameChunks(got, want []Chunk) error {
	if len(got) != len(want) {
		return fmt.Errorf("%d chunks, want %d", len(got), len(want))
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.Exec != w.Exec || g.Seq != w.Seq || g.Stream != w.Stream || !g.Time.Equal(w.Time) || !bytes.Equal(g.Data, w.Data) {
			return fmt.Errorf("chunk %d: got {%s %d %d %v %d bytes}, want {%s %d %d %v %d bytes}",
				i, g.Exec, g.Seq, g.Stream, g.Time, len(g.Data), w.Exec, w.Seq, w.Stream, w.Time, len(w.Data))
		}
	}
	return nil
}

// check verifies a session's stored output against the model: each exec's
// kept chunks are byte-exact, what was trimmed is a prefix, every gap is
// right, and the running total matches and respects the limit. Which exec
// was trimmed is pinned by TestRetention's cases: an older exec that writes
// again after a newer one was trimmed legitimately keeps its new output.
func (m *model) check(t testing.TB, session string, limit int64) {
	t.Helper()
	var ids []string
	for id, e := range m.execs {
		if e.Session == session {
			ids = append(ids, id)
		}
	}
	slices.SortFunc(ids, func(a, b string) int {
		if c := m.execs[a].StartedAt.Compare(m.execs[b].StartedAt); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	var stored int64
	for _, id := range ids {
		all := m.chunks[id]
		e, err := m.s.GetExec(id)
		if err != nil {
			t.Fatal(err)
		}
		ts := int(e.TrimmedSeq)
		if e.TrimmedBytes != size(all[:ts]) || e.NextSeq != uint64(len(all)) {
			t.Errorf("exec %s: TrimmedSeq %d TrimmedBytes %d NextSeq %d; model says %d bytes before seq %d of %d",
				id, ts, e.TrimmedBytes, e.NextSeq, size(all[:ts]), ts, len(all))
		}
		chunks, gap, next, err := m.s.ReadOutput(id, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := sameChunks(chunks, all[ts:]); err != nil {
			t.Errorf("exec %s replay from 0: %v", id, err)
		}
		if gap != e.TrimmedBytes || next != uint64(len(all)) {
			t.Errorf("exec %s replay from 0: gap %d next %d; want %d %d", id, gap, next, e.TrimmedBytes, len(all))
		}
		stored += size(all[ts:])

		var st *outState
		m.s.db.View(func(txn *badger.Txn) error {
			st, err = getOutState(txn, id)
			return err
		})
		for from := range len(all) + 2 {
			chunks, gap, next, err := m.s.ReadOutput(id, uint64(from), 2)
			if err != nil {
				t.Fatal(err)
			}
			first := max(from, ts)
			want := all[min(first, len(all)):min(first+2, len(all))]
			if err := sameChunks(chunks, want); err != nil {
				t.Errorf("exec %s read from %d: %v", id, from, err)
			}
			var wantGap int64
			switch {
			case from >= ts:
			case from == 0 || uint64(from) >= st.TrimLogStart:
				wantGap = size(all[from:ts])
			default: // the trim log has forgotten these sizes
				wantGap = e.TrimmedBytes
			}
			wantNext := uint64(first + len(want))
			if gap != wantGap || next != wantNext {
				t.Errorf("exec %s read from %d: gap %d next %d; want %d %d", id, from, gap, next, wantGap, wantNext)
			}
		}
	}
	var use int64
	m.s.db.View(func(txn *badger.Txn) error {
		var err error
		use, err = getUse(txn, session)
		return err
	})
	if use != stored || stored > limit {
		t.Errorf("session %s: running total %d, stored %d, limit %d", session, use, stored, limit)
	}
}

func TestReplayFromAnySeq(t *testing.T) {
	s := openTest(t, t.TempDir())
	m := newModel(s)
	m.exec(t, "e", "s", t0)
	rng := rand.New(rand.NewPCG(1, 2))
	for range 12 {
		sizes := make([]int, 1+rng.IntN(4))
		for i := range sizes {
			switch rng.IntN(4) {
			case 0:
				sizes[i] = 0
			case 1:
				sizes[i] = 70 << 10 // above badger's value threshold and a 64 KiB read
			default:
				sizes[i] = rng.IntN(3000)
			}
		}
		m.append(t, rng, "e", sizes...)
	}
	m.check(t, "s", DefaultRetention)

	// Paging with every limit reassembles the exact stream.
	all := m.chunks["e"]
	for _, limit := range []int{1, 3, 7, len(all)} {
		for from := range len(all) {
			var got []Chunk
			for next := uint64(from); ; {
				cs, gap, n, err := s.ReadOutput("e", next, limit)
				if err != nil || gap != 0 {
					t.Fatalf("ReadOutput(%d, %d): gap %d, %v", next, limit, gap, err)
				}
				if len(cs) == 0 {
					if n != uint64(len(all)) {
						t.Fatalf("ReadOutput at end: next %d, want %d", n, len(all))
					}
					break
				}
				got = append(got, cs...)
				next = n
			}
			if err := sameChunks(got, all[from:]); err != nil {
				t.Fatalf("paging from %d by %d: %v", from, limit, err)
			}
		}
	}
}

type appendStep struct {
	exec  int // index into the case's execs, started in that order
	sizes []int
}

func TestRetention(t *testing.T) {
	rep := func(n, size int) []int {
		s := make([]int, n)
		for i := range s {
			s[i] = size
		}
		return s
	}
	random := func(execs, steps, maxSize int) []appendStep {
		rng := rand.New(rand.NewPCG(7, 7))
		var out []appendStep
		for range steps {
			sizes := make([]int, 1+rng.IntN(5))
			for i := range sizes {
				sizes[i] = rng.IntN(maxSize)
			}
			out = append(out, appendStep{rng.IntN(execs), sizes})
		}
		return out
	}
	cases := []struct {
		name     string
		limit    int64
		execs    int
		steps    []appendStep
		lower    int64  // if set, PutSession lowers Retention to it after the steps
		logBlock uint64 // if set, trimLogBlocks for the case
		// wantTrimmed is each exec's TrimmedSeq, when the case pins it.
		wantTrimmed []uint64
	}{
		{name: "under the limit", limit: 1 << 20, execs: 2,
			steps:       []appendStep{{0, []int{100, 200}}, {1, []int{300}}},
			wantTrimmed: []uint64{0, 0}},
		{name: "single exec keeps the newest", limit: 10000, execs: 1,
			steps:       []appendStep{{0, rep(5, 1000)}, {0, rep(5, 1000)}, {0, rep(5, 1000)}, {0, rep(5, 1000)}, {0, rep(5, 1000)}},
			wantTrimmed: []uint64{15}},
		{name: "oldest exec goes first", limit: 10000, execs: 2,
			steps:       []appendStep{{0, []int{6000}}, {1, []int{3000}}, {1, []int{3000}}, {1, []int{5000}}},
			wantTrimmed: []uint64{1, 1}},
		{name: "older exec trimmed though it wrote last", limit: 10000, execs: 2,
			steps:       []appendStep{{1, []int{6000}}, {0, []int{6000}}},
			wantTrimmed: []uint64{1, 0}},
		{name: "one append larger than the limit", limit: 1000, execs: 1,
			steps:       []appendStep{{0, rep(10, 300)}},
			wantTrimmed: []uint64{7}},
		{name: "zero-length chunks", limit: 500, execs: 2,
			steps: []appendStep{{0, []int{0, 300, 0}}, {1, []int{0, 0}}, {0, []int{400, 0}}, {1, []int{200}}}},
		{name: "random appends across execs", limit: 50000, execs: 4, steps: random(4, 150, 5000)},
		{name: "lowered retention trims over many transactions", limit: 1 << 20, execs: 2,
			steps: []appendStep{{0, rep(maxAppendChunks, 10)}, {1, rep(maxAppendChunks, 10)}, {1, rep(100, 10)}},
			lower: 50, wantTrimmed: []uint64{maxAppendChunks, maxAppendChunks + 95}},
		{name: "trim log forgets the oldest sizes", limit: 3000, execs: 1, logBlock: 2,
			steps: []appendStep{{0, rep(1000, 7)}, {0, rep(1000, 13)}, {0, rep(1000, 3)}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.logBlock != 0 {
				old := trimLogBlocks
				trimLogBlocks = c.logBlock
				t.Cleanup(func() { trimLogBlocks = old })
			}
			s := openTest(t, t.TempDir())
			if err := s.PutSession(Session{Name: "s", Retention: c.limit}); err != nil {
				t.Fatal(err)
			}
			m := newModel(s)
			ids := make([]string, c.execs)
			for i := range ids {
				// Ids sort against start order, so only start time can explain
				// which exec is trimmed first.
				ids[i] = fmt.Sprintf("e%d", c.execs-i)
				m.exec(t, ids[i], "s", t0.Add(time.Duration(i)*time.Second))
			}
			rng := rand.New(rand.NewPCG(3, 4))
			for _, st := range c.steps {
				m.append(t, rng, ids[st.exec], st.sizes...)
			}
			limit := c.limit
			if c.lower != 0 {
				limit = c.lower
				if err := s.PutSession(Session{Name: "s", Retention: limit}); err != nil {
					t.Fatal(err)
				}
			}
			m.check(t, "s", limit)
			for i, want := range c.wantTrimmed {
				if e, _ := s.GetExec(ids[i]); e.TrimmedSeq != want {
					t.Errorf("exec %d: TrimmedSeq %d, want %d", i, e.TrimmedSeq, want)
				}
			}
			if c.logBlock != 0 {
				var st *outState
				s.db.View(func(txn *badger.Txn) (err error) {
					st, err = getOutState(txn, ids[0])
					return err
				})
				if st.TrimLogStart == 0 {
					t.Errorf("TrimLogStart = 0; the case should have made the log forget")
				}
			}
			if err := s.GC(); err != nil {
				t.Errorf("GC: %v", err)
			}
		})
	}
}

func TestConcurrentAppendOutput(t *testing.T) {
	s := openTest(t, t.TempDir())
	limits := map[string]int64{"big": DefaultRetention, "small": 20000}
	for name, limit := range limits {
		if err := s.PutSession(Session{Name: name, Retention: limit}); err != nil {
			t.Fatal(err)
		}
	}
	m := newModel(s)
	var ids []string
	for name := range limits {
		for i := range 3 {
			id := fmt.Sprintf("%s-%d", name, i)
			m.exec(t, id, name, t0.Add(time.Duration(i)))
			ids = append(ids, id)
		}
	}
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 99))
			for range 60 {
				sizes := make([]int, 1+rng.IntN(4))
				for j := range sizes {
					sizes[j] = rng.IntN(2000)
				}
				m.append(t, rng, id, sizes...)
			}
		})
	}
	wg.Wait()
	for name, limit := range limits {
		m.check(t, name, limit)
	}
}

func TestAppendOutputRejects(t *testing.T) {
	s := openTest(t, t.TempDir())
	if err := s.PutExec(Exec{ID: "e", Session: "s"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AppendOutput("e", []Chunk{{Stream: Stdout, Data: []byte("abc")}}, 3, 5); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name     string
		chunks   []Chunk
		out, err int64
		want     error
	}{
		{"stdout offset goes back", nil, 2, 5, ErrInvalid},
		{"stderr offset goes back", nil, 3, 4, ErrInvalid},
		{"unknown stream", []Chunk{{Stream: 3}}, 3, 5, ErrInvalid},
		{"too many chunks", make([]Chunk, maxAppendChunks+1), 3, 5, ErrInvalid},
		{"offsets only", nil, 3, 5, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := s.AppendOutput("e", c.chunks, c.out, c.err); !errors.Is(err, c.want) {
				t.Errorf("err = %v, want %v", err, c.want)
			}
		})
	}
	// Nothing rejected was stored.
	if e, _ := s.GetExec("e"); e.NextSeq != 1 || e.StdoutOffset != 3 || e.StderrOffset != 5 {
		t.Errorf("after rejects: %+v", e)
	}
}

// A read returns at most MaxReadBytes of data, and at least one chunk;
// reading on from next gets the rest.
func TestReadOutputBounded(t *testing.T) {
	s := openTest(t, t.TempDir())
	if err := s.PutSession(Session{Name: "s", Retention: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutExec(Exec{ID: "e", Session: "s"}); err != nil {
		t.Fatal(err)
	}
	const n, size = 40, 1 << 20
	var off int64
	for i := 0; i < n; i++ {
		off += size
		if _, err := s.AppendOutput("e", []Chunk{{Stream: Stdout, Data: bytes.Repeat([]byte{byte(i)}, size)}}, off, 0); err != nil {
			t.Fatal(err)
		}
	}
	var got int
	for from := uint64(0); got < n; {
		chunks, _, next, err := s.ReadOutput("e", from, 0)
		if err != nil {
			t.Fatal(err)
		}
		var b int
		for _, c := range chunks {
			if c.Data[0] != byte(got) || len(c.Data) != size {
				t.Fatalf("chunk %d holds %d×%d", got, c.Data[0], len(c.Data))
			}
			got++
			b += len(c.Data)
		}
		if len(chunks) == 0 || b > MaxReadBytes+size {
			t.Fatalf("a read returned %d chunks, %d bytes", len(chunks), b)
		}
		from = next
	}
	big := bytes.Repeat([]byte{'x'}, MaxReadBytes+1)
	if err := s.PutExec(Exec{ID: "f", Session: "s"}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if _, err := s.AppendOutput("f", []Chunk{{Stream: Stdout, Data: big}}, int64(i+1)*int64(len(big)), 0); err != nil {
			t.Fatal(err)
		}
	}
	if chunks, _, _, err := s.ReadOutput("f", 0, 0); err != nil || len(chunks) != 1 {
		t.Fatalf("a chunk over the bound: %d chunks, %v", len(chunks), err)
	}
}

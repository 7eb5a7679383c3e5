package store

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

func TestFinished(t *testing.T) {
	for state, want := range map[string]bool{
		"": false, "starting": false, "running": false,
		"exited": true, "failed": true, "cancelled": true, "timed-out": true, "lost": true,
	} {
		if got := finished(state); got != want {
			t.Errorf("finished(%q) = %v, want %v", state, got, want)
		}
	}
}

// TestOutputBudget: the budget bounds all sessions' output together,
// taking finished execs' oldest output first (by start time, whatever the
// session), and running execs' only when no finished one has any.
func TestOutputBudget(t *testing.T) {
	type exec struct {
		session, state string
	}
	type step struct {
		exec  int // index into execs; -1 sets the state of setExec
		sizes []int
		// setExec/state: a PutExec changing an exec's state.
		setExec int
		state   string
	}
	// Execs are started in the order listed; ids sort against that order.
	execs := []exec{
		{"a", "exited"},  // 0: oldest, finished
		{"b", "running"}, // 1: older running
		{"a", "running"}, // 2
		{"b", "lost"},    // 3: newest finished
	}
	app := func(e int, sizes ...int) step { return step{exec: e, sizes: sizes} }
	cases := []struct {
		name   string
		budget int64
		steps  []step
		// wantTrimmed is each exec's TrimmedSeq at the end.
		wantTrimmed []uint64
	}{
		{"under the budget", 10000, []step{app(0, 1000), app(1, 1000), app(2, 1000), app(3, 1000)},
			[]uint64{0, 0, 0, 0}},
		{"oldest finished goes first", 4000, []step{app(0, 1000, 1000), app(1, 1000), app(2, 1000), app(3, 1000)},
			[]uint64{1, 0, 0, 0}},
		{"then the newer finished, in another session", 4000,
			[]step{app(0, 1000), app(3, 1000, 1000), app(1, 1000), app(2, 1000), app(2, 1000)},
			[]uint64{1, 0, 0, 1}},
		{"running only when no finished output is left", 3000,
			[]step{app(0, 1000), app(3, 1000), app(1, 1000, 1000), app(2, 1000), app(2, 1000)},
			[]uint64{1, 1, 0, 1}},
		{"an exec that finishes goes before running ones", 3000,
			[]step{app(1, 1000), app(2, 1000), {exec: -1, setExec: 2, state: "exited"}, app(1, 1000), app(1, 1000)},
			[]uint64{0, 0, 1, 0}},
		{"the writing exec itself", 2500, []step{app(2, 1000, 1000, 1000, 1000)},
			[]uint64{0, 0, 2, 0}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			s := openTest(t, dir)
			for _, name := range []string{"a", "b"} {
				if err := s.PutSession(Session{Name: name, Retention: 1 << 20}); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.SetOutputBudget(c.budget); err != nil {
				t.Fatal(err)
			}
			m := newModel(s)
			ids := make([]string, len(execs))
			for i, e := range execs {
				ids[i] = fmt.Sprintf("e%d", len(execs)-i)
				m.exec(t, ids[i], e.session, t0.Add(time.Duration(i)*time.Second))
				rec := m.execs[ids[i]]
				rec.State = e.state
				if err := s.PutExec(rec); err != nil {
					t.Fatal(err)
				}
			}
			rng := rand.New(rand.NewPCG(12, 12))
			for _, st := range c.steps {
				if st.exec < 0 {
					rec, _ := s.GetExec(ids[st.setExec])
					rec.State = st.state
					if err := s.PutExec(rec); err != nil {
						t.Fatal(err)
					}
					continue
				}
				m.append(t, rng, ids[st.exec], st.sizes...)
				if n := s.OutputTotal(); n > c.budget {
					t.Fatalf("after an append the total is %d, over the budget %d", n, c.budget)
				}
			}
			check := func(when string) {
				t.Helper()
				m.check(t, "a", 1<<20)
				m.check(t, "b", 1<<20)
				var stored int64
				for i, id := range ids {
					e, err := s.GetExec(id)
					if err != nil {
						t.Fatal(err)
					}
					stored += size(m.chunks[id][e.TrimmedSeq:])
					if e.TrimmedSeq != c.wantTrimmed[i] {
						t.Errorf("%s: exec %d (%s, %s): TrimmedSeq %d, want %d",
							when, i, execs[i].session, execs[i].state, e.TrimmedSeq, c.wantTrimmed[i])
					}
				}
				if n := s.OutputTotal(); n != stored || n > c.budget {
					t.Errorf("%s: OutputTotal() = %d, stored %d, budget %d", when, n, stored, c.budget)
				}
			}
			check("after the steps")
			s.Close()
			s = openTest(t, dir)
			m.s = s
			check("after reopen")
			// The index is rebuilt: a lower budget trims in the same order.
			if err := s.SetOutputBudget(1); err != nil {
				t.Fatal(err)
			}
			if n := s.OutputTotal(); n != 0 {
				t.Errorf("OutputTotal() = %d with a budget of 1", n)
			}
		})
	}
}

func TestOutputBudgetConcurrent(t *testing.T) {
	s := openTest(t, t.TempDir())
	const budget = 60000
	if err := s.SetOutputBudget(budget); err != nil {
		t.Fatal(err)
	}
	m := newModel(s)
	var ids []string
	for _, name := range []string{"a", "b", "c"} {
		if err := s.PutSession(Session{Name: name, Retention: 40000}); err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			id := fmt.Sprintf("%s-%d", name, i)
			m.exec(t, id, name, t0.Add(time.Duration(i)))
			ids = append(ids, id)
		}
	}
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 13))
			for j := range 50 {
				if j == 25 && i%2 == 0 {
					e := m.execs[id]
					e.State = "exited"
					if err := s.PutExec(e); err != nil {
						t.Error(err)
					}
				}
				sizes := make([]int, 1+rng.IntN(4))
				for k := range sizes {
					sizes[k] = rng.IntN(2000)
				}
				m.append(t, rng, id, sizes...)
			}
		})
	}
	wg.Wait()
	for _, name := range []string{"a", "b", "c"} {
		m.check(t, name, 40000)
	}
	if n := s.OutputTotal(); n > budget {
		t.Errorf("OutputTotal() = %d, over the budget %d", n, budget)
	}
}

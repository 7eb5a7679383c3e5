package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
)

// The engine under churn from many goroutines — state changes, statistics
// refreshed every 5 ms, policy changes, Host, List, Get, executions
// starting and ending, checkpoints, deletes and creates — on sessions whose
// VMs are the agent in-process. It fails when any call takes longer than a
// bound (a freeze: the goroutines are dumped) and, built with the lockcheck
// tag as make test builds it, as soon as two locks are seen taken in both
// orders.
func TestLockStress(t *testing.T) {
	const (
		sessions = 50
		workers  = 12
		bound    = 20 * time.Second
	)
	churn := 15 * time.Second
	if testing.Short() {
		churn = 3 * time.Second
	}
	m := newAgentManager(t, 5*time.Millisecond)
	ctx := t.Context()
	names := make([]string, sessions)
	var wg sync.WaitGroup
	for i := range names {
		names[i] = fmt.Sprintf("s%02d", i)
		wg.Go(func() {
			if _, err := m.Create(ctx, session.CreateOptions{Name: names[i]}); err != nil {
				t.Errorf("create %s: %v", names[i], err)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}

	type call struct {
		what  string
		since time.Time
	}
	var inflight [workers]atomic.Pointer[call]
	var ops [workers]int
	var ok [13]atomic.Int64 // calls that succeeded, by op
	stop := time.Now().Add(churn)
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 22))
			for time.Now().Before(stop) {
				name := names[rng.IntN(len(names))]
				op := rng.IntN(len(ok))
				inflight[w].Store(&call{what: fmt.Sprintf("op %d on %s", op, name), since: time.Now()})
				cctx, cancel := context.WithTimeout(ctx, bound)
				var err error
				switch op {
				case 0:
					_, err = m.List(cctx)
				case 1:
					_, err = m.Get(cctx, name)
				case 2:
					_, err = m.Host(cctx)
				case 3:
					_, err = m.Pause(cctx, name)
				case 4:
					_, err = m.Resume(cctx, name)
				case 5:
					policy := []string{"none", "open", "allow:example.com"}[rng.IntN(3)]
					_, err = m.SetNet(cctx, name, policy)
				case 6, 7:
					var p session.Process
					if p, err = m.Exec(cctx, name, session.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo out; echo err >&2"}}); err == nil {
						var x session.Execution
						if x, err = p.Wait(cctx); err == nil && x.State != session.ExecExited {
							err = fmt.Errorf("ended %s", x.State)
						}
					}
				case 8:
					// The agents' workspaces are on tmpfs, which cannot be
					// frozen: a checkpoint fails after taking its locks.
					_, err = m.Checkpoint(cctx, name, session.CheckpointOptions{Label: "stress"})
				case 9:
					if _, err = m.Executions(cctx, name, true); err == nil {
						_, err = m.History(cctx, name)
					}
				case 10:
					if rng.IntN(4) == 0 {
						if err = m.Delete(cctx, name); err == nil {
							_, err = m.Create(cctx, session.CreateOptions{Name: name})
						}
					}
				case 11:
					if rng.IntN(3) == 0 {
						if _, err = m.Stop(cctx, name); err == nil {
							_, err = m.Start(cctx, name)
						}
					}
				case 12:
					_, err = m.Flush(cctx, name)
				}
				if err == nil {
					ok[op].Add(1)
				}
				cancel()
				inflight[w].Store(nil)
				ops[w]++
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-done:
			n := 0
			for _, o := range ops {
				n += o
			}
			var counts []string
			for op := range ok {
				counts = append(counts, fmt.Sprint(ok[op].Load()))
			}
			t.Logf("%d calls from %d goroutines on %d sessions in %s; succeeded by op: %s", n, workers, sessions, churn, strings.Join(counts, " "))
			// The churn must have reached the engine, not bounced off it.
			for _, op := range []int{0, 1, 2, 3, 4, 5, 6, 9} {
				if ok[op].Load() == 0 {
					t.Errorf("op %d never succeeded: the stress did not exercise it", op)
				}
			}
			return
		case <-tick.C:
		}
		for w := range inflight {
			c := inflight[w].Load()
			if c != nil && time.Since(c.since) > bound {
				var b strings.Builder
				pprof.Lookup("goroutine").WriteTo(&b, 2)
				// The engine is frozen: its cleanup would hang too.
				t.Fatalf("%s has not returned after %s: the engine froze\n%s", c.what, time.Since(c.since).Round(time.Second), b.String())
			}
		}
	}
}

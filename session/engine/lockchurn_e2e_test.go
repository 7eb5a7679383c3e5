package engine_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/engine"
	"github.com/berthvm/berth/store"
	"github.com/berthvm/berth/vmm"
	"github.com/berthvm/berth/vmm/qemu"
	"github.com/berthvm/berth/vmm/vmmtest"
)

// lockedBuffer is a log sink for the Manager and the test at once.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// The churn of TestLockStress on real VMs: six sessions, two minutes of
// pause/resume, exec, policy changes, statistics every 100 ms, sleep and
// wake, stop and start, checkpoints, Host, List and Get from eight
// goroutines. No call may take longer than a bound, no lock of the engine
// may be held over two seconds (the Manager's lock watch), and under
// -tags lockcheck no two locks may be seen in both orders. The seed is
// printed; BERTH_CHURN_SEED replays it.
func TestLockChurnVMs(t *testing.T) {
	if testing.Short() {
		t.Skip("boots VMs")
	}
	const (
		sessions = 6
		workers  = 8
		bound    = 3 * time.Minute
	)
	churn := 2 * time.Minute
	seed := uint64(time.Now().UnixNano())
	if s := envSeed(); s != 0 {
		seed = s
	}
	t.Logf("seed %d (BERTH_CHURN_SEED=%d replays it)", seed, seed)

	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "store"), nil)
	if err != nil {
		t.Fatal(err)
	}
	var logs lockedBuffer
	m, err := engine.NewManager(t.Context(), st, engine.Config{
		DataDir:       dir,
		Defaults:      engine.Defaults{DiskBytes: 128 << 20, MemoryMiB: 256, Accel: vmm.AccelTCG},
		Drivers:       map[string]vmm.Driver{"qemu": qemu.New(qemu.Options{})},
		Images:        vmmtest.Images(t),
		StatsInterval: 100 * time.Millisecond,
		LockWatch:     2 * time.Second,
		Logger:        slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatal(err)
	}
	frozen := false
	t.Cleanup(func() {
		if frozen {
			return // its calls would hang as the churn's did
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		list, _ := m.List(ctx)
		for _, s := range list {
			if err := m.Delete(ctx, s.Name); err != nil {
				// Never leave a VM behind to load the machine for the
				// tests after: a delete that failed kills its VMM.
				t.Logf("delete %s: %v; killing its VMM (pid %d)", s.Name, err, s.Pid)
				if s.Pid > 0 {
					syscall.Kill(s.Pid, syscall.SIGKILL)
				}
			}
		}
		m.Close()
		st.Close()
	})
	ctx := t.Context()
	names := make([]string, sessions)
	for i := range names {
		names[i] = fmt.Sprintf("churn%d", i)
		if _, err := m.Create(ctx, session.CreateOptions{Name: names[i]}); err != nil {
			t.Fatalf("create %s: %v", names[i], err)
		}
	}

	type call struct {
		what  string
		since time.Time
	}
	var inflight [workers]atomic.Pointer[call]
	var calls, execs atomic.Int64
	stop := time.Now().Add(churn)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			for time.Now().Before(stop) {
				name := names[rng.IntN(len(names))]
				op := rng.IntN(12)
				inflight[w].Store(&call{what: fmt.Sprintf("op %d on %s", op, name), since: time.Now()})
				cctx, cancel := context.WithTimeout(ctx, bound)
				switch op {
				case 0:
					m.List(cctx)
				case 1:
					m.Get(cctx, name)
				case 2:
					m.Host(cctx)
				case 3:
					m.Pause(cctx, name)
					time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
					m.Resume(cctx, name)
				case 4:
					m.SetNet(cctx, name, []string{"none", "open", "allow:example.com"}[rng.IntN(3)])
				case 5, 6, 7:
					if p, err := m.Exec(cctx, name, session.ExecRequest{Argv: []string{"sh", "-c", "echo out; echo err >&2; sleep 0.$((RANDOM%5))"}}); err == nil {
						if x, err := p.Wait(cctx); err == nil && x.State == session.ExecExited {
							execs.Add(1)
						}
					}
				case 8:
					if rng.IntN(3) == 0 {
						m.Sleep(cctx, name)
					}
				case 9:
					if rng.IntN(4) == 0 {
						m.Stop(cctx, name)
						m.Start(cctx, name)
					}
				case 10:
					if rng.IntN(3) == 0 {
						m.Checkpoint(cctx, name, session.CheckpointOptions{Label: "churn"})
					}
				case 11:
					m.Flush(cctx, name)
				}
				cancel()
				inflight[w].Store(nil)
				calls.Add(1)
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
loop:
	for {
		select {
		case <-done:
			break loop
		case <-tick.C:
		}
		for w := range inflight {
			if c := inflight[w].Load(); c != nil && time.Since(c.since) > bound {
				frozen = true
				var b strings.Builder
				pprof.Lookup("goroutine").WriteTo(&b, 2)
				t.Fatalf("%s has not returned after %s: the engine froze (seed %d)\n%s", c.what, time.Since(c.since).Round(time.Second), seed, b.String())
			}
		}
	}
	t.Logf("%d calls, %d commands exited, from %d goroutines on %d VMs in %s", calls.Load(), execs.Load(), workers, sessions, churn)
	if execs.Load() == 0 {
		t.Errorf("no command ran: the churn did not reach the guests")
	}
	// Every session still answers, and can run a command.
	for _, name := range names {
		cctx, cancel := context.WithTimeout(ctx, bound)
		s, err := m.Get(cctx, name)
		if err == nil && s.State == session.StatePaused {
			_, err = m.Resume(cctx, name)
		}
		if err == nil {
			var p session.Process
			if p, err = m.Exec(cctx, name, session.ExecRequest{Argv: []string{"true"}}); err == nil {
				var x session.Execution
				if x, err = p.Wait(cctx); err == nil && x.State != session.ExecExited {
					err = fmt.Errorf("true ended %s", x.State)
				}
			}
		}
		cancel()
		if err != nil {
			t.Errorf("%s after the churn: %v", name, err)
		}
	}
	if l := logs.String(); strings.Contains(l, "lock held too long") || strings.Contains(l, "lock still held") {
		t.Errorf("an engine lock was held over the watch's bound (seed %d):\n%s", seed, l)
	}
}

func envSeed() uint64 {
	var s uint64
	fmt.Sscan(strings.TrimSpace(os.Getenv("BERTH_CHURN_SEED")), &s)
	return s
}

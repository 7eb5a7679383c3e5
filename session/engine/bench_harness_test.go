package engine_test

import (
	"context"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/api"
)

func percentile(d []time.Duration, p float64) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// TestBenchHarness prints issue 16's figures: MCP exec against berth exec,
// and a schedule's start delay after its due time on a running and on a
// sleeping session (against the wake). It runs only under `make bench`.
func TestBenchHarness(t *testing.T) {
	needBench(t)
	ctx := context.Background()
	e := newBenchEnv(t, "memory = \"256M\"\ndisk = \"128M\"\nidle_timeout = \"0\"\n")
	e.OK("create", "bench")
	client := api.Dial(filepath.Join(e.Data, "berth.sock"))
	defer client.Close()

	// MCP exec of true, one connection, against berth exec -- true.
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: e.Cmd("mcp", "--session", "bench")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var mcpRT, cliRT []time.Duration
	for i := range 45 {
		start := time.Now()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"argv": []string{"true"}}})
		if err != nil || res.IsError {
			t.Fatalf("mcp exec: %v %+v", err, res)
		}
		if i >= 5 { // warm-up
			mcpRT = append(mcpRT, time.Since(start))
		}
	}
	cs.Close()
	for range 40 {
		start := time.Now()
		e.OK("exec", "bench", "--", "true")
		cliRT = append(cliRT, time.Since(start))
	}
	t.Logf("BENCH %-40s %10s vs cli %10s  ratio %.2fx  (target ≤ 1.2x)", "MCP exec true p50", median(mcpRT).Round(time.Microsecond), median(cliRT).Round(time.Microsecond), float64(median(mcpRT))/float64(median(cliRT)))

	// Start delay on a running session: every firing of @every 1s, from
	// its due time (a whole second) to its execution's start.
	sc, err := client.AddSchedule(ctx, "bench", session.ScheduleRequest{Spec: "@every 1s", Argv: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(31 * time.Second)
	if err := client.RemoveSchedule(ctx, "bench", sc.ID); err != nil {
		t.Fatal(err)
	}
	var running []time.Duration
	xs, _ := client.Executions(ctx, "bench", true)
	for _, x := range xs {
		if x.By == "schedule:"+sc.ID {
			running = append(running, x.StartedAt.Sub(x.StartedAt.Truncate(time.Second)))
		}
	}
	if len(running) < 20 {
		t.Fatalf("%d firings in 31s of @every 1s", len(running))
	}
	t.Logf("BENCH %-40s p50 %8s p99 %8s vs exec %8s  ratio %.2fx  (p50 against berth exec true)", "schedule start delay, running", percentile(running, 0.5).Round(time.Microsecond), percentile(running, 0.99).Round(time.Microsecond), median(cliRT).Round(time.Microsecond), float64(percentile(running, 0.5))/float64(median(cliRT)))

	// Start delay on a sleeping session, against its wake time.
	var sleeping, wakes []time.Duration
	idle := func() bool { xs, _ := client.Executions(ctx, "bench", false); return len(xs) == 0 }
	for range 6 {
		// The wake figure: wake → first exec true, as issue 7 measures it.
		e.eventually("no command running", 30*time.Second, idle)
		e.OK("sleep", "bench")
		e.WaitState("bench", session.StateSleeping, 30*time.Second)
		start := time.Now()
		e.OK("exec", "bench", "--", "true")
		wakes = append(wakes, time.Since(start))

		e.eventually("no command running", 30*time.Second, idle)
		e.OK("sleep", "bench")
		e.WaitState("bench", session.StateSleeping, 30*time.Second)
		sc, err := client.AddSchedule(ctx, "bench", session.ScheduleRequest{Spec: "@every 2s", Argv: []string{"true"}})
		if err != nil {
			t.Fatal(err)
		}
		var started time.Time
		deadline := time.Now().Add(60 * time.Second)
		for started.IsZero() && time.Now().Before(deadline) {
			xs, _ := client.Executions(ctx, "bench", true)
			for _, x := range xs {
				if x.By == "schedule:"+sc.ID {
					started = x.StartedAt
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
		client.RemoveSchedule(ctx, "bench", sc.ID)
		if started.IsZero() {
			t.Fatal("no firing in the sleeping session")
		}
		sleeping = append(sleeping, started.Sub(sc.Next))
	}
	t.Logf("BENCH %-40s p50 %8s p99 %8s vs wake %8s  ratio %.2fx  (p50 against wake → first exec true)", "schedule start delay, sleeping", percentile(sleeping, 0.5).Round(time.Millisecond), percentile(sleeping, 0.99).Round(time.Millisecond), median(wakes).Round(time.Millisecond), float64(percentile(sleeping, 0.5))/float64(median(wakes)))
	e.OK("delete", "bench", "--yes")
}

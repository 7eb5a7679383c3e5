package metrics

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/sessiontest"
)

// fleet is a fake with n sessions, most running with sampled figures.
func fleet(t testing.TB, n int) *sessiontest.Fake {
	f := sessiontest.New(sessiontest.Options{})
	t.Cleanup(func() { f.Close() })
	states := []session.State{session.StateRunning, session.StateRunning, session.StateRunning, session.StateSleeping, session.StateStopped}
	for i := range n {
		name := "session-" + strconv.Itoa(i)
		if err := f.AddSession(session.Session{Name: name, State: states[i%len(states)], CPUs: 2, MemoryMiB: 1024, DiskBytes: 4 << 30, SystemBytes: 8 << 30}); err != nil {
			t.Fatal(err)
		}
		update(f, name, i)
	}
	return f
}

func update(f *sessiontest.Fake, name string, i int) {
	f.Update(name, func(s *session.Session) {
		if s.State != session.StateRunning {
			return
		}
		s.MemUsedBytes, s.DirtyBytes, s.WorkspaceUsed = int64(i)<<20, int64(i)<<10, int64(i)<<22
		s.Live = &session.Live{Time: time.Now(), CPUSeconds: float64(i), GuestCPUPercent: float64(i % 100), RSSBytes: int64(i) << 20,
			WorkspaceReadBytes: int64(i), WorkspaceWriteBytes: int64(i) * 2, SystemReadBytes: int64(i) * 3, SystemWriteBytes: int64(i) * 4}
	})
}

func get(t testing.TB, url string) int {
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("scrape: %s %v", resp.Status, err)
	}
	return int(n)
}

// TestScrapeDuringUpdates: a scrape of 10,000 sessions while their figures
// change parses, holds every session, takes bounded memory, and neither
// side stops the other: the updates go on while the scrape reads. Its time
// is logged, not bounded: on this shared machine a time measures the load
// (TestBenchScrape, in make bench, gives the ratio).
func TestScrapeDuringUpdates(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000 sessions")
	}
	f := fleet(t, 10_000)
	m := New()
	m.timeout = 5 * time.Minute // the scrape's own bound is not what this tests
	m.Sessions(f)
	srv := httptest.NewServer(m.Handler(func(context.Context) (any, error) { return "ok", nil }))
	defer srv.Close()
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	var updates atomic.Int64
	scraping := make(chan struct{})
	wg.Go(func() {
		<-scraping
		for i := 0; ctx.Err() == nil; i++ {
			update(f, "session-"+strconv.Itoa(i%10_000), i)
			updates.Add(1)
		}
	})
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	close(scraping)
	fams, size := Scrape(t, srv.URL+"/metrics")
	took := time.Since(start)
	during := updates.Load()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	cancel()
	wg.Wait()
	if n, _ := value(fams, "berth_sessions", "state", "running"); n != 6000 {
		t.Errorf("running sessions %v", n)
	}
	if got := len(fams["berth_session_cpu_seconds_total"].GetMetric()); got != 6000 {
		t.Errorf("%d CPU series, want 6000", got)
	}
	t.Logf("10,000 sessions: scrape %s while %d updates went on, %d bytes, heap in use %d MiB", took, during, size, after.HeapInuse>>20)
	if during == 0 {
		t.Error("no session's figures changed while the scrape read them: the scrape held the updates off")
	}
	if after.HeapInuse > 1<<30 {
		t.Errorf("heap in use %d MiB after a scrape", after.HeapInuse>>20)
	}
}

// TestBenchScrape (make bench): /metrics with 1,000 sessions, p99 time and
// bytes, against listing the same sessions (the scrape's input) over the
// same HTTP server as JSON.
func TestBenchScrape(t *testing.T) {
	if os.Getenv("BERTH_BENCH") == "" {
		t.Skip("set BERTH_BENCH=1 (make bench)")
	}
	f := fleet(t, 1000)
	m := New()
	m.Sessions(f)
	mux := http.NewServeMux()
	mux.Handle("/", m.Handler(func(context.Context) (any, error) { return "ok", nil }))
	mux.HandleFunc("/list", func(w http.ResponseWriter, r *http.Request) {
		list, _ := f.List(r.Context())
		writeJSONList(w, list)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	const rounds = 200
	measure := func(path string) (time.Duration, int) {
		var d []time.Duration
		size := 0
		for range rounds {
			start := time.Now()
			size = get(t, srv.URL+path)
			d = append(d, time.Since(start))
		}
		slices.Sort(d)
		return d[rounds*99/100], size
	}
	measure("/metrics") // warm up
	scrape, bytes := measure("/metrics")
	list, listBytes := measure("/list")
	t.Logf("BENCH %-40s %10s vs list %10s  ratio %.2fx  (target ≤ 10x: the text encoding and gzip of client_golang dominate)", "scrape /metrics, 1,000 sessions (p99)", scrape.Round(time.Microsecond), list.Round(time.Microsecond), float64(scrape)/float64(list))
	t.Logf("BENCH %-40s %10d bytes vs list %d  ratio %.2fx  (%d bytes a session)", "scrape /metrics, 1,000 sessions (size)", bytes, listBytes, float64(bytes)/float64(listBytes), bytes/1000)
}

func writeJSONList(w http.ResponseWriter, list []session.Session) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(list)
}

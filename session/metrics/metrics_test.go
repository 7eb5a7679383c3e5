package metrics

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/sessiontest"
)

// Scrape fetches url and parses the Prometheus text format.
func Scrape(t testing.TB, url string) (map[string]*dto.MetricFamily, int) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams, len(body)
}

// value returns the value of family name's series with the given labels.
func value(fams map[string]*dto.MetricFamily, name string, labels ...string) (float64, bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
next:
	for _, m := range f.Metric {
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, lp := range m.Label {
				if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		}
	}
	return 0, false
}

func TestMetricsScrape(t *testing.T) {
	f := sessiontest.New(sessiontest.Options{})
	defer f.Close()
	for _, s := range []session.Session{
		{Name: "busy", State: session.StateRunning, CPUs: 2, MemoryMiB: 512, DiskBytes: 4 << 30, WorkspaceUsed: 1 << 20},
		{Name: "asleep", State: session.StateSleeping, CPUs: 1, MemoryMiB: 512, DiskBytes: 4 << 30, SnapshotBytes: 99},
		{Name: "off", State: session.StateStopped, CPUs: 1, MemoryMiB: 512, DiskBytes: 4 << 30},
	} {
		if err := f.AddSession(s); err != nil {
			t.Fatal(err)
		}
	}
	f.Update("busy", func(s *session.Session) {
		s.Live = &session.Live{Time: time.Now(), CPUSeconds: 12.5, GuestCPUPercent: 50, RSSBytes: 300 << 20,
			WorkspaceReadBytes: 1000, WorkspaceWriteBytes: 2000, HostWriteBytes: 3000}
		s.DirtyBytes = 4096
	})
	m := New()
	if err := m.Sessions(f); err != nil {
		t.Fatal(err)
	}
	m.Created(2 * time.Second)
	m.Woke(300 * time.Millisecond)
	m.ExecEnded(session.ExecExited)
	m.ExecEnded(session.ExecExited)
	m.ExecEnded(session.ExecLost)
	srv := httptest.NewServer(m.Handler(func(context.Context) (any, error) { return map[string]string{"status": "ok"}, nil }))
	defer srv.Close()

	fams, _ := Scrape(t, srv.URL+"/metrics")
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"berth_session_cpu_seconds_total", []string{"session", "busy"}, 12.5},
		{"berth_session_guest_cpu_ratio", []string{"session", "busy"}, 0.5},
		{"berth_session_memory_rss_bytes", []string{"session", "busy"}, 300 << 20},
		{"berth_session_disk_read_bytes_total", []string{"session", "busy", "disk", "workspace"}, 1000},
		{"berth_session_disk_written_bytes_total", []string{"session", "busy", "disk", "workspace"}, 2000},
		{"berth_session_host_written_bytes_total", []string{"session", "busy"}, 3000},
		{"berth_session_dirty_bytes", []string{"session", "busy"}, 4096},
		{"berth_session_workspace_used_bytes", []string{"session", "busy"}, 1 << 20},
		{"berth_session_workspace_size_bytes", []string{"session", "off"}, 4 << 30},
		{"berth_session_snapshot_bytes", []string{"session", "asleep"}, 99},
		{"berth_sessions", []string{"state", "running"}, 1},
		{"berth_sessions", []string{"state", "sleeping"}, 1},
		{"berth_sessions", []string{"state", "crashed"}, 0},
		{"berth_executions_total", []string{"state", "exited"}, 2},
		{"berth_executions_total", []string{"state", "lost"}, 1},
		{"berth_executions_total", []string{"state", "timed-out"}, 0},
		{"berth_session_create_duration_seconds", nil, 1},
		{"berth_session_wake_duration_seconds", nil, 1},
	} {
		got, ok := value(fams, c.name, c.labels...)
		if !ok || got != c.want {
			t.Errorf("%s%v = %v (found %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	// Sessions that are not running have no sampled series.
	if _, ok := value(fams, "berth_session_cpu_seconds_total", "session", "off"); ok {
		t.Errorf("a stopped session has a CPU series")
	}
	if fams["berth_session_cpu_seconds_total"].GetType() != dto.MetricType_COUNTER {
		t.Errorf("cpu seconds is a %v", fams["berth_session_cpu_seconds_total"].GetType())
	}
	// The daemon's own figures.
	for _, name := range []string{"go_goroutines", "process_resident_memory_bytes"} {
		if fams[name] == nil {
			t.Errorf("no %s", name)
		}
	}
	// A session whose VM goes away: its series end.
	if err := f.Crash("busy", "VMM killed"); err != nil {
		t.Fatal(err)
	}
	fams, _ = Scrape(t, srv.URL+"/metrics")
	if _, ok := value(fams, "berth_session_cpu_seconds_total", "session", "busy"); ok {
		t.Errorf("a crashed session still has a CPU series")
	}

	resp, err := http.Get(srv.URL + "/healthz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("healthz: %v %v", resp, err)
	}
	resp.Body.Close()
	bad := httptest.NewServer(m.Handler(func(context.Context) (any, error) { return nil, errors.New("wedged") }))
	defer bad.Close()
	resp, err = http.Get(bad.URL + "/healthz")
	if err != nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("unhealthy healthz: %v %v", resp, err)
	}
	resp.Body.Close()
}

func TestListenAddr(t *testing.T) {
	for _, c := range []struct {
		in     string
		public bool
		want   string
		err    error
	}{
		{"9464", false, "127.0.0.1:9464", nil},
		{":9464", false, "127.0.0.1:9464", nil},
		{"127.0.0.1:9464", false, "127.0.0.1:9464", nil},
		{"localhost:9464", false, "localhost:9464", nil},
		{"[::1]:9464", false, "[::1]:9464", nil},
		{"0.0.0.0:9464", false, "", ErrNotLoopback},
		{"192.0.2.1:9464", false, "", ErrNotLoopback},
		{"example.com:9464", false, "", ErrNotLoopback},
		{"0.0.0.0:9464", true, "0.0.0.0:9464", nil},
		{"", false, "", session.ErrInvalid},
		{"nope", false, "", session.ErrInvalid},
		{":99999", false, "", session.ErrInvalid},
		{"127.0.0.1:x", false, "", session.ErrInvalid},
	} {
		got, err := ListenAddr(c.in, c.public)
		if got != c.want || (c.err == nil) != (err == nil) || (c.err != nil && !errors.Is(err, c.err)) {
			t.Errorf("ListenAddr(%q, %v) = %q, %v; want %q, %v", c.in, c.public, got, err, c.want, c.err)
		}
	}
}

func TestListenTaken(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, err = Listen(ln.Addr().String(), false)
	if !errors.Is(err, session.ErrConflict) || !strings.Contains(err.Error(), "--metrics") {
		t.Fatalf("Listen on a taken port: %v", err)
	}
}

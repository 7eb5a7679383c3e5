// Package metrics serves berth's figures in the Prometheus text format:
// per-session gauges and counters read from the session Service at scrape
// time, the Manager's create and wake durations and executions' ends as it
// reports them (session.Observer), and the daemon's own Go and process
// metrics. It also answers /healthz on the same listener.
package metrics

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/berthvm/berth/session"
)

// Metrics holds the daemon's registry. It is a session.Observer: give it
// to the Manager's Config, then Watch the Manager with Sessions.
type Metrics struct {
	// timeout bounds one scrape (scrapeTimeout; tests on a loaded
	// machine give more).
	timeout time.Duration
	reg     *prometheus.Registry
	created prometheus.Histogram
	woke    prometheus.Histogram
	execs   *prometheus.CounterVec
}

var _ session.Observer = (*Metrics)(nil)

// New returns a registry with the daemon's Go and process metrics and the
// Observer's histograms and counters.
func New() *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry(), timeout: scrapeTimeout}
	m.created = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "berth_session_create_duration_seconds", Help: "How long creates that succeeded took.",
		Buckets: []float64{0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160},
	})
	m.woke = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "berth_session_wake_duration_seconds", Help: "How long wakes from sleep took.",
		Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40},
	})
	m.execs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "berth_executions_total", Help: "Executions that ended, by final state.",
	}, []string{"state"})
	for _, st := range []session.ExecState{session.ExecExited, session.ExecFailed, session.ExecCancelled, session.ExecTimedOut, session.ExecLost} {
		m.execs.WithLabelValues(string(st)) // every state present from the start
	}
	m.reg.MustRegister(m.created, m.woke, m.execs,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Created implements session.Observer.
func (m *Metrics) Created(took time.Duration) { m.created.Observe(took.Seconds()) }

// Woke implements session.Observer.
func (m *Metrics) Woke(took time.Duration) { m.woke.Observe(took.Seconds()) }

// ExecEnded implements session.Observer.
func (m *Metrics) ExecEnded(st session.ExecState) { m.execs.WithLabelValues(string(st)).Inc() }

// Sessions registers the per-session figures of svc, read at each scrape.
func (m *Metrics) Sessions(svc session.Lister) error {
	return m.reg.Register(&sessionCollector{svc: svc})
}

// Registry is the registry, for tests and extra collectors.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// scrapeTimeout bounds one scrape: reading the sessions and writing them.
const scrapeTimeout = 10 * time.Second

// Handler serves /metrics and /healthz. health is called for /healthz; a
// nil error answers 200 with its report, an error 503.
func (m *Metrics) Handler(health func(ctx context.Context) (any, error)) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		Timeout:             m.timeout,
		MaxRequestsInFlight: 4,
		ErrorHandling:       promhttp.ContinueOnError,
	}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		// health bounds its own wait for the Manager (and says so); this
		// bound is for a health func that does not.
		ctx, cancel := context.WithTimeout(r.Context(), 15*time.Second)
		defer cancel()
		rep, err := health(ctx)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		if err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			json.NewEncoder(w).Encode(map[string]string{"status": "unhealthy", "error": err.Error()})
			return
		}
		json.NewEncoder(w).Encode(rep)
	})
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "berth daemon: /metrics (Prometheus text format), /healthz")
	})
	return mux
}

// Serve serves h on ln until ctx ends.
func Serve(ctx context.Context, ln net.Listener, h http.Handler, log *slog.Logger) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, WriteTimeout: 2 * scrapeTimeout, IdleTimeout: time.Minute}
	stop := context.AfterFunc(ctx, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			srv.Close()
		}
	})
	defer stop()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("metrics server on %s: %w", ln.Addr(), err)
	}
	return nil
}

// ErrNotLoopback refuses a metrics address that others could reach
// without the caller saying so.
var ErrNotLoopback = errors.New("not a loopback address")

// ListenAddr resolves the --metrics address: a bare port ("9464" or
// ":9464") means loopback (127.0.0.1); an explicit host must be loopback
// unless public is set.
func ListenAddr(addr string, public bool) (string, error) {
	if addr == "" {
		return "", fmt.Errorf("empty metrics address: want PORT, :PORT or HOST:PORT: %w", session.ErrInvalid)
	}
	if _, err := strconv.ParseUint(addr, 10, 16); err == nil {
		addr = ":" + addr
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("metrics address %q: %v: want PORT, :PORT or HOST:PORT: %w", addr, err, session.ErrInvalid)
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || (p == 0 && port != "0") {
		return "", fmt.Errorf("metrics address %q: bad port %q: %w", addr, port, session.ErrInvalid)
	}
	if host == "" {
		return net.JoinHostPort("127.0.0.1", port), nil
	}
	if public {
		return addr, nil
	}
	loop := host == "localhost"
	if ip := net.ParseIP(host); ip != nil {
		loop = ip.IsLoopback()
	}
	if !loop {
		return "", fmt.Errorf("metrics address %q: %s is %w: the metrics show every session's name and figures, so serving them beyond this host takes --metrics-public: %w",
			addr, host, ErrNotLoopback, session.ErrInvalid)
	}
	return addr, nil
}

// Listen opens the metrics listener on ListenAddr(addr, public); an
// address in use is refused with what to do.
func Listen(addr string, public bool) (net.Listener, error) {
	a, err := ListenAddr(addr, public)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", a)
	if err != nil {
		return nil, fmt.Errorf("serve metrics on %s: %v (another process holds it? pick another --metrics port): %w", a, err, session.ErrConflict)
	}
	return ln, nil
}

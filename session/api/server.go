package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/berthvm/berth/session"
)

// ServerOption changes a server built by NewServer.
type ServerOption func(*server)

// WithVersion sets the version GET /v1/version reports (Client.Ping).
// The default is the main module's version from the build info.
func WithVersion(v string) ServerOption {
	return func(s *server) { s.version = v }
}

// WithHosts has GET /v1/hosts answer from h, the daemon's fleet; nil
// (the default) answers that this berth is not in a fleet.
func WithHosts(h session.HostLister) ServerOption {
	return func(s *server) { s.hostList = h }
}

type server struct {
	svc      session.Service
	log      *slog.Logger
	version  string
	mux      *http.ServeMux
	hostList session.HostLister
}

// NewServer returns the API handler for svc. A nil logger discards logs.
// Streams (watch, exec, attach) last until the client goes away or the
// request context ends; give the http.Server a BaseContext that is
// cancelled at shutdown so Shutdown does not wait for them.
func NewServer(svc session.Service, logger *slog.Logger, opts ...ServerOption) http.Handler {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &server{svc: svc, log: logger.With("component", "api"), version: buildVersion()}
	for _, o := range opts {
		o(s)
	}
	m := http.NewServeMux()
	for _, rt := range s.routes() {
		m.HandleFunc(rt.method+" "+rt.pattern, rt.handler)
	}
	m.HandleFunc("/", s.noRoute)
	s.mux = m
	return s
}

func buildVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}

// ServeHTTP passes the caller's name on and logs the request.
func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	by := r.Header.Get(HeaderBy)
	if len(by) > 128 {
		by = by[:128]
	}
	if by == "" {
		by = "api"
	}
	r = r.WithContext(session.WithActor(r.Context(), by))
	if run := r.Header.Get(HeaderRun); run != "" {
		r = r.WithContext(session.WithRun(r.Context(), run))
	}
	if f := r.Header.Get(HeaderForwarded); f != "" {
		epoch, err := strconv.ParseInt(f, 10, 64)
		if err != nil || epoch < 0 {
			s.writeError(w, r, fmt.Errorf("header %s %q: want an epoch, a whole number: %w", HeaderForwarded, f, session.ErrInvalid))
			return
		}
		r = r.WithContext(session.WithForwarded(r.Context(), epoch))
	}
	w.Header().Set(HeaderAPI, Version)
	sw := &statusWriter{ResponseWriter: w}
	defer func() {
		s.log.Debug("request", "method", r.Method, "path", r.URL.Path, "by", by, "status", sw.status, "took", time.Since(start))
	}()
	s.mux.ServeHTTP(sw, r)
}

// statusWriter remembers the status; Unwrap lets http.ResponseController
// reach the connection for flushing, deadlines and full duplex.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (s *server) noRoute(w http.ResponseWriter, r *http.Request) {
	s.writeJSON(w, http.StatusNotFound, errorBody{
		Error: fmt.Sprintf("no API route %s %s (is the daemon older than this client?)", r.Method, r.URL.Path),
	})
}

func (s *server) writeJSON(w http.ResponseWriter, status int, v any) {
	b := frame(v)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	w.Write(b)
}

func (s *server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	status, body := toWire(err)
	if status >= 500 && status != http.StatusServiceUnavailable {
		s.log.Warn("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	s.writeJSON(w, status, body)
}

// readJSON decodes a bounded request body into v, refusing unknown fields
// so a newer client's settings are not silently dropped.
func readJSON(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxJSONBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("request body: %v: %w", err, session.ErrInvalid)
	}
	return endOfBody(dec)
}

// endOfBody refuses anything but white space after the body's JSON
// value: a second object would be silently dropped, as unknown fields
// would.
func endOfBody(dec *json.Decoder) error {
	if _, err := dec.Token(); err != io.EOF {
		if err == nil {
			err = errors.New("more than one JSON value")
		}
		return fmt.Errorf("request body: after the JSON value: %v: %w", err, session.ErrInvalid)
	}
	return nil
}

// readOptionalJSON is readJSON for a body that may be absent or empty:
// then v keeps its zero value.
func readOptionalJSON(w http.ResponseWriter, r *http.Request, v any) error {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxJSONBody))
	if err != nil {
		return fmt.Errorf("request body: %v: %w", err, session.ErrInvalid)
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("request body: %v: %w", err, session.ErrInvalid)
	}
	return endOfBody(dec)
}

func queryUint(r *http.Request, key string) (uint64, error) {
	v := r.URL.Query().Get(key)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("query parameter %s=%q: want a non-negative integer: %w", key, v, session.ErrInvalid)
	}
	return n, nil
}

func queryBool(r *http.Request, key string) (bool, error) {
	v := r.URL.Query().Get(key)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("query parameter %s=%q: want true or false: %w", key, v, session.ErrInvalid)
	}
	return b, nil
}

func (s *server) getVersion(w http.ResponseWriter, r *http.Request) {
	s.writeJSON(w, http.StatusOK, versionInfo{API: Version, Version: s.version})
}

func (s *server) host(w http.ResponseWriter, r *http.Request) {
	h, err := s.svc.Host(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, h)
}

func (s *server) list(w http.ResponseWriter, r *http.Request) {
	list, err := s.svc.List(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if list == nil {
		list = []session.Session{}
	}
	s.writeJSON(w, http.StatusOK, list)
}

func (s *server) create(w http.ResponseWriter, r *http.Request) {
	var opts session.CreateOptions
	if err := readJSON(w, r, &opts); err != nil {
		s.writeError(w, r, err)
		return
	}
	if opts.On != "" && s.hostList == nil {
		s.writeError(w, r, &session.Error{Class: session.ErrInvalid, Field: "on", Msg: fmt.Sprintf("%q: this berth is not in a fleet, so there is no host to pin to", opts.On),
			Hint: "berth serve --fleet ETCD_URLS --host-id H joins one"})
		return
	}
	sess, err := s.svc.Create(r.Context(), opts)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusCreated, sess)
}

func (s *server) get(w http.ResponseWriter, r *http.Request) {
	sess, err := s.svc.Get(r.Context(), r.PathValue("name"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, sess)
}

func (s *server) delete(w http.ResponseWriter, r *http.Request) {
	if err := s.svc.Delete(r.Context(), r.PathValue("name")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *server) lifecycle(call func(context.Context, string) (session.Session, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sess, err := call(r.Context(), r.PathValue("name"))
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		s.writeJSON(w, http.StatusOK, sess)
	}
}

func (s *server) flush(w http.ResponseWriter, r *http.Request) {
	res, err := s.svc.Flush(r.Context(), r.PathValue("name"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, res)
}

// replace gives the session a new VM. The body (ReplaceOptions) may be
// empty: the session keeps its image.
func (s *server) replace(w http.ResponseWriter, r *http.Request) {
	var opts session.ReplaceOptions
	if err := readOptionalJSON(w, r, &opts); err != nil {
		s.writeError(w, r, err)
		return
	}
	res, err := s.svc.Replace(r.Context(), r.PathValue("name"), opts)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, res)
}

func (s *server) timeline(w http.ResponseWriter, r *http.Request) {
	limit, err := queryUint(r, "limit")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	evs, err := s.svc.Timeline(r.Context(), r.PathValue("name"), int(min(limit, 1<<20)))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if evs == nil {
		evs = []session.Event{}
	}
	s.writeJSON(w, http.StatusOK, evs)
}

func (s *server) executions(w http.ResponseWriter, r *http.Request) {
	all, err := queryBool(r, "all")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	list, err := s.svc.Executions(r.Context(), r.PathValue("name"), all)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if list == nil {
		list = []session.Execution{}
	}
	s.writeJSON(w, http.StatusOK, list)
}

func (s *server) execution(w http.ResponseWriter, r *http.Request) {
	x, err := s.svc.Execution(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, x)
}

// maxOutputPage bounds the chunks in one output response; limit 0 asks for
// this many.
const maxOutputPage = 1000

func (s *server) output(w http.ResponseWriter, r *http.Request) {
	from, err := queryUint(r, "from")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	limit, err := queryUint(r, "limit")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if limit == 0 || limit > maxOutputPage {
		limit = maxOutputPage
	}
	page, err := s.svc.Output(r.Context(), r.PathValue("id"), from, int(limit))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if page.Chunks == nil {
		page.Chunks = []session.Chunk{}
	}
	s.writeJSON(w, http.StatusOK, page)
}

func (s *server) cancel(w http.ResponseWriter, r *http.Request) {
	if err := s.svc.Cancel(r.Context(), r.PathValue("id")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

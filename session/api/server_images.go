package api

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"sync/atomic"

	"github.com/berthvm/berth/session"
)

func (s *server) images(w http.ResponseWriter, r *http.Request) {
	list, err := s.svc.Images(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if list == nil {
		list = []session.ImageInfo{}
	}
	s.writeJSON(w, http.StatusOK, list)
}

func (s *server) removeImage(w http.ResponseWriter, r *http.Request) {
	if err := s.svc.RemoveImage(r.Context(), r.PathValue("name")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// commitBody is a commit's request body: the image is the path's.
type commitBody struct {
	Session string `json:"session"`
	Label   string `json:"label,omitempty"`
}

// commitImage makes a session's system disk the image named in the path.
func (s *server) commitImage(w http.ResponseWriter, r *http.Request) {
	var body commitBody
	if err := readJSON(w, r, &body); err != nil {
		s.writeError(w, r, err)
		return
	}
	req := session.CommitRequest{Session: body.Session, Image: r.PathValue("name"), Label: body.Label}
	if err := req.Validate(); err != nil {
		s.writeError(w, r, err)
		return
	}
	res, err := s.svc.CommitImage(r.Context(), req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusCreated, res)
}

// buildImage builds an image and streams its progress as it happens, then
// the image or the error (buildFrame). The build runs on the request's
// context: a client that goes away cancels it.
func (s *server) buildImage(w http.ResponseWriter, r *http.Request) {
	var req session.BuildRequest
	if err := readJSON(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.Recipe != "" && !filepath.IsAbs(req.Recipe) {
		s.writeError(w, r, fmt.Errorf("recipe path %q is relative: the daemon needs it absolute: %w", req.Recipe, session.ErrInvalid))
		return
	}
	rc := http.NewResponseController(w)
	s.buildStream(w, r, rc, []any{"image", req.Name, "recipe", req.Recipe}, func(progress func(session.BuildProgress)) (session.ImageInfo, error) {
		return s.svc.BuildImage(r.Context(), req, progress)
	})
}

// importImage imports a container image named by the query (name in the
// path, source and ref in the query), reading the request body as the
// image when the source is "-", and streams its progress as buildImage
// does. The body is read while progress is written: full duplex.
func (s *server) importImage(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	if err := rc.EnableFullDuplex(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		s.writeError(w, r, err)
		return
	}
	defer endBody(rc, r)
	q := r.URL.Query()
	for k := range q {
		if k != "source" && k != "ref" {
			s.writeError(w, r, fmt.Errorf("unknown query parameter %q: %w", k, session.ErrInvalid))
			return
		}
	}
	req := session.ImportRequest{Name: r.PathValue("name"), Source: q.Get("source"), Ref: q.Get("ref")}
	var src io.Reader
	if req.Source == session.ImportStdin {
		src = uploadReader{r.Body}
	}
	if err := req.Validate(src != nil); err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.Source != session.ImportStdin && !filepath.IsAbs(req.Source) {
		s.writeError(w, r, &session.Error{Class: session.ErrInvalid, Field: session.FieldSource,
			Msg: fmt.Sprintf("%q is relative", req.Source), Hint: "give the daemon an absolute path"})
		return
	}
	s.buildStream(w, r, rc, []any{"image", req.Name, "source", req.Source}, func(progress func(session.BuildProgress)) (session.ImageInfo, error) {
		return s.svc.ImportImage(r.Context(), req, src, progress)
	})
}

// buildStream runs a build or an import and streams its progress as it
// happens, then the image or the error (buildFrame). It runs on the
// request's context: a client that goes away cancels it. what names it
// in the log.
func (s *server) buildStream(w http.ResponseWriter, r *http.Request, rc *http.ResponseController, what []any,
	run func(progress func(session.BuildProgress)) (session.ImageInfo, error)) {
	out := startStream(w, rc)
	if err := out.rc.Flush(); err != nil { // headers out now: a build takes a while
		return
	}
	// The builder reports from inside the engine's build lock, from more
	// than one goroutine: a report must never wait on this client's socket
	// (a suspended `berth image build` would hold every build and every
	// cold start of an unbuilt image). Reports queue here and are dropped
	// when the client does not keep up; the handler alone writes.
	type result struct {
		info session.ImageInfo
		err  error
	}
	reports := make(chan session.BuildProgress, 256)
	var dropped atomic.Int64
	done := make(chan result, 1)
	go func() {
		info, err := run(func(p session.BuildProgress) {
			select {
			case reports <- p:
			default:
				dropped.Add(1)
			}
		})
		done <- result{info, err}
	}()
	open := true
	send := func(f buildFrame) {
		if open && out.send(f) != nil {
			open = false // the client is gone; r.Context() ends the build
		}
	}
	var res result
wait:
	for {
		select {
		case p := <-reports:
			send(buildFrame{Progress: &p})
		case res = <-done:
			break wait
		}
	}
	for len(reports) > 0 { // what the build reported before it returned
		p := <-reports
		send(buildFrame{Progress: &p})
	}
	if n := dropped.Load(); n > 0 {
		s.log.Info("image progress dropped: the client read too slowly", append(what, "lines", n)...)
	}
	if !open {
		return
	}
	if res.err != nil {
		status, body := toWire(res.err)
		if status >= 500 && status != http.StatusServiceUnavailable && status != http.StatusNotImplemented {
			s.log.Warn("image build or import failed", append(what, "err", res.err)...)
		}
		send(buildFrame{Error: &body})
		return
	}
	send(buildFrame{Image: &res.info})
}

// exportImage streams an image export: progress frames while it is
// prepared, the export's description, exactly its Size bytes of
// tarball, then a trailer saying whether they are whole (an error once
// the bytes have begun can only be said there). It runs on the
// request's context: a client that goes away ends it.
func (s *server) exportImage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	for k := range q {
		if k != "digest" {
			s.writeError(w, r, fmt.Errorf("unknown query parameter %q: %w", k, session.ErrInvalid))
			return
		}
	}
	req := session.ExportRequest{Name: r.PathValue("name"), Digest: q.Get("digest")}
	if err := req.Validate(); err != nil {
		s.writeError(w, r, err)
		return
	}
	rc := http.NewResponseController(w)
	w.Header().Set("Trailer", trailerEnd+", "+trailerError)
	out := startStream(w, rc)
	if err := rc.Flush(); err != nil {
		return
	}
	started := false // the tarball's bytes have begun
	_, err := s.svc.ExportImage(r.Context(), req, func(x session.ImageExport) (io.Writer, error) {
		if err := out.send(exportFrame{Export: &x}); err != nil {
			return nil, err
		}
		started = true
		return w, nil
	}, func(p session.BuildProgress) {
		if !started {
			out.send(exportFrame{Progress: &p})
		}
	})
	if err != nil {
		if r.Context().Err() != nil {
			return // the client is gone
		}
		status, body := toWire(err)
		if status >= 500 && status != http.StatusServiceUnavailable && status != http.StatusNotImplemented {
			s.log.Warn("image export failed", "image", req.Name, "err", err)
		}
		if !started {
			out.send(exportFrame{Error: &body})
			return
		}
		w.Header().Set(trailerError, headerJSON(body))
		return
	}
	w.Header().Set(trailerEnd, "ok")
}

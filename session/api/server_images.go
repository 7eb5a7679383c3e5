package api

import (
	"fmt"
	"net/http"
	"path/filepath"
	"sync"

	"github.com/berthvm/berth/session"
)

var errNoImager = fmt.Errorf("this daemon does not build or keep images: %w", session.ErrUnavailable)

func (s *server) images(w http.ResponseWriter, r *http.Request) {
	if s.img == nil {
		s.writeError(w, r, errNoImager)
		return
	}
	list, err := s.img.Images(r.Context())
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
	if s.img == nil {
		s.writeError(w, r, errNoImager)
		return
	}
	if err := s.img.RemoveImage(r.Context(), r.PathValue("name")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// buildImage builds an image and streams its progress as it happens, then
// the image or the error (buildFrame). The build runs on the request's
// context: a client that goes away cancels it.
func (s *server) buildImage(w http.ResponseWriter, r *http.Request) {
	if s.img == nil {
		s.writeError(w, r, errNoImager)
		return
	}
	var req session.BuildRequest
	if err := readJSON(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.Recipe != "" && !filepath.IsAbs(req.Recipe) {
		s.writeError(w, r, fmt.Errorf("recipe path %q is relative: the daemon needs it absolute: %w", req.Recipe, session.ErrInvalid))
		return
	}
	out := startStream(w, http.NewResponseController(w))
	if err := out.rc.Flush(); err != nil { // headers out now: a build takes a while
		return
	}
	// The builder may report from more than one goroutine, and must not
	// write to the response once BuildImage returned.
	var mu sync.Mutex
	open := true
	progress := func(p session.BuildProgress) {
		mu.Lock()
		defer mu.Unlock()
		if open && out.send(buildFrame{Progress: &p}) != nil {
			open = false // the client is gone; r.Context() ends the build
		}
	}
	info, err := s.img.BuildImage(r.Context(), req, progress)
	mu.Lock()
	defer mu.Unlock()
	if !open {
		return
	}
	open = false
	if err != nil {
		status, body := toWire(err)
		if status >= 500 && status != http.StatusServiceUnavailable {
			s.log.Warn("image build failed", "image", req.Name, "recipe", req.Recipe, "err", err)
		}
		out.send(buildFrame{Error: &body})
		return
	}
	out.send(buildFrame{Image: &info})
}

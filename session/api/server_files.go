package api

import (
	"fmt"
	"io"
	"net/http"

	"github.com/berthvm/berth/session"
)

// fileGet reads a file, or with ?op=stat or ?op=list describes it.
func (s *server) fileGet(w http.ResponseWriter, r *http.Request) {
	name, p := r.PathValue("name"), r.PathValue("path")
	switch op := r.URL.Query().Get("op"); op {
	case "stat":
		fi, err := s.svc.Stat(r.Context(), name, p)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		s.writeJSON(w, http.StatusOK, fi)
	case "list":
		list, err := s.svc.ListDir(r.Context(), name, p)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		if list == nil {
			list = []session.FileInfo{}
		}
		s.writeJSON(w, http.StatusOK, list)
	case "", "read":
		rc, err := s.svc.ReadFile(r.Context(), name, p)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		defer rc.Close()
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusOK)
		if _, err := io.Copy(w, rc); err != nil {
			// Cut the response off so the client sees an error, not a
			// short file.
			s.log.Debug("file read failed mid-stream", "session", name, "path", p, "err", err)
			panic(http.ErrAbortHandler)
		}
	default:
		s.writeError(w, r, badOp(op))
	}
}

// filePut writes the request body to a file; it answers once the file is
// durable.
func (s *server) filePut(w http.ResponseWriter, r *http.Request) {
	n, err := s.svc.WriteFile(r.Context(), r.PathValue("name"), r.PathValue("path"), r.Body)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, written{Written: n})
}

// filePost makes a directory (?op=mkdir) or renames (?op=rename&to=PATH).
func (s *server) filePost(w http.ResponseWriter, r *http.Request) {
	name, p := r.PathValue("name"), r.PathValue("path")
	var err error
	switch op := r.URL.Query().Get("op"); op {
	case "mkdir":
		err = s.svc.Mkdir(r.Context(), name, p)
	case "rename":
		err = s.svc.Rename(r.Context(), name, p, r.URL.Query().Get("to"))
	default:
		err = badOp(op)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *server) fileDelete(w http.ResponseWriter, r *http.Request) {
	if err := s.svc.Remove(r.Context(), r.PathValue("name"), r.PathValue("path")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func badOp(op string) error {
	return fmt.Errorf("unknown file operation %q: %w", op, session.ErrInvalid)
}

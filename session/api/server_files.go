package api

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

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

// treePut writes the tar in the request body into the directory at path;
// it answers once the Service has made every file durable. The body is
// bounded by nothing but the tar itself.
func (s *server) treePut(w http.ResponseWriter, r *http.Request) {
	res, err := s.svc.CopyIn(r.Context(), r.PathValue("name"), r.PathValue("path"), uploadReader{r.Body})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, res)
}

// uploadReader keeps a body cut off mid-way from reading as its end.
// A chunked body that breaks returns io.ErrUnexpectedEOF, which readers
// built on io.ReadFull take for a short last block; and a tar that stops
// between two entries reads as complete. Wrapped, the error is an error.
type uploadReader struct{ r io.Reader }

func (u uploadReader) Read(p []byte) (int, error) {
	n, err := u.r.Read(p)
	if err != nil && err != io.EOF {
		err = fmt.Errorf("the upload was cut off: %w", err)
	}
	return n, err
}

// treeGet streams the file or tree at path as a tar, then a trailer that
// says whether it is complete (see trailerEnd, trailerError).
func (s *server) treeGet(w http.ResponseWriter, r *http.Request) {
	name, p := r.PathValue("name"), r.PathValue("path")
	rc, err := s.svc.CopyOut(r.Context(), name, p)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Trailer", trailerEnd+", "+trailerError)
	w.Header().Set("Content-Type", "application/x-tar")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, rc); err != nil {
		if r.Context().Err() != nil {
			return // the client is gone
		}
		s.log.Debug("tree copy failed mid-stream", "session", name, "path", p, "err", err)
		_, body := toWire(err)
		w.Header().Set(trailerError, headerJSON(body))
		return
	}
	w.Header().Set(trailerEnd, "ok")
}

// maxTrailerError bounds an error message sent in a trailer.
const maxTrailerError = 4 << 10

// headerJSON encodes an error body for a header field: one line, ASCII
// only (JSON escapes for the rest), bounded.
func headerJSON(body errorBody) string {
	if len(body.Error) > maxTrailerError {
		body.Error = strings.ToValidUTF8(body.Error[:maxTrailerError], "") + "…"
	}
	b, err := json.Marshal(body)
	if err != nil {
		panic(fmt.Sprintf("api: encoding an error body: %v", err))
	}
	var sb strings.Builder
	for _, r := range string(b) {
		switch {
		case r < utf8.RuneSelf:
			sb.WriteRune(r)
		case r > 0xFFFF:
			r1, r2 := utf16.EncodeRune(r)
			fmt.Fprintf(&sb, `\u%04x\u%04x`, r1, r2)
		default:
			fmt.Fprintf(&sb, `\u%04x`, r)
		}
	}
	return sb.String()
}

package api

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/berthvm/berth/session"
)

// ForwardProtocol is the Upgrade token of a port-forward connection.
const ForwardProtocol = "berth-forward"

type netRequest struct {
	Policy string `json:"policy"`
}

func (s *server) setNet(w http.ResponseWriter, r *http.Request) {
	var in netRequest
	if err := readJSON(w, r, &in); err != nil {
		s.writeError(w, r, err)
		return
	}
	out, err := s.svc.SetNet(r.Context(), r.PathValue("name"), in.Policy)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, out)
}

func (s *server) netStatus(w http.ResponseWriter, r *http.Request) {
	out, err := s.svc.NetStatus(r.Context(), r.PathValue("name"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, out)
}

// forward upgrades the request's connection to a byte stream joined to a
// port in the session's VM.
func (s *server) forward(w http.ResponseWriter, r *http.Request) {
	if !strings.EqualFold(r.Header.Get("Upgrade"), ForwardProtocol) {
		s.writeError(w, r, fmt.Errorf("a forward needs Upgrade: %s: %w", ForwardProtocol, session.ErrInvalid))
		return
	}
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil {
		s.writeError(w, r, fmt.Errorf("port %q: %w", r.PathValue("port"), session.ErrInvalid))
		return
	}
	gc, err := s.svc.Forward(r.Context(), r.PathValue("name"), port)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer gc.Close()
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer conn.Close()
	if _, err := brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: " + ForwardProtocol + "\r\nConnection: Upgrade\r\n\r\n"); err != nil {
		return
	}
	if brw.Flush() != nil {
		return
	}
	if n := brw.Reader.Buffered(); n > 0 {
		b, _ := brw.Reader.Peek(n)
		if _, err := gc.Write(b); err != nil {
			return
		}
	}
	session.Splice(conn, gc)
}

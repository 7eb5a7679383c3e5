package api

import (
	"net/http"

	"github.com/berthvm/berth/session"
)

func (s *server) history(w http.ResponseWriter, r *http.Request) {
	h, err := s.svc.History(r.Context(), r.PathValue("name"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if h == nil {
		h = []session.Sample{}
	}
	s.writeJSON(w, http.StatusOK, h)
}

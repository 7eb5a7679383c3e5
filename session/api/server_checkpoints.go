package api

import (
	"net/http"

	"github.com/berthvm/berth/session"
)

// Checkpoints, restore and fork.
//
//	POST   /v1/sessions/{name}/checkpoints        CheckpointOptions (body optional) → 201 Checkpoint
//	GET    /v1/sessions/{name}/checkpoints        []Checkpoint
//	DELETE /v1/sessions/{name}/checkpoints/{id}   204
//	POST   /v1/sessions/{name}/restore            {"id": ID} → RestoreResult
//	POST   /v1/sessions/{name}/fork               {"name": NEW} → ForkResult

func (s *server) checkpoint(w http.ResponseWriter, r *http.Request) {
	var opts session.CheckpointOptions
	if err := readOptionalJSON(w, r, &opts); err != nil {
		s.writeError(w, r, err)
		return
	}
	c, err := s.svc.Checkpoint(r.Context(), r.PathValue("name"), opts)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusCreated, c)
}

func (s *server) checkpoints(w http.ResponseWriter, r *http.Request) {
	list, err := s.svc.Checkpoints(r.Context(), r.PathValue("name"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if list == nil {
		list = []session.Checkpoint{}
	}
	s.writeJSON(w, http.StatusOK, list)
}

func (s *server) deleteCheckpoint(w http.ResponseWriter, r *http.Request) {
	if err := s.svc.DeleteCheckpoint(r.Context(), r.PathValue("name"), r.PathValue("id")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

type restoreRequest struct {
	ID string `json:"id"`
}

func (s *server) restore(w http.ResponseWriter, r *http.Request) {
	var req restoreRequest
	if err := readJSON(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	res, err := s.svc.Restore(r.Context(), r.PathValue("name"), req.ID)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, res)
}

type forkRequest struct {
	Name string `json:"name"`
}

func (s *server) fork(w http.ResponseWriter, r *http.Request) {
	var req forkRequest
	if err := readJSON(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	res, err := s.svc.Fork(r.Context(), r.PathValue("name"), req.Name)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusCreated, res)
}

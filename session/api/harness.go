package api

import (
	"context"
	"net/http"

	"github.com/berthvm/berth/session"
)

var _ session.Harness = (*Client)(nil)

// endRunBody is the body of POST /v1/runs/{id}/end.
type endRunBody struct {
	Status session.RunStatus `json:"status"`
}

// withHarness runs f with the Service's Harness, or answers that this
// side has none.
func (s *server) withHarness(f func(h session.Harness, w http.ResponseWriter, r *http.Request)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		f(s.svc, w, r)
	}
}

func (s *server) startRun(h session.Harness, w http.ResponseWriter, r *http.Request) {
	var opts session.RunOptions
	if err := readOptionalJSON(w, r, &opts); err != nil {
		s.writeError(w, r, err)
		return
	}
	run, err := h.StartRun(r.Context(), r.PathValue("name"), opts)
	s.answer(w, r, http.StatusCreated, run, err)
}

func (s *server) runs(h session.Harness, w http.ResponseWriter, r *http.Request) {
	runs, err := h.Runs(r.Context(), r.PathValue("name"))
	if runs == nil {
		runs = []session.Run{}
	}
	s.answer(w, r, http.StatusOK, runs, err)
}

func (s *server) getRun(h session.Harness, w http.ResponseWriter, r *http.Request) {
	run, err := h.GetRun(r.Context(), r.PathValue("id"))
	s.answer(w, r, http.StatusOK, run, err)
}

func (s *server) endRun(h session.Harness, w http.ResponseWriter, r *http.Request) {
	var body endRunBody
	if err := readJSON(w, r, &body); err != nil {
		s.writeError(w, r, err)
		return
	}
	run, err := h.EndRun(r.Context(), r.PathValue("id"), body.Status)
	s.answer(w, r, http.StatusOK, run, err)
}

func (s *server) removeRun(h session.Harness, w http.ResponseWriter, r *http.Request) {
	res, err := h.RemoveRun(r.Context(), r.PathValue("id"))
	s.answer(w, r, http.StatusOK, res, err)
}

func (s *server) addSchedule(h session.Harness, w http.ResponseWriter, r *http.Request) {
	var req session.ScheduleRequest
	if err := readJSON(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	sc, err := h.AddSchedule(r.Context(), r.PathValue("name"), req)
	s.answer(w, r, http.StatusCreated, sc, err)
}

func (s *server) schedules(h session.Harness, w http.ResponseWriter, r *http.Request) {
	list, err := h.Schedules(r.Context(), r.PathValue("name"))
	if list == nil {
		list = []session.Schedule{}
	}
	s.answer(w, r, http.StatusOK, list, err)
}

func (s *server) removeSchedule(h session.Harness, w http.ResponseWriter, r *http.Request) {
	if err := h.RemoveSchedule(r.Context(), r.PathValue("name"), r.PathValue("id")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// answer writes v with status, or err.
func (s *server) answer(w http.ResponseWriter, r *http.Request, status int, v any, err error) {
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, status, v)
}

func runPath(id, suffix string) (string, error) {
	if err := session.ValidateRunID(id); err != nil {
		return "", err
	}
	return "/v1/runs/" + id + suffix, nil
}

// StartRun opens an agent run on a session.
func (c *Client) StartRun(ctx context.Context, name string, opts session.RunOptions) (session.Run, error) {
	var out session.Run
	p, err := sessionPath(name, "/runs")
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, http.MethodPost, p, nil, opts, &out)
}

// EndRun ends an open run.
func (c *Client) EndRun(ctx context.Context, runID string, status session.RunStatus) (session.Run, error) {
	var out session.Run
	p, err := runPath(runID, "/end")
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, http.MethodPost, p, nil, endRunBody{Status: status}, &out)
}

// Runs lists a session's runs.
func (c *Client) Runs(ctx context.Context, name string) ([]session.Run, error) {
	var out []session.Run
	p, err := sessionPath(name, "/runs")
	if err != nil {
		return nil, err
	}
	return out, c.call(ctx, http.MethodGet, p, nil, nil, &out)
}

// GetRun returns one run with its executions' ids.
func (c *Client) GetRun(ctx context.Context, runID string) (session.Run, error) {
	var out session.Run
	p, err := runPath(runID, "")
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, http.MethodGet, p, nil, nil, &out)
}

// RemoveRun removes a run and its starting point.
func (c *Client) RemoveRun(ctx context.Context, runID string) (session.RemovedRun, error) {
	var out session.RemovedRun
	p, err := runPath(runID, "")
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, http.MethodDelete, p, nil, nil, &out)
}

// AddSchedule adds a schedule to a session.
func (c *Client) AddSchedule(ctx context.Context, name string, req session.ScheduleRequest) (session.Schedule, error) {
	var out session.Schedule
	p, err := sessionPath(name, "/schedules")
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, http.MethodPost, p, nil, req, &out)
}

// Schedules lists a session's schedules.
func (c *Client) Schedules(ctx context.Context, name string) ([]session.Schedule, error) {
	var out []session.Schedule
	p, err := sessionPath(name, "/schedules")
	if err != nil {
		return nil, err
	}
	return out, c.call(ctx, http.MethodGet, p, nil, nil, &out)
}

// RemoveSchedule deletes a schedule.
func (c *Client) RemoveSchedule(ctx context.Context, name, id string) error {
	sid, err := seg("schedule id", id)
	if err != nil {
		return err
	}
	p, err := sessionPath(name, "/schedules/"+sid)
	if err != nil {
		return err
	}
	return c.call(ctx, http.MethodDelete, p, nil, nil, nil)
}

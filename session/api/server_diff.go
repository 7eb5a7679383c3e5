package api

import (
	"context"
	"net/http"
	"net/url"

	"github.com/berthvm/berth/session"
)

// Diffs and undo: a diff's options travel in the query (path repeated),
// an undo's paths in its body.

// undoRequest is the body of POST /v1/runs/{id}/undo.
type undoRequest struct {
	Paths []string `json:"paths,omitempty"`
}

func diffOptions(q url.Values) session.DiffOptions {
	return session.DiffOptions{Paths: q["path"], Patch: q.Get("patch") == "true"}
}

func diffQuery(from, to string, opts session.DiffOptions) url.Values {
	q := url.Values{}
	if from != "" {
		q.Set("from", from)
	}
	if to != "" {
		q.Set("to", to)
	}
	if opts.Patch {
		q.Set("patch", "true")
	}
	for _, p := range opts.Paths {
		q.Add("path", p)
	}
	return q
}

func (s *server) diff(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	d, err := s.svc.Diff(r.Context(), r.PathValue("name"), q.Get("from"), q.Get("to"), diffOptions(q))
	s.answer(w, r, http.StatusOK, d, err)
}

func (s *server) runDiff(w http.ResponseWriter, r *http.Request) {
	d, err := s.svc.RunDiff(r.Context(), r.PathValue("id"), diffOptions(r.URL.Query()))
	s.answer(w, r, http.StatusOK, d, err)
}

func (s *server) undoRun(w http.ResponseWriter, r *http.Request) {
	var req undoRequest
	if err := readOptionalJSON(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	res, err := s.svc.UndoRun(r.Context(), r.PathValue("id"), req.Paths)
	s.answer(w, r, http.StatusOK, res, err)
}

// Diff compares checkpoint from with checkpoint to, or with now ("").
func (c *Client) Diff(ctx context.Context, name, from, to string, opts session.DiffOptions) (session.Diff, error) {
	var out session.Diff
	p, err := sessionPath(name, "/diff")
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, http.MethodGet, p, diffQuery(from, to, opts), nil, &out)
}

// RunDiff compares a run's starting point with now.
func (c *Client) RunDiff(ctx context.Context, runID string, opts session.DiffOptions) (session.Diff, error) {
	var out session.Diff
	p, err := runPath(runID, "/diff")
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, http.MethodGet, p, diffQuery("", "", opts), nil, &out)
}

// UndoRun puts a run's changes back.
func (c *Client) UndoRun(ctx context.Context, runID string, paths []string) (session.UndoResult, error) {
	var out session.UndoResult
	p, err := runPath(runID, "/undo")
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, http.MethodPost, p, nil, undoRequest{Paths: paths}, &out)
}

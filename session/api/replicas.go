package api

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	"io"

	"github.com/berthvm/berth/session"
)

// Replicas and recovery: the owner answers
// GET /v1/sessions/{name}/checkpoints/{id}/bundle with a checkpoint's
// replica bundle; the replica's host takes it as POST /v1/replicas,
// lists what it keeps at GET /v1/replicas, stages one for a recovery at
// POST /v1/replicas/{name}/{id}/stage and drops one at
// DELETE /v1/replicas/{name}/{id}. Those are host to host calls. A front
// door answers POST /v1/sessions/{name}/checkpoints/{id}/replicate and
// POST /v1/sessions/{name}/recover (berth checkpoint replicate, berth
// recover).

type replicateRequest struct {
	To string `json:"to"`
}

func (s *server) recoverer(w http.ResponseWriter, r *http.Request) (session.Recoverer, bool) {
	rc, ok := s.svc.(session.Recoverer)
	if !ok {
		s.writeError(w, r, &session.Error{Class: session.ErrUnsupported, Msg: "this berth is one host on its own: replicas and recovery need a fleet",
			Hint: "berth serve --fleet URLS --host-id H joins one"})
	}
	return rc, ok
}

func (s *server) replicator(w http.ResponseWriter, r *http.Request) (session.Replicator, bool) {
	rp, ok := s.svc.(session.Replicator)
	if !ok {
		s.writeError(w, r, fmt.Errorf("this daemon keeps no checkpoint replicas: %w", session.ErrUnsupported))
	}
	return rp, ok
}

func (s *server) replicateCheckpoint(w http.ResponseWriter, r *http.Request) {
	var req replicateRequest
	if err := readJSON(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	rc, ok := s.recoverer(w, r)
	if !ok {
		return
	}
	rep, err := rc.ReplicateCheckpoint(r.Context(), r.PathValue("name"), r.PathValue("id"), req.To)
	s.answer(w, r, http.StatusOK, rep, err)
}

func (s *server) recoverSession(w http.ResponseWriter, r *http.Request) {
	var req session.RecoverOptions
	if err := readJSON(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	rc, ok := s.recoverer(w, r)
	if !ok {
		return
	}
	res, err := rc.Recover(r.Context(), r.PathValue("name"), req)
	s.answer(w, r, http.StatusOK, res, err)
}

// sendReplicaBundle streams the bundle as sendBundle does.
func (s *server) sendReplicaBundle(w http.ResponseWriter, r *http.Request) {
	rp, ok := s.replicator(w, r)
	if !ok {
		return
	}
	bw := &lazyWriter{w: w}
	err := rp.SendCheckpoint(r.Context(), r.PathValue("name"), r.PathValue("id"), bw)
	if err != nil && !bw.started {
		s.writeError(w, r, err)
		return
	}
	if err != nil {
		s.log.Warn("send checkpoint bundle", "session", r.PathValue("name"), "checkpoint", r.PathValue("id"), "err", err)
		panic(http.ErrAbortHandler)
	}
}

func (s *server) receiveReplica(w http.ResponseWriter, r *http.Request) {
	rp, ok := s.replicator(w, r)
	if !ok {
		return
	}
	rep, err := rp.ReceiveReplica(r.Context(), uploadReader{r.Body})
	s.answer(w, r, http.StatusCreated, rep, err)
}

func (s *server) listReplicas(w http.ResponseWriter, r *http.Request) {
	rp, ok := s.replicator(w, r)
	if !ok {
		return
	}
	reps, err := rp.Replicas(r.Context(), r.URL.Query().Get("session"))
	s.answer(w, r, http.StatusOK, reps, err)
}

func (s *server) stageReplica(w http.ResponseWriter, r *http.Request) {
	rp, ok := s.replicator(w, r)
	if !ok {
		return
	}
	st, err := rp.StageReplica(r.Context(), r.PathValue("name"), r.PathValue("id"))
	s.answer(w, r, http.StatusOK, st, err)
}

func (s *server) dropReplica(w http.ResponseWriter, r *http.Request) {
	rp, ok := s.replicator(w, r)
	if !ok {
		return
	}
	if err := rp.DropReplica(r.Context(), r.PathValue("name"), r.PathValue("id")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

var (
	_ session.Replicator = (*Client)(nil)
	_ session.Recoverer  = (*Client)(nil)
)

func checkpointPath(name, id, suffix string) (string, error) {
	i, err := seg("checkpoint id", id)
	if err != nil {
		return "", err
	}
	return sessionPath(name, "/checkpoints/"+i+suffix)
}

func replicaPath(name, id, suffix string) (string, error) {
	n, err := seg("session name", name)
	if err != nil {
		return "", err
	}
	i, err := seg("checkpoint id", id)
	if err != nil {
		return "", err
	}
	return "/v1/replicas/" + n + "/" + i + suffix, nil
}

// ReplicateCheckpoint asks the daemon to copy checkpoint id of name to
// host to of its fleet.
func (c *Client) ReplicateCheckpoint(ctx context.Context, name, id, to string) (session.Replica, error) {
	var out session.Replica
	p, err := checkpointPath(name, id, "/replicate")
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, http.MethodPost, p, nil, replicateRequest{To: to}, &out)
}

// Recover asks the daemon to recover session name (see session.Recoverer).
func (c *Client) Recover(ctx context.Context, name string, opts session.RecoverOptions) (session.RecoverResult, error) {
	var out session.RecoverResult
	p, err := sessionPath(name, "/recover")
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, http.MethodPost, p, nil, opts, &out)
}

// SendCheckpoint writes the daemon's replica bundle of a checkpoint to w.
func (c *Client) SendCheckpoint(ctx context.Context, name, id string, w io.Writer) error {
	p, err := checkpointPath(name, id, "/bundle")
	if err != nil {
		return err
	}
	return c.download(ctx, p, "send checkpoint "+id+" of "+name, w)
}

// ReceiveReplica has the daemon keep the replica bundle read from r.
func (c *Client) ReceiveReplica(ctx context.Context, r io.Reader) (session.Replica, error) {
	var out session.Replica
	return out, c.upload(ctx, "/v1/replicas", r, &out)
}

// Replicas lists the replicas the daemon keeps (of name; all with "").
func (c *Client) Replicas(ctx context.Context, name string) ([]session.Replica, error) {
	var out []session.Replica
	var q url.Values
	if name != "" {
		q = url.Values{"session": {name}}
	}
	return out, c.call(ctx, http.MethodGet, "/v1/replicas", q, nil, &out)
}

// StageReplica has the daemon stage its replica for a recovery.
func (c *Client) StageReplica(ctx context.Context, name, id string) (session.MoveStaged, error) {
	var out session.MoveStaged
	p, err := replicaPath(name, id, "/stage")
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, http.MethodPost, p, nil, nil, &out)
}

// DropReplica has the daemon remove a replica.
func (c *Client) DropReplica(ctx context.Context, name, id string) error {
	p, err := replicaPath(name, id, "")
	if err != nil {
		return err
	}
	return c.call(ctx, http.MethodDelete, p, nil, nil, nil)
}

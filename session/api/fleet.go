package api

import (
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/berthvm/berth/session"
)

func (s *server) hosts(w http.ResponseWriter, r *http.Request) {
	if s.hostList == nil {
		s.writeJSON(w, http.StatusOK, session.HostList{Hosts: []session.HostInfo{}})
		return
	}
	list, err := s.hostList.Hosts(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, list)
}

// Hosts lists the hosts of the daemon's fleet (Fleet false: it is in
// none).
func (c *Client) Hosts(ctx context.Context) (session.HostList, error) {
	var out session.HostList
	return out, c.call(ctx, http.MethodGet, "/v1/hosts", nil, nil, &out)
}

var _ session.HostLister = (*Client)(nil)

// drainFrame is one line of a drain's response: a step per session as
// the drain is done with it, then the result or the error.
type drainFrame struct {
	Step   *session.DrainStep   `json:"step,omitempty"`
	Result *session.DrainResult `json:"result,omitempty"`
	Error  *errorBody           `json:"error,omitempty"`
}

// maxDrainSteps bounds the steps of one drain's result read back: a
// host holds far fewer sessions.
const maxDrainSteps = 100000

func (s *server) drainer(w http.ResponseWriter, r *http.Request) (session.Drainer, bool) {
	dr, ok := s.svc.(session.Drainer)
	if !ok {
		s.writeError(w, r, &session.Error{Class: session.ErrUnsupported, Msg: "this berth is one host on its own: draining a host needs a fleet",
			Hint: "berth serve --fleet URLS --host-id H joins one"})
	}
	return dr, ok
}

// drainHost drains a host and streams a step per session as it is done
// with, then the result or the error (drainFrame). It runs on the
// request's context: a client that goes away ends it (a move under way
// then ends as an interrupted move does).
func (s *server) drainHost(w http.ResponseWriter, r *http.Request) {
	dr, ok := s.drainer(w, r)
	if !ok {
		return
	}
	rc := http.NewResponseController(w)
	out := startStream(w, rc)
	if err := rc.Flush(); err != nil { // headers out now: moves take a while
		return
	}
	open := true
	send := func(f drainFrame) {
		if open && out.send(f) != nil {
			open = false // the client is gone; r.Context() ends the drain
		}
	}
	res, err := dr.Drain(r.Context(), r.PathValue("id"), func(st session.DrainStep) { send(drainFrame{Step: &st}) })
	if err != nil {
		status, body := toWire(err)
		if status >= 500 && status != http.StatusServiceUnavailable && status != http.StatusNotImplemented {
			s.log.Warn("drain failed", "host", r.PathValue("id"), "err", err)
		}
		send(drainFrame{Error: &body})
		return
	}
	send(drainFrame{Result: &res})
}

func (s *server) undrainHost(w http.ResponseWriter, r *http.Request) {
	dr, ok := s.drainer(w, r)
	if !ok {
		return
	}
	if err := dr.Undrain(r.Context(), r.PathValue("id")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

var _ session.Drainer = (*Client)(nil)

// Drain has the daemon drain host (see session.Drainer), calling
// progress (if not nil) for each session as the daemon reports it, from
// the calling goroutine. Ending ctx ends the drain.
func (c *Client) Drain(ctx context.Context, host string, progress func(session.DrainStep)) (session.DrainResult, error) {
	h, err := seg("host id", host)
	if err != nil {
		return session.DrainResult{}, err
	}
	req, err := c.newRequest(ctx, http.MethodPost, "/v1/hosts/"+h+"/drain", nil, nil)
	if err != nil {
		return session.DrainResult{}, err
	}
	resp, err := c.do(req)
	if err != nil {
		return session.DrainResult{}, err
	}
	defer resp.Body.Close()
	res, err := readDrain(resp.Body, progress)
	if err != nil && ctx.Err() != nil {
		return res, ctx.Err()
	}
	return res, err
}

// readDrain reads a drain's stream: progress for each step, then the
// result or the error. Each line is bounded (maxFrame), and so are the
// result's steps.
func readDrain(r io.Reader, progress func(session.DrainStep)) (session.DrainResult, error) {
	in := newFrameReader(r)
	for {
		var f drainFrame
		if err := in.next(&f); err != nil {
			return session.DrainResult{}, fmt.Errorf("drain: the daemon's stream ended without a result (%v): %w", err, session.ErrUnavailable)
		}
		switch {
		case f.Error != nil:
			return session.DrainResult{}, fromWire(http.StatusInternalServerError, *f.Error)
		case f.Result != nil:
			if len(f.Result.Steps) > maxDrainSteps {
				return session.DrainResult{}, fmt.Errorf("drain: a result of %d steps, over %d: %w", len(f.Result.Steps), maxDrainSteps, session.ErrInvalid)
			}
			return *f.Result, nil
		case f.Step != nil && progress != nil:
			progress(*f.Step)
		}
	}
}

// Undrain has the daemon end host's drain.
func (c *Client) Undrain(ctx context.Context, host string) error {
	h, err := seg("host id", host)
	if err != nil {
		return err
	}
	return c.call(ctx, http.MethodPost, "/v1/hosts/"+h+"/undrain", nil, nil, nil)
}

package api

import (
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/berthvm/berth/session"
)

// Moves: the source answers GET /v1/sessions/{name}/bundle with the
// session's bundle and POST /v1/sessions/{name}/drop once the target has
// it; the target takes the bundle as POST /v1/moves and answers
// POST /v1/moves/{name}/commit and DELETE /v1/moves/{name}. They are host
// to host calls of a fleet (and of tests): the SSH server does not carry
// them.

type moveRequest struct {
	To string `json:"to"`
}

func (s *server) moveTo(w http.ResponseWriter, r *http.Request) {
	var req moveRequest
	if err := readJSON(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	rl, ok := s.svc.(session.Relocator)
	if !ok {
		s.writeError(w, r, &session.Error{Class: session.ErrUnsupported, Msg: "this berth is one host on its own: moving a session needs a fleet",
			Hint: "berth serve --fleet URLS --host-id H joins one"})
		return
	}
	res, err := rl.MoveTo(r.Context(), r.PathValue("name"), req.To)
	s.answer(w, r, http.StatusOK, res, err)
}

func (s *server) mover(w http.ResponseWriter, r *http.Request) (session.Mover, bool) {
	mv, ok := s.svc.(session.Mover)
	if !ok {
		s.writeError(w, r, fmt.Errorf("this daemon does not move sessions: %w", session.ErrUnsupported))
	}
	return mv, ok
}

// sendBundle streams the bundle. An error before its first byte is a JSON
// error; one after cuts the body, which the receiver refuses as truncated.
func (s *server) sendBundle(w http.ResponseWriter, r *http.Request) {
	mv, ok := s.mover(w, r)
	if !ok {
		return
	}
	bw := &lazyWriter{w: w}
	err := mv.SendSession(r.Context(), r.PathValue("name"), bw)
	if err != nil && !bw.started {
		s.writeError(w, r, err)
		return
	}
	if err != nil {
		s.log.Warn("send session bundle", "session", r.PathValue("name"), "err", err)
		panic(http.ErrAbortHandler) // the client must see a cut body, not an end
	}
}

// lazyWriter sends the response's header with its first byte.
type lazyWriter struct {
	w       http.ResponseWriter
	started bool
}

func (l *lazyWriter) Write(p []byte) (int, error) {
	if !l.started {
		l.started = true
		l.w.Header().Set("Content-Type", "application/octet-stream")
		l.w.WriteHeader(http.StatusOK)
	}
	return l.w.Write(p)
}

// sendImageBundle streams the image build a session was made on, as
// sendBundle streams the session.
func (s *server) sendImageBundle(w http.ResponseWriter, r *http.Request) {
	mv, ok := s.mover(w, r)
	if !ok {
		return
	}
	bw := &lazyWriter{w: w}
	err := mv.SendSessionImage(r.Context(), r.PathValue("name"), bw)
	if err != nil && !bw.started {
		s.writeError(w, r, err)
		return
	}
	if err != nil {
		s.log.Warn("send image bundle", "session", r.PathValue("name"), "err", err)
		panic(http.ErrAbortHandler)
	}
}

func (s *server) receiveImage(w http.ResponseWriter, r *http.Request) {
	mv, ok := s.mover(w, r)
	if !ok {
		return
	}
	if err := mv.ReceiveImage(r.Context(), uploadReader{r.Body}); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *server) receiveBundle(w http.ResponseWriter, r *http.Request) {
	mv, ok := s.mover(w, r)
	if !ok {
		return
	}
	st, err := mv.ReceiveSession(r.Context(), uploadReader{r.Body})
	s.answer(w, r, http.StatusCreated, st, err)
}

func (s *server) commitMove(w http.ResponseWriter, r *http.Request) {
	mv, ok := s.mover(w, r)
	if !ok {
		return
	}
	sess, err := mv.CommitReceived(r.Context(), r.PathValue("name"))
	s.answer(w, r, http.StatusOK, sess, err)
}

func (s *server) discardMove(w http.ResponseWriter, r *http.Request) {
	mv, ok := s.mover(w, r)
	if !ok {
		return
	}
	if err := mv.DiscardReceived(r.Context(), r.PathValue("name")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *server) dropSent(w http.ResponseWriter, r *http.Request) {
	mv, ok := s.mover(w, r)
	if !ok {
		return
	}
	if err := mv.DropSent(r.Context(), r.PathValue("name")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

var (
	_ session.Mover     = (*Client)(nil)
	_ session.Relocator = (*Client)(nil)
)

// MoveTo asks the daemon to move session name to host to of its fleet.
func (c *Client) MoveTo(ctx context.Context, name, to string) (session.MoveResult, error) {
	var out session.MoveResult
	p, err := sessionPath(name, "/move")
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, http.MethodPost, p, nil, moveRequest{To: to}, &out)
}

// SendSession writes the daemon's bundle of a stopped or sleeping session
// to w. A bundle cut short is an error (and the receiver refuses it).
func (c *Client) SendSession(ctx context.Context, name string, w io.Writer) error {
	p, err := sessionPath(name, "/bundle")
	if err != nil {
		return err
	}
	return c.download(ctx, p, "send session "+name, w)
}

// download copies the body of GET path to w.
func (c *Client) download(ctx context.Context, path, what string, w io.Writer) error {
	req, err := c.newRequest(ctx, http.MethodGet, path, nil, nil)
	if err != nil {
		return err
	}
	resp, err := c.do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(w, resp.Body); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%s: the stream was cut off: %w", what, err)
	}
	return nil
}

// upload POSTs r's bytes to path and decodes the answer into out (if
// not nil).
func (c *Client) upload(ctx context.Context, path string, r io.Reader, out any) error {
	// The transport closes the body; r is the caller's.
	req, err := c.newRequest(ctx, http.MethodPost, path, nil, io.NopCloser(r))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		return nil
	}
	if err := decodeBody(resp, out); err != nil {
		return fmt.Errorf("reading the daemon's answer to POST %s: %w", path, err)
	}
	return nil
}

// SendSessionImage writes the image build the session was made on to w.
func (c *Client) SendSessionImage(ctx context.Context, name string, w io.Writer) error {
	p, err := sessionPath(name, "/image-bundle")
	if err != nil {
		return err
	}
	return c.download(ctx, p, "send the image of session "+name, w)
}

// ReceiveImage has the daemon store the image build read from r.
func (c *Client) ReceiveImage(ctx context.Context, r io.Reader) error {
	return c.upload(ctx, "/v1/moves/images", r, nil)
}

// ReceiveSession has the daemon stage the bundle read from r.
func (c *Client) ReceiveSession(ctx context.Context, r io.Reader) (session.MoveStaged, error) {
	var out session.MoveStaged
	return out, c.upload(ctx, "/v1/moves", r, &out)
}

// CommitReceived has the daemon make a staged session its own.
func (c *Client) CommitReceived(ctx context.Context, name string) (session.Session, error) {
	var out session.Session
	n, err := seg("session name", name)
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, http.MethodPost, "/v1/moves/"+n+"/commit", nil, nil, &out)
}

// DiscardReceived has the daemon remove a staged session.
func (c *Client) DiscardReceived(ctx context.Context, name string) error {
	n, err := seg("session name", name)
	if err != nil {
		return err
	}
	return c.call(ctx, http.MethodDelete, "/v1/moves/"+n, nil, nil, nil)
}

// DropSent has the daemon remove its copy of a session moved away.
func (c *Client) DropSent(ctx context.Context, name string) error {
	p, err := sessionPath(name, "/drop")
	if err != nil {
		return err
	}
	return c.call(ctx, http.MethodPost, p, nil, nil, nil)
}

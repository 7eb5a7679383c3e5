package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"strings"
	"sync"

	"github.com/berthvm/berth/session"
)

// workspacePath turns a workspace path (relative to /workspace, or
// absolute under it) into the escaped URL form "seg/seg", "" for the root.
// Dot segments are resolved here, because a URL path cannot carry them.
func workspacePath(p string) (string, error) {
	full := p
	if !path.IsAbs(p) {
		full = "/workspace/" + p
	}
	full = path.Clean(full)
	if full == "/workspace" {
		return "", nil
	}
	if !strings.HasPrefix(full, "/workspace/") {
		return "", session.OutsideWorkspace(p)
	}
	parts := strings.Split(strings.TrimPrefix(full, "/workspace/"), "/")
	for i, s := range parts {
		parts[i] = url.PathEscape(s)
	}
	return strings.Join(parts, "/"), nil
}

func filePath(name, p string) (string, error) {
	rel, err := workspacePath(p)
	if err != nil {
		return "", err
	}
	return sessionPath(name, "/files/"+rel)
}

// ListDir lists a workspace directory.
func (c *Client) ListDir(ctx context.Context, name, p string) ([]session.FileInfo, error) {
	u, err := filePath(name, p)
	if err != nil {
		return nil, err
	}
	var out []session.FileInfo
	return out, c.call(ctx, http.MethodGet, u, url.Values{"op": {"list"}}, nil, &out)
}

// Stat describes a workspace file.
func (c *Client) Stat(ctx context.Context, name, p string) (session.FileInfo, error) {
	var out session.FileInfo
	u, err := filePath(name, p)
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, http.MethodGet, u, url.Values{"op": {"stat"}}, nil, &out)
}

// ReadFile streams a workspace file. A transfer cut short reads as an
// error, never as a short file. Close the reader; ctx bounds the transfer.
func (c *Client) ReadFile(ctx context.Context, name, p string) (io.ReadCloser, error) {
	u, err := filePath(name, p)
	if err != nil {
		return nil, err
	}
	req, err := c.newRequest(ctx, http.MethodGet, u, nil, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.do(req)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// WriteFile streams r into a workspace file; it returns once the file is
// durable. r is read to its end but not closed.
func (c *Client) WriteFile(ctx context.Context, name, p string, r io.Reader) (int64, error) {
	u, err := filePath(name, p)
	if err != nil {
		return 0, err
	}
	// NopCloser: the transport closes the body, and r is the caller's.
	req, err := c.newRequest(ctx, http.MethodPut, u, nil, io.NopCloser(r))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var w written
	if err := decodeJSON(resp.Body, &w); err != nil {
		return 0, fmt.Errorf("write %s: reading the daemon's answer: %w", p, err)
	}
	return w.Written, nil
}

// Mkdir makes a workspace directory and its missing parents.
func (c *Client) Mkdir(ctx context.Context, name, p string) error {
	u, err := filePath(name, p)
	if err != nil {
		return err
	}
	return c.call(ctx, http.MethodPost, u, url.Values{"op": {"mkdir"}}, nil, nil)
}

// Remove deletes a workspace file or directory tree.
func (c *Client) Remove(ctx context.Context, name, p string) error {
	u, err := filePath(name, p)
	if err != nil {
		return err
	}
	return c.call(ctx, http.MethodDelete, u, nil, nil, nil)
}

// Rename moves a workspace file or directory.
func (c *Client) Rename(ctx context.Context, name, from, to string) error {
	u, err := filePath(name, from)
	if err != nil {
		return err
	}
	if _, err := workspacePath(to); err != nil {
		return err
	}
	return c.call(ctx, http.MethodPost, u, url.Values{"op": {"rename"}, "to": {to}}, nil, nil)
}

func treePath(name, p string) (string, error) {
	rel, err := workspacePath(p)
	if err != nil {
		return "", err
	}
	return sessionPath(name, "/tree/"+rel)
}

// CopyIn streams the tar r into the workspace directory dir and returns
// once the daemon made every file durable. r is read to its end (or until
// the daemon refuses an entry) but not closed; once CopyIn returned it is
// not read again.
func (c *Client) CopyIn(ctx context.Context, name, dir string, r io.Reader) (session.CopyResult, error) {
	var out session.CopyResult
	u, err := treePath(name, dir)
	if err != nil {
		return out, err
	}
	src := &uploadSource{r: r}
	defer src.stop()
	// The transport closes the body, and r is the caller's: no Close.
	req, err := c.newRequest(ctx, http.MethodPut, u, nil, io.NopCloser(src))
	if err != nil {
		return out, err
	}
	req.Header.Set("Content-Type", "application/x-tar")
	resp, err := c.do(req)
	if err != nil {
		if rerr := src.failed(); rerr != nil && ctx.Err() == nil {
			return out, fmt.Errorf("copy into %s: reading the tar: %w", dir, rerr)
		}
		return out, err
	}
	defer resp.Body.Close()
	if err := decodeBody(resp, &out); err != nil {
		return out, fmt.Errorf("copy into %s: reading the daemon's answer: %w", dir, err)
	}
	return out, nil
}

// uploadSource is the caller's reader as a request body. The transport
// may go on reading a body after the answer came (a refusal answered
// before the upload ended); once stopped, the source refuses reads, so
// the caller's reader is its own again when CopyIn returns (but for a
// read in flight then).
type uploadSource struct {
	r       io.Reader
	mu      sync.Mutex
	err     error
	stopped bool
}

var errUploadStopped = errors.New("upload ended")

func (u *uploadSource) Read(p []byte) (int, error) {
	u.mu.Lock()
	stopped := u.stopped
	u.mu.Unlock()
	if stopped {
		return 0, errUploadStopped
	}
	n, err := u.r.Read(p)
	if err != nil && err != io.EOF {
		u.mu.Lock()
		if u.err == nil {
			u.err = err
		}
		u.mu.Unlock()
	}
	return n, err
}

func (u *uploadSource) stop() {
	u.mu.Lock()
	u.stopped = true
	u.mu.Unlock()
}

// failed returns the error reading the caller's reader, if any.
func (u *uploadSource) failed() error {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.err
}

// CopyOut streams the workspace file or tree at p as a tar. An error the
// daemon meets after the stream began, or a stream cut off, is returned
// by Read (never io.EOF after a short tar). Close the reader; ctx bounds
// the transfer.
func (c *Client) CopyOut(ctx context.Context, name, p string) (io.ReadCloser, error) {
	u, err := treePath(name, p)
	if err != nil {
		return nil, err
	}
	req, err := c.newRequest(ctx, http.MethodGet, u, nil, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.do(req)
	if err != nil {
		return nil, err
	}
	return &tarStream{ctx: ctx, resp: resp, path: p}, nil
}

// tarStream reads a tar response and checks its trailer at the end.
type tarStream struct {
	ctx  context.Context
	resp *http.Response
	path string
	err  error // sticky
}

func (t *tarStream) Read(p []byte) (int, error) {
	if t.err != nil {
		return 0, t.err
	}
	n, err := t.resp.Body.Read(p)
	switch {
	case err == nil:
	case err == io.EOF:
		err = t.end()
	case t.ctx.Err() != nil:
		err = t.ctx.Err()
	default:
		err = fmt.Errorf("copy out of %s: the daemon's stream was cut off: %w: %w", t.path, session.ErrUnavailable, err)
	}
	t.err = err
	return n, err
}

// end returns io.EOF for a stream the daemon ended as complete, else the
// error it sent or one saying the stream was cut off.
func (t *tarStream) end() error {
	if e := t.resp.Trailer.Get(trailerError); e != "" {
		var body errorBody
		if json.Unmarshal([]byte(e), &body) != nil || body.Error == "" {
			body = errorBody{Error: fmt.Sprintf("copy out of %s failed: the daemon said %q", t.path, e)}
		}
		return fromWire(http.StatusInternalServerError, body)
	}
	if t.resp.Trailer.Get(trailerEnd) != "ok" {
		return fmt.Errorf("copy out of %s: the daemon's stream ended without its end mark: %w", t.path, session.ErrUnavailable)
	}
	return io.EOF
}

func (t *tarStream) Close() error { return t.resp.Body.Close() }

package api

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"strings"

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
		return "", fmt.Errorf("path %q is outside /workspace: %w", p, session.ErrInvalid)
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

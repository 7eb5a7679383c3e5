package api

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"

	"github.com/berthvm/berth/session"
)

// Images lists the image builds on the daemon's host.
func (c *Client) Images(ctx context.Context) ([]session.ImageInfo, error) {
	var out []session.ImageInfo
	return out, c.call(ctx, http.MethodGet, "/v1/images", nil, nil, &out)
}

// RemoveImage deletes every build of an image; the daemon refuses while a
// session uses it.
func (c *Client) RemoveImage(ctx context.Context, name string) error {
	n, err := seg("image name", name)
	if err != nil {
		return err
	}
	return c.call(ctx, http.MethodDelete, "/v1/images/"+n, nil, nil, nil)
}

// CommitImage has the daemon make a session's system disk an image. The
// request is checked here first, as the daemon checks it.
func (c *Client) CommitImage(ctx context.Context, req session.CommitRequest) (session.CommitResult, error) {
	var out session.CommitResult
	if err := req.Validate(); err != nil {
		return out, err
	}
	n, err := seg("image name", req.Image)
	if err != nil {
		return out, err
	}
	body := struct {
		Session string `json:"session"`
		Label   string `json:"label,omitempty"`
	}{req.Session, req.Label}
	return out, c.call(ctx, http.MethodPost, "/v1/images/"+n+"/commit", nil, body, &out)
}

// BuildImage has the daemon build an image, calling progress (if not nil)
// for each step as the daemon reports it, from the calling goroutine. A
// relative recipe path is made absolute here: the daemon runs on this
// host but not in this directory. Ending ctx cancels the build.
func (c *Client) BuildImage(ctx context.Context, req session.BuildRequest, progress func(session.BuildProgress)) (session.ImageInfo, error) {
	if req.Recipe != "" && !filepath.IsAbs(req.Recipe) {
		abs, err := filepath.Abs(req.Recipe)
		if err != nil {
			return session.ImageInfo{}, fmt.Errorf("recipe %s: %w", req.Recipe, err)
		}
		req.Recipe = abs
	}
	hr, err := c.newRequest(ctx, http.MethodPost, "/v1/images", nil, bytes.NewReader(frame(req)))
	if err != nil {
		return session.ImageInfo{}, err
	}
	hr.Header.Set("Content-Type", "application/json")
	return c.buildStream(ctx, hr, "build image", progress)
}

// ImportImage has the daemon import a container image, calling progress
// (if not nil) for each step as the daemon reports it, from the calling
// goroutine. A path source is made absolute here and read by the daemon,
// on this host; for "-" src is sent as the request body while progress
// comes back. Ending ctx cancels the import. The transport reads src in
// a goroutine of its own until src ends or the call does; a read of src
// still blocked then (a terminal's stdin) ends when src next returns.
func (c *Client) ImportImage(ctx context.Context, req session.ImportRequest, src io.Reader, progress func(session.BuildProgress)) (session.ImageInfo, error) {
	if req.Source != "" && req.Source != session.ImportStdin && !filepath.IsAbs(req.Source) {
		abs, err := filepath.Abs(req.Source)
		if err != nil {
			return session.ImageInfo{}, fmt.Errorf("source %s: %w", req.Source, err)
		}
		req.Source = abs
	}
	if err := req.Validate(src != nil); err != nil {
		return session.ImageInfo{}, err
	}
	n, err := seg("image name", req.Name)
	if err != nil {
		return session.ImageInfo{}, err
	}
	q := url.Values{"source": {req.Source}}
	if req.Ref != "" {
		q.Set("ref", req.Ref)
	}
	var body io.Reader = http.NoBody
	if src != nil {
		body = io.NopCloser(src) // the transport closes the body; src is the caller's
	}
	hr, err := c.newRequest(ctx, http.MethodPost, "/v1/images/"+n+"/import", q, body)
	if err != nil {
		return session.ImageInfo{}, err
	}
	if src != nil {
		hr.Header.Set("Content-Type", "application/octet-stream")
	}
	return c.buildStream(ctx, hr, "import image", progress)
}

// buildStream sends a build's or an import's request and follows its
// NDJSON answer (buildFrame) to the image or the error.
func (c *Client) buildStream(ctx context.Context, hr *http.Request, what string, progress func(session.BuildProgress)) (session.ImageInfo, error) {
	resp, err := c.do(hr)
	if err != nil {
		return session.ImageInfo{}, err
	}
	defer resp.Body.Close()
	in := newFrameReader(resp.Body)
	for {
		var f buildFrame
		if err := in.next(&f); err != nil {
			if ctx.Err() != nil {
				return session.ImageInfo{}, ctx.Err()
			}
			return session.ImageInfo{}, fmt.Errorf("%s: the daemon's stream ended without a result (%v): %w", what, err, session.ErrUnavailable)
		}
		switch {
		case f.Error != nil:
			return session.ImageInfo{}, fromWire(http.StatusInternalServerError, *f.Error)
		case f.Image != nil:
			return *f.Image, nil
		case f.Progress != nil && progress != nil:
			progress(*f.Progress)
		}
	}
}

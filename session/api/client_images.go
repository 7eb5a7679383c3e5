package api

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
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
			return session.ImageInfo{}, fmt.Errorf("build image: the daemon's stream ended without a result (%v): %w", err, session.ErrUnavailable)
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

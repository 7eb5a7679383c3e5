package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
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

// ExportImage has the daemon export a build of an image: progress (if
// not nil) for each step it reports while preparing, then open with the
// export's description, then the tarball's bytes written to what open
// returned, with progress by layer as they arrive. An error from open
// ends the call, and with it the daemon's export. A tarball cut short
// is an error, with the daemon's reason when it sent one.
func (c *Client) ExportImage(ctx context.Context, req session.ExportRequest, open func(session.ImageExport) (io.Writer, error), progress func(session.BuildProgress)) (session.ImageExport, error) {
	if progress == nil {
		progress = func(session.BuildProgress) {}
	}
	if err := req.Validate(); err != nil {
		return session.ImageExport{}, err
	}
	n, err := seg("image name", req.Name)
	if err != nil {
		return session.ImageExport{}, err
	}
	var q url.Values
	if req.Digest != "" {
		q = url.Values{"digest": {req.Digest}}
	}
	hr, err := c.newRequest(ctx, http.MethodGet, "/v1/images/"+n+"/export", q, nil)
	if err != nil {
		return session.ImageExport{}, err
	}
	resp, err := c.do(hr)
	if err != nil {
		return session.ImageExport{}, err
	}
	defer resp.Body.Close()
	in := newFrameReader(resp.Body)
	var x session.ImageExport
	for {
		var f exportFrame
		if err := in.next(&f); err != nil {
			if ctx.Err() != nil {
				return session.ImageExport{}, ctx.Err()
			}
			return session.ImageExport{}, fmt.Errorf("export image %s: the daemon's stream ended without the export (%v): %w", req.Name, err, session.ErrUnavailable)
		}
		if f.Error != nil {
			return session.ImageExport{}, fromWire(http.StatusInternalServerError, *f.Error)
		}
		if f.Progress != nil {
			progress(*f.Progress)
		}
		if f.Export != nil {
			x = *f.Export
			break
		}
	}
	if x.Size < 0 {
		return x, fmt.Errorf("export image %s: the daemon said the tarball is %d bytes: %w", req.Name, x.Size, session.ErrUnavailable)
	}
	w, err := open(x)
	if err != nil {
		return x, err
	}
	pw := &exportProgress{w: w, x: x, progress: progress}
	got, err := io.Copy(pw, faultReader{io.LimitReader(in.r, x.Size)})
	if err != nil && ctx.Err() != nil {
		return x, ctx.Err()
	}
	if err != nil && !errors.As(err, new(*readFault)) {
		return x, err // the writer's: the output's own error
	}
	// The rest of the stream (nothing, or what a bad daemon adds) up to
	// its trailer, which says whether the bytes were whole.
	io.Copy(io.Discard, io.LimitReader(in.r, 1<<20))
	if e := resp.Trailer.Get(trailerError); e != "" {
		var body errorBody
		if json.Unmarshal([]byte(e), &body) != nil || body.Error == "" {
			body = errorBody{Error: fmt.Sprintf("export image %s failed: the daemon said %q", req.Name, e)}
		}
		return x, fromWire(http.StatusInternalServerError, body)
	}
	if got != x.Size || resp.Trailer.Get(trailerEnd) != "ok" {
		return x, fmt.Errorf("export image %s: the daemon's stream was cut off after %d of %d bytes: %w", req.Name, got, x.Size, session.ErrUnavailable)
	}
	progress(x.ProgressAt(x.Size))
	return x, nil
}

// readFault marks an error reading the daemon's stream, not writing
// the output.
type readFault struct{ err error }

func (r *readFault) Error() string { return r.err.Error() }
func (r *readFault) Unwrap() error { return r.err }

type faultReader struct{ r io.Reader }

func (f faultReader) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if err != nil && err != io.EOF {
		err = &readFault{err}
	}
	return n, err
}

// exportProgress writes an export's bytes, reporting progress as
// session.ReportExport says.
type exportProgress struct {
	w        io.Writer
	x        session.ImageExport
	n, next  int64
	progress func(session.BuildProgress)
}

func (p *exportProgress) Write(b []byte) (int, error) {
	n, err := p.w.Write(b)
	p.n += int64(n)
	p.next = session.ReportExport(p.x, p.n, p.next, p.progress)
	return n, err
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

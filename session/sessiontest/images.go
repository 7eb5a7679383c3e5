package sessiontest

import (
	"context"
	"fmt"
	"io"
	"slices"

	"github.com/berthvm/berth/session"
)

// The fake has images only by name (Options.Images): it lists them and
// builds, imports, exports or removes none, saying so.

func errNoBuilds(op string) error {
	return &session.Error{Class: session.ErrUnsupported, Msg: op + ": the fake builds and removes no images", Hint: "give the images it has in Options.Images"}
}

// Images lists the images Create accepts, each current.
func (f *Fake) Images(ctx context.Context) ([]session.ImageInfo, error) {
	if err := f.enter(ctx, "Images"); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []session.ImageInfo
	for _, name := range f.opts.Images {
		im := session.ImageInfo{Name: name, Digest: "fake", Current: true, Source: "berth"}
		for n, s := range f.sessions {
			if s.info.Image == name {
				im.Sessions = append(im.Sessions, n)
			}
		}
		slices.Sort(im.Sessions)
		out = append(out, im)
	}
	return out, nil
}

// BuildImage builds nothing: it fails with ErrUnsupported.
func (f *Fake) BuildImage(ctx context.Context, req session.BuildRequest, progress func(session.BuildProgress)) (session.ImageInfo, error) {
	if err := f.enter(ctx, "BuildImage"); err != nil {
		return session.ImageInfo{}, err
	}
	return session.ImageInfo{}, errNoBuilds("build image " + req.Name)
}

// ImportImage imports nothing: it fails with ErrUnsupported, reading
// nothing of src.
func (f *Fake) ImportImage(ctx context.Context, req session.ImportRequest, src io.Reader, progress func(session.BuildProgress)) (session.ImageInfo, error) {
	if err := f.enter(ctx, "ImportImage"); err != nil {
		return session.ImageInfo{}, err
	}
	return session.ImageInfo{}, &session.Error{Class: session.ErrUnsupported, Msg: "import image " + req.Name + ": the fake imports no images", Hint: "give the images it has in Options.Images"}
}

// RemoveImage removes nothing: it fails with ErrUnsupported.
func (f *Fake) RemoveImage(ctx context.Context, name string) error {
	if err := f.enter(ctx, "RemoveImage"); err != nil {
		return err
	}
	return errNoBuilds("remove image " + name)
}

// ExportImage exports nothing: an image the fake knows fails with
// ErrUnsupported (it has no bytes to write), one it does not with
// ErrNotFound, as the engine would.
func (f *Fake) ExportImage(ctx context.Context, req session.ExportRequest, open func(session.ImageExport) (io.Writer, error), progress func(session.BuildProgress)) (session.ImageExport, error) {
	if err := f.enter(ctx, "ExportImage"); err != nil {
		return session.ImageExport{}, err
	}
	if err := req.Validate(); err != nil {
		return session.ImageExport{}, err
	}
	if !slices.Contains(f.opts.Images, req.Name) {
		return session.ImageExport{}, &session.Error{Class: session.ErrNotFound, Field: session.FieldImage, Msg: fmt.Sprintf("%q does not exist here", req.Name), Hint: "list the images there are"}
	}
	return session.ImageExport{}, &session.Error{Class: session.ErrUnsupported, Msg: "export image " + req.Name + ": the fake has no image bytes to export"}
}

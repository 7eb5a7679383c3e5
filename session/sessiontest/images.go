package sessiontest

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/berthvm/berth/session"
)

// The fake has images by name (Options.Images): it lists them, and builds,
// imports, exports or removes none of them, saying so. Commits it does keep: an
// image committed from a session (which has no system disk here, so the
// image holds nothing of it) is listed with its parent, sessions can be
// created from it, and it can be removed while nothing uses it.

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
		if c, ok := f.committed[name]; ok {
			im = c
		}
		im.Sessions = f.imageSessionsLocked(name)
		out = append(out, im)
	}
	return out, nil
}

func (f *Fake) imageSessionsLocked(name string) []string {
	var out []string
	for n, s := range f.sessions {
		if s.info.Image == name {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
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

// CommitImage makes an image of a session as the daemon does, with the
// same refusals: an unknown session, a state the action table does not
// allow, a name an image not committed has. The image captures nothing
// (the fake's sessions have no system disk).
func (f *Fake) CommitImage(ctx context.Context, req session.CommitRequest) (session.CommitResult, error) {
	if err := f.enter(ctx, "CommitImage"); err != nil {
		return session.CommitResult{}, err
	}
	if err := req.Validate(); err != nil {
		return session.CommitResult{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.sessions[req.Session]
	if !ok || s.info.State == session.StateDeleting {
		return session.CommitResult{}, session.UnknownSession(req.Session)
	}
	if _, ok := f.committed[req.Image]; !ok && slices.Contains(f.opts.Images, req.Image) {
		return session.CommitResult{}, &session.Error{Class: session.ErrExists, Field: session.FieldNewImage,
			Msg: fmt.Sprintf("%q exists already, from berth", req.Image), Hint: "remove that image first or choose another name"}
	}
	if err := session.CheckTransition(req.Session, session.ActionCommitImage, s.info.State); err != nil {
		return session.CommitResult{}, err
	}
	digest := "fake"
	if c, ok := f.committed[s.info.Image]; ok {
		digest = c.Digest
	}
	res := session.CommitResult{Parent: s.info.Image + "@" + digest, Copy: "sparse copy", Took: time.Millisecond, State: s.info.State}
	if s.info.State == session.StateRunning {
		res.Frozen = time.Millisecond
	}
	if f.committed == nil {
		f.committed = map[string]session.ImageInfo{}
	}
	f.commitSeq++
	res.Image = session.ImageInfo{Name: req.Image, Digest: fmt.Sprintf("commit%d", f.commitSeq), Current: true, RootFS: true, Layers: 1,
		Built: f.now(), Source: "session:" + req.Session, Parent: res.Parent, Label: req.Label}
	f.committed[req.Image] = res.Image
	if !slices.Contains(f.opts.Images, req.Image) {
		f.opts.Images = append(f.opts.Images, req.Image)
	}
	res.Image.Sessions = f.imageSessionsLocked(req.Image)
	f.publishLocked(ctx, s, session.Event{Kind: session.EventNote, Message: fmt.Sprintf("system disk committed as image %s@%s on %s", req.Image, res.Image.Digest, res.Parent)})
	return res, nil
}

// RemoveImage removes an image the fake committed, refused as the
// daemon refuses it while sessions or images built on it use it;
// any other image it does not remove (ErrUnsupported).
func (f *Fake) RemoveImage(ctx context.Context, name string) error {
	if err := f.enter(ctx, "RemoveImage"); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.committed[name]; !ok {
		return errNoBuilds("remove image " + name)
	}
	users := f.imageSessionsLocked(name)
	var children []string
	for n, c := range f.committed {
		if parent, _, _ := strings.Cut(c.Parent, "@"); parent == name && n != name {
			children = append(children, n)
		}
	}
	slices.Sort(children)
	if len(users) > 0 || len(children) > 0 {
		return session.ImageInUse(name, users, children)
	}
	delete(f.committed, name)
	f.opts.Images = slices.DeleteFunc(f.opts.Images, func(n string) bool { return n == name })
	return nil
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

package api_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/sessiontest"
)

// imaging is a Service that is also a session.Imager, driven by the test.
type imaging struct {
	session.Service
	build  func(ctx context.Context, req session.BuildRequest, progress func(session.BuildProgress)) (session.ImageInfo, error)
	imp    func(ctx context.Context, req session.ImportRequest, src io.Reader, progress func(session.BuildProgress)) (session.ImageInfo, error)
	exp    func(ctx context.Context, req session.ExportRequest, open func(session.ImageExport) (io.Writer, error), progress func(session.BuildProgress)) (session.ImageExport, error)
	mu     sync.Mutex
	images []session.ImageInfo
}

var _ session.Imager = (*imaging)(nil)

func (im *imaging) Images(context.Context) ([]session.ImageInfo, error) {
	im.mu.Lock()
	defer im.mu.Unlock()
	return slices.Clone(im.images), nil
}

func (im *imaging) BuildImage(ctx context.Context, req session.BuildRequest, progress func(session.BuildProgress)) (session.ImageInfo, error) {
	return im.build(ctx, req, progress)
}

func (im *imaging) ImportImage(ctx context.Context, req session.ImportRequest, src io.Reader, progress func(session.BuildProgress)) (session.ImageInfo, error) {
	return im.imp(ctx, req, src, progress)
}

func (im *imaging) ExportImage(ctx context.Context, req session.ExportRequest, open func(session.ImageExport) (io.Writer, error), progress func(session.BuildProgress)) (session.ImageExport, error) {
	return im.exp(ctx, req, open, progress)
}

func (im *imaging) RemoveImage(_ context.Context, name string) error {
	im.mu.Lock()
	defer im.mu.Unlock()
	i := slices.IndexFunc(im.images, func(info session.ImageInfo) bool { return info.Name == name })
	switch {
	case i < 0:
		return fmt.Errorf("image %q: %w", name, session.ErrNotFound)
	case len(im.images[i].Sessions) > 0:
		return fmt.Errorf("image %q is used by %s: %w", name, strings.Join(im.images[i].Sessions, ", "), session.ErrConflict)
	}
	im.images = slices.Delete(im.images, i, i+1)
	return nil
}

func TestImagesAndRemove(t *testing.T) {
	built := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	im := &imaging{images: []session.ImageInfo{
		{Name: "debian", Digest: "d1", Current: true, RootFS: true, Layers: 1, Packages: 123, DiskBytes: 300 << 20, Built: built, BuildTook: 20 * time.Second, Source: "berth", Sessions: []string{"a", "b"}},
		{Name: "mini", Digest: "m1", Current: true, Built: built, Source: "berth", Sessions: []string{}},
	}}
	h := start(t, im)
	ctx := t.Context()
	list, err := h.client.Images(ctx)
	if err != nil || len(list) != 2 || list[0].Name != "debian" || list[0].Packages != 123 || !list[0].Built.Equal(built) ||
		list[0].BuildTook != 20*time.Second || !slices.Equal(list[0].Sessions, []string{"a", "b"}) {
		t.Fatalf("Images = %+v, %v", list, err)
	}
	err = h.client.RemoveImage(ctx, "debian")
	wantClass(t, "RemoveImage in use", err, session.ErrConflict)
	if err != nil && !strings.Contains(err.Error(), "a, b") {
		t.Errorf("RemoveImage in use: %q does not name the sessions", err)
	}
	wantClass(t, "RemoveImage missing", h.client.RemoveImage(ctx, "nope"), session.ErrNotFound)
	wantClass(t, "RemoveImage ..", h.client.RemoveImage(ctx, ".."), session.ErrInvalid)
	if err := h.client.RemoveImage(ctx, "mini"); err != nil {
		t.Fatalf("RemoveImage: %v", err)
	}
	if list, err := h.client.Images(ctx); err != nil || len(list) != 1 {
		t.Errorf("after RemoveImage, Images = %+v, %v", list, err)
	}
}

// Progress reaches the client as it happens, not when the build ends.
func TestBuildImageStreamsProgress(t *testing.T) {
	seen := make(chan session.BuildProgress)
	var got session.BuildRequest
	im := &imaging{build: func(ctx context.Context, req session.BuildRequest, progress func(session.BuildProgress)) (session.ImageInfo, error) {
		got = req
		for i := 1; i <= 3; i++ {
			p := session.BuildProgress{Phase: "download", Done: i, Total: 3, Bytes: int64(i) << 20, TotalBytes: 3 << 20}
			progress(p)
			select { // the client must have it before the build goes on
			case c := <-seen:
				if c != p {
					return session.ImageInfo{}, fmt.Errorf("the client saw %+v, want %+v", c, p)
				}
			case <-time.After(5 * time.Second):
				return session.ImageInfo{}, errors.New("progress did not reach the client while the build ran")
			}
		}
		return session.ImageInfo{Name: "debian", Digest: "d2", Current: true, RootFS: true}, nil
	}}
	h := start(t, im)
	info, err := h.client.BuildImage(t.Context(), session.BuildRequest{Name: "debian"}, func(p session.BuildProgress) { seen <- p })
	if err != nil || info.Name != "debian" || info.Digest != "d2" || got.Name != "debian" {
		t.Fatalf("BuildImage = %+v, %v (the daemon got %+v)", info, err, got)
	}

	// A relative recipe path is the caller's: the client makes it absolute.
	wd, _ := os.Getwd()
	im.build = func(_ context.Context, req session.BuildRequest, _ func(session.BuildProgress)) (session.ImageInfo, error) {
		got = req
		return session.ImageInfo{Name: "mine"}, nil
	}
	if _, err := h.client.BuildImage(t.Context(), session.BuildRequest{Recipe: "recipes/mine.toml"}, nil); err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(wd, "recipes/mine.toml"); got.Recipe != want {
		t.Errorf("the daemon got recipe %q, want %q", got.Recipe, want)
	}
}

func TestBuildImageErrors(t *testing.T) {
	for _, class := range []error{session.ErrInvalid, session.ErrExists, session.ErrNotFound, session.ErrUnavailable} {
		t.Run(class.Error(), func(t *testing.T) {
			want := fmt.Errorf("setup step 2 of 3 (`apt-get install nope`) exited with code 100: E: Unable to locate package nope: %w", class)
			var calls int
			im := &imaging{build: func(_ context.Context, _ session.BuildRequest, progress func(session.BuildProgress)) (session.ImageInfo, error) {
				progress(session.BuildProgress{Phase: "setup", Line: "$ apt-get install nope"})
				return session.ImageInfo{}, want
			}}
			h := start(t, im)
			_, err := h.client.BuildImage(t.Context(), session.BuildRequest{Name: "x"}, func(session.BuildProgress) { calls++ })
			wantClass(t, "BuildImage", err, class)
			if err == nil || err.Error() != want.Error() || calls != 1 {
				t.Errorf("BuildImage = %v after %d progress calls, want %q after 1", err, calls, want)
			}
		})
	}
}

// A client that goes away cancels the build.
func TestBuildImageCancelledByClient(t *testing.T) {
	buildCtx := make(chan error, 1)
	im := &imaging{build: func(ctx context.Context, _ session.BuildRequest, progress func(session.BuildProgress)) (session.ImageInfo, error) {
		progress(session.BuildProgress{Phase: "resolve"})
		select {
		case <-ctx.Done():
			buildCtx <- ctx.Err()
			return session.ImageInfo{}, ctx.Err()
		case <-time.After(10 * time.Second):
			buildCtx <- nil
			return session.ImageInfo{}, errors.New("not cancelled")
		}
	}}
	h := start(t, im)
	check := goroutinesBack(t)
	ctx, cancel := context.WithCancel(t.Context())
	_, err := h.client.BuildImage(ctx, session.BuildRequest{Name: "debian"}, func(session.BuildProgress) { cancel() })
	if !errors.Is(err, context.Canceled) {
		t.Errorf("BuildImage after cancel = %v, want context.Canceled", err)
	}
	select {
	case err := <-buildCtx:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("the daemon's build context: %v, want cancelled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the build went on after its client went away")
	}
	h.client.Close()
	check()
}

// A Service that builds no images (the fake) says so with its own class,
// across the socket too; it still lists the images it has.
func TestImagesUnsupported(t *testing.T) {
	h := start(t, nil)
	ctx := t.Context()
	if list, err := h.client.Images(ctx); err != nil || len(list) == 0 {
		t.Errorf("Images = %v, %v; want the fake's", list, err)
	}
	_, err := h.client.BuildImage(ctx, session.BuildRequest{Name: "debian"}, nil)
	wantClass(t, "BuildImage", err, session.ErrUnsupported)
	wantClass(t, "RemoveImage", h.client.RemoveImage(ctx, "debian"), session.ErrUnsupported)
	_, err = h.client.ImportImage(ctx, session.ImportRequest{Name: "app", Source: "-"}, strings.NewReader("not read"), nil)
	wantClass(t, "ImportImage", err, session.ErrUnsupported)
}

// The new routes' bad requests, as a client other than ours sends them.
func TestNewRoutesBadRequests(t *testing.T) {
	fake := sessiontest.New(sessiontest.Options{})
	t.Cleanup(func() { fake.Close() })
	h := start(t, &imaging{Service: fake})
	h.create(t, "a")
	hc := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", h.socket)
		},
	}}
	defer hc.CloseIdleConnections()
	tests := []struct {
		method, path, body string
		status             int
		want               string
	}{
		{"POST", "/v1/images", `{"recipe":"relative.toml"}`, 400, `"class":"invalid"`},
		{"POST", "/v1/images", `{"name":"debian","colour":"red"}`, 400, `"class":"invalid"`},
		{"POST", "/v1/images/app/import?source=rel.tar", "", 400, `"class":"invalid"`},
		{"POST", "/v1/images/app/import?source=/x.tar&colour=red", "", 400, `"class":"invalid"`},
		{"POST", "/v1/images/app/commit", `{"session":"a","image":"other"}`, 400, `"class":"invalid"`},
		{"POST", "/v1/images/app/commit", `{"session":"nope"}`, 404, `"field":"session"`},
		{"POST", "/v1/images/Bad/commit", `{"session":"a"}`, 400, `"field":"new_image"`},
		{"POST", "/v1/sessions/a/replace", `{"image":"mini","force":true}`, 400, `"class":"invalid"`},
		{"POST", "/v1/sessions/a/replace", ``, 200, `"session":{"name":"a","state":"running"`},
		{"POST", "/v1/sessions/a/replace", `{"image":"other"}`, 404, `"class":"not_found"`},
		{"GET", "/v1/sessions/a/tree/missing", "", 404, `"class":"not_found"`},
		{"PUT", "/v1/sessions/a/tree/d", "not a tar at all, but longer than one tar block of 512 bytes" + strings.Repeat(".", 600), 500, `reading the tar`},
	}
	for _, tt := range tests {
		req, _ := http.NewRequest(tt.method, "http://berth"+tt.path, strings.NewReader(tt.body))
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 4096)
		n, _ := resp.Body.Read(b)
		resp.Body.Close()
		if resp.StatusCode != tt.status || !strings.Contains(string(b[:n]), tt.want) {
			t.Errorf("%s %s: %d %s, want %d with %s", tt.method, tt.path, resp.StatusCode, b[:n], tt.status, tt.want)
		}
	}
}

// A client that stops reading (a suspended `berth image build`) never
// holds up the build: the builder reports from inside the engine's build
// lock, so a report that waited on the socket would hold every build.
func TestBuildImageSlowClientDoesNotBlockTheBuild(t *testing.T) {
	built := make(chan time.Duration, 1)
	im := &imaging{build: func(ctx context.Context, _ session.BuildRequest, progress func(session.BuildProgress)) (session.ImageInfo, error) {
		start := time.Now()
		line := strings.Repeat("x", 60<<10)
		for range 2000 { // 120 MB of reports: far beyond any socket buffer
			progress(session.BuildProgress{Phase: "setup", Line: line})
		}
		built <- time.Since(start)
		return session.ImageInfo{Name: "slow", Digest: "s1"}, nil
	}}
	h := start(t, im)
	release := make(chan struct{})
	type answer struct {
		info session.ImageInfo
		err  error
	}
	answered := make(chan answer, 1)
	go func() {
		first := true
		info, err := h.client.BuildImage(t.Context(), session.BuildRequest{Name: "slow"}, func(session.BuildProgress) {
			if first {
				first = false
				<-release // the client stops reading
			}
		})
		answered <- answer{info, err}
	}()
	select {
	case d := <-built:
		t.Logf("the build reported 2000 lines in %s with its client stalled", d)
	case <-time.After(20 * time.Second):
		t.Fatal("the build waited on a client that stopped reading")
	}
	close(release)
	a := <-answered
	if a.err != nil || a.info.Digest != "s1" {
		t.Fatalf("after the client read again: %+v, %v", a.info, a.err)
	}
}

// An import from standard input sends the stream as the request body
// while progress comes back: the daemon reports bytes read before the
// client has sent them all.
func TestImportImageStreamsBothWays(t *testing.T) {
	var got session.ImportRequest
	im := &imaging{imp: func(ctx context.Context, req session.ImportRequest, src io.Reader, progress func(session.BuildProgress)) (session.ImageInfo, error) {
		got = req
		var n int64
		buf := make([]byte, 4)
		for {
			k, err := src.Read(buf)
			n += int64(k)
			if k > 0 {
				progress(session.BuildProgress{Phase: "resolve", Bytes: n})
			}
			if err == io.EOF {
				break
			}
			if err != nil {
				return session.ImageInfo{}, err
			}
		}
		return session.ImageInfo{Name: req.Name, Digest: "i1", Source: "docker-archive:-", SourceDigest: "sha256:abc", Current: true, RootFS: true}, nil
	}}
	h := start(t, im)
	pr, pw := io.Pipe()
	seen := make(chan int64, 16)
	type answer struct {
		info session.ImageInfo
		err  error
	}
	answered := make(chan answer, 1)
	go func() {
		info, err := h.client.ImportImage(t.Context(), session.ImportRequest{Name: "app", Source: "-", Ref: "app:1"}, pr,
			func(p session.BuildProgress) { seen <- p.Bytes })
		answered <- answer{info, err}
	}()
	for i := int64(1); i <= 3; i++ {
		if _, err := pw.Write([]byte("abcd")); err != nil {
			t.Fatal(err)
		}
		select {
		case n := <-seen:
			if n != 4*i {
				t.Fatalf("progress says %d bytes read, want %d", n, 4*i)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("progress did not come back while the stream was still being sent")
		}
	}
	pw.Close()
	a := <-answered
	if a.err != nil || a.info.SourceDigest != "sha256:abc" || a.info.Source != "docker-archive:-" {
		t.Fatalf("ImportImage = %+v, %v", a.info, a.err)
	}
	if got != (session.ImportRequest{Name: "app", Source: "-", Ref: "app:1"}) {
		t.Errorf("the daemon got %+v", got)
	}

	// A path is the caller's: made absolute, and no body is sent.
	wd, _ := os.Getwd()
	im.imp = func(_ context.Context, req session.ImportRequest, src io.Reader, _ func(session.BuildProgress)) (session.ImageInfo, error) {
		got = req
		if src != nil {
			return session.ImageInfo{}, errors.New("a stream came with a path")
		}
		return session.ImageInfo{Name: req.Name}, nil
	}
	if _, err := h.client.ImportImage(t.Context(), session.ImportRequest{Name: "app", Source: "images/app.tar"}, nil, nil); err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(wd, "images/app.tar"); got.Source != want {
		t.Errorf("the daemon got source %q, want %q", got.Source, want)
	}
}

// An import that fails says why with its class, also while the client
// still has bytes to send; the connection stays usable.
func TestImportImageErrors(t *testing.T) {
	want := fmt.Errorf("layer 2 of 3: the source is truncated: %w", session.ErrInvalid)
	im := &imaging{imp: func(_ context.Context, req session.ImportRequest, src io.Reader, progress func(session.BuildProgress)) (session.ImageInfo, error) {
		progress(session.BuildProgress{Phase: "resolve", Line: "reading standard input"})
		io.CopyN(io.Discard, src, 10)
		return session.ImageInfo{}, want
	}}
	h := start(t, im)
	// More than the daemon reads, in more than one write.
	big := io.MultiReader(strings.NewReader(strings.Repeat("x", 1<<20)), strings.NewReader(strings.Repeat("y", 1<<20)))
	_, err := h.client.ImportImage(t.Context(), session.ImportRequest{Name: "app", Source: "-"}, big, nil)
	wantClass(t, "ImportImage", err, session.ErrInvalid)
	if err == nil || err.Error() != want.Error() {
		t.Errorf("ImportImage = %v, want %q", err, want)
	}
	if _, err := h.client.Images(t.Context()); err != nil {
		t.Errorf("the next call: %v", err)
	}

	// Refused before anything is sent.
	for _, req := range []session.ImportRequest{{Name: "app"}, {Source: "-"}, {Name: "app", Source: "/x", Ref: strings.Repeat("r", 600)}} {
		_, err := h.client.ImportImage(t.Context(), req, strings.NewReader("x"), nil)
		wantClass(t, fmt.Sprintf("ImportImage(%+v)", req.Source), err, session.ErrInvalid)
	}
	_, err = h.client.ImportImage(t.Context(), session.ImportRequest{Name: "app", Source: "-"}, nil, nil)
	wantClass(t, "ImportImage - without a stream", err, session.ErrInvalid)
}

// A client that goes away mid-stream cancels the import.
func TestImportImageCancelledByClient(t *testing.T) {
	importCtx := make(chan error, 1)
	im := &imaging{imp: func(ctx context.Context, _ session.ImportRequest, src io.Reader, progress func(session.BuildProgress)) (session.ImageInfo, error) {
		progress(session.BuildProgress{Phase: "resolve"})
		_, err := io.Copy(io.Discard, src)
		<-ctx.Done()
		importCtx <- err
		return session.ImageInfo{}, ctx.Err()
	}}
	h := start(t, im)
	check := goroutinesBack(t)
	ctx, cancel := context.WithCancel(t.Context())
	pr, pw := io.Pipe()
	defer pw.Close()
	_, err := h.client.ImportImage(ctx, session.ImportRequest{Name: "app", Source: "-"}, pr, func(session.BuildProgress) { cancel() })
	if !errors.Is(err, context.Canceled) {
		t.Errorf("ImportImage after cancel = %v, want context.Canceled", err)
	}
	select {
	case err := <-importCtx:
		if err == nil {
			t.Error("the daemon read the cut-off stream to a clean end")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the import went on after its client went away")
	}
	pw.Close()
	h.client.Close()
	check()
}

// A commit over the socket: the result whole, and each refusal with its
// class, field and code, as the service gave them.
func TestCommitImageOverTheSocket(t *testing.T) {
	h := start(t, nil)
	ctx := t.Context()
	h.create(t, "a")
	res, err := h.client.CommitImage(ctx, session.CommitRequest{Session: "a", Image: "app", Label: "set up"})
	if err != nil || res.Image.Name != "app" || res.Image.Parent != "mini@fake" || res.Image.Label != "set up" || res.Parent != "mini@fake" || res.Copy == "" {
		t.Fatalf("CommitImage = %+v, %v", res, err)
	}
	_, err = h.client.CommitImage(ctx, session.CommitRequest{Session: "missing", Image: "app"})
	if !errors.Is(err, &session.Error{Class: session.ErrNotFound, Field: session.FieldSession}) || strings.Contains(err.Error(), "\n") {
		t.Errorf("CommitImage of an unknown session: %v, want ErrNotFound in field session, one line", err)
	}
	h.create(t, "b")
	if _, err := h.client.Create(ctx, session.CreateOptions{Name: "c", Image: "app"}); err != nil {
		t.Fatal(err)
	}
	err = h.client.RemoveImage(ctx, "app")
	if !errors.Is(err, &session.Error{Class: session.ErrConflict, Code: session.CodeInUse}) || !strings.Contains(err.Error(), "used by c (a session)") {
		t.Errorf("RemoveImage in use: %v, want ErrConflict, code in-use, naming c", err)
	}
	// Checked on the client's side too, before anything is sent.
	_, err = h.client.CommitImage(ctx, session.CommitRequest{Session: "a", Image: "../x"})
	if session.FieldOf(err) != session.FieldNewImage {
		t.Errorf("CommitImage of ../x: %v, want a refusal of the new image's name", err)
	}
}

// TestExportImage: an export's progress, description and bytes cross
// the socket whole; an error before the bytes keeps its class, one after
// them arrives through the trailer, and an output that cannot be opened
// ends the export on both sides.
func TestExportImage(t *testing.T) {
	payload := []byte(strings.Repeat("0123456789abcdef", 1<<16)) // 1 MiB
	desc := session.ImageExport{Name: "app", Digest: "d1", Manifest: "sha256:" + strings.Repeat("a", 64), Size: int64(len(payload)),
		Layers: []session.ExportLayer{{Digest: "sha256:" + strings.Repeat("b", 64), Size: 1000, Offset: 1536}, {Digest: "sha256:" + strings.Repeat("c", 64), Size: 500 << 10, Offset: 3072, Made: true}}}
	var serverErr error
	done := make(chan struct{}, 1)
	im := &imaging{exp: func(ctx context.Context, req session.ExportRequest, open func(session.ImageExport) (io.Writer, error), progress func(session.BuildProgress)) (session.ImageExport, error) {
		defer func() { done <- struct{}{} }()
		switch req.Name {
		case "nope":
			return session.ImageExport{}, &session.Error{Class: session.ErrNotFound, Field: session.FieldImage, Msg: `"nope" does not exist`}
		case "mini":
			return session.ImageExport{}, &session.Error{Class: session.ErrInvalid, Field: session.FieldImage, Msg: `"mini" has no root filesystem layers`}
		}
		if req.Digest != "d1" && req.Digest != "" {
			return session.ImageExport{}, fmt.Errorf("digest %q: %w", req.Digest, session.ErrNotFound)
		}
		progress(session.BuildProgress{Phase: "digest", Done: 2, Total: 2, Line: "reading it once"})
		w, err := open(desc)
		if err != nil {
			return desc, err
		}
		if req.Name == "gone" {
			// The client gave up at open: the request's context ends.
			select {
			case <-ctx.Done():
				serverErr = ctx.Err()
			case <-time.After(20 * time.Second):
			}
			return desc, ctx.Err()
		}
		half := payload[:len(payload)/2]
		if _, err := w.Write(half); err != nil {
			return desc, err
		}
		if req.Name == "broken" {
			return desc, &session.Error{Class: session.ErrInvalid, Msg: "the kept blob sha256:bbbb is corrupt"}
		}
		_, err = w.Write(payload[len(half):])
		return desc, err
	}}
	h := start(t, im)
	ctx := t.Context()

	var got strings.Builder
	var lines []string
	x, err := h.client.ExportImage(ctx, session.ExportRequest{Name: "app", Digest: "d1"}, func(x session.ImageExport) (io.Writer, error) {
		if x.Size != desc.Size || len(x.Layers) != 2 || !x.Layers[1].Made {
			t.Errorf("open got %+v", x)
		}
		return &got, nil
	}, func(p session.BuildProgress) { lines = append(lines, p.Phase+" "+p.Line) })
	<-done
	if err != nil || x.Manifest != desc.Manifest || got.String() != string(payload) {
		t.Fatalf("ExportImage = %+v, %v; %d bytes of %d", x, err, got.Len(), len(payload))
	}
	all := strings.Join(lines, "\n")
	for _, want := range []string{"digest reading it once", "layer 2 of 2 (sha256:cccccccccccc, made from its berth layer)", "done exported image app (d1)"} {
		if !strings.Contains(all, want) {
			t.Errorf("progress does not say %q:\n%s", want, all)
		}
	}

	open := func(session.ImageExport) (io.Writer, error) { return io.Discard, nil }
	_, err = h.client.ExportImage(ctx, session.ExportRequest{Name: "nope"}, open, nil)
	<-done
	wantClass(t, "export of an unknown image", err, session.ErrNotFound)
	_, err = h.client.ExportImage(ctx, session.ExportRequest{Name: "mini"}, open, nil)
	<-done
	wantClass(t, "export of mini", err, session.ErrInvalid)
	_, err = h.client.ExportImage(ctx, session.ExportRequest{Name: "broken"}, open, nil)
	<-done
	wantClass(t, "export failing mid-stream", err, session.ErrInvalid)
	if err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Errorf("export failing mid-stream: %v, want the daemon's reason", err)
	}
	_, err = h.client.ExportImage(ctx, session.ExportRequest{Name: ""}, open, nil)
	wantClass(t, "export without a name", err, session.ErrInvalid)

	// The output cannot be opened: the caller's error, and the export
	// on the daemon's side ends too.
	full := errors.New("no room here")
	_, err = h.client.ExportImage(ctx, session.ExportRequest{Name: "gone"}, func(session.ImageExport) (io.Writer, error) { return nil, full }, nil)
	if !errors.Is(err, full) {
		t.Errorf("open failing: %v, want its error", err)
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the daemon's export went on after the client gave up")
	}
	if serverErr == nil {
		t.Error("the daemon's export went on as if the client were there")
	}
}

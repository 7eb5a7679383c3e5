package api_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/sessiontest"
)

// treeService serves CopyIn and CopyOut as each test needs.
type treeService struct {
	session.Service
	copyIn  func(ctx context.Context, dir string, r io.Reader) (session.CopyResult, error)
	copyOut func(ctx context.Context, p string) (io.ReadCloser, error)
}

func (s treeService) CopyIn(ctx context.Context, _, dir string, r io.Reader) (session.CopyResult, error) {
	return s.copyIn(ctx, dir, r)
}

func (s treeService) CopyOut(ctx context.Context, _, p string) (io.ReadCloser, error) {
	return s.copyOut(ctx, p)
}

// failAfter reads as data, then as err.
func failAfter(data string, err error) io.ReadCloser {
	return io.NopCloser(io.MultiReader(strings.NewReader(data), readErr{err}))
}

type readErr struct{ err error }

func (r readErr) Read([]byte) (int, error) { return 0, r.err }

// An error the service meets once the tar is streaming reaches the
// client's Read with its class and message, never as a clean end.
func TestCopyOutErrorAfterStart(t *testing.T) {
	classes := []error{session.ErrInvalid, session.ErrNotFound, session.ErrPermission, session.ErrConflict, errors.New("unclassified")}
	for _, class := range classes {
		t.Run(class.Error(), func(t *testing.T) {
			want := fmt.Errorf("refusing symlink a → /etc \"x\"\nline two: %w", class)
			h := start(t, treeService{copyOut: func(context.Context, string) (io.ReadCloser, error) {
				return failAfter(strings.Repeat("t", 100<<10), want), nil
			}})
			rc, err := h.client.CopyOut(t.Context(), "demo", "d")
			if err != nil {
				t.Fatal(err)
			}
			defer rc.Close()
			n, err := io.Copy(io.Discard, rc)
			if n != 100<<10 {
				t.Errorf("read %d bytes before the error, want %d", n, 100<<10)
			}
			if err == nil || err.Error() != want.Error() || (class != classes[len(classes)-1] && !errors.Is(err, class)) {
				t.Errorf("Read error = %v, want %q of class %v", err, want, class)
			}
			if _, again := rc.Read(make([]byte, 10)); again == nil || again.Error() != err.Error() {
				t.Errorf("Read after the error = %v, want the same error", again)
			}
		})
	}
}

// A daemon that dies mid-stream (no trailer, no final chunk) is an error
// too, as is a clean stream: EOF.
func TestCopyOutCutOff(t *testing.T) {
	h := start(t, treeService{copyOut: func(_ context.Context, p string) (io.ReadCloser, error) {
		if p == "clean" {
			return io.NopCloser(strings.NewReader("all of it")), nil
		}
		return io.NopCloser(io.MultiReader(strings.NewReader(strings.Repeat("t", 64<<10)), panicReader{})), nil
	}})
	rc, err := h.client.CopyOut(t.Context(), "demo", "cut")
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.Copy(io.Discard, rc)
	rc.Close()
	wantClass(t, "Read of a stream cut off", err, session.ErrUnavailable)

	rc, err = h.client.CopyOut(t.Context(), "demo", "clean")
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || string(b) != "all of it" {
		t.Errorf("clean stream: %q, %v", b, err)
	}
}

// panicReader aborts the handler, as a daemon dying would cut the stream.
type panicReader struct{}

func (panicReader) Read([]byte) (int, error) { panic(http.ErrAbortHandler) }

// CopyIn answers only once the service returned (made the files durable),
// and passes the service's answer through.
func TestCopyInAnswersAfterService(t *testing.T) {
	release := make(chan struct{})
	var got []byte
	h := start(t, treeService{copyIn: func(_ context.Context, dir string, r io.Reader) (session.CopyResult, error) {
		b, err := io.ReadAll(r)
		got = b
		if err != nil || dir != "sub/dir" {
			return session.CopyResult{}, fmt.Errorf("dir %q, body: %v: %w", dir, err, session.ErrInvalid)
		}
		<-release
		return session.CopyResult{Files: 3, Bytes: int64(len(b))}, nil
	}})
	body := sessiontest.Tar(t, sessiontest.TarEntry{Name: "f", Data: "hello"})
	done := make(chan error, 1)
	var res session.CopyResult
	go func() {
		var err error
		res, err = h.client.CopyIn(t.Context(), "demo", "/workspace/sub/dir", bytes.NewReader(body))
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("CopyIn returned before the service did: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if err := <-done; err != nil || res.Files != 3 || res.Bytes != int64(len(body)) {
		t.Fatalf("CopyIn = %+v, %v", res, err)
	}
	if !bytes.Equal(got, body) {
		t.Errorf("the service got %d bytes, want the %d-byte tar", len(got), len(body))
	}
	_, err := h.client.CopyIn(t.Context(), "demo", "../x", bytes.NewReader(body))
	wantClass(t, "CopyIn ../x", err, session.ErrInvalid)
}

// countingReader counts its reads and their bytes.
type countingReader struct {
	r     io.Reader
	reads atomic.Int64
	bytes atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	c.reads.Add(1)
	n, err := c.r.Read(p)
	c.bytes.Add(int64(n))
	return n, err
}

// A refusal the service makes early reaches the client with its class
// while the client is still uploading, and the caller's reader is left
// alone once CopyIn returned.
func TestCopyInRefusedMidUpload(t *testing.T) {
	h := start(t, treeService{copyIn: func(_ context.Context, _ string, r io.Reader) (session.CopyResult, error) {
		io.ReadFull(r, make([]byte, 4096))
		return session.CopyResult{}, fmt.Errorf("refusing tar entry %q: %w", "../evil", session.ErrInvalid)
	}})
	src := &countingReader{r: io.LimitReader(zeros{}, 64<<20)}
	_, err := h.client.CopyIn(t.Context(), "demo", "d", src)
	wantClass(t, "CopyIn refused early", err, session.ErrInvalid)
	if err != nil && !strings.Contains(err.Error(), "../evil") {
		t.Errorf("CopyIn error %q lost the daemon's message", err)
	}
	reads := src.reads.Load()
	time.Sleep(200 * time.Millisecond)
	if later := src.reads.Load(); later > reads+1 {
		t.Errorf("the caller's reader was read %d times after CopyIn returned", later-reads)
	}
	if n := src.bytes.Load(); n >= 64<<20 {
		t.Errorf("the whole 64 MiB was uploaded for a refused copy")
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// A caller's tar that fails mid-way fails CopyIn with that error, and the
// service reads a broken upload, never a clean end it would take for a
// complete (shorter) tree.
func TestCopyInSourceFails(t *testing.T) {
	var mu sync.Mutex
	var serviceErr error
	h := start(t, treeService{copyIn: func(_ context.Context, _ string, r io.Reader) (session.CopyResult, error) {
		_, err := io.Copy(io.Discard, r)
		mu.Lock()
		serviceErr = err
		mu.Unlock()
		if err != nil {
			return session.CopyResult{}, err
		}
		return session.CopyResult{Files: 1}, nil
	}})
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for i := range 64 {
		tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("f%d", i), Mode: 0o644, Size: 1024, Typeflag: tar.TypeReg})
		tw.Write(make([]byte, 1024))
	}
	broken := errors.New("local disk read error")
	src := io.MultiReader(bytes.NewReader(buf.Bytes()[:32<<10]), readErr{broken}) // cut at an entry's edge
	_, err := h.client.CopyIn(t.Context(), "demo", "d", src)
	if !errors.Is(err, broken) {
		t.Errorf("CopyIn = %v, want it to wrap the source's error", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		got := serviceErr
		mu.Unlock()
		if got != nil {
			if errors.Is(got, io.EOF) || got == io.ErrUnexpectedEOF {
				t.Errorf("the service read %v, want an error it cannot take for an end", got)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the service saw the broken upload end cleanly (or not at all)")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

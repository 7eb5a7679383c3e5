package sshd

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pkg/sftp"
	gossh "golang.org/x/crypto/ssh"

	"github.com/berthvm/berth/session"
)

// sftpClient connects as user (the session name) with k.
func (w *world) sftpClient(k testKey, user string) (*sftp.Client, *gossh.Client, error) {
	cfg := w.config(gossh.PublicKeys(k.signer))
	cfg.User = user
	c, err := gossh.Dial("tcp", w.addr, cfg)
	if err != nil {
		return nil, nil, err
	}
	sc, err := sftp.NewClient(c, sftp.UseConcurrentWrites(true), sftp.MaxConcurrentRequestsPerFile(64))
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	return sc, c, nil
}

func (w *world) readFile(name, path string) string {
	w.t.Helper()
	rc, err := w.fake.ReadFile(context.Background(), name, path)
	if err != nil {
		w.t.Fatalf("read %s: %v", path, err)
	}
	defer rc.Close()
	b, _ := io.ReadAll(rc)
	return string(b)
}

// statusCode returns the sftp status behind a client error (the client
// turns some into fs errors).
func statusCode(err error) uint32 {
	switch {
	case errors.Is(err, os.ErrPermission):
		return fxPermissionDenied
	case errors.Is(err, os.ErrNotExist):
		return fxNoSuchFile
	}
	var se *sftp.StatusError
	if errors.As(err, &se) {
		return se.Code
	}
	return 0
}

const (
	fxNoSuchFile       = 2
	fxPermissionDenied = 3
	fxFailure          = 4
	fxOpUnsupported    = 8
)

func TestSFTP(t *testing.T) {
	op := newKey(t, "op", Operator)
	w := newWorld(t, worldOpts{}, op)
	w.create("demo")
	w.fake.WriteFile(context.Background(), "demo", "hello.txt", strings.NewReader("hello\n"))

	sc, c, err := w.sftpClient(op, "demo")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	defer sc.Close()

	if wd, err := sc.Getwd(); err != nil || wd != "/workspace" {
		t.Errorf("Getwd = %q, %v; want /workspace", wd, err)
	}
	ents, err := sc.ReadDir("/workspace")
	if err != nil || len(ents) != 1 || ents[0].Name() != "hello.txt" || ents[0].Size() != 6 {
		t.Errorf("ReadDir = %v, %v", ents, err)
	}

	// A 3 MB upload with concurrent (reordered) writes, and back.
	data := make([]byte, 3<<20+123)
	rand.Read(data)
	f, err := sc.Create("up.bin") // relative: /workspace/up.bin
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadFrom(bytes.NewReader(data)); err != nil {
		t.Fatalf("upload: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("close after upload: %v", err)
	}
	if got := w.readFile("demo", "up.bin"); sha256.Sum256([]byte(got)) != sha256.Sum256(data) {
		t.Fatalf("uploaded content differs (%d bytes, want %d)", len(got), len(data))
	}
	rf, err := sc.Open("/workspace/up.bin")
	if err != nil {
		t.Fatal(err)
	}
	var back bytes.Buffer
	if _, err := rf.WriteTo(&back); err != nil {
		t.Fatalf("download: %v", err)
	}
	rf.Close()
	if !bytes.Equal(back.Bytes(), data) {
		t.Fatalf("downloaded %d bytes, differ from the upload", back.Len())
	}
	if fi, err := sc.Stat("up.bin"); err != nil || fi.Size() != int64(len(data)) {
		t.Errorf("Stat = %v, %v", fi, err)
	}

	// Directories and renames.
	if err := sc.Mkdir("sub"); err != nil {
		t.Fatal(err)
	}
	if err := sc.Mkdir("sub"); statusCode(err) != fxFailure {
		t.Errorf("second Mkdir: %v", err)
	}
	if err := sc.Rename("hello.txt", "sub/hello.txt"); err != nil {
		t.Fatal(err)
	}
	if err := sc.Rename("up.bin", "sub/hello.txt"); statusCode(err) != fxFailure {
		t.Errorf("Rename onto an existing file: %v", err)
	}
	if err := sc.PosixRename("up.bin", "sub/hello.txt"); err != nil {
		t.Errorf("PosixRename onto an existing file: %v", err)
	}
	if err := sc.Remove("sub"); err == nil {
		t.Error("Remove of a directory succeeded")
	}
	if err := sc.RemoveDirectory("sub"); statusCode(err) != fxFailure {
		t.Errorf("RemoveDirectory of a non-empty directory: %v", err)
	}
	if err := sc.Remove("sub/hello.txt"); err != nil {
		t.Fatal(err)
	}
	if err := sc.RemoveDirectory("sub"); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Stat("sub"); statusCode(err) != fxNoSuchFile {
		t.Errorf("Stat of a removed directory: %v", err)
	}
	if err := sc.Chmod("/workspace", 0o777); statusCode(err) != fxOpUnsupported {
		t.Errorf("Chmod: %v", err)
	}
}

// TestSFTPConfinement: nothing outside /workspace can be reached.
func TestSFTPConfinement(t *testing.T) {
	op := newKey(t, "op", Operator)
	w := newWorld(t, worldOpts{}, op)
	w.create("demo")
	sc, c, err := w.sftpClient(op, "demo")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	defer sc.Close()
	for _, p := range []string{"/etc/passwd", "../etc/passwd", "/workspace/../etc/passwd", "/", "..", "/workspace2/x", "/workspacefoo"} {
		if _, err := sc.Stat(p); statusCode(err) != fxPermissionDenied {
			t.Errorf("Stat(%q): %v, want permission denied", p, err)
		}
		if _, err := sc.Open(p); statusCode(err) != fxPermissionDenied {
			t.Errorf("Open(%q): %v, want permission denied", p, err)
		}
		if _, err := sc.Create(p); statusCode(err) != fxPermissionDenied {
			t.Errorf("Create(%q): %v, want permission denied", p, err)
		}
		if _, err := sc.ReadDir(p); statusCode(err) != fxPermissionDenied {
			t.Errorf("ReadDir(%q): %v, want permission denied", p, err)
		}
	}
	if err := sc.Rename("/workspace/x", "/tmp/x"); statusCode(err) != fxPermissionDenied {
		t.Errorf("Rename out: %v", err)
	}
	if err := sc.Symlink("/etc/passwd", "link"); statusCode(err) != fxOpUnsupported {
		t.Errorf("Symlink: %v", err)
	}
	ents, _ := w.fake.ListDir(context.Background(), "demo", ".")
	if len(ents) != 0 {
		t.Errorf("workspace changed: %v", ents)
	}
}

// TestSFTPRoles: a viewer reads but cannot write, refused at open; an
// unknown session name is refused.
func TestSFTPRoles(t *testing.T) {
	viewer := newKey(t, "vera", Viewer)
	w := newWorld(t, worldOpts{}, viewer)
	w.create("demo")
	w.fake.WriteFile(context.Background(), "demo", "f.txt", strings.NewReader("content"))
	sc, c, err := w.sftpClient(viewer, "demo")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	defer sc.Close()
	f, err := sc.Open("f.txt")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(f)
	f.Close()
	if string(b) != "content" {
		t.Errorf("read %q", b)
	}
	if _, err := sc.Create("f.txt"); statusCode(err) != fxPermissionDenied {
		t.Errorf("viewer Create: %v, want permission denied", err)
	}
	if err := sc.Mkdir("d"); statusCode(err) != fxPermissionDenied {
		t.Errorf("viewer Mkdir: %v, want permission denied", err)
	}
	if err := sc.Remove("f.txt"); statusCode(err) != fxPermissionDenied {
		t.Errorf("viewer Remove: %v, want permission denied", err)
	}
	if got := w.readFile("demo", "f.txt"); got != "content" {
		t.Errorf("content %q after a viewer's writes", got)
	}
	if _, c2, err := w.sftpClient(viewer, "nosuch"); err == nil {
		c2.Close()
		t.Error("sftp to an unknown session started")
	}
}

// gatedWrites lets a test stop an upload halfway: WriteFile's reader
// blocks once after bytes until release is closed. WriteFile runs with a
// context that never ends, so only the data stream can fail it.
type gatedWrites struct {
	session.Service
	after   int64
	reached chan struct{}
	release chan struct{}
	results chan error
	once    sync.Once
}

func newGatedWrites(svc session.Service, after int64) *gatedWrites {
	return &gatedWrites{Service: svc, after: after, reached: make(chan struct{}), release: make(chan struct{}), results: make(chan error, 4)}
}

func (g *gatedWrites) WriteFile(ctx context.Context, name, p string, r io.Reader) (int64, error) {
	n, err := g.Service.WriteFile(context.WithoutCancel(ctx), name, p, &gateReader{r: r, g: g})
	g.results <- err
	return n, err
}

type gateReader struct {
	r io.Reader
	g *gatedWrites
	n int64
}

func (gr *gateReader) Read(b []byte) (int, error) {
	n, err := gr.r.Read(b)
	gr.n += int64(n)
	if gr.n >= gr.g.after {
		gr.g.once.Do(func() {
			close(gr.g.reached)
			<-gr.g.release
		})
	}
	return n, err
}

// TestSFTPInterruptedUpload: a client that disconnects mid-upload leaves
// the old content in place.
func TestSFTPInterruptedUpload(t *testing.T) {
	op := newKey(t, "op", Operator)
	var gate *gatedWrites
	w := newWorld(t, worldOpts{wrap: func(s session.Service) session.Service {
		gate = newGatedWrites(s, 1<<20)
		return gate
	}}, op)
	w.create("demo")
	w.fake.WriteFile(context.Background(), "demo", "target.bin", strings.NewReader("old content"))

	sc, c, err := w.sftpClient(op, "demo")
	if err != nil {
		t.Fatal(err)
	}
	f, err := sc.Create("target.bin")
	if err != nil {
		t.Fatal(err)
	}
	uploaded := make(chan error, 1)
	go func() {
		_, err := f.ReadFrom(io.LimitReader(rand.Reader, 8<<20))
		uploaded <- err
	}()
	select {
	case <-gate.reached:
	case <-time.After(10 * time.Second):
		t.Fatal("the upload did not start")
	}
	c.Close() // the client goes away mid-upload
	close(gate.release)
	select {
	case err := <-gate.results:
		if err == nil {
			t.Fatal("WriteFile succeeded for an interrupted upload")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WriteFile did not end after the client left")
	}
	<-uploaded
	if got := w.readFile("demo", "target.bin"); got != "old content" {
		t.Errorf("target has %d bytes, want the old content", len(got))
	}
}

// TestUploadOrder: writes arriving out of order are put in order; a gap
// or an overlap fails the upload.
func TestUploadOrder(t *testing.T) {
	start := func() (*upload, *bytes.Buffer) {
		pr, pw := io.Pipe()
		u := &upload{pw: pw, pending: map[int64][]byte{}, done: make(chan struct{})}
		var got bytes.Buffer
		go func() {
			defer close(u.done)
			_, u.err = io.Copy(&got, pr)
		}()
		return u, &got
	}
	u, got := start()
	for _, w := range []struct {
		off  int64
		data string
	}{{4, "efgh"}, {12, "mn"}, {0, "abcd"}, {8, "ijkl"}} {
		if _, err := u.WriteAt([]byte(w.data), w.off); err != nil {
			t.Fatalf("WriteAt(%d): %v", w.off, err)
		}
	}
	if err := u.Close(); err != nil || got.String() != "abcdefghijklmn" {
		t.Errorf("reordered upload: %q, %v", got.String(), err)
	}

	u, _ = start()
	u.WriteAt([]byte("abcd"), 0)
	u.WriteAt([]byte("zz"), 10)
	if err := u.Close(); err == nil {
		t.Error("an upload with a gap closed fine")
	}

	u, _ = start()
	u.WriteAt([]byte("abcd"), 0)
	if _, err := u.WriteAt([]byte("xx"), 2); err == nil {
		t.Error("an overlapping write was accepted")
	}
	if err := u.Close(); err == nil {
		t.Error("an upload with an overlap closed fine")
	}
}

// TestDownloadOutOfOrder: reads at any offset return the right bytes,
// also behind the window (which reopens the file).
func TestDownloadOutOfOrder(t *testing.T) {
	data := make([]byte, 3*downloadWindow)
	rand.Read(data)
	opens := 0
	d := &download{open: func() (io.ReadCloser, error) {
		opens++
		return io.NopCloser(bytes.NewReader(data)), nil
	}}
	if err := d.reopen(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 32<<10)
	for _, off := range []int64{64 << 10, 0, 32 << 10, 2 * downloadWindow, downloadWindow, 3*downloadWindow - 100, 5} {
		n, err := d.ReadAt(buf, off)
		want := data[off:min(off+int64(len(buf)), int64(len(data)))]
		if n != len(want) || !bytes.Equal(buf[:n], want) {
			t.Fatalf("ReadAt(%d) = %d bytes, want %d", off, n, len(want))
		}
		if n < len(buf) && err != io.EOF {
			t.Errorf("short ReadAt(%d) without EOF: %v", off, err)
		}
	}
	if n, err := d.ReadAt(buf, int64(len(data))+10); n != 0 || err != io.EOF {
		t.Errorf("ReadAt past the end = %d, %v", n, err)
	}
	if opens < 2 {
		t.Errorf("%d opens: reading behind the window must reopen", opens)
	}
}

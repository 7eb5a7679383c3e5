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
	"testing"
	"time"

	"github.com/pkg/sftp"
	gossh "golang.org/x/crypto/ssh"
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
	w.fake.WriteFile(context.Background(), "demo", "mode.txt", strings.NewReader("m"))
	if err := sc.Chmod("mode.txt", 0o600); err != nil {
		t.Fatalf("Chmod: %v", err)
	}
	if fi, err := sc.Stat("mode.txt"); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("Stat after Chmod 0600: %v, %v", fi.Mode(), err)
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
	for _, target := range []string{"/etc/passwd", "../etc/passwd", "a/../../x"} {
		if err := sc.Symlink(target, "link"); statusCode(err) != fxPermissionDenied {
			t.Errorf("Symlink(%q): %v, want permission denied", target, err)
		}
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

// TestSFTPInterruptedUpload: a client that disconnects mid-upload leaves
// the old content in place, and the server releases the upload's handle
// without putting it under the name.
func TestSFTPInterruptedUpload(t *testing.T) {
	op := newKey(t, "op", Operator)
	w := newWorld(t, worldOpts{}, op)
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
	if _, err := f.Write(bytes.Repeat([]byte("new"), 100<<10)); err != nil {
		t.Fatal(err)
	}
	if got := w.readFile("demo", "target.bin"); got != "old content" {
		t.Errorf("mid-upload the target has %d bytes, want the old content", len(got))
	}
	if n := w.fake.OpenFiles("demo"); n != 1 {
		t.Fatalf("%d files open mid-upload, want 1", n)
	}
	c.Close() // the client goes away mid-upload
	deadline := time.Now().Add(10 * time.Second)
	for w.fake.OpenFiles("demo") != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the server kept the upload open after its client left")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := w.readFile("demo", "target.bin"); got != "old content" {
		t.Errorf("target has %d bytes, want the old content", len(got))
	}
}

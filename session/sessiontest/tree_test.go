package sessiontest

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"io/fs"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
)

func newFake(t *testing.T, opts Options) *Fake {
	t.Helper()
	f := New(opts)
	t.Cleanup(func() { f.Close() })
	if _, err := f.Create(t.Context(), session.CreateOptions{Name: "s"}); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestReplaceResetsTheSystem(t *testing.T) {
	ctx := t.Context()
	f := newFake(t, Options{Images: []string{"mini", "debian"}})
	f.WriteFile(ctx, "s", "keep.txt", strings.NewReader("kept"))
	f.Update("s", func(s *session.Session) { s.SystemUsed, s.ImageDigest = 5<<20, "abc" })
	p, err := f.Exec(ctx, "s", session.ExecRequest{Argv: []string{"sleep", "30"}})
	if err != nil {
		t.Fatal(err)
	}
	before, _ := f.Get(ctx, "s")
	tl, _ := f.Timeline(ctx, "s", 0)
	seen := len(tl)
	res, err := f.Replace(session.WithActor(ctx, "cli"), "s", session.ReplaceOptions{Image: "debian"})
	if err != nil {
		t.Fatal(err)
	}
	want := session.ReplaceResult{Dropped: 5 << 20, From: "mini@abc", To: "debian@-"}
	if res.Dropped != want.Dropped || res.From != want.From || res.To != want.To {
		t.Errorf("Replace = dropped %d from %s to %s, want %+v", res.Dropped, res.From, res.To, want)
	}
	s := res.Session
	if s.State != session.StateRunning || s.Image != "debian" || s.SystemUsed != 0 || s.Pid == before.Pid || s.Cause != "replaced by cli" {
		t.Errorf("after Replace: %+v", s)
	}
	if x, err := p.Wait(ctx); err != nil || x.State != session.ExecCancelled {
		t.Errorf("a command across Replace: %s, %v; want cancelled as by stop", x.State, err)
	}
	if b := readFake(t, f, "keep.txt"); b != "kept" {
		t.Errorf("keep.txt = %q", b)
	}
	tl, _ = f.Timeline(ctx, "s", 0)
	var states []session.State
	var note string
	for _, ev := range tl[seen:] {
		if ev.Kind == session.EventState {
			states = append(states, ev.Session.State)
		}
		if ev.Kind == session.EventNote {
			note = ev.Message
		}
	}
	if len(states) != 3 || states[0] != session.StateStopping || states[1] != session.StateStopped || states[2] != session.StateRunning ||
		!strings.Contains(note, "5.0 MiB of system changes dropped") {
		t.Errorf("timeline ends %v, note %q", states, note)
	}

	_, err = f.Replace(ctx, "s", session.ReplaceOptions{Image: "ubuntu"})
	if !errors.Is(err, session.ErrNotFound) {
		t.Errorf("Replace with an unknown image: %v, want ErrNotFound", err)
	}
	if _, err := f.Replace(ctx, "s", session.ReplaceOptions{Image: "debian"}); err != nil {
		t.Errorf("Replace with the session's own image: %v", err)
	}
}

func readFake(t *testing.T, f *Fake, p string) string {
	t.Helper()
	rc, err := f.ReadFile(t.Context(), "s", p)
	if err != nil {
		t.Fatalf("ReadFile %s: %v", p, err)
	}
	b, _ := io.ReadAll(rc)
	return string(b)
}

// Into an existing directory, entries before a refused one stay, as the
// agent writes each in turn; into a new one, a refused copy leaves nothing;
// symlinks inside the workspace are followed on the way; directory stamps
// are the tar's, whatever was written into them afterwards.
func TestCopyInSemantics(t *testing.T) {
	ctx := t.Context()
	f := newFake(t, Options{})
	at := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	tr := Tar(t,
		TarEntry{Name: "./", Type: tar.TypeDir, Mode: 0o711, MTime: at},
		TarEntry{Name: "d/", Type: tar.TypeDir, Mode: 0o700, MTime: at},
		TarEntry{Name: "l", Type: tar.TypeSymlink, Link: "d"},
		TarEntry{Name: "l/through.txt", Data: "via the link", MTime: at, Mode: 0o600},
		TarEntry{Name: "ok.txt", Data: "first", MTime: at, Mode: 0o644},
		TarEntry{Name: "../escape", Data: "no"},
		TarEntry{Name: "never.txt", Data: "no"},
	)
	if _, err := f.CopyIn(ctx, "s", "new/dst", bytes.NewReader(tr)); !errors.Is(err, session.ErrInvalid) {
		t.Fatalf("CopyIn into a new directory = %v; want the refusal", err)
	}
	if _, err := f.Stat(ctx, "s", "new"); !errors.Is(err, session.ErrNotFound) {
		t.Errorf("after a refused copy into new/dst, Stat new = %v; want not found", err)
	}
	if err := f.Mkdir(ctx, "s", "dst"); err != nil {
		t.Fatal(err)
	}
	res, err := f.CopyIn(ctx, "s", "dst", bytes.NewReader(tr))
	if !errors.Is(err, session.ErrInvalid) || res.Files != 2 || res.Dirs != 2 || res.Symlinks != 1 {
		t.Fatalf("CopyIn = %+v, %v; want the refusal after 2 files, 2 dirs, 1 symlink", res, err)
	}
	if b := readFake(t, f, "dst/d/through.txt"); b != "via the link" {
		t.Errorf("a file written through an inner symlink: %q", b)
	}
	if b := readFake(t, f, "dst/ok.txt"); b != "first" {
		t.Errorf("a file before the refused entry: %q", b)
	}
	if _, err := f.Stat(ctx, "s", "dst/never.txt"); !errors.Is(err, session.ErrNotFound) {
		t.Errorf("a file after the refused entry: %v, want not found", err)
	}
	for p, want := range map[string]fs.FileMode{"dst": fs.ModeDir | 0o711, "dst/d": fs.ModeDir | 0o700} {
		fi, err := f.Stat(ctx, "s", p)
		if err != nil || fi.Mode != want || !fi.ModTime.Equal(at) {
			t.Errorf("Stat %s = %v %s, %v; want %v at %s", p, fi.Mode, fi.ModTime, err, want, at)
		}
	}

	// Conflicts with what is there.
	for _, c := range []struct {
		name  string
		entry TarEntry
		class error
	}{
		{"file over a directory", TarEntry{Name: "d", Data: "x"}, session.ErrInvalid},
		{"directory under a file", TarEntry{Name: "ok.txt/sub/", Type: tar.TypeDir}, session.ErrInvalid},
		{"fifo", TarEntry{Name: "p", Type: tar.TypeFifo}, session.ErrInvalid},
	} {
		if _, err := f.CopyIn(ctx, "s", "dst", bytes.NewReader(Tar(t, c.entry))); !errors.Is(err, c.class) {
			t.Errorf("%s: %v, want %v", c.name, err, c.class)
		}
	}
	// The setuid bit travels as tar has it (04000), both ways.
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "suid", Typeflag: tar.TypeReg, Mode: 0o4755, ModTime: at})
	tw.Close()
	if _, err := f.CopyIn(ctx, "s", "m", &buf); err != nil {
		t.Fatal(err)
	}
	if fi, _ := f.Stat(ctx, "s", "m/suid"); fi.Mode != fs.ModeSetuid|0o755 {
		t.Errorf("copied-in 04755 file has mode %v", fi.Mode)
	}
	rc, _ := f.CopyOut(ctx, "s", "m/suid")
	h, err := tar.NewReader(rc).Next()
	if err != nil || h.Mode != 0o4755 {
		t.Errorf("copied-out mode %o, %v; want 4755", h.Mode, err)
	}
}

func TestSymlinkResolution(t *testing.T) {
	ctx := t.Context()
	f := newFake(t, Options{})
	tr := Tar(t,
		TarEntry{Name: "a/f", Data: "target"},
		TarEntry{Name: "a/b/", Type: tar.TypeDir},
		TarEntry{Name: "a/b/up", Type: tar.TypeSymlink, Link: "../f"},
		TarEntry{Name: "a/chain", Type: tar.TypeSymlink, Link: "b/up"},
		TarEntry{Name: "a/loop1", Type: tar.TypeSymlink, Link: "loop2"},
		TarEntry{Name: "a/loop2", Type: tar.TypeSymlink, Link: "loop1"},
		TarEntry{Name: "a/dirlink", Type: tar.TypeSymlink, Link: "b"},
	)
	if _, err := f.CopyIn(ctx, "s", "", bytes.NewReader(tr)); err != nil {
		t.Fatal(err)
	}
	// A symlink pointing out of /workspace can only come from the guest.
	f.mu.Lock()
	f.sessions["s"].root.children["a"].children["out"] = &node{link: "../../etc", mode: fs.ModeSymlink | 0o777}
	f.mu.Unlock()

	if b := readFake(t, f, "a/chain"); b != "target" {
		t.Errorf("ReadFile through a chain of symlinks = %q", b)
	}
	if fi, err := f.Stat(ctx, "s", "a/chain"); err != nil || fi.Link != "b/up" || fi.Size != 4 {
		t.Errorf("Stat of a symlink = %+v, %v; want the link itself", fi, err)
	}
	if l, err := f.ListDir(ctx, "s", "a/dirlink"); err != nil || len(l) != 1 || l[0].Name != "up" {
		t.Errorf("ListDir through a symlink = %+v, %v", l, err)
	}
	for _, p := range []string{"a/loop1", "a/out/passwd"} {
		if _, err := f.ReadFile(ctx, "s", p); !errors.Is(err, session.ErrInvalid) {
			t.Errorf("ReadFile %s: %v, want ErrInvalid", p, err)
		}
	}
	// Copying the tree out: the escaping link ends it with an error, after
	// what came before it.
	rc, err := f.CopyOut(ctx, "s", "a")
	if err != nil {
		t.Fatalf("CopyOut: %v (want the error from Read: entries come first)", err)
	}
	b, err := io.ReadAll(rc)
	if !errors.Is(err, session.ErrInvalid) || len(b) == 0 {
		t.Errorf("CopyOut read %d bytes, %v; want some, then ErrInvalid", len(b), err)
	}
	if _, err := f.CopyOut(ctx, "s", "a/out"); !errors.Is(err, session.ErrInvalid) {
		t.Errorf("CopyOut of the escaping symlink itself: %v, want ErrInvalid", err)
	}
}

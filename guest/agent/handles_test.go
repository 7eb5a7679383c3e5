package agent

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berthvm/berth/guest"
)

const (
	rd   = guest.OpenRead
	wr   = guest.OpenWrite
	app  = guest.OpenAppend
	crt  = guest.OpenCreate
	trc  = guest.OpenTruncate
	excl = guest.OpenExclusive
)

// content returns a file's content, or "<missing>".
func content(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return "<missing>"
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// temps lists the staged temporary files left in dir.
func temps(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if strings.Contains(e.Name(), ".berth-") {
			out = append(out, e.Name())
		}
	}
	return out
}

// eventually retries cond for up to 5 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestOpenModes(t *testing.T) {
	const old = "old content"
	tests := []struct {
		name    string
		path    string
		flags   int
		wantErr error
		staged  bool
		off     int64
		write   string // written at off, then the name is read before Close
		before  string // the name's content with the File still open
		after   string // and after Close
		perm    fs.FileMode
	}{
		{name: "create new, in place", path: "new", flags: wr | crt, write: "data", before: "data", after: "data"},
		{name: "create truncate new", path: "new", flags: wr | crt | trc, staged: true, write: "data", before: "<missing>", after: "data", perm: 0o640},
		{name: "create truncate existing", path: "f", flags: wr | crt | trc, staged: true, write: "new", before: old, after: "new", perm: 0o600},
		{name: "truncate existing, in place", path: "f", flags: rd | wr | trc, write: "new", before: "new", after: "new", perm: 0o600},
		{name: "truncate missing", path: "new", flags: wr | trc, wantErr: syscall.ENOENT},
		{name: "write in place", path: "f", flags: wr, off: 4, write: "CONT", before: "old CONTent", after: "old CONTent"},
		{name: "create existing in place", path: "f", flags: rd | wr | crt, off: 11, write: "!", before: old + "!", after: old + "!"},
		{name: "exclusive new", path: "new", flags: wr | crt | excl, write: "lock", before: "lock", after: "lock"},
		{name: "exclusive truncate new", path: "new", flags: wr | crt | trc | excl, write: "lock", before: "lock", after: "lock"},
		{name: "exclusive existing", path: "f", flags: wr | crt | excl, wantErr: syscall.EEXIST},
		{name: "append ignores offset", path: "f", flags: wr | app, off: 0, write: "+", before: old + "+", after: old + "+"},
		{name: "append create new, in place", path: "new", flags: wr | app | crt, write: "a", before: "a", after: "a"},
		{name: "append create truncate new", path: "new", flags: wr | app | crt | trc, staged: true, write: "a", before: "<missing>", after: "a"},
		{name: "through a symlink, in place", path: "ln", flags: wr | crt | trc, write: "via", before: "via", after: "via"},
		{name: "hard linked, in place", path: "hard", flags: wr | trc, write: "both", before: "both", after: "both"},
		{name: "directory for writing", path: "d", flags: wr, wantErr: syscall.EISDIR},
		{name: "directory staged", path: "d", flags: wr | crt | trc, wantErr: syscall.EISDIR},
		{name: "missing parent", path: "no/such", flags: wr | crt, wantErr: syscall.ENOENT},
		{name: "missing", path: "none", flags: rd, wantErr: syscall.ENOENT},
		{name: "unknown flag", path: "f", flags: rd | 0x100, wantErr: syscall.EINVAL},
		{name: "workspace root for writing", path: "/workspace", flags: wr | crt | trc, wantErr: syscall.EISDIR},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			os.WriteFile(filepath.Join(dir, "f"), []byte(old), 0o600)
			os.Mkdir(filepath.Join(dir, "d"), 0o755)
			os.WriteFile(filepath.Join(dir, "target"), []byte(old), 0o644)
			os.Symlink("target", filepath.Join(dir, "ln"))
			os.WriteFile(filepath.Join(dir, "linked"), []byte(old), 0o644)
			os.Link(filepath.Join(dir, "linked"), filepath.Join(dir, "hard"))
			_, c := connect(t, dir)
			perm := tt.perm
			if perm == 0 {
				perm = 0o644
			}
			f, err := c.Open(t.Context(), tt.path, tt.flags, perm)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Open = %v, want %v", err, tt.wantErr)
				}
				if left := temps(t, dir); len(left) > 0 {
					t.Errorf("temporary files left: %v", left)
				}
				return
			}
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			if f.Staged() != tt.staged {
				t.Errorf("Staged = %v, want %v", f.Staged(), tt.staged)
			}
			if n, err := f.WriteAt([]byte(tt.write), tt.off); err != nil || n != len(tt.write) {
				t.Fatalf("WriteAt = %d, %v", n, err)
			}
			if got := content(t, filepath.Join(dir, tt.path)); got != tt.before {
				t.Errorf("before Close: %q, want %q", got, tt.before)
			}
			if err := f.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if got := content(t, filepath.Join(dir, tt.path)); got != tt.after {
				t.Errorf("after Close: %q, want %q", got, tt.after)
			}
			if left := temps(t, dir); len(left) > 0 {
				t.Errorf("temporary files left: %v", left)
			}
			if tt.staged {
				fi, err := os.Stat(filepath.Join(dir, tt.path))
				if err != nil || fi.Mode().Perm() != tt.perm&^0o022 && tt.perm != 0 {
					t.Errorf("staged file's mode = %v, %v; want %v", fi.Mode(), err, tt.perm)
				}
			}
			if fi, _ := os.Lstat(filepath.Join(dir, "ln")); fi.Mode()&fs.ModeSymlink == 0 {
				t.Error("the symlink was replaced by a file")
			}
			if content(t, filepath.Join(dir, "hard")) != content(t, filepath.Join(dir, "linked")) {
				t.Error("the hard link was broken")
			}
			if _, err := f.ReadAt(make([]byte, 1), 0); !errors.Is(err, fs.ErrClosed) {
				t.Errorf("ReadAt after Close: %v, want ErrClosed", err)
			}
			if err := f.Close(); !errors.Is(err, fs.ErrClosed) {
				t.Errorf("second Close: %v, want ErrClosed", err)
			}
		})
	}
}

func TestOpenAccessModes(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "f"), []byte("abc"), 0o644)
	_, c := connect(t, dir)
	ro, err := c.Open(t.Context(), "f", rd, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if _, err := ro.WriteAt([]byte("x"), 0); !errors.Is(err, syscall.EBADF) {
		t.Errorf("write on a read-only handle: %v, want EBADF", err)
	}
	wo, err := c.Open(t.Context(), "f", wr, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer wo.Close()
	if _, err := wo.ReadAt(make([]byte, 1), 0); !errors.Is(err, syscall.EBADF) {
		t.Errorf("read on a write-only handle: %v, want EBADF", err)
	}
	// An error answers one request: the handle still works.
	if n, err := wo.WriteAt([]byte("X"), 1); err != nil || n != 1 {
		t.Errorf("write after a refused read: %d, %v", n, err)
	}
	// A FIFO opens without waiting for a peer, and its attributes change.
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	ff, err := c.Open(t.Context(), "fifo", rd, 0)
	if err != nil {
		t.Fatalf("open a FIFO: %v", err)
	}
	ff.Close()
	if err := c.Setstat(t.Context(), "fifo", guest.Attrs{Mode: ptr(uint32(0o600))}); err != nil {
		t.Errorf("setstat a FIFO: %v", err)
	}
	d, err := c.Open(t.Context(), "/workspace", rd, 0)
	if err != nil {
		t.Fatalf("open the workspace for reading: %v", err)
	}
	defer d.Close()
	if _, err := d.ReadAt(make([]byte, 1), 0); !errors.Is(err, syscall.EISDIR) {
		t.Errorf("read of a directory: %v, want EISDIR", err)
	}
	if fi, err := d.Stat(t.Context()); err != nil || !fs.FileMode(fi.Mode).IsDir() {
		t.Errorf("Stat of an open directory = %+v, %v", fi, err)
	}
}

func TestOffsets(t *testing.T) {
	dir := t.TempDir()
	_, c := connect(t, dir)
	f, err := c.Open(t.Context(), "f", rd|wr|crt|excl, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	write := func(s string, off int64) {
		t.Helper()
		if n, err := f.WriteAt([]byte(s), off); err != nil || n != len(s) {
			t.Fatalf("WriteAt(%q, %d) = %d, %v", s, off, n, err)
		}
	}
	write("world", 6)
	write("hello ", 0)
	write("!", 20) // a hole from 11 to 20
	tests := []struct {
		off  int64
		len  int
		want string
		err  error
	}{
		{0, 11, "hello world", nil},
		{6, 5, "world", nil},
		{0, 21, "hello world\x00\x00\x00\x00\x00\x00\x00\x00\x00!", nil},
		{18, 10, "\x00\x00!", io.EOF},
		{21, 5, "", io.EOF},
		{1000, 5, "", io.EOF},
		{0, 0, "", nil},
	}
	for _, tt := range tests {
		p := make([]byte, tt.len)
		n, err := f.ReadAt(p, tt.off)
		if string(p[:n]) != tt.want || err != tt.err {
			t.Errorf("ReadAt(%d, %d) = %q, %v; want %q, %v", tt.len, tt.off, p[:n], err, tt.want, tt.err)
		}
	}
	if _, err := f.ReadAt(make([]byte, 1), -1); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("negative offset: %v, want EINVAL", err)
	}
	fi, err := f.Stat(t.Context())
	if err != nil || fi.Size != 21 || fi.Name != "f" {
		t.Errorf("Stat = %+v, %v", fi, err)
	}

	// Larger than a data chunk, at an odd offset, both ways.
	big := make([]byte, 3*guest.DataChunk+12345)
	for i := range big {
		big[i] = byte(rand.IntN(256))
	}
	if n, err := f.WriteAt(big, 777); err != nil || n != len(big) {
		t.Fatalf("big WriteAt = %d, %v", n, err)
	}
	back := make([]byte, len(big))
	if n, err := f.ReadAt(back, 777); err != nil || n != len(big) || !bytes.Equal(back, big) {
		t.Fatalf("big ReadAt = %d, %v, equal %v", n, err, bytes.Equal(back, big))
	}
	back = make([]byte, len(big)+100)
	if n, err := f.ReadAt(back, 777); err != io.EOF || n != len(big) {
		t.Fatalf("big ReadAt past the end = %d, %v; want %d, EOF", n, err, len(big))
	}
}

// rawStream runs the agent's handler on one end of a pipe and returns
// the other end, for frames the Client never sends.
func rawStream(t *testing.T, a *Agent, req guest.Request) (*guest.FrameReader, net.Conn) {
	t.Helper()
	host, g := net.Pipe()
	done := make(chan struct{})
	go func() { a.handle(t.Context(), g); g.Close(); close(done) }()
	t.Cleanup(func() { host.Close(); <-done })
	b, _ := json.Marshal(req)
	if err := guest.WriteFrame(host, guest.FrameRequest, b); err != nil {
		t.Fatal(err)
	}
	fr := guest.NewFrameReader(host)
	typ, p, err := fr.Next()
	if err != nil || typ != guest.FrameResult {
		t.Fatalf("open reply %d %s, %v", typ, p, err)
	}
	return fr, host
}

func TestReadAtIsCappedAndBadFramesEndTheHandle(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "f"), make([]byte, 2*guest.DataChunk), 0o644)
	a, err := New(Config{Workspace: dir})
	if err != nil {
		t.Fatal(err)
	}
	fr, host := rawStream(t, a, guest.Request{Op: guest.OpOpen, Path: "f", Flags: rd})
	req := make([]byte, 12)
	binary.BigEndian.PutUint32(req[8:], 1<<31) // a hostile length
	guest.WriteFrame(host, guest.FrameReadAt, req)
	typ, p, err := fr.Next()
	if err != nil || typ != guest.FrameData || len(p) != guest.DataChunk {
		t.Fatalf("read of 2 GiB: frame %d of %d bytes, %v; want %d bytes", typ, len(p), err, guest.DataChunk)
	}
	guest.WriteFrame(host, guest.FrameReadAt, []byte{1, 2, 3})
	if typ, p, err := fr.Next(); err != nil || typ != guest.FrameError || !strings.Contains(string(p), guest.CodeBadRequest) {
		t.Fatalf("short read-at frame: %d %s, %v; want a bad request", typ, p, err)
	}
	if _, _, err := fr.Next(); err != io.EOF {
		t.Fatalf("after a bad frame the stream goes on: %v", err)
	}
	eventually(t, "the handle released", func() bool { return a.openHandles() == 0 })
}

func TestStagedUploadInterrupted(t *testing.T) {
	ways := []struct {
		name      string
		interrupt func(a *Agent, c *guest.Client, f *guest.File, cancel context.CancelFunc)
	}{
		{"caller's context ends", func(_ *Agent, _ *guest.Client, _ *guest.File, cancel context.CancelFunc) { cancel() }},
		{"connection lost", func(_ *Agent, c *guest.Client, _ *guest.File, _ context.CancelFunc) { c.Close() }},
		{"newer host connection", func(a *Agent, _ *guest.Client, _ *guest.File, _ context.CancelFunc) { dial(t, a) }},
	}
	for _, w := range ways {
		for _, existing := range []bool{false, true} {
			name := w.name
			if existing {
				name += ", over an existing file"
			}
			t.Run(name, func(t *testing.T) {
				dir := t.TempDir()
				want := "<missing>"
				if existing {
					want = "old"
					os.WriteFile(filepath.Join(dir, "up"), []byte(want), 0o644)
				}
				a, c := connect(t, dir)
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				f, err := c.Open(ctx, "up", wr|crt|trc, 0o644)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := f.WriteAt(make([]byte, 3<<20), 0); err != nil {
					t.Fatal(err)
				}
				if len(temps(t, dir)) != 1 {
					t.Fatalf("no staged file while writing: %v", temps(t, dir))
				}
				w.interrupt(a, c, f, cancel)
				eventually(t, "the staged file removed", func() bool { return len(temps(t, dir)) == 0 && a.openHandles() == 0 })
				if got := content(t, filepath.Join(dir, "up")); got != want {
					t.Errorf("after the interruption: %d bytes, want %q", len(got), want)
				}
				if err := f.Close(); err == nil {
					t.Error("Close of an interrupted upload succeeded")
				}
				if got := content(t, filepath.Join(dir, "up")); got != want {
					t.Errorf("after Close: %d bytes, want %q", len(got), want)
				}
			})
		}
	}
}

func TestExclusiveCreateRace(t *testing.T) {
	_, c := connect(t, t.TempDir())
	const n = 16
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			f, err := c.Open(t.Context(), "lock", wr|crt|excl, 0o644)
			if err == nil {
				_, err = f.WriteAt([]byte{byte('a' + i)}, 0)
				if cerr := f.Close(); err == nil {
					err = cerr
				}
			}
			errs[i] = err
		})
	}
	wg.Wait()
	won := 0
	for _, err := range errs {
		switch {
		case err == nil:
			won++
		case !errors.Is(err, syscall.EEXIST):
			t.Errorf("a losing exclusive create: %v, want EEXIST", err)
		}
	}
	if won != 1 {
		t.Fatalf("%d exclusive creates succeeded, want 1", won)
	}
}

func TestConcurrentReadsAndWritesOnOneHandle(t *testing.T) {
	dir := t.TempDir()
	_, c := connect(t, dir)
	f, err := c.Open(t.Context(), "f", rd|wr|crt|trc, 0)
	if err != nil {
		t.Fatal(err)
	}
	const piece, pieces = 40 << 10, 64
	want := make([]byte, piece*pieces)
	for i := range want {
		want[i] = byte(rand.IntN(256))
	}
	var wg sync.WaitGroup
	for _, i := range rand.Perm(pieces) {
		wg.Go(func() {
			off := int64(i * piece)
			if n, err := f.WriteAt(want[off:off+piece], off); err != nil || n != piece {
				t.Errorf("WriteAt %d = %d, %v", off, n, err)
			}
			// Read back at once, while the others write.
			p := make([]byte, piece)
			if n, err := f.ReadAt(p, off); err != nil || n != piece || !bytes.Equal(p, want[off:off+piece]) {
				t.Errorf("ReadAt %d = %d, %v, equal %v", off, n, err, bytes.Equal(p, want[off:off+piece]))
			}
		})
	}
	wg.Wait()
	for range 8 {
		wg.Go(func() {
			p := make([]byte, len(want))
			if n, err := f.ReadAt(p, 0); err != nil || n != len(want) || !bytes.Equal(p, want) {
				t.Errorf("whole ReadAt = %d, %v", n, err)
			}
		})
	}
	wg.Wait()
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "f")); !bytes.Equal(got, want) {
		t.Fatal("the file differs from what was written")
	}
}

func ptr[T any](v T) *T { return &v }

func TestHandleSetstat(t *testing.T) {
	dir := t.TempDir()
	_, c := connect(t, dir)
	f, err := c.Open(t.Context(), "f", wr|crt|excl, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("0123456789"), 0)
	mtime := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	steps := []struct {
		attrs guest.Attrs
		check func(fi fs.FileInfo, st *syscall.Stat_t) bool
	}{
		{guest.Attrs{Size: ptr[int64](4)}, func(fi fs.FileInfo, _ *syscall.Stat_t) bool { return fi.Size() == 4 }},
		{guest.Attrs{Size: ptr[int64](8000)}, func(fi fs.FileInfo, _ *syscall.Stat_t) bool { return fi.Size() == 8000 }},
		{guest.Attrs{Mode: ptr(uint32(fs.ModeSetuid | 0o750))}, func(fi fs.FileInfo, _ *syscall.Stat_t) bool {
			return fi.Mode()&fs.ModeSetuid != 0 && fi.Mode().Perm() == 0o750
		}},
		{guest.Attrs{Mtime: &mtime}, func(fi fs.FileInfo, _ *syscall.Stat_t) bool { return fi.ModTime().Equal(mtime) }},
		{guest.Attrs{Atime: &mtime}, func(fi fs.FileInfo, st *syscall.Stat_t) bool { return st.Atim.Sec == mtime.Unix() }},
		{guest.Attrs{UID: ptr(1234), GID: ptr(4321)}, func(_ fs.FileInfo, st *syscall.Stat_t) bool { return st.Uid == 1234 && st.Gid == 4321 }},
		{guest.Attrs{GID: ptr(55)}, func(_ fs.FileInfo, st *syscall.Stat_t) bool { return st.Uid == 1234 && st.Gid == 55 }},
		// The owner first, then the mode: the setuid bit survives both.
		{guest.Attrs{UID: ptr(0), Mode: ptr(uint32(fs.ModeSetuid | 0o755))}, func(fi fs.FileInfo, st *syscall.Stat_t) bool {
			return st.Uid == 0 && fi.Mode()&fs.ModeSetuid != 0
		}},
	}
	for i, s := range steps {
		if (s.attrs.UID != nil || s.attrs.GID != nil) && os.Getuid() != 0 {
			continue
		}
		if err := f.Setstat(t.Context(), s.attrs); err != nil {
			t.Fatalf("step %d: Setstat: %v", i, err)
		}
		fi, err := os.Stat(filepath.Join(dir, "f"))
		if err != nil || !s.check(fi, fi.Sys().(*syscall.Stat_t)) {
			t.Errorf("step %d: after Setstat(%+v): %v %v", i, s.attrs, fi.Mode(), err)
		}
	}
	gfi, err := f.Stat(t.Context())
	if err != nil || gfi.Size != 8000 || !gfi.ModTime.Equal(mtime) {
		t.Errorf("Stat = %+v, %v", gfi, err)
	}
	if err := f.Sync(t.Context()); err != nil {
		t.Errorf("Sync: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestPathOps(t *testing.T) {
	dir := t.TempDir()
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "secret"), []byte("s"), 0o600)
	os.WriteFile(filepath.Join(dir, "f"), []byte("0123456789"), 0o644)
	os.Mkdir(filepath.Join(dir, "empty"), 0o755)
	os.MkdirAll(filepath.Join(dir, "full/x"), 0o755)
	os.Symlink("f", filepath.Join(dir, "ln"))
	os.Symlink("empty", filepath.Join(dir, "dirln"))
	os.Symlink("nothing", filepath.Join(dir, "dangling"))
	os.Symlink(outside, filepath.Join(dir, "out"))
	_, c := connect(t, dir)
	ctx := t.Context()
	mtime := time.Date(2010, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name  string
		call  func() error
		err   error // nil: success
		check func() bool
	}{
		{"setstat size", func() error { return c.Setstat(ctx, "f", guest.Attrs{Size: ptr[int64](3)}) }, nil,
			func() bool { return content(t, filepath.Join(dir, "f")) == "012" }},
		{"setstat through a symlink", func() error { return c.Setstat(ctx, "ln", guest.Attrs{Mode: ptr(uint32(0o600)), Mtime: &mtime}) }, nil,
			func() bool {
				fi, _ := os.Stat(filepath.Join(dir, "f"))
				return fi.Mode().Perm() == 0o600 && fi.ModTime().Equal(mtime)
			}},
		{"setstat a directory", func() error { return c.Setstat(ctx, "empty", guest.Attrs{Mode: ptr(uint32(fs.ModeSticky | 0o777))}) }, nil,
			func() bool { fi, _ := os.Stat(filepath.Join(dir, "empty")); return fi.Mode()&fs.ModeSticky != 0 }},
		{"setstat size of a directory", func() error { return c.Setstat(ctx, "empty", guest.Attrs{Size: ptr[int64](0)}) }, syscall.EISDIR, nil},
		{"setstat missing", func() error { return c.Setstat(ctx, "none", guest.Attrs{Mode: ptr(uint32(0o644))}) }, syscall.ENOENT, nil},
		{"setstat dangling", func() error { return c.Setstat(ctx, "dangling", guest.Attrs{Mode: ptr(uint32(0o644))}) }, syscall.ENOENT, nil},
		{"setstat out", func() error { return c.Setstat(ctx, "out/secret", guest.Attrs{Size: ptr[int64](0)}) }, guest.ErrEscape, nil},

		{"statfollow symlink", func() error {
			fi, err := c.StatFollow(ctx, "ln")
			if err == nil && (fi.Name != "ln" || fs.FileMode(fi.Mode)&fs.ModeSymlink != 0 || fi.Size != 3) {
				t.Errorf("StatFollow(ln) = %+v", fi)
			}
			return err
		}, nil, nil},
		{"statfollow dangling", func() error { _, err := c.StatFollow(ctx, "dangling"); return err }, syscall.ENOENT, nil},
		{"statfollow out", func() error { _, err := c.StatFollow(ctx, "out"); return err }, guest.ErrEscape, nil},

		{"symlink", func() error { return c.Symlink(ctx, "f", "ln2") }, nil,
			func() bool { l, _ := os.Readlink(filepath.Join(dir, "ln2")); return l == "f" }},
		{"symlink stored as given", func() error { return c.Symlink(ctx, "/etc/passwd", "etc") }, nil,
			func() bool { l, _ := os.Readlink(filepath.Join(dir, "etc")); return l == "/etc/passwd" }},
		{"symlink out is never followed", func() error { _, err := c.Open(ctx, "etc", rd, 0); return err }, guest.ErrEscape, nil},
		{"symlink over a file", func() error { return c.Symlink(ctx, "x", "f") }, syscall.EEXIST, nil},
		{"symlink in a missing directory", func() error { return c.Symlink(ctx, "x", "no/ln") }, syscall.ENOENT, nil},

		{"link", func() error { return c.Link(ctx, "f", "f2") }, nil,
			func() bool {
				a, _ := os.Stat(filepath.Join(dir, "f"))
				b, _ := os.Stat(filepath.Join(dir, "f2"))
				return os.SameFile(a, b)
			}},
		{"link of a symlink links the symlink", func() error { return c.Link(ctx, "ln", "ln3") }, nil,
			func() bool { fi, _ := os.Lstat(filepath.Join(dir, "ln3")); return fi.Mode()&fs.ModeSymlink != 0 }},
		{"link over a file", func() error { return c.Link(ctx, "f", "f2") }, syscall.EEXIST, nil},
		{"link missing", func() error { return c.Link(ctx, "none", "f3") }, syscall.ENOENT, nil},
		{"link a directory", func() error { return c.Link(ctx, "empty", "empty2") }, syscall.EPERM, nil},
		{"link out", func() error { return c.Link(ctx, "out/secret", "s") }, guest.ErrEscape, nil},
		{"link to outside", func() error { return c.Link(ctx, "f", "out/f") }, guest.ErrEscape, nil},

		{"statfs", func() error {
			st, err := c.Statfs(ctx, "f")
			if err == nil && (st.BlockSize == 0 || st.Blocks == 0 || st.BlocksFree > st.Blocks || st.BlocksAvail > st.BlocksFree || st.NameMax == 0) {
				t.Errorf("Statfs = %+v", st)
			}
			return err
		}, nil, nil},
		{"statfs out", func() error { _, err := c.Statfs(ctx, "out"); return err }, guest.ErrEscape, nil},

		{"rmdir non-empty", func() error { return c.Rmdir(ctx, "full") }, syscall.ENOTEMPTY, nil},
		{"rmdir a file", func() error { return c.Rmdir(ctx, "f") }, syscall.ENOTDIR, nil},
		{"rmdir a symlink to a directory", func() error { return c.Rmdir(ctx, "dirln") }, syscall.ENOTDIR, nil},
		{"rmdir missing", func() error { return c.Rmdir(ctx, "none") }, syscall.ENOENT, nil},
		{"rmdir the workspace", func() error { return c.Rmdir(ctx, "/workspace") }, syscall.EBUSY, nil},
		{"rmdir out", func() error { return c.Rmdir(ctx, "out/x") }, guest.ErrEscape, nil},
		{"rmdir", func() error { return c.Rmdir(ctx, "empty") }, nil,
			func() bool { _, err := os.Stat(filepath.Join(dir, "empty")); return errors.Is(err, fs.ErrNotExist) }},
	}
	for _, tt := range tests {
		err := tt.call()
		switch {
		case tt.err == nil && err != nil:
			t.Errorf("%s: %v", tt.name, err)
		case tt.err != nil && !errors.Is(err, tt.err):
			t.Errorf("%s: %v, want %v", tt.name, err, tt.err)
		case tt.check != nil && !tt.check():
			t.Errorf("%s: the change is not there", tt.name)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(outside, "secret")); string(b) != "s" {
		t.Fatal("a call changed a file outside the workspace")
	}
}

func TestHandlesRefuseEscapes(t *testing.T) {
	dir := t.TempDir()
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "secret"), []byte("s"), 0o600)
	os.Symlink(outside, filepath.Join(dir, "out"))
	os.Symlink(filepath.Join(outside, "secret"), filepath.Join(dir, "abs"))
	os.Symlink("../"+filepath.Base(outside)+"/secret", filepath.Join(dir, "rel"))
	os.Mkdir(filepath.Join(dir, "a"), 0o755)
	_, c := connect(t, dir)
	ctx := t.Context()
	paths := []string{"../x", "/etc/passwd", "a/../../x", "out/secret", "out/new", "abs", "rel", "/workspace/../etc/passwd", "a/\x00"}
	flagSets := []int{rd, wr, rd | wr, wr | crt, wr | crt | trc, wr | crt | excl, wr | app}
	for _, p := range paths {
		for _, fl := range flagSets {
			want := guest.ErrEscape
			if (p == "abs" || p == "rel") && fl&excl != 0 {
				want = syscall.EEXIST // O_EXCL never follows a symlink
			}
			if f, err := c.Open(ctx, p, fl, 0o644); !errors.Is(err, want) {
				if f != nil {
					f.Close()
				}
				t.Errorf("Open(%q, %#x) = %v, want %v", p, fl, err, want)
			}
		}
		calls := map[string]error{
			"setstat":    c.Setstat(ctx, p, guest.Attrs{Size: ptr[int64](0)}),
			"symlink at": c.Symlink(ctx, "a", p),
			"link from":  c.Link(ctx, p, "a/l"),
			"link to":    c.Link(ctx, "a", p),
			"rmdir":      c.Rmdir(ctx, p),
		}
		_, calls["statfollow"] = c.StatFollow(ctx, p)
		_, calls["statfs"] = c.Statfs(ctx, p)
		for name, err := range calls {
			// A symlink named by the path (not followed) may be
			// linked or refused as not a directory; never followed.
			if (p == "abs" || p == "rel") && (name == "link from" || name == "link to" || name == "rmdir" || name == "symlink at") {
				continue
			}
			if !errors.Is(err, guest.ErrEscape) {
				t.Errorf("%s %q = %v, want ErrEscape", name, p, err)
			}
		}
	}
	if b, _ := os.ReadFile(filepath.Join(outside, "secret")); string(b) != "s" {
		t.Fatal("a call changed a file outside the workspace")
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 1 {
		t.Fatalf("a call created a file outside the workspace: %v", ents)
	}
}

func TestShutdownReleasesHandles(t *testing.T) {
	dir := t.TempDir()
	a, c := connect(t, dir)
	f, err := c.Open(t.Context(), "up", wr|crt|trc, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("half"), 0)
	if _, err := c.Shutdown(t.Context(), time.Second); err != nil {
		t.Fatal(err)
	}
	if a.openHandles() != 0 || len(temps(t, dir)) != 0 {
		t.Fatalf("after shutdown: %d handles open, temporary files %v", a.openHandles(), temps(t, dir))
	}
	if _, err := f.WriteAt([]byte("more"), 4); !errors.Is(err, guest.ErrNoWorkspace) {
		t.Errorf("write after shutdown: %v, want ErrNoWorkspace", err)
	}
	if err := f.Close(); !errors.Is(err, guest.ErrNoWorkspace) {
		t.Errorf("Close after shutdown: %v, want ErrNoWorkspace", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "up")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a staged file appeared: %v", err)
	}
	if _, err := c.Open(t.Context(), "x", rd|wr|crt, 0); !errors.Is(err, guest.ErrNoWorkspace) {
		t.Errorf("Open after shutdown: %v, want ErrNoWorkspace", err)
	}
}

func TestHandleLimit(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "f"), nil, 0o644)
	a, c := connect(t, dir)
	ctx, cancel := context.WithCancel(t.Context())
	for i := range maxHandles {
		if _, err := c.Open(ctx, "f", rd, 0); err != nil {
			t.Fatalf("open %d: %v", i, err)
		}
	}
	if _, err := c.Open(t.Context(), "f", rd, 0); !errors.Is(err, syscall.EMFILE) {
		t.Fatalf("open past the limit: %v, want EMFILE", err)
	}
	cancel() // every handle's stream ends: all are released
	eventually(t, "the handles released", func() bool { return a.openHandles() == 0 })
	f, err := c.Open(t.Context(), "f", rd, 0)
	if err != nil {
		t.Fatalf("open after releasing: %v", err)
	}
	f.Close()
}

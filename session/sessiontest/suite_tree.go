package sessiontest

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
)

// TarEntry is one entry of a tar built by Tar.
type TarEntry struct {
	Name  string // a directory's ends in "/"
	Type  byte   // tar.TypeReg (also the zero value), tar.TypeDir or tar.TypeSymlink
	Mode  fs.FileMode
	MTime time.Time
	Data  string // a file's content
	Link  string // a symlink's target
}

// Tar builds a tar stream of entries, in order.
func Tar(t testing.TB, entries ...TarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.Name, Typeflag: e.Type, Mode: int64(e.Mode.Perm()), ModTime: e.MTime, Linkname: e.Link}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.Data))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatalf("tar header %s: %v", e.Name, err)
		}
		if _, err := io.WriteString(tw, e.Data); err != nil {
			t.Fatalf("tar %s: %v", e.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// Untar reads a tar stream into its entries, by name.
func Untar(t testing.TB, r io.Reader) (map[string]TarEntry, error) {
	t.Helper()
	out := map[string]TarEntry{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return out, err
		}
		out[h.Name] = TarEntry{Name: h.Name, Type: h.Typeflag, Mode: fs.FileMode(h.Mode).Perm(), MTime: h.ModTime.UTC(), Data: string(data), Link: h.Linkname}
	}
}

// copyOut reads the tar CopyOut sends; an error may come from CopyOut or
// from reading (when the service had begun streaming).
func copyOut(t testing.TB, ctx context.Context, svc session.Service, name, p string) (map[string]TarEntry, error) {
	t.Helper()
	rc, err := svc.CopyOut(ctx, name, p)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	entries, err := Untar(t, rc)
	if err != nil {
		return entries, err
	}
	// The tar's end marker is not the stream's end: read on, for an
	// error after it.
	if _, err := io.Copy(io.Discard, rc); err != nil {
		return entries, err
	}
	return entries, nil
}

func suiteCopy(t *testing.T, ctx context.Context, svc session.Service, name string) {
	t.Cleanup(func() {
		for _, d := range []string{"cin", "cbad", "evil.txt"} {
			svc.Remove(context.WithoutCancel(ctx), name, d)
		}
	})
	at := time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)
	binary := make([]byte, 70<<10) // more than one agent data frame
	for i := range binary {
		binary[i] = byte(i * 7 % 251)
	}
	tree := []TarEntry{
		{Name: "a.txt", Mode: 0o644, MTime: at, Data: "alpha\n"},
		{Name: "empty/", Type: tar.TypeDir, Mode: 0o700, MTime: at.Add(1 * time.Second)},
		{Name: "link", Type: tar.TypeSymlink, Mode: 0o777, MTime: at, Link: "sub/b.bin"},
		{Name: "run.sh", Mode: 0o755, MTime: at.Add(2 * time.Second), Data: "#!/bin/sh\necho hi\n"},
		{Name: "secret", Mode: 0o600, MTime: at, Data: ""},
		{Name: "sub/", Type: tar.TypeDir, Mode: 0o750, MTime: at.Add(3 * time.Second)},
		{Name: "sub/b.bin", Mode: 0o640, MTime: at.Add(4 * time.Second), Data: string(binary)},
		{Name: "sub/up", Type: tar.TypeSymlink, Mode: 0o777, MTime: at, Link: "../a.txt"},
	}

	t.Run("RoundTrip", func(t *testing.T) {
		res, err := svc.CopyIn(ctx, name, "cin", bytes.NewReader(Tar(t, tree...)))
		if err != nil {
			t.Fatalf("CopyIn: %v", err)
		}
		if res.Files != 4 || res.Dirs != 2 || res.Symlinks != 2 || res.Bytes != int64(6+18+len(binary)) {
			t.Errorf("CopyIn = %+v, want 4 files, 2 dirs, 2 symlinks, %d bytes", res, 6+18+len(binary))
		}
		got, err := copyOut(t, ctx, svc, name, "/workspace/cin")
		if err != nil {
			t.Fatalf("CopyOut: %v", err)
		}
		want := map[string]TarEntry{}
		for _, e := range tree {
			if e.Type == 0 {
				e.Type = tar.TypeReg
			}
			want[e.Name] = e
		}
		for _, n := range slices.Sorted(maps.Keys(want)) {
			g, w := got[n], want[n]
			if g.Type == tar.TypeSymlink {
				// A symlink's own mode is the system's, and the guest
				// agent does not keep a symlink's own mtime.
				g.Mode, w.Mode = 0, 0
				g.MTime, w.MTime = time.Time{}, time.Time{}
			}
			if g != w {
				t.Errorf("CopyOut entry %s = %s, want %s", n, describe(g), describe(w))
			}
		}
		for n := range got {
			if _, ok := want[n]; !ok {
				t.Errorf("CopyOut has %s, not copied in", n)
			}
		}
		fi, err := svc.Stat(ctx, name, "cin/link")
		if err != nil || fi.Link != "sub/b.bin" || fi.Mode&fs.ModeSymlink == 0 {
			t.Errorf("Stat cin/link = %+v, %v; want a symlink to sub/b.bin", fi, err)
		}
		if got := readAll(t, ctx, svc, name, "cin/sub/up"); got != "alpha\n" {
			t.Errorf("ReadFile through the inner symlink = %q", got)
		}

		one, err := copyOut(t, ctx, svc, name, "cin/run.sh")
		if e := one["run.sh"]; err != nil || len(one) != 1 || e.Data != "#!/bin/sh\necho hi\n" || e.Mode != 0o755 {
			t.Errorf("CopyOut of one file = %v, %v; want run.sh alone, mode 755", one, err)
		}
	})

	t.Run("Refused", func(t *testing.T) {
		after := TarEntry{Name: "after.txt", Mode: 0o644, MTime: at, Data: "must not land"}
		for _, bad := range []TarEntry{
			{Name: "../evil.txt", Data: "x"},
			{Name: "/evil.txt", Data: "x"},
			{Name: "in/../../evil.txt", Data: "x"},
			{Name: "bad", Type: tar.TypeSymlink, Link: "../evil.txt"},
			{Name: "in/bad", Type: tar.TypeSymlink, Link: "../../evil.txt"},
			{Name: "bad", Type: tar.TypeSymlink, Link: "/etc/passwd"},
		} {
			label := fmt.Sprintf("CopyIn %s → %q", bad.Name, bad.Link)
			_, err := svc.CopyIn(ctx, name, "cbad", bytes.NewReader(Tar(t, bad, after)))
			wantClass(t, label, err, session.ErrInvalid)
			// cbad did not exist: a refused copy leaves nothing under its
			// name, so the same copy again means what it meant.
			for _, p := range []string{"evil.txt", "cbad"} {
				if _, err := svc.Stat(ctx, name, p); !isNotFound(err) {
					t.Errorf("after %s: Stat %s = %v, want not found", label, p, err)
				}
			}
		}
		_, err := svc.CopyIn(ctx, name, "../out", bytes.NewReader(Tar(t, after)))
		wantClass(t, "CopyIn into ../out", err, session.ErrInvalid)

		// sub/up points at ../a.txt: inside cin, out of cin/sub.
		_, err = copyOut(t, ctx, svc, name, "cin/sub")
		wantClass(t, "CopyOut of a tree with a symlink out of it", err, session.ErrInvalid)
		_, err = svc.CopyOut(ctx, name, "cin/missing")
		wantClass(t, "CopyOut missing", err, session.ErrNotFound)
		_, err = svc.CopyOut(ctx, name, "../etc")
		wantClass(t, "CopyOut ../etc", err, session.ErrInvalid)
		_, err = svc.CopyOut(ctx, "conf-missing", "")
		wantClass(t, "CopyOut of a missing session", err, session.ErrNotFound)
	})
}

func isNotFound(err error) bool { return errors.Is(err, session.ErrNotFound) }

func describe(e TarEntry) string {
	data := e.Data
	if len(data) > 16 {
		data = fmt.Sprintf("%d bytes", len(data))
	}
	return fmt.Sprintf("{type %q mode %v mtime %s data %q link %q}", e.Type, e.Mode, e.MTime.Format(time.RFC3339), data, e.Link)
}

func suiteReplace(t *testing.T, ctx context.Context, svc session.Service, name string) {
	if _, err := svc.WriteFile(ctx, name, "replace.txt", strings.NewReader("kept across replace")); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	t.Cleanup(func() { svc.Remove(context.WithoutCancel(ctx), name, "replace.txt") })
	p, err := svc.Exec(ctx, name, session.ExecRequest{Argv: []string{"sleep", "30"}})
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	res, err := svc.Replace(ctx, name, session.ReplaceOptions{})
	if err != nil {
		t.Fatalf("Replace: %v", err)
	}
	if res.Session.Name != name || res.Session.State != session.StateRunning || res.From == "" || res.To == "" {
		t.Errorf("Replace = %+v, want the session running, with from and to", res)
	}
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if x, err := p.Wait(wctx); err != nil || !x.State.Done() {
		t.Errorf("a command running across Replace: Wait = %s, %v; want it ended", x.State, err)
	}
	if got := readAll(t, ctx, svc, name, "replace.txt"); got != "kept across replace" {
		t.Errorf("after Replace, replace.txt = %q", got)
	}
	tl, err := svc.Timeline(ctx, name, 0)
	if err != nil {
		t.Fatalf("Timeline: %v", err)
	}
	if !slices.ContainsFunc(tl, func(ev session.Event) bool {
		return ev.Kind == session.EventNote && ev.By == "suite" && strings.Contains(ev.Message, "replaced")
	}) {
		t.Errorf("Timeline has no note of the replacement by suite")
	}

	_, err = svc.Replace(ctx, name, session.ReplaceOptions{Image: "conf-no-such-image"})
	wantClass(t, "Replace with a missing image", err, session.ErrNotFound)
	if s, err := svc.Get(ctx, name); err != nil || s.State != session.StateRunning {
		t.Errorf("after a refused Replace: %s, %v; want it still running", s.State, err)
	}
	_, err = svc.Replace(ctx, "conf-missing", session.ReplaceOptions{})
	wantClass(t, "Replace missing", err, session.ErrNotFound)
}

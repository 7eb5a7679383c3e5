package agent

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/berthvm/berth/guest"
)

// What the file calls create belongs to the user the host names (the
// session's, resolved against the guest's passwd as a command's user is),
// directories made on the way too; what they replace keeps its owner,
// whoever asks; Setstat's Owner gives a file to a named user; an unknown
// user is refused and nothing is made.
func TestFileCallsOwnWhatTheyCreate(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("giving files to another user needs root")
	}
	etc := t.TempDir()
	os.WriteFile(filepath.Join(etc, "passwd"), []byte("root:x:0:0:root:/root:/bin/sh\napp:x:1000:1001:App:/home/app:/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(etc, "group"), []byte("root:x:0:\napp:x:1001:\n"), 0o644)
	ws := t.TempDir()
	a, err := New(Config{Workspace: ws, Home: "/root", Etc: etc})
	if err != nil {
		t.Fatal(err)
	}
	root := dial(t, a)
	app := root.Owned("app")
	ctx := context.Background()
	owner := func(p string) string {
		fi, err := os.Lstat(filepath.Join(ws, p))
		if err != nil {
			return err.Error()
		}
		st := fi.Sys().(*syscall.Stat_t)
		return fmt.Sprintf("%d:%d", st.Uid, st.Gid)
	}
	// Files that exist before the calls: root's, and app's.
	os.WriteFile(filepath.Join(ws, "roots"), []byte("r"), 0o644)
	os.WriteFile(filepath.Join(ws, "apps"), []byte("a"), 0o644)
	os.Chown(filepath.Join(ws, "apps"), 1000, 1001)

	openWrite := func(c *guest.Client, p string, flags int) error {
		f, err := c.Open(ctx, p, guest.OpenWrite|flags, 0)
		if err != nil {
			return err
		}
		if _, err := f.WriteAt([]byte("x"), 0); err != nil {
			return err
		}
		return f.Close()
	}
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "d/", Mode: 0o755})
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "d/f", Mode: 0o644, Size: 1})
	tw.Write([]byte("x"))
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "d/l", Linkname: "f", Mode: 0o777})
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "roots", Mode: 0o644, Size: 1})
	tw.Write([]byte("y"))
	tw.Close()
	var ab bytes.Buffer // app's file, from root
	aw := tar.NewWriter(&ab)
	aw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "apps", Mode: 0o644, Size: 1})
	aw.Write([]byte("z"))
	aw.Close()

	for _, tc := range []struct {
		name string
		call func() error
		want map[string]string // path → uid:gid
	}{
		{"write a new file", func() error { _, err := app.WriteFile(ctx, "w.txt", strings.NewReader("x"), 0); return err },
			map[string]string{"w.txt": "1000:1001"}},
		{"write over root's file", func() error { _, err := app.WriteFile(ctx, "roots", strings.NewReader("x"), 0); return err },
			map[string]string{"roots": "0:0"}},
		{"root writes over app's file", func() error { _, err := root.WriteFile(ctx, "apps", strings.NewReader("x"), 0); return err },
			map[string]string{"apps": "1000:1001"}},
		{"open a new file, staged", func() error { return openWrite(app, "staged.txt", guest.OpenCreate|guest.OpenTruncate) },
			map[string]string{"staged.txt": "1000:1001"}},
		{"open a new file in place", func() error { return openWrite(app, "inplace.txt", guest.OpenCreate) },
			map[string]string{"inplace.txt": "1000:1001"}},
		{"open root's file, staged", func() error { return openWrite(app, "roots", guest.OpenCreate|guest.OpenTruncate) },
			map[string]string{"roots": "0:0"}},
		{"mkdir -p", func() error { return app.Mkdir(ctx, "m1/m2/m3", true) },
			map[string]string{"m1": "1000:1001", "m1/m2": "1000:1001", "m1/m2/m3": "1000:1001"}},
		{"mkdir", func() error { return app.Mkdir(ctx, "m1/one", false) },
			map[string]string{"m1/one": "1000:1001"}},
		{"symlink", func() error { return app.Symlink(ctx, "w.txt", "sl") },
			map[string]string{"sl": "1000:1001"}},
		{"unpack into a new directory", func() error { _, err := app.Unpack(ctx, "u1/u2", bytes.NewReader(tb.Bytes())); return err },
			map[string]string{"u1": "1000:1001", "u1/u2": "1000:1001", "u1/u2/d": "1000:1001", "u1/u2/d/f": "1000:1001", "u1/u2/d/l": "1000:1001", "u1/u2/roots": "1000:1001"}},
		{"unpack over root's file", func() error { _, err := app.Unpack(ctx, ".", bytes.NewReader(tb.Bytes())); return err },
			map[string]string{"roots": "0:0", "d": "1000:1001", "d/f": "1000:1001"}},
		{"root unpacks over app's file", func() error { _, err := root.Unpack(ctx, ".", bytes.NewReader(ab.Bytes())); return err },
			map[string]string{"apps": "1000:1001"}},
		{"setstat an owner", func() error {
			os.WriteFile(filepath.Join(ws, "give"), nil, 0o644)
			return root.Setstat(ctx, "give", guest.Attrs{Owner: "app"})
		}, map[string]string{"give": "1000:1001"}},
		{"as root", func() error { return root.Mkdir(ctx, "rootdir/sub", true) },
			map[string]string{"rootdir": "0:0", "rootdir/sub": "0:0"}},
	} {
		if err := tc.call(); err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		for p, want := range tc.want {
			if got := owner(p); got != want {
				t.Errorf("%s: %s is %s's, want %s's", tc.name, p, got, want)
			}
		}
	}

	ghost := root.Owned("ghost")
	for name, call := range map[string]func() error{
		"write":   func() error { _, err := ghost.WriteFile(ctx, "ghost1", strings.NewReader("x"), 0); return err },
		"mkdir":   func() error { return ghost.Mkdir(ctx, "ghost2/x", true) },
		"unpack":  func() error { _, err := ghost.Unpack(ctx, "ghost3", bytes.NewReader(tb.Bytes())); return err },
		"symlink": func() error { return ghost.Symlink(ctx, "x", "ghost4") },
		"open":    func() error { return openWrite(ghost, "ghost5", guest.OpenCreate) },
		"setstat": func() error { return root.Setstat(ctx, "roots", guest.Attrs{Owner: "ghost"}) },
	} {
		err := call()
		if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), `cannot give files to user "ghost"`) {
			t.Errorf("%s as an unknown user: %v", name, err)
		}
	}
	// Reading creates nothing, so names no owner to resolve.
	if f, err := ghost.Open(ctx, "roots", guest.OpenRead, 0); err != nil {
		t.Errorf("a read-only open by a client whose user is unknown: %v", err)
	} else {
		f.Close()
	}
	ents, _ := os.ReadDir(ws)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "ghost") || strings.Contains(e.Name(), ".berth-") {
			t.Errorf("a refused call left %s", e.Name())
		}
	}
	if got := owner("roots"); got != "0:0" {
		t.Errorf("a refused setstat changed roots to %s", got)
	}
	uid := 5
	if err := root.Setstat(ctx, "roots", guest.Attrs{Owner: "app", UID: &uid}); err == nil {
		t.Error("setstat with an owner and a uid succeeded")
	}
}

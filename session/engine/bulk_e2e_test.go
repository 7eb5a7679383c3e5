package engine_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/guest/tree"
	"github.com/berthvm/berth/vmm"
	"github.com/berthvm/berth/vmm/qemu"
	"github.com/berthvm/berth/vmm/vmmtest"
)

// TestTreeRoundTripVM copies a tree into a real guest as a session's user
// would (Client.Owned) and back out: content, modes, inner symlinks, empty
// directories and the owner survive, into a new directory (built under a
// stage, files written under their names) and over an existing one
// (each file replaced whole, its owner kept); an archive naming a file
// twice keeps the last; a symlink out of the tree, a ".." entry and an
// absolute one are refused and leave nothing behind.
func TestTreeRoundTripVM(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	b := vmmtest.Boot(t, qemu.New(qemu.Options{}), filepath.Join(dir, "vm"), filepath.Join(dir, "ws.img"), vmm.NewUUID())
	c := b.Agent.Owned("1000:1000")
	sh := func(script string) string {
		t.Helper()
		r := vmmtest.Run(t, b.Agent, "", "sh", "-c", "cd /workspace && "+script)
		if r.Err != nil || r.Exit.ExitCode != 0 {
			t.Fatalf("%s: %v exit %d: %s", script, r.Err, r.Exit.ExitCode, r.Stderr)
		}
		return strings.TrimSpace(string(r.Stdout))
	}

	src := filepath.Join(t.TempDir(), "src")
	for _, d := range []struct {
		p    string
		mode os.FileMode
	}{{"bin", 0o755}, {"empty", 0o700}, {"deep/er", 0o750}} {
		os.MkdirAll(filepath.Join(src, d.p), d.mode)
		os.Chmod(filepath.Join(src, d.p), d.mode)
	}
	big := make([]byte, 3<<20+17)
	rand.Read(big)
	os.WriteFile(filepath.Join(src, "deep", "er", "big.bin"), big, 0o600)
	os.WriteFile(filepath.Join(src, "bin", "run"), []byte("#!/bin/sh\necho run\n"), 0o755)
	os.WriteFile(filepath.Join(src, "README"), []byte("hello\n"), 0o644)
	os.WriteFile(filepath.Join(src, "zero"), nil, 0o640)
	os.Symlink("../README", filepath.Join(src, "bin", "readme"))
	os.Symlink("deep/er", filepath.Join(src, "er"))
	want := treeSums(t, src)
	pack := func() []byte {
		t.Helper()
		root, err := os.OpenRoot(src)
		if err != nil {
			t.Fatal(err)
		}
		defer root.Close()
		var buf bytes.Buffer
		if _, err := tree.Pack(root, ".", &buf, nil); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}

	// In, to a new directory, as user 1000.
	res, err := c.Unpack(ctx, "t/in", bytes.NewReader(pack()))
	if err != nil {
		t.Fatal(err)
	}
	if res.Files != 4 || res.Dirs != 4 || res.Symlinks != 2 {
		t.Errorf("unpack reported %+v, want 4 files, 4 directories, 2 symlinks", res)
	}
	owners := "t 1000:1000\nt/in 1000:1000\nt/in/README 1000:1000\nt/in/bin 1000:1000\nt/in/bin/readme 1000:1000\n" +
		"t/in/bin/run 1000:1000\nt/in/deep 1000:1000\nt/in/deep/er 1000:1000\nt/in/deep/er/big.bin 1000:1000\n" +
		"t/in/empty 1000:1000\nt/in/er 1000:1000\nt/in/zero 1000:1000"
	if got := sh("find t | sort | xargs stat -c '%n %u:%g'"); got != owners {
		t.Errorf("owners in the guest:\n%s\nwant:\n%s", got, owners)
	}
	if got := sh("ls -a t"); got != ".\n..\nin" {
		t.Errorf("left beside the copy: %q", got)
	}

	// Out again, unpacked on the host.
	out := func(p string) map[string]string {
		t.Helper()
		r, err := c.Pack(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		back := t.TempDir()
		root, err := os.OpenRoot(back)
		if err != nil {
			t.Fatal(err)
		}
		defer root.Close()
		if _, err := tree.Unpack(root, "got", r, tree.Options{}); err != nil {
			t.Fatal(err)
		}
		return treeSums(t, filepath.Join(back, "got"))
	}
	sameTree := func(what string, got map[string]string) {
		t.Helper()
		for k, v := range want {
			if k != "." && got[k] != v {
				t.Errorf("%s: %s came back as %q, went in as %q", what, k, got[k], v)
			}
		}
		if len(got) != len(want) {
			t.Errorf("%s: %d entries came back, %d went in", what, len(got), len(want))
		}
	}
	sameTree("new directory", out("t/in"))

	// Over the existing directory: root's file keeps root as its owner,
	// its content replaced whole.
	sh("chown 0:0 t/in/README && echo old > t/in/README")
	os.WriteFile(filepath.Join(src, "README"), []byte("hello again\n"), 0o644)
	want = treeSums(t, src)
	if _, err := c.Unpack(ctx, "t/in", bytes.NewReader(pack())); err != nil {
		t.Fatal(err)
	}
	sameTree("existing directory", out("t/in"))
	if got := sh("stat -c '%u:%g' t/in/README t/in/bin/run"); got != "0:0\n1000:1000" {
		t.Errorf("owners after a copy over: %q, want root's file still root's", got)
	}
	if got := sh("ls -a t/in | grep berth || true"); got != "" {
		t.Errorf("temporary files left: %q", got)
	}

	// One name twice: the last wins, as tar would have it.
	tarOf := func(hs ...*tar.Header) []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range hs {
			tw.WriteHeader(h)
			if h.Typeflag == tar.TypeReg {
				tw.Write([]byte(h.Linkname)) // the content, carried in an unused field
				h.Linkname = ""
			}
		}
		tw.Close()
		return buf.Bytes()
	}
	file := func(name, content string) *tar.Header {
		return &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(content)), Linkname: content}
	}
	if _, err := c.Unpack(ctx, "t/dup", bytes.NewReader(tarOf(file("x", "first"), file("x", "second!")))); err != nil {
		t.Fatal(err)
	}
	if got := sh("cat t/dup/x; echo; stat -c %u t/dup/x"); got != "second!\n1000" {
		t.Errorf("a name given twice: %q", got)
	}

	// Refused: nothing of them stays, in the new directory or beside it.
	for _, bad := range []struct {
		name string
		tar  []byte
	}{
		{"symlink out", tarOf(file("a", "a"), &tar.Header{Typeflag: tar.TypeSymlink, Name: "etc", Linkname: "../../etc"})},
		{"absolute symlink", tarOf(file("a", "a"), &tar.Header{Typeflag: tar.TypeSymlink, Name: "pw", Linkname: "/etc/passwd"})},
		{"dot-dot entry", tarOf(file("a", "a"), file("../escaped", "x"))},
		{"absolute entry", tarOf(file("a", "a"), file("/etc/escaped", "x"))},
	} {
		_, err := c.Unpack(ctx, "t/evil", bytes.NewReader(bad.tar))
		if !errors.Is(err, guest.ErrEscape) {
			t.Errorf("%s: %v, want ErrEscape", bad.name, err)
		}
	}
	if got := sh("ls -a t; ls -a /etc | grep escaped || true"); got != ".\n..\ndup\nin" {
		t.Errorf("refused copies left: %q", got)
	}
	// Out: a symlink that leads out of the tree stops the copy.
	sh("ln -s /etc t/in/bin/etc")
	r, err := c.Pack(ctx, "t/in")
	if err == nil {
		_, err = tree.Unpack(mustRoot(t, t.TempDir()), "got", r, tree.Options{})
		r.Close()
	}
	if !errors.Is(err, guest.ErrEscape) && (err == nil || !strings.Contains(err.Error(), "points out of the tree")) {
		t.Errorf("packing a tree with a symlink out: %v", err)
	}
}

func mustRoot(t *testing.T, dir string) *os.Root {
	t.Helper()
	r, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// TestStdinSlowReaderVM sends a command more stdin than the agent queues
// (16 MB) before the command starts reading: the host waits for it (the
// stream's window) and every byte arrives. The agent used to give up on
// the stream once its queue was over the bound, and the host's writes then
// blocked forever (a 100 MB stdin into cat hung on a loaded host).
func TestStdinSlowReaderVM(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	b := vmmtest.Boot(t, qemu.New(qemu.Options{}), filepath.Join(dir, "vm"), filepath.Join(dir, "ws.img"), vmm.NewUUID())
	const size = 40 << 20
	x, err := b.Agent.Exec(ctx, guest.ExecRequest{ID: "slow-stdin", Argv: []string{"sh", "-c", "sleep 3; wc -c"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	sent := make(chan error, 1)
	go func() {
		buf := make([]byte, 1<<20)
		for i := 0; i < size>>20; i++ {
			if _, err := x.Write(buf); err != nil {
				sent <- err
				return
			}
		}
		sent <- x.CloseStdin()
	}()
	var out []byte
	for o := range x.Output() {
		out = append(out, o.Data...)
	}
	if err := <-sent; err != nil {
		t.Fatalf("sending stdin: %v", err)
	}
	info, err := x.Wait(ctx)
	if err != nil || info.ExitCode != 0 {
		t.Fatalf("exit %+v, %v", info, err)
	}
	if got := strings.TrimSpace(string(out)); got != fmt.Sprint(size) {
		t.Errorf("the command read %q bytes, want %d", got, size)
	}
}

package agent

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestTrackChanges records changes made outside the agent (a plain
// process, as an SSH shell's would be) and reads them back as paths.
func TestTrackChanges(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "old/dir"), 0o755)
	os.WriteFile(filepath.Join(dir, "keep"), []byte("k"), 0o644)
	os.WriteFile(filepath.Join(dir, "edit"), []byte("e"), 0o644)
	os.WriteFile(filepath.Join(dir, "gone"), []byte("g"), 0o644)
	os.WriteFile(filepath.Join(dir, "mv-from"), []byte("m"), 0o644)
	os.WriteFile(filepath.Join(dir, "mode"), []byte("x"), 0o644)
	_, c := connect(t, dir)
	ctx := context.Background()
	if err := c.Track(ctx, "r1", 0); err != nil {
		if errors.Is(err, unix.EPERM) || os.Geteuid() != 0 {
			t.Skipf("fanotify needs CAP_SYS_ADMIN: %v", err)
		}
		t.Fatal(err)
	}
	sh := `echo more >> edit && rm gone && mv mv-from mv-to && chmod 755 mode && mkdir -p new/deep && echo n > new/deep/f && mv old renamed`
	cmd := exec.Command("sh", "-c", sh)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	want := []string{"edit", "gone", "mode", "mv-from", "mv-to", "new", "new/deep", "new/deep/f", "old", "renamed"}
	var paths []string
	// Events arrive asynchronously: wait until the record has them all
	// (bounded by the test's deadline, not by a guess at a time).
	for {
		st, p, err := c.Changes(ctx, "r1")
		if err != nil {
			t.Fatal(err)
		}
		if !st.Known || st.Overflow {
			t.Fatalf("state %+v", st)
		}
		paths = p
		if hasAll(paths, want) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if slices.Contains(paths, "keep") {
		t.Errorf("untouched path recorded: %q", paths)
	}
	if st, _, _ := c.Changes(ctx, "nope"); st.Known {
		t.Error("unknown tracker reported as known")
	}
	if err := c.Untrack(ctx, "r1"); err != nil {
		t.Fatal(err)
	}
	if st, _, _ := c.Changes(ctx, "r1"); st.Known {
		t.Error("dropped tracker still known")
	}
}

// TestTrackOverflow: a record past its bound is dropped and says so.
func TestTrackOverflow(t *testing.T) {
	dir := t.TempDir()
	a, c := connect(t, dir)
	a.trackerFor().limit = 5
	ctx := context.Background()
	if err := c.Track(ctx, "r1", 0); err != nil {
		if os.Geteuid() != 0 {
			t.Skipf("fanotify needs CAP_SYS_ADMIN: %v", err)
		}
		t.Fatal(err)
	}
	for i := range 20 {
		os.WriteFile(filepath.Join(dir, fmt.Sprint(i)), []byte("x"), 0o644)
	}
	for {
		st, paths, err := c.Changes(ctx, "r1")
		if err != nil {
			t.Fatal(err)
		}
		if st.Overflow {
			if len(paths) != 0 {
				t.Errorf("an overflowed record lists %d paths", len(paths))
			}
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func hasAll(got, want []string) bool {
	for _, w := range want {
		if !slices.Contains(got, w) {
			return false
		}
	}
	return true
}

// TestScan describes paths with identity, content hashes and symlinks,
// and refuses paths out of the workspace.
func TestScan(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "d/e"), 0o755)
	os.WriteFile(filepath.Join(dir, "d/e/f"), []byte("hello"), 0o600)
	os.Symlink("/etc", filepath.Join(dir, "out"))
	os.Symlink("d", filepath.Join(dir, "in"))
	_, c := connect(t, dir)
	ctx := context.Background()
	es, err := c.Scan(ctx, []string{"d", "missing", "out", "d/e/f"}, false, true)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, e := range es {
		got[e.Path] = fmt.Sprintf("%v %o %s %s", e.Missing, e.Mode&0o777, e.Link, e.Sum)
		if !e.Missing && e.Ino == 0 {
			t.Errorf("%s: no inode number", e.Path)
		}
	}
	want := map[string]string{
		"d":       "false 755  ",
		"missing": "true 0  ",
		"out":     "false 777 /etc ",
		"d/e/f":   "false 600  2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824",
	}
	for p, w := range want {
		if got[p] != w {
			t.Errorf("%s: %q, want %q", p, got[p], w)
		}
	}
	all, err := c.Scan(ctx, []string{"."}, true, false)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range all {
		names = append(names, e.Path)
	}
	slices.Sort(names)
	if fmt.Sprint(names) != "[d d/e d/e/f in out]" {
		t.Errorf("walk: %q (a walk must not enter symlinks)", names)
	}
	for _, bad := range []string{"../x", "/etc/passwd", "out/passwd"} {
		if _, err := c.Scan(ctx, []string{bad}, false, false); err == nil {
			t.Errorf("%s: no refusal", bad)
		}
	}
}

// FuzzFanotifyEvents parses whatever a read of the fanotify group gives.
func FuzzFanotifyEvents(f *testing.F) {
	ev := func(mask uint64, typ byte, handle []byte, name string) []byte {
		info := make([]byte, 20+len(handle)+len(name)+1)
		info[0] = typ
		binary.LittleEndian.PutUint16(info[2:], uint16(len(info)))
		binary.LittleEndian.PutUint32(info[12:], uint32(len(handle)))
		binary.LittleEndian.PutUint32(info[16:], 1)
		copy(info[20:], handle)
		copy(info[20+len(handle):], name)
		meta := make([]byte, 24)
		binary.LittleEndian.PutUint32(meta[0:], uint32(24+len(info)))
		meta[4] = 3
		binary.LittleEndian.PutUint16(meta[6:], 24)
		binary.LittleEndian.PutUint64(meta[8:], mask)
		return append(meta, info...)
	}
	f.Add(ev(unix.FAN_CREATE, unix.FAN_EVENT_INFO_TYPE_DFID_NAME, []byte("12345678"), "file"))
	f.Add(append(ev(unix.FAN_MODIFY, unix.FAN_EVENT_INFO_TYPE_DFID_NAME, []byte("12345678"), "a"), ev(unix.FAN_ATTRIB|unix.FAN_ONDIR, unix.FAN_EVENT_INFO_TYPE_DFID, []byte("abcdefgh"), "")...))
	f.Add(ev(unix.FAN_Q_OVERFLOW, 0, nil, ""))
	f.Fuzz(func(t *testing.T, b []byte) {
		keys, _ := parseEvents(b)
		for _, k := range keys {
			if len(k) > len(b) {
				t.Fatalf("key of %d bytes from %d", len(k), len(b))
			}
			if hk, _ := splitKey(k); hk == "" {
				t.Fatalf("key %q does not split", k)
			}
		}
	})
}

// TestTrackDrained: the record read just after a change holds it, though
// the reader lets events gather between its reads (readPause): what the
// kernel queued is read in first. Each round's writes end before Changes
// is asked, so the kernel has queued their events (fanotify queues them
// in the writer's syscall).
func TestTrackDrained(t *testing.T) {
	dir := t.TempDir()
	_, c := connect(t, dir)
	ctx := context.Background()
	if err := c.Track(ctx, "r1", 0); err != nil {
		if errors.Is(err, unix.EPERM) || os.Geteuid() != 0 {
			t.Skipf("fanotify needs CAP_SYS_ADMIN: %v", err)
		}
		t.Fatal(err)
	}
	for i := range 20 {
		name := fmt.Sprintf("f%d", i)
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		st, paths, err := c.Changes(ctx, "r1")
		if err != nil || !st.Known || st.Overflow {
			t.Fatalf("Changes: %+v, %v", st, err)
		}
		if !slices.Contains(paths, name) {
			t.Fatalf("round %d: %s, written before Changes was asked, is not in the record %q", i, name, paths)
		}
	}
}

// TestTrackIdleRead: a record is read while the reader waits for events
// that do not come (it holds its descriptor's read lock then): the read
// must not wait for it. The record is of a tmpfs of its own, so nothing
// else on the machine writes there and wakes the reader.
func TestTrackIdleRead(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("a quiet filesystem needs mounting a tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	_, c := connect(t, dir)
	ctx := context.Background()
	if err := c.Track(ctx, "r1", 0); err != nil {
		if errors.Is(err, unix.EPERM) || os.Geteuid() != 0 {
			t.Skipf("fanotify needs CAP_SYS_ADMIN: %v", err)
		}
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644)
	time.Sleep(3 * readPause) // the reader has read it and waits again
	for range 3 {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		st, paths, err := c.Changes(cctx, "r1")
		cancel()
		if err != nil || !st.Known || !slices.Contains(paths, "f") {
			t.Fatalf("Changes while the reader is idle: %+v %q, %v", st, paths, err)
		}
	}
}

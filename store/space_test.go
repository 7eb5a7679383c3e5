package store

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
	"golang.org/x/sys/unix"
)

func TestBadgerMapped(t *testing.T) {
	cases := []struct {
		name  string
		files []string
		want  []string
	}{
		{"fresh store", []string{"00001.mem", "000001.vlog", "DISCARD", "KEYREGISTRY", "MANIFEST"},
			[]string{"DISCARD", "00001.mem", "000001.vlog"}},
		{"immutable memtables and old value logs are left alone",
			[]string{"00003.mem", "00012.mem", "00007.mem", "000002.vlog", "000010.vlog", "000009.vlog", "DISCARD", "000004.sst"},
			[]string{"DISCARD", "00012.mem", "000010.vlog"}},
		{"other files", []string{"berth.lock", "x.mem.tmp", "abc.vlog", "output"}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, f := range c.files {
				if err := os.WriteFile(filepath.Join(dir, f), nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			got, err := badgerMapped(dir)
			if err != nil {
				t.Fatal(err)
			}
			slices.Sort(got)
			want := slices.Clone(c.want)
			slices.Sort(want)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("badgerMapped = %q, want %q", got, want)
			}
		})
	}
}

func freeBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * int64(st.Bsize)
}

// TestSpaceFloors: output is kept above the whole reserve, other writes
// above half of it, and the store's own files are allocated before.
func TestSpaceFloors(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir)
	// Every mapped badger file is fully allocated after Open.
	names, err := badgerMapped(dir)
	if err != nil || len(names) != 3 {
		t.Fatalf("badgerMapped = %q, %v", names, err)
	}
	for _, name := range names {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if a := fi.Sys().(*syscall.Stat_t).Blocks * 512; a < fi.Size() {
			t.Errorf("%s: %d of %d bytes allocated", name, a, fi.Size())
		}
	}

	free := freeBytes(t, dir)
	cases := []struct {
		name      string
		reserve   int64
		need      int64
		wantFloor int64 // 0: allowed
	}{
		{"output above the reserve", free / 2, 1 << 20, 0},
		{"output that would go below the reserve", free / 2, free/2 + 1<<30, free / 2},
		{"output below the reserve", free * 3 / 2, 1, free * 3 / 2},
		{"a record below the reserve, above its half", free * 3 / 2, 0, 0},
		{"a record below half the reserve", free * 3, 0, free * 3 / 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sp := newSpace(dir, c.reserve, testLogger(t))
			err := sp.room(c.need)
			if c.wantFloor == 0 {
				if err != nil {
					t.Fatalf("room(%d) with %d free, reserve %d: %v", c.need, free, c.reserve, err)
				}
				return
			}
			var se *SpaceError
			if !errors.As(err, &se) || !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("room(%d) with %d free, reserve %d: %v, want a SpaceError", c.need, free, c.reserve, err)
			}
			if se.Dir != dir || se.Floor != c.wantFloor || se.Need != c.need {
				t.Errorf("SpaceError %+v, want floor %d need %d", se, c.wantFloor, c.need)
			}
		})
	}

	// A store whose reserve exceeds the disk refuses writes and serves reads.
	if err := s.PutSession(Session{Name: "s"}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = Open(dir, testLogger(t), WithReserve(free*3))
	if err != nil {
		t.Fatalf("Open with a reserve above the free space: %v", err)
	}
	defer s.Close()
	if err := s.PutSession(Session{Name: "t"}); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("PutSession: %v, want ENOSPC", err)
	}
	if _, err := s.GetSession("s"); err != nil {
		t.Errorf("GetSession: %v", err)
	}
	s.Close()
	if _, err := Open(dir, testLogger(t), WithReserve(free*5)); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("Open with a quarter of the reserve not free: %v, want ENOSPC", err)
	}
}

// smallFS mounts a new filesystem of the given kind ("tmpfs" or "ext4" on
// a loop device) and size, unmounted when the test ends. It skips the
// test when it cannot.
func smallFS(t *testing.T, kind string, size int64) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a small filesystem needs root")
	}
	dir := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	run := func(name string, args ...string) {
		t.Helper()
		if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
			t.Skipf("cannot make a small %s: %s %q: %v: %s", kind, name, args, err, out)
		}
	}
	switch kind {
	case "tmpfs":
		run("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", size), "tmpfs", dir)
	case "ext4":
		img := filepath.Join(t.TempDir(), "fs.img")
		if err := os.WriteFile(img, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(img, size); err != nil {
			t.Fatal(err)
		}
		// No blocks reserved for root, so root's writes and the store see
		// the same free space.
		run("mkfs.ext4", "-q", "-F", "-m", "0", img)
		run("mount", "-o", "loop", img, dir)
	default:
		t.Fatalf("unknown filesystem %q", kind)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
			exec.Command("umount", "-l", dir).Run()
		}
	})
	return dir
}

// fill creates a file under dir that leaves at most leave bytes free.
func fill(t *testing.T, dir, name string, leave int64) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	off := fi.Size()
	zeros := make([]byte, 512)
	for {
		n := freeBytes(t, dir) - leave
		if n <= 0 {
			return
		}
		if n >= 1<<20 {
			step := min(n, 8<<20) &^ (1<<20 - 1)
			if err := unix.Fallocate(int(f.Fd()), 0, off, step); err == nil {
				off += step
				continue
			} else if !errors.Is(err, unix.ENOSPC) {
				t.Fatal(err)
			}
		}
		// The last blocks a write at a time, until the disk is full.
		w, err := f.WriteAt(zeros[:min(n, int64(len(zeros)))], off)
		off += int64(w)
		if errors.Is(err, syscall.ENOSPC) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// pending is an append prepared for the model, kept to be retried as it
// was.
type pending struct {
	id       string
	chunks   []Chunk
	out, err int64
}

func (m *model) prepare(rng *rand.Rand, id string, sizes ...int) pending {
	m.mu.Lock()
	prev := m.chunks[id]
	m.mu.Unlock()
	p := pending{id: id}
	for _, c := range prev {
		if c.Stream == Stdout {
			p.out += int64(len(c.Data))
		} else {
			p.err += int64(len(c.Data))
		}
	}
	for i, n := range sizes {
		c := Chunk{Exec: id, Seq: uint64(len(prev) + i), Stream: Stdout, Time: t0.Add(time.Duration(rng.Int64N(1e12))),
			Data: make([]byte, n)}
		for j := range c.Data {
			c.Data[j] = byte(rng.Uint32())
		}
		if n%2 == 1 {
			c.Stream = Stderr
			p.err += int64(n)
		} else {
			p.out += int64(n)
		}
		p.chunks = append(p.chunks, c)
	}
	return p
}

// store appends p; the model records it only if it was stored.
func (m *model) store(t *testing.T, p pending) error {
	t.Helper()
	e, err := m.s.AppendOutput(p.id, p.chunks, p.out, p.err)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if want := uint64(len(m.chunks[p.id]) + len(p.chunks)); e.NextSeq != want {
		t.Errorf("AppendOutput(%q) returned NextSeq %d, want %d", p.id, e.NextSeq, want)
	}
	m.chunks[p.id] = append(m.chunks[p.id], p.chunks...)
	return nil
}

// TestFullDisk fills a real, small filesystem under the store: the process
// survives, output and then every other write is refused with ENOSPC,
// reads go on, and once space returns the held output is stored exactly
// once.
func TestFullDisk(t *testing.T) {
	for _, kind := range []string{"tmpfs", "ext4"} {
		t.Run(kind, func(t *testing.T) { testFullDisk(t, kind) })
	}
}

func testFullDisk(t *testing.T, kind string) {
	root := smallFS(t, kind, 256<<20)
	dir := filepath.Join(root, "store")
	s := openTest(t, dir)
	fillers := []string{"filler-1", "filler-2", "filler-3"}
	unfill := func() {
		for _, f := range fillers {
			if err := os.Remove(filepath.Join(root, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Error(err)
			}
		}
		time.Sleep(statEvery + 10*time.Millisecond) // the store sees the space
	}
	// Before the store closes (cleanups run last first): closing flushes
	// the memtable, which needs space.
	t.Cleanup(unfill)
	if err := s.PutSession(Session{Name: "s", State: "running", Retention: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	m := newModel(s)
	m.exec(t, "e", "s", t0)
	rng := rand.New(rand.NewPCG(14, 14))

	// A noisy session's output fills the disk down to the reserve plus
	// the quiet share, and is held there.
	quietShare := DefaultReserve / 2
	fill(t, root, fillers[0], DefaultReserve+quietShare+8<<20)
	time.Sleep(statEvery + 10*time.Millisecond)
	var held pending
	var err error
	stored := 0
	for {
		held = m.prepare(rng, "e", 64<<10)
		if err = m.store(t, held); err != nil {
			break
		}
		if stored++; stored > 1000 {
			t.Fatalf("%d MiB stored on a disk with 8 MiB above the reserve and share", stored/16)
		}
	}
	var se *SpaceError
	if !errors.Is(err, syscall.ENOSPC) || !errors.As(err, &se) || !se.Noisy || se.Floor != DefaultReserve+quietShare || !strings.Contains(err.Error(), "held first") {
		t.Fatalf("AppendOutput of the noisy session on a filling disk: %v, want it held first, above the reserve and the quiet share", err)
	}
	if stored < 64 {
		t.Errorf("only %d chunks stored before the reserve", stored)
	}
	t.Logf("%d chunks stored, then: %v", stored, err)
	m.check(t, "s", 1<<30)

	// Another session's small output is still stored, down to the reserve
	// itself; below it, it is held too.
	if err := s.PutSession(Session{Name: "q", State: "running", Retention: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	m.exec(t, "qx", "q", t0)
	if err := m.store(t, m.prepare(rng, "qx", 100)); err != nil {
		t.Fatalf("a quiet session's output with the noisy one held: %v", err)
	}
	fill(t, root, "filler-q", DefaultReserve+4<<20)
	time.Sleep(statEvery + 10*time.Millisecond)
	if err := m.store(t, m.prepare(rng, "qx", 100)); err != nil {
		t.Fatalf("a quiet session's output 4 MiB above the reserve: %v", err)
	}
	if err := m.store(t, held); !errors.As(err, &se) || !se.Noisy {
		t.Fatalf("the noisy session's held output 4 MiB above the reserve: %v, want it still held", err)
	}
	fill(t, root, "filler-q", DefaultReserve-1<<20)
	time.Sleep(statEvery + 10*time.Millisecond)
	quiet := m.prepare(rng, "qx", 100)
	if err := m.store(t, quiet); !errors.As(err, &se) || se.Noisy || se.Floor != DefaultReserve {
		t.Fatalf("a quiet session's output below the reserve: %v, want held at the reserve", err)
	}
	if err := os.Remove(filepath.Join(root, "filler-q")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(statEvery + 10*time.Millisecond)
	if err := m.store(t, quiet); err != nil {
		t.Fatalf("the quiet session's held output once space returned: %v", err)
	}
	m.check(t, "q", 1<<30)
	// Records still go in: the daemon can say why output is held.
	if err := s.PutSession(Session{Name: "s", State: "running", Retention: 1 << 30, Cause: "output held"}); err != nil {
		t.Errorf("PutSession above half the reserve: %v", err)
	}
	if _, err := s.AppendEvent(Event{Session: "s", Kind: "held"}); err != nil {
		t.Errorf("AppendEvent above half the reserve: %v", err)
	}

	// Something else takes the disk below half the reserve: every write is
	// refused, every read still works.
	fill(t, root, fillers[1], DefaultReserve/2-4<<20)
	time.Sleep(statEvery + 10*time.Millisecond)
	writes := map[string]func() error{
		"PutSession":  func() error { return s.PutSession(Session{Name: "s", State: "stopped"}) },
		"PutExec":     func() error { return s.PutExec(Exec{ID: "f", Session: "s", State: "running"}) },
		"AppendEvent": func() error { _, err := s.AppendEvent(Event{Session: "s", Kind: "k"}); return err },
		"AppendOutput": func() error {
			_, err := s.AppendOutput(held.id, held.chunks, held.out, held.err)
			return err
		},
		"AppendOutput offsets only": func() error { _, err := s.AppendOutput("e", nil, held.out-64<<10, held.err); return err },
		"DeleteSession":             func() error { return s.DeleteSession("s") },
		"GC":                        s.GC,
	}
	checkRefused := func(when string) {
		t.Helper()
		for name, w := range writes {
			if err := w(); !errors.Is(err, syscall.ENOSPC) {
				t.Errorf("%s: %s = %v, want ENOSPC", when, name, err)
			}
		}
		if sess, err := s.GetSession("s"); err != nil || sess.Cause != "output held" {
			t.Errorf("%s: GetSession = %+v, %v", when, sess, err)
		}
		if evs, err := s.Events("s", 0); err != nil || len(evs) != 1 {
			t.Errorf("%s: Events = %+v, %v", when, evs, err)
		}
		m.check(t, "s", 1<<30)
	}
	checkRefused("below half the reserve")

	// The disk is full to the last block. Badger's own writes go into the
	// files allocated ahead, so even a write past the store's checks does
	// not fault; a segment write fails with ENOSPC and leaves nothing.
	fill(t, root, fillers[2], 0)
	time.Sleep(statEvery + 10*time.Millisecond)
	if free := freeBytes(t, root); free >= 64<<10 {
		t.Fatalf("%d bytes free after filling the disk", free)
	}
	checkRefused("on a full disk")
	for i := range 20 {
		err := s.db.Update(func(txn *badger.Txn) error {
			for j := range 100 {
				k := fmt.Appendf(nil, "test/full/%02d/%03d", i, j)
				if err := txn.Set(k, make([]byte, 16+j%2*200)); err != nil { // some to the value log
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("badger write into its preallocated files: %v", err)
		}
	}
	var st *outState
	s.db.View(func(txn *badger.Txn) (err error) {
		st, err = getOutState(txn, "e")
		return err
	})
	big := []Chunk{{Stream: Stdout, Data: make([]byte, 4<<20)}}
	if err := s.seg.write("e", st.SegEnd, big); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("segment write on a full disk: %v, want ENOSPC", err)
	}
	if fi, err := os.Stat(s.seg.path("e")); err != nil || fi.Size() != st.SegEnd {
		t.Errorf("segment after a failed write: %v, %v; want it cut back to %d", fi.Size(), err, st.SegEnd)
	}

	// Space returns: the held append goes in once, and output continues.
	unfill()
	if err := m.store(t, held); err != nil {
		t.Fatalf("retrying the held append: %v", err)
	}
	for range 32 {
		if err := m.store(t, m.prepare(rng, "e", 64<<10, 1000, 3)); err != nil {
			t.Fatal(err)
		}
	}
	m.check(t, "s", 1<<30)
	if err := s.Sync(); err != nil {
		t.Errorf("Sync: %v", err)
	}
	s.Close()

	// Too little space to open badger safely: refused, not a crash.
	fill(t, root, fillers[0], DefaultReserve/4-4<<20)
	if s, err := Open(dir, testLogger(t)); !errors.Is(err, syscall.ENOSPC) {
		if err == nil {
			s.Close()
		}
		t.Errorf("Open on a full disk: %v, want ENOSPC", err)
	}
	unfill()
	s = openTest(t, dir)
	m.s = s
	m.check(t, "s", 1<<30)
}

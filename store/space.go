package store

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultReserve is the free space the store keeps on its filesystem when
// Open is not given WithReserve. Output stops being stored below it; the
// database's own records stop below half of it. See Store for the figures.
const DefaultReserve int64 = 64 << 20

// SpaceError reports a write the store refused because its filesystem has
// too little free space. It unwraps to syscall.ENOSPC, so errors.Is(err,
// syscall.ENOSPC) holds for it as for a failed write(2).
type SpaceError struct {
	Dir   string
	Free  int64 // bytes available to the store when it checked
	Need  int64 // bytes the write would have taken, 0 for records
	Floor int64 // bytes the store keeps free for this kind of write
	// Noisy is set when the output was held early because its session
	// filled the disk fastest: Recent is what it wrote in the last
	// noisyWindow; the band above the reserve is kept for the others.
	Noisy  bool
	Recent int64
}

func (e *SpaceError) Error() string {
	if e.Noisy {
		return fmt.Sprintf("store %s: %d bytes free; output of a session that wrote %d bytes in the last %s is held first, above %d kept free for the others: %v",
			e.Dir, e.Free, e.Recent, noisyWindow, e.Floor, syscall.ENOSPC)
	}
	if e.Need > 0 {
		return fmt.Sprintf("store %s: %d bytes free, %d more would leave less than the %d kept free: %v",
			e.Dir, e.Free, e.Need, e.Floor, syscall.ENOSPC)
	}
	return fmt.Sprintf("store %s: %d bytes free, below the %d kept free: %v", e.Dir, e.Free, e.Floor, syscall.ENOSPC)
}

func (e *SpaceError) Unwrap() error { return syscall.ENOSPC }

// Option configures Open.
type Option func(*options)

type options struct {
	reserve int64
}

// WithReserve sets the free space the store keeps on its filesystem (see
// DefaultReserve). Values below the database's largest allocation make a
// full disk crash the daemon again; tests use it to fill a small disk.
func WithReserve(n int64) Option {
	return func(o *options) {
		if n > 0 {
			o.reserve = n
		}
	}
}

// statEvery bounds how stale the free-space figure may be. Between two
// statfs calls the store subtracts what it writes itself, so only other
// writers to the filesystem can make it optimistic.
const statEvery = 100 * time.Millisecond

// space keeps badger's writes within space reserved ahead. Badger writes
// its WAL (.mem), value log (.vlog) and discard stats through shared
// memory maps of files it only ftruncates, and a page fault that needs a
// block on a full filesystem is SIGBUS, which kills the process. So before
// every write the store makes sure those files are fully allocated
// (fallocate) and that enough space is free for what badger allocates on
// its own (memtable flushes, compactions), and refuses the write with a
// SpaceError otherwise.
type space struct {
	dir     string
	reserve int64
	log     *slog.Logger

	mu     sync.Mutex
	statAt time.Time
	free   int64 // available at statAt, less what the store wrote since
	// dirMod is the store dir's mtime at the last scan; ready means the
	// files found then are fully allocated.
	dirMod time.Time
	ready  bool
	// files are the badger files kept allocated, with the size they were
	// allocated to; noAlloc is set when the filesystem cannot fallocate.
	files   map[string]int64
	noAlloc bool
	// recent is each session's output offered (stored or held) in the
	// current and the previous noisyWindow, to tell the session filling
	// the disk from the others.
	recent map[string]*outRate
}

// outRate counts a session's output in two consecutive windows.
type outRate struct {
	start     time.Time // of the current window
	cur, prev int64
}

// The fairness of a full disk: a session that stored more than noisyBytes
// of output in the last noisyWindow is noisy, and its output is held once
// free space falls below the reserve plus a quiet share (half the
// reserve), which is left to the others' smaller output.
const (
	noisyWindow = 10 * time.Second
	noisyBytes  = 4 << 20
)

func newSpace(dir string, reserve int64, log *slog.Logger) *space {
	return &space{dir: dir, reserve: reserve, log: log, files: make(map[string]int64), recent: make(map[string]*outRate)}
}

// recentLocked is what session stored in about the last noisyWindow (the
// current window and the overlapping part of the previous one).
func (sp *space) recentLocked(session string, now time.Time) int64 {
	r := sp.recent[session]
	if r == nil {
		return 0
	}
	r.roll(now)
	left := noisyWindow - now.Sub(r.start)
	return r.cur + r.prev*int64(left)/int64(noisyWindow)
}

func (r *outRate) roll(now time.Time) {
	switch d := now.Sub(r.start); {
	case d >= 2*noisyWindow:
		r.start, r.cur, r.prev = now, 0, 0
	case d >= noisyWindow:
		r.start, r.cur, r.prev = r.start.Add(noisyWindow), 0, r.cur
	}
}

// note counts n bytes of output stored for session.
func (sp *space) noteLocked(session string, n int64, now time.Time) {
	r := sp.recent[session]
	if r == nil {
		if len(sp.recent) >= maxRates {
			for k, v := range sp.recent { // forget the idle
				if now.Sub(v.start) >= 2*noisyWindow {
					delete(sp.recent, k)
				}
			}
		}
		r = &outRate{start: now}
		sp.recent[session] = r
	}
	r.roll(now)
	r.cur += n
}

// maxRates bounds the sessions tracked before idle ones are dropped.
const maxRates = 4096

// recordFloor is what badger may need at once by itself; see Store.
func (sp *space) recordFloor() int64 { return sp.reserve / 2 }

// room checks that a write may go ahead: need bytes of output (kept above
// the whole reserve), or, when need is 0, a database write (kept above
// half of it). It allocates badger's new files first.
func (sp *space) room(need int64) error { return sp.roomFor("", need) }

// roomFor is room for output of session: a noisy session's output is held
// above the reserve plus a quiet share, so the others' keeps being stored.
func (sp *space) roomFor(session string, need int64) error {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	now := time.Now()
	fresh := false
	if now.Sub(sp.statAt) >= statEvery {
		if err := sp.statLocked(now); err != nil {
			return err
		}
		fresh = true
	}
	if err := sp.prepareLocked(fresh); err != nil {
		return err
	}
	floor := sp.recordFloor()
	if need > 0 {
		floor = sp.reserve
		if session != "" {
			// Demand counts, stored or not: a session whose output is
			// held retries, and stays noisy while it does.
			recent := sp.recentLocked(session, now)
			sp.noteLocked(session, need, now)
			if recent+need > noisyBytes {
				if noisy := sp.reserve + sp.reserve/2; sp.free-need < noisy {
					return &SpaceError{Dir: sp.dir, Free: sp.free, Need: need, Floor: noisy, Noisy: true, Recent: recent}
				}
			}
		}
	}
	if sp.free-need < floor {
		return &SpaceError{Dir: sp.dir, Free: sp.free, Need: need, Floor: floor}
	}
	sp.free -= need
	return nil
}

// atLeast refuses with a SpaceError when less than floor is free; Open uses
// it before badger writes anything.
func (sp *space) atLeast(floor int64) error {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if err := sp.statLocked(time.Now()); err != nil {
		return err
	}
	if sp.free < floor {
		return &SpaceError{Dir: sp.dir, Free: sp.free, Floor: floor}
	}
	return nil
}

func (sp *space) statLocked(now time.Time) error {
	var st unix.Statfs_t
	if err := unix.Statfs(sp.dir, &st); err != nil {
		return fmt.Errorf("free space of %s: %w", sp.dir, err)
	}
	sp.free = int64(st.Bavail) * int64(st.Bsize)
	sp.statAt = now
	return nil
}

// prepareLocked allocates the badger files that are written through
// memory maps: the newest .mem (the mutable memtable's WAL; older ones
// are immutable until flushed and deleted), the newest .vlog, and DISCARD.
// Between fresh statfs calls it looks at the directory only when its mtime
// changed; on each fresh one it looks anyway, because a coarse mtime can
// miss a change and DISCARD grows in place. So a new file goes unallocated
// for at most statEvery, which the floor covers.
func (sp *space) prepareLocked(fresh bool) error {
	fi, err := os.Stat(sp.dir)
	if err != nil {
		return fmt.Errorf("free space of %s: %w", sp.dir, err)
	}
	mod := fi.ModTime()
	if sp.ready && !fresh && mod.Equal(sp.dirMod) {
		return nil
	}
	names, err := badgerMapped(sp.dir)
	if err != nil {
		return err
	}
	sp.ready = false
	files := make(map[string]int64, len(names))
	for _, name := range names {
		size, err := sp.allocLocked(name)
		if errors.Is(err, os.ErrNotExist) {
			continue // deleted by badger meanwhile; the next scan sees why
		}
		if err != nil {
			return err
		}
		files[name] = size
	}
	sp.files = files
	sp.dirMod, sp.ready = mod, true
	return nil
}

// allocLocked makes sure the named file's blocks are all allocated, and
// returns its size.
func (sp *space) allocLocked(name string) (int64, error) {
	path := filepath.Join(sp.dir, name)
	fi, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	size := fi.Size()
	if sp.noAlloc {
		return size, nil
	}
	if done, ok := sp.files[name]; ok && done == size {
		return size, nil
	}
	var allocated int64
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		allocated = st.Blocks * 512
	}
	missing := max(size-allocated, 0)
	if missing == 0 {
		return size, nil
	}
	if floor := sp.recordFloor(); sp.free-missing < floor {
		return 0, &SpaceError{Dir: sp.dir, Free: sp.free, Need: missing, Floor: floor}
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	// Mode 0 allocates without changing the size or any byte: badger may be
	// writing the same file through its map meanwhile.
	err = unix.Fallocate(int(f.Fd()), 0, 0, size)
	switch {
	case errors.Is(err, unix.EOPNOTSUPP):
		// Nothing can be allocated ahead here (as on some network
		// filesystems); the free-space floor is the only protection left.
		sp.noAlloc = true
		sp.log.Warn("filesystem cannot preallocate; a full disk may crash the daemon", "dir", sp.dir)
		return size, nil
	case err != nil:
		// A failed fallocate may have allocated part; the next statfs counts it.
		sp.statAt = time.Time{}
		return 0, fmt.Errorf("preallocate %s: %w", path, err)
	}
	sp.free -= missing
	return size, nil
}

// badgerMapped lists the badger files in dir that it writes through maps.
func badgerMapped(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("free space of %s: %w", dir, err)
	}
	var names []string
	type file struct {
		fid  int
		name string
	}
	newest := map[string]file{".mem": {fid: -1}, ".vlog": {fid: -1}}
	for _, e := range ents {
		name := e.Name()
		if name == "DISCARD" {
			names = append(names, name)
			continue
		}
		ext := filepath.Ext(name)
		if f, ok := newest[ext]; ok {
			if fid, err := strconv.Atoi(strings.TrimSuffix(name, ext)); err == nil && fid > f.fid {
				newest[ext] = file{fid, name}
			}
		}
	}
	for _, ext := range []string{".mem", ".vlog"} {
		if f := newest[ext]; f.fid >= 0 {
			names = append(names, f.name)
		}
	}
	return names, nil
}

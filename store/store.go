// Package store persists berth's records in badger: sessions, executions, output chunks and events.
package store

import (
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/dgraph-io/badger/v4"
)

// Error classes; each is wrapped with the subject it concerns, so test
// them with errors.Is.
var (
	ErrNotFound = errors.New("not found")
	// ErrInvalid reports an argument the store cannot accept: an empty or
	// slash-containing name, an unknown stream, offsets that go backwards.
	ErrInvalid = errors.New("invalid argument")
	// ErrLocked means another process (another berth daemon) has the store
	// open; badger's own lock error does not unwrap, hence our lock file.
	ErrLocked = errors.New("store is in use by another process")
	ErrClosed = errors.New("store is closed")
	// ErrExists refuses to import a session (or an exec) already here.
	ErrExists = errors.New("already exists")
)

// DefaultRetention is the output kept per session when Session.Retention is 0.
const DefaultRetention int64 = 256 << 20

// Store is berth's record store. Its methods are safe for concurrent use.
//
// Layout: badger holds the records, events and a small index record per
// output chunk; each exec's output data is in its own append-only segment
// file under output/ (see segment.go), written with pwritev(2).
//
// Durability: badger runs with SyncWrites off, and segments are written
// without fsync. A committed write is in badger's memory-mapped WAL and
// value log, and output in the page cache, when the call returns, so a
// daemon crash or kill loses nothing; an OS crash or power loss can lose
// what was written since the last Sync (output may then read back as
// zeros). Output chunks, exec records and events take that risk for
// throughput: an fsync per 64 KiB chunk would cap ingest far below what a
// guest produces. AppendOutput writes the data, then commits its index and
// the exec's offsets in one transaction, so a restarted daemon resumes the
// agent's streams exactly where the stored output ends. Session creation,
// state changes and deletion are synced, because they must match the
// workspaces on disk; the daemon calls Sync when it needs more (on clean
// shutdown, or when the user flushes).
//
// A full disk: badger writes through shared memory maps, and a page fault
// that needs a block on a full filesystem is SIGBUS, which kills the
// process. So every write first checks the free space (statfs, at most
// 100 ms old, less what the store wrote since) and makes sure the files
// badger writes through maps (the newest .mem and .vlog, DISCARD) are
// fully allocated. Output is refused below the reserve (DefaultReserve,
// 64 MiB, or WithReserve); every other write (records, events, trims,
// deletes, GC) below half of it, so that while output is held the daemon
// can still record why. Both refusals are a *SpaceError, which wraps
// syscall.ENOSPC, as does a segment write that hits a full disk. Reads
// keep working.
//
// Half the reserve, 32 MiB by default, exceeds the most badger allocates
// at once by itself with badgerOptions: flushing a full memtable writes
// one table of at most 24 MiB (about half that in practice, since the
// skiplist's nodes are not written), and the L0 compaction after it about
// that plus the overlapping base level (10 MiB), ~22 MiB. A memtable holds
// tens of thousands of appends, so flushes are minutes apart at full
// ingest and do not overlap. A rotation writes one batch (at most 3.6 MB)
// into a new .mem or .vlog before the next write allocates it (48 MiB and
// 16 MiB, which must themselves fit above the floor, or writes are
// refused until the old .mem's flush frees it). The store preallocates
// about 65 MiB of badger files in all.
//
// Residual risk: the reserve only holds against the store's own writes.
// If another process fills the filesystem while badger flushes or
// compacts in the background (tables are written through fresh maps, as
// are the first bytes of a new .mem or .vlog, and a value-log file that a
// batch overflows grows in place until the next check, at most 100 ms
// later), or while ext4 converts a preallocated extent, the fault still
// kills the daemon; so does a filesystem that cannot fallocate (logged at
// the first check). Open refuses to start badger below a quarter of the
// reserve, since opening writes headers through maps and flushes
// replayed memtables.
type Store struct {
	db     *badger.DB
	log    *slog.Logger
	lockFD *os.File
	dir    string

	space  *space
	seg    *segments
	budget *budget

	// Lock order: closeMu (shared by every operation, exclusive only in
	// Close) → budget.trimMu → one stripe (never two) → the leaves sessMu,
	// space.mu, budget.mu, and a segment's lock → segments.mu. ReadOutput
	// holds closeMu then a segment's lock shared and takes no stripe. The
	// store calls nothing outside itself while holding any of them, so the
	// engine may call it under its own locks.
	//
	// closeMu is held shared by every operation and exclusively by Close,
	// because badger panics (not errors) when iterating a closed DB.
	closeMu sync.RWMutex
	closed  bool

	// stripes serialise writers per session: appends to a session's execs
	// share its retention total, and event sequence numbers are read then
	// written. Unrelated sessions rarely share a stripe.
	stripes [64]sync.Mutex
	seed    maphash.Seed

	// execSession caches exec id → session so AppendOutput can pick the
	// stripe without decoding the exec record; an exec never changes session.
	execSession sync.Map
	// sessions mirrors the session records, so listing them (which the UI
	// does constantly) costs no decoding. Only PutSession and DeleteSession
	// write session records, under the session's stripe, and update the
	// mirror after their commit; the directory lock makes this process the
	// only writer.
	sessMu   sync.RWMutex
	sessions map[string]Session
}

// Open opens (creating if needed) the store in dir and brings every owner's
// records to the current schema in one transaction. A nil logger discards.
func Open(dir string, logger *slog.Logger, opts ...Option) (_ *Store, err error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	logger = logger.With("component", "store")
	o := options{reserve: DefaultReserve}
	for _, opt := range opts {
		opt(&o)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	lockFD, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			lockFD.Close()
		}
	}()
	sp := newSpace(dir, o.reserve, logger)
	if err := sp.atLeast(o.reserve / 4); err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	db, err := badger.Open(badgerOptions(dir, logger))
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", dir, err)
	}
	defer func() {
		if err != nil {
			db.Close()
		}
	}()
	s := &Store{
		db:     db,
		log:    logger,
		lockFD: lockFD,
		dir:    dir,
		space:  sp,
		seg:    newSegments(filepath.Join(dir, "output")),
		budget: newBudget(),
		seed:   maphash.MakeSeed(),
	}
	// Allocate badger's files now; if the disk is too full, writes are
	// refused until it is not, but reads work.
	if err := sp.room(0); err != nil {
		logger.Warn("store writes are held", "err", err)
	}
	if err := s.migrate(); err != nil {
		return nil, err
	}
	if s.sessions, err = s.loadSessions(); err != nil {
		return nil, err
	}
	if err := s.loadOutput(); err != nil {
		return nil, err
	}
	if err := s.abandonImports(); err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	return s, nil
}

// badgerOptions tunes badger for a desktop daemon whose bulk (output data)
// is in segment files: the LSM holds keys, small records and pointers to
// larger ones in the value log. The sizes bound what badger allocates at
// once (see Store), since each mapped file must be preallocated and the
// free-space floor must cover a flush.
func badgerOptions(dir string, logger *slog.Logger) badger.Options {
	return badger.DefaultOptions(dir).
		WithLogger(badgerLogger{logger}).
		WithSyncWrites(false). // see Store
		WithNumVersionsToKeep(1).
		WithMetricsEnabled(false).
		// Values above 64 B (records, events, inline chunks of old stores)
		// live in the value log, so in a transaction each costs its key plus
		// a 12-byte pointer. That lets the one-transaction migration at Open
		// rewrite ~39,000 exec records (the transaction limit below),
		// whatever their size. Segment records (26 B) stay in the LSM.
		WithValueThreshold(64).
		// A transaction may hold 15% of a memtable: 3.6 MB or ~39k entries;
		// the migration's limit is what keeps the memtable this large. Each
		// .mem file is mapped at twice this, 48 MiB, all preallocated. It
		// fills after tens of thousands of appends. Trimmed inline output
		// becomes reclaimable only once compaction has seen the deletes, so
		// L0 is compacted after every flush rather than after five. One
		// memtable waits for flush at most, which bounds the .mem files to
		// three.
		WithMemTableSize(24 << 20).
		WithNumMemtables(1).
		WithNumLevelZeroTables(1).
		WithNumCompactors(2).
		WithBaseTableSize(2 << 20).
		WithBaseLevelSize(10 << 20).
		// The value log holds records and events only. Files are mapped at
		// twice this (16 MiB, preallocated); GC frees space a file at a time.
		WithValueLogFileSize(8 << 20).
		WithBlockCacheSize(16 << 20)
}

// lockDir takes an exclusive flock on dir/berth.lock so a second daemon gets
// ErrLocked instead of badger's unwrappable lock message.
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, "berth.lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("store %s: %w", dir, ErrLocked)
		}
		return nil, fmt.Errorf("lock store %s: %w", dir, err)
	}
	return f, nil
}

// Close flushes and closes the store. Close on a closed store returns nil.
func (s *Store) Close() error {
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	err := s.seg.sync()
	if cerr := s.db.Close(); err == nil {
		err = cerr
	}
	if cerr := s.lockFD.Close(); err == nil {
		err = cerr
	}
	return err
}

// Sync makes every committed write durable against power loss: the
// segments written since the last Sync first, then badger, so a synced
// index never points at unsynced output.
func (s *Store) Sync() error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.closeMu.RUnlock()
	if err := s.seg.sync(); err != nil {
		return err
	}
	return s.db.Sync()
}

// gcMaxRewrites bounds one GC call: a rewrite copies the live half (at
// most) of one value-log file (8 MiB; up to 256 MiB in files written
// before segments), so a call moves at most 256 MiB.
const gcMaxRewrites = 2

// GC reclaims value-log space held by trimmed or deleted records and inline
// output (segments free their space as they are trimmed). The daemon
// calls it periodically (every few minutes, and after deleting a session);
// it returns quickly when there is nothing to do.
//
// Badger learns that a value-log file holds garbage only when compaction
// drops the keys pointing into it, so space freed by retention comes back
// after the next compactions, not immediately. Each rewrite moves a file's
// live values forward and deletes the file when at least half of it is
// garbage.
func (s *Store) GC() error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.closeMu.RUnlock()
	for range gcMaxRewrites {
		// A rewrite writes the live values again before it frees the file.
		if err := s.space.room(0); err != nil {
			return fmt.Errorf("value log gc: %w", err)
		}
		err := s.db.RunValueLogGC(0.5)
		if errors.Is(err, badger.ErrNoRewrite) || errors.Is(err, badger.ErrRejected) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("value log gc: %w", err)
		}
	}
	return nil
}

// enter marks an operation in progress; callers defer s.closeMu.RUnlock().
func (s *Store) enter() error {
	s.closeMu.RLock()
	if s.closed {
		s.closeMu.RUnlock()
		return ErrClosed
	}
	return nil
}

func (s *Store) stripe(session string) *sync.Mutex {
	return &s.stripes[maphash.String(s.seed, session)%uint64(len(s.stripes))]
}

// update runs fn in a read-write transaction, retrying on conflict. Writers
// of a session's keys hold its stripe, so conflicts should not occur; if
// one does, retrying is correct because fn re-reads what it depends on.
// It refuses with a SpaceError when the disk is too full (see Store).
func (s *Store) update(fn func(txn *badger.Txn) error) error {
	return s.updateNeed("", 0, fn)
}

// updateNeed is update for a write that also puts need bytes of session's
// output in segments.
func (s *Store) updateNeed(session string, need int64, fn func(txn *badger.Txn) error) error {
	if err := s.space.roomFor(session, need); err != nil {
		return err
	}
	var err error
	for range 5 {
		err = s.db.Update(fn)
		if !errors.Is(err, badger.ErrConflict) {
			return err
		}
	}
	return err
}

// maxNameLen bounds names so that a full AppendOutput plus its trimming
// stays well inside one transaction (keys embed them).
const maxNameLen = 128

// checkName rejects names that would break prefix scans: keys are
// "<owner>/<name>/...", so a '/' in a name would let one session's prefix
// match another's keys.
func checkName(kind, name string) error {
	if name == "" {
		return fmt.Errorf("empty %s name: %w", kind, ErrInvalid)
	}
	if len(name) > maxNameLen {
		return fmt.Errorf("%s %.32q...: longer than %d bytes: %w", kind, name, maxNameLen, ErrInvalid)
	}
	if strings.ContainsAny(name, "/\x00") {
		return fmt.Errorf("%s %q: contains '/' or NUL: %w", kind, name, ErrInvalid)
	}
	return nil
}

// badgerLogger routes badger's logging to slog. Badger is chatty at info
// (every compaction, every open), which is noise in a daemon log.
type badgerLogger struct{ l *slog.Logger }

func (b badgerLogger) Errorf(f string, args ...any) {
	b.l.Error(strings.TrimSpace(fmt.Sprintf(f, args...)), "source", "badger")
}

func (b badgerLogger) Warningf(f string, args ...any) {
	b.l.Warn(strings.TrimSpace(fmt.Sprintf(f, args...)), "source", "badger")
}

func (badgerLogger) Infof(string, ...any)  {}
func (badgerLogger) Debugf(string, ...any) {}

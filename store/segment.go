package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/dgraph-io/badger/v4"
	"golang.org/x/sys/unix"
)

// An exec's output data lives in its segment file, <store>/output/<exec>.seg,
// written append-only with pwritev(2) so that a full disk is an error, not
// a fault in a memory map. Badger keeps one small record per chunk under
// out/<exec>/<seq>. Chunk values come in two formats, told apart by their
// first byte:
//
//	inline  (out schema v1): stream (1 or 2), time (8), data
//	segment (out schema v2): segMarker, stream, time (8), offset (8), length (8)
//
// Times are Unix nanoseconds and numbers 8-byte big endian. An inline
// value's first byte is a stream, which AppendOutput has always checked to
// be 1 or 2, so it never equals segMarker. Stores written before segments
// keep their inline chunks until retention trims them; nothing is rewritten.
const (
	segMarker    = 0x80
	segRecordLen = 26
)

// chunkRec is a decoded chunk value: inline data, or a range of the
// exec's segment file.
type chunkRec struct {
	stream uint8
	time   int64
	seg    bool
	off    int64 // segment records: where the data starts in the segment
	n      int64 // bytes of data
	data   []byte
}

func appendSegRecord(b []byte, stream uint8, t time.Time, off, n int64) []byte {
	b = append(b, segMarker, stream)
	b = binary.BigEndian.AppendUint64(b, uint64(t.UnixNano()))
	b = binary.BigEndian.AppendUint64(b, uint64(off))
	return binary.BigEndian.AppendUint64(b, uint64(n))
}

// decodeChunk decodes a chunk value of either format. Inline data is
// returned in place: copy it if it must outlive the transaction.
func decodeChunk(v []byte) (chunkRec, error) {
	if len(v) > 0 && v[0] == segMarker {
		if len(v) != segRecordLen {
			return chunkRec{}, fmt.Errorf("segment record of %d bytes, want %d", len(v), segRecordLen)
		}
		r := chunkRec{
			stream: v[1],
			time:   int64(binary.BigEndian.Uint64(v[2:10])),
			seg:    true,
			off:    int64(binary.BigEndian.Uint64(v[10:18])),
			n:      int64(binary.BigEndian.Uint64(v[18:26])),
		}
		if r.off < 0 || r.n < 0 || r.off+r.n < r.off {
			return chunkRec{}, fmt.Errorf("segment record for bytes %d+%d", r.off, r.n)
		}
		return r, nil
	}
	if len(v) < chunkHeader {
		return chunkRec{}, fmt.Errorf("%d bytes, shorter than its header", len(v))
	}
	return chunkRec{
		stream: v[0],
		time:   int64(binary.BigEndian.Uint64(v[1:9])),
		n:      int64(len(v) - chunkHeader),
		data:   v[chunkHeader:],
	}, nil
}

// segments manages the segment files. Appending needs no lock of its own:
// an exec's appends and trims run under its session's stripe, and appends
// write only beyond what is indexed. Hole punching and removal, which
// destroy indexed bytes once their index is gone, take the exec's lock
// exclusively; ReadOutput holds it shared from before its read
// transaction until its reads are done, so it never reads a range that a
// trim committed after the transaction began and then punched.
type segments struct {
	dir   string
	locks [64]sync.RWMutex
	seed  maphash.Seed

	mu sync.Mutex
	// dirty are the execs whose segments were written since the last Sync;
	// dirDirty means a segment file was created since.
	dirty    map[string]struct{}
	dirDirty bool
	// noPunch is set once the filesystem refused to punch holes.
	noPunch bool
}

func newSegments(dir string) *segments {
	return &segments{dir: dir, seed: maphash.MakeSeed(), dirty: make(map[string]struct{})}
}

func (g *segments) path(id string) string { return filepath.Join(g.dir, id+".seg") }

func (g *segments) lock(id string) *sync.RWMutex {
	return &g.locks[maphash.String(g.seed, id)%uint64(len(g.locks))]
}

// iovMax is the most iovecs one pwritev takes (IOV_MAX on Linux).
const iovMax = 1024

// write writes the chunks' data at off of the exec's segment, in one
// pwritev when there are at most iovMax chunks. On an error nothing past
// off is left behind, as far as the filesystem allows.
func (g *segments) write(id string, off int64, chunks []Chunk) error {
	path := g.path(id)
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		if err = os.MkdirAll(g.dir, 0o700); err == nil {
			fd, err = unix.Open(path, unix.O_WRONLY|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
		}
		g.mu.Lock()
		g.dirDirty = true
		g.mu.Unlock()
	}
	if err != nil {
		return fmt.Errorf("output segment: %w", &os.PathError{Op: "open", Path: path, Err: err})
	}
	defer unix.Close(fd)
	iovs := make([][]byte, 0, min(len(chunks), iovMax))
	at := off
	for i := 0; i < len(chunks); {
		iovs = iovs[:0]
		for ; i < len(chunks) && len(iovs) < iovMax; i++ {
			if len(chunks[i].Data) > 0 {
				iovs = append(iovs, chunks[i].Data)
			}
		}
		if err := pwritevAll(fd, iovs, at); err != nil {
			// Cut the orphan tail so a full disk gets its blocks back; the
			// next append overwrites from off anyway.
			unix.Ftruncate(fd, off)
			return fmt.Errorf("output segment at %d: %w", at, &os.PathError{Op: "write", Path: path, Err: err})
		}
		for _, b := range iovs {
			at += int64(len(b))
		}
	}
	g.mu.Lock()
	g.dirty[id] = struct{}{}
	g.mu.Unlock()
	return nil
}

// pwritevAll writes all of iovs at off, resuming after short writes.
func pwritevAll(fd int, iovs [][]byte, off int64) error {
	for len(iovs) > 0 {
		n, err := unix.Pwritev(fd, iovs, off)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return io.ErrShortWrite
		}
		off += int64(n)
		for n > 0 {
			if n >= len(iovs[0]) {
				n -= len(iovs[0])
				iovs = iovs[1:]
			} else {
				iovs[0] = iovs[0][n:]
				n = 0
			}
		}
	}
	return nil
}

// maxRead bounds one pread of coalesced chunks; the chunks returned share
// its buffer.
const maxRead = 1 << 20

// segRead is a chunk whose data ReadOutput reads from the segment.
type segRead struct {
	i      int // index in the chunks being returned
	off, n int64
}

// read fills chunks[r.i].Data for each read, coalescing neighbours into
// one pread. The caller holds the exec's lock shared.
func (g *segments) read(id string, chunks []Chunk, reads []segRead) error {
	if len(reads) == 0 {
		return nil
	}
	f, err := os.Open(g.path(id))
	if err != nil {
		return fmt.Errorf("open output segment: %w", err)
	}
	defer f.Close()
	for len(reads) > 0 {
		run, end := 1, reads[0].off+reads[0].n
		for run < len(reads) && reads[run].off == end && end+reads[run].n-reads[0].off <= maxRead {
			end += reads[run].n
			run++
		}
		buf := make([]byte, end-reads[0].off)
		if _, err := f.ReadAt(buf, reads[0].off); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("read output segment %s at %d: %w", f.Name(), reads[0].off, err)
		}
		for _, r := range reads[:run] {
			if r.n > 0 {
				at := r.off - reads[0].off
				chunks[r.i].Data = buf[at : at+r.n : at+r.n]
			}
		}
		reads = reads[run:]
	}
	return nil
}

// punch frees [off, off+n) of the exec's segment, whose index is gone.
func (g *segments) punch(id string, off, n int64) error {
	if n <= 0 {
		return nil
	}
	g.mu.Lock()
	skip := g.noPunch
	g.mu.Unlock()
	if skip {
		return nil
	}
	l := g.lock(id)
	l.Lock()
	defer l.Unlock()
	f, err := os.OpenFile(g.path(id), os.O_WRONLY, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	err = unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
	if errors.Is(err, unix.EOPNOTSUPP) {
		// The space comes back when the segment is removed.
		g.mu.Lock()
		g.noPunch = true
		g.mu.Unlock()
		return nil
	}
	if err != nil {
		return fmt.Errorf("punch output segment %s at %d+%d: %w", f.Name(), off, n, err)
	}
	return nil
}

// remove deletes the exec's segment, of which nothing is indexed any more.
func (g *segments) remove(id string) error {
	l := g.lock(id)
	l.Lock()
	defer l.Unlock()
	g.mu.Lock()
	delete(g.dirty, id)
	g.mu.Unlock()
	if err := os.Remove(g.path(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// sync makes the segments written since the last sync durable, and their
// directory entries.
func (g *segments) sync() error {
	g.mu.Lock()
	dirty, dirDirty := g.dirty, g.dirDirty
	g.dirty, g.dirDirty = make(map[string]struct{}), false
	g.mu.Unlock()
	var errs []error
	for id := range dirty {
		f, err := os.Open(g.path(id))
		if errors.Is(err, os.ErrNotExist) {
			continue // trimmed away meanwhile
		}
		if err == nil {
			err = f.Sync()
			f.Close()
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("sync output segment: %w", err))
			g.mu.Lock()
			g.dirty[id] = struct{}{}
			g.mu.Unlock()
		}
	}
	if dirDirty {
		if err := syncDir(g.dir); err != nil {
			errs = append(errs, err)
			g.mu.Lock()
			g.dirDirty = true
			g.mu.Unlock()
		}
	}
	return errors.Join(errs...)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// loadOutput, at Open, recomputes the output total and the budget's index
// from the outuse and outorder keys, and reconciles the segments with the
// index. A crash between a segment write and its commit leaves an orphan
// tail, one between a trim's commit and its hole punch (or file removal)
// space that nothing indexes; both are freed here. A segment shorter than
// its index (an OS crash lost unsynced output) is extended, so its lost
// bytes read back as zeros instead of failing every replay.
func (s *Store) loadOutput() error {
	type seg struct{ end, first int64 }
	segs := make(map[string]seg)
	err := s.db.View(func(txn *badger.Txn) error {
		p := prefix("outuse")
		it := txn.NewIterator(badger.IteratorOptions{Prefix: p})
		var total int64
		for it.Rewind(); it.Valid(); it.Next() {
			session := string(it.Item().Key()[len(p):])
			n, err := getUse(txn, session)
			if err != nil {
				it.Close()
				return err
			}
			total += n
		}
		it.Close()
		s.budget.total.Store(total)

		p = prefix("outorder")
		it = txn.NewIterator(badger.IteratorOptions{Prefix: p})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			rest := it.Item().Key()[len(p):]
			i := bytes.IndexByte(rest, '/')
			if i < 0 || len(rest) < i+10 {
				return fmt.Errorf("output order key %q: malformed", it.Item().Key())
			}
			session, order, id := string(rest[:i]), binary.BigEndian.Uint64(rest[i+1:i+9]), string(rest[i+10:])
			var rec Exec
			if err := getJSON(txn, execKey(id), &rec); errors.Is(err, badger.ErrKeyNotFound) {
				continue
			} else if err != nil {
				return fmt.Errorf("exec %q: %w", id, err)
			}
			s.budget.add(id, orderEntry{session: session, order: order, finished: finished(rec.State)})
			st, err := getOutState(txn, id)
			if err != nil {
				return err
			}
			if st.SegEnd > 0 {
				first, err := firstSegOffset(txn, id, st)
				if err != nil {
					return err
				}
				segs[id] = seg{st.SegEnd, first}
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("open store: load output index: %w", err)
	}
	ents, err := os.ReadDir(s.seg.dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("open store: %w", err)
	}
	onDisk := make(map[string]bool, len(ents))
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".seg")
		if !ok {
			continue
		}
		onDisk[id] = true
		if _, ok := segs[id]; !ok {
			s.log.Info("removing output segment nothing refers to", "exec", id)
			if err := s.seg.remove(id); err != nil {
				s.log.Warn("remove output segment", "exec", id, "err", err)
			}
		}
	}
	for id, sg := range segs {
		if err := s.seg.reconcile(id, sg.end, sg.first, onDisk[id], s.log); err != nil {
			s.log.Warn("reconcile output segment", "exec", id, "err", err)
		}
	}
	return nil
}

// firstSegOffset returns where the exec's first stored segment chunk
// starts (its chunks before that, trimmed, are free space), or SegEnd if
// none is stored.
func firstSegOffset(txn *badger.Txn, id string, st *outState) (int64, error) {
	it := txn.NewIterator(badger.IteratorOptions{Prefix: chunkPrefix(id)})
	defer it.Close()
	for it.Seek(chunkKey(id, st.TrimmedSeq)); it.Valid(); it.Next() {
		item := it.Item()
		// Inline chunks from before segments are other sizes or pointers
		// into the value log (whose approximate size is far above 26).
		if item.ValueSize() != segRecordLen {
			continue
		}
		var r chunkRec
		err := item.Value(func(v []byte) (err error) {
			r, err = decodeChunk(v)
			return err
		})
		if err != nil {
			return 0, fmt.Errorf("chunk %q: %w", item.Key(), err)
		}
		if r.seg {
			return r.off, nil
		}
	}
	return st.SegEnd, nil
}

// reconcile makes the exec's segment end at end and frees what lies before
// first.
func (g *segments) reconcile(id string, end, first int64, exists bool, log *slog.Logger) error {
	path := g.path(id)
	if !exists {
		log.Warn("output segment is missing (lost in a system crash?); its output reads as zeros", "exec", id, "bytes", end-first)
		if err := os.MkdirAll(g.dir, 0o700); err != nil {
			return err
		}
	}
	if err := resize(path, end, exists, id, log); err != nil {
		return err
	}
	return g.punch(id, 0, first)
}

func resize(path string, end int64, exists bool, id string, log *slog.Logger) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if size := fi.Size(); size != end {
		if exists && size < end {
			log.Warn("output segment is shorter than its index (lost in a system crash?); the rest reads as zeros",
				"exec", id, "bytes", end-size)
		}
		return f.Truncate(end)
	}
	return nil
}

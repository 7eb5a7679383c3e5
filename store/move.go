package store

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/dgraph-io/badger/v4"
	"golang.org/x/sys/unix"
)

// Moving a session's records to another store (another host's). The
// stream is self-describing and checked end to end:
//
//	magic "BERTHREC" · version u16
//	frames: kind u8 · length u32 · payload
//	  'h' header, JSON: the session's name and the schema version of
//	      every owner whose records follow
//	  'k' record: key length u16 · key · value
//	  'z' segment: exec id length u16 · id · size u64 (before its data)
//	  'd' segment data: exec id length u16 · id · offset u64 · bytes
//	  'e' end: the SHA-256 of every byte before this frame
//
// Records come first (the session's, its execs' and what lists them,
// then output index, bookkeeping, events, runs and schedules), segments
// after, only their data extents: trimmed output is a hole at both ends.
// Numbers are big endian. The reader is a network peer's: every length
// is bounded, every key must be one of the session's own, and nothing
// is written into the store until the end frame's hash matched.

const (
	recMagic   = "BERTHREC"
	recVersion = 1

	frameHeader  = 'h'
	frameRecord  = 'k'
	frameSegSize = 'z'
	frameSegData = 'd'
	frameEnd     = 'e'

	// maxFrame bounds one frame's payload: a record (badger values of
	// ours are a few KiB; an exec's argv is bounded far below this) or a
	// segment data frame (segDataMax plus its header).
	maxFrame = 4 << 20
	// segDataMax is the most data one 'd' frame carries.
	segDataMax = 1 << 20
	// maxImportRecords bounds the records (keys and values) an import
	// holds in memory before it writes them.
	maxImportRecords = 256 << 20
	// maxSegSize bounds one imported segment's apparent size.
	maxSegSize = 1 << 40
	// maxKey bounds a record's key.
	maxKey = 1024

	// importMarkerPrefix lists the sessions whose import began and did
	// not end: importMarkerPrefix<name> → JSON list of exec ids. Open
	// removes what such an import left.
	importMarkerPrefix = "meta/import/"
)

func importMarkerKey(name string) []byte { return []byte(importMarkerPrefix + name) }

// recHeader is the stream's 'h' frame.
type recHeader struct {
	Session string         `json:"session"`
	Schemas map[string]int `json:"schemas"`
}

// ExportSession writes every record of the session — its record, its
// execs and their output (index and data), its events, runs, schedules
// and the output bookkeeping — to w as a stream ImportSession reads. It
// holds the session's write lock throughout, so the stream is one
// consistent state; the caller makes sure nothing records into the
// session meanwhile (a stopped or sleeping session, claimed).
func (s *Store) ExportSession(name string, w io.Writer) error {
	if err := checkName("session", name); err != nil {
		return err
	}
	if err := s.enter(); err != nil {
		return err
	}
	defer s.closeMu.RUnlock()
	mu := s.stripe(name)
	mu.Lock()
	defer mu.Unlock()
	s.sessMu.RLock()
	_, ok := s.sessions[name]
	s.sessMu.RUnlock()
	if !ok {
		return fmt.Errorf("session %q: %w", name, ErrNotFound)
	}
	h := sha256.New()
	fw := &frameWriter{w: bufio.NewWriterSize(io.MultiWriter(w, h), 1<<20)}
	fw.raw([]byte(recMagic))
	fw.raw(binary.BigEndian.AppendUint16(nil, recVersion))
	hdr := recHeader{Session: name, Schemas: map[string]int{}}
	for _, o := range owners {
		hdr.Schemas[o] = knownVersion(o)
	}
	b, _ := json.Marshal(hdr)
	fw.frame(frameHeader, b)

	var ids []string
	err := s.db.View(func(txn *badger.Txn) error {
		one := func(k []byte) error {
			item, err := txn.Get(k)
			if errors.Is(err, badger.ErrKeyNotFound) {
				return nil
			}
			if err != nil {
				return err
			}
			return item.Value(func(v []byte) error { fw.record(k, v); return fw.err })
		}
		under := func(p []byte) error {
			it := txn.NewIterator(badger.IteratorOptions{Prefix: p, PrefetchValues: true})
			defer it.Close()
			for it.Rewind(); it.Valid(); it.Next() {
				item := it.Item()
				if err := item.Value(func(v []byte) error { fw.record(item.Key(), v); return fw.err }); err != nil {
					return err
				}
			}
			return nil
		}
		if err := one(sessionKey(name)); err != nil {
			return err
		}
		ids = keySuffixes(txn, sessionExecPrefix(name))
		if err := under(sessionExecPrefix(name)); err != nil {
			return err
		}
		for _, id := range ids {
			for _, k := range [][]byte{execKey(id), outStateKey(id)} {
				if err := one(k); err != nil {
					return err
				}
			}
			for _, p := range [][]byte{chunkPrefix(id), trimPrefix(id)} {
				if err := under(p); err != nil {
					return err
				}
			}
		}
		if err := one(outUseKey(name)); err != nil {
			return err
		}
		for _, p := range [][]byte{outOrderPrefix(name), eventPrefix(name), runPrefix(name), schedulePrefix(name)} {
			if err := under(p); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("export session %q records: %w", name, err)
	}
	for _, id := range ids {
		if err := s.exportSegment(fw, id); err != nil {
			return fmt.Errorf("export session %q output of %s: %w", name, id, err)
		}
	}
	if fw.err == nil {
		fw.err = fw.w.Flush()
	}
	if fw.err != nil {
		return fmt.Errorf("export session %q: %w", name, fw.err)
	}
	sum := h.Sum(nil)
	fw.w.Reset(w) // the end frame is not part of what it hashes
	fw.frame(frameEnd, sum)
	if fw.err == nil {
		fw.err = fw.w.Flush()
	}
	if fw.err != nil {
		return fmt.Errorf("export session %q: %w", name, fw.err)
	}
	return nil
}

// exportSegment writes the data extents of exec id's segment, if it has
// one. Holes (trimmed output) are skipped: the importer's file has them
// too.
func (s *Store) exportSegment(fw *frameWriter, id string) error {
	l := s.seg.lock(id)
	l.RLock()
	defer l.RUnlock()
	f, err := os.Open(s.seg.path(id))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	hdr := func() []byte {
		b := binary.BigEndian.AppendUint16(nil, uint16(len(id)))
		return append(b, id...)
	}
	fw.frame(frameSegSize, binary.BigEndian.AppendUint64(hdr(), uint64(size)))
	buf := make([]byte, segDataMax)
	return dataExtents(f, size, func(off, n int64) error {
		for n > 0 {
			c := min(n, segDataMax)
			if _, err := f.ReadAt(buf[:c], off); err != nil {
				return err
			}
			p := binary.BigEndian.AppendUint64(hdr(), uint64(off))
			fw.frame2(frameSegData, p, buf[:c])
			if fw.err != nil {
				return fw.err
			}
			off, n = off+c, n-c
		}
		return nil
	})
}

// dataExtents calls fn with each range of f (of size bytes) that holds
// data, found with SEEK_DATA and SEEK_HOLE; a filesystem without them
// reports the whole file as data. It is diskcopy.DataExtents's twin: the
// store sits below the engine and imports none of it.
func dataExtents(f *os.File, size int64, fn func(off, n int64) error) error {
	fd := int(f.Fd())
	for off := int64(0); off < size; {
		start, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // only a hole is left
		}
		if err != nil {
			if errors.Is(err, unix.EINVAL) && off == 0 {
				return fn(0, size)
			}
			return fmt.Errorf("seek data in %s: %w", f.Name(), err)
		}
		end, err := unix.Seek(fd, start, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole in %s: %w", f.Name(), err)
		}
		end = min(end, size)
		if end > start {
			if err := fn(start, end-start); err != nil {
				return err
			}
		}
		off = end
	}
	return nil
}

// frameWriter writes frames, keeping the first error.
type frameWriter struct {
	w   *bufio.Writer
	err error
}

func (fw *frameWriter) raw(b []byte) {
	if fw.err == nil {
		_, fw.err = fw.w.Write(b)
	}
}

func (fw *frameWriter) frame(kind byte, p []byte) { fw.frame2(kind, p, nil) }

func (fw *frameWriter) frame2(kind byte, p, q []byte) {
	if fw.err != nil {
		return
	}
	n := len(p) + len(q)
	if n > maxFrame {
		fw.err = fmt.Errorf("frame of %d bytes exceeds %d", n, maxFrame)
		return
	}
	var h [5]byte
	h[0] = kind
	binary.BigEndian.PutUint32(h[1:], uint32(n))
	fw.raw(h[:])
	fw.raw(p)
	fw.raw(q)
}

func (fw *frameWriter) record(k, v []byte) {
	p := make([]byte, 0, 2+len(k)+len(v))
	p = binary.BigEndian.AppendUint16(p, uint16(len(k)))
	p = append(p, k...)
	fw.frame2(frameRecord, p, v)
}

// ErrBadStream wraps every refusal of a stream that is malformed,
// truncated, fails its hash or names what is not the session's.
var ErrBadStream = errors.New("bad session record stream")

func badStream(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), ErrBadStream)
}

// frameReader reads frames, hashing what it reads.
type frameReader struct {
	r   *bufio.Reader
	h   hash.Hash
	buf []byte
}

func (fr *frameReader) full(n int) ([]byte, error) {
	if cap(fr.buf) < n {
		fr.buf = make([]byte, n)
	}
	b := fr.buf[:n]
	if _, err := io.ReadFull(fr.r, b); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, badStream("truncated")
		}
		return nil, err
	}
	return b, nil
}

// next returns the next frame. Its payload is valid until the next call.
// The end frame's payload is not hashed.
func (fr *frameReader) next() (byte, []byte, error) {
	h, err := fr.full(5)
	if err != nil {
		return 0, nil, err
	}
	kind, n := h[0], binary.BigEndian.Uint32(h[1:])
	if n > maxFrame {
		return 0, nil, badStream("frame of %d bytes exceeds %d", n, maxFrame)
	}
	if kind != frameEnd {
		fr.h.Write(h)
	}
	p, err := fr.full(int(n))
	if err != nil {
		return 0, nil, err
	}
	if kind != frameEnd {
		fr.h.Write(p)
	}
	return kind, p, nil
}

// cutID splits a frame payload that starts with an exec id.
func cutID(p []byte) (string, []byte, error) {
	if len(p) < 2 {
		return "", nil, badStream("short frame")
	}
	n := int(binary.BigEndian.Uint16(p))
	if len(p) < 2+n {
		return "", nil, badStream("short frame")
	}
	return string(p[2 : 2+n]), p[2+n:], nil
}

// importPlan is what a verified stream holds, before it is written.
type importPlan struct {
	name    string
	rec     Session
	recVal  []byte
	execs   map[string]bool // declared by sexec records
	keys    [][]byte
	vals    [][]byte
	size    int64
	use     int64
	orders  []orderKey
	execRec map[string]Exec
	segs    map[string]string // exec id → staged segment file
}

type orderKey struct {
	order uint64
	id    string
}

// checkKey refuses a key that is not one of session p.name's own.
func (p *importPlan) checkKey(k []byte, v []byte) error {
	name := p.name
	execOf := func(id string) error {
		if !p.execs[id] {
			return badStream("record %q of an exec the session does not list", k)
		}
		return nil
	}
	owner, rest, ok := strings.Cut(string(k), "/")
	if !ok {
		return badStream("record key %q", k)
	}
	sessRest := func() (string, error) {
		r, ok := strings.CutPrefix(rest, name+"/")
		if !ok || r == "" {
			return "", badStream("record %q is not session %q's", k, name)
		}
		return r, nil
	}
	switch owner {
	case ownerSession:
		if rest != name {
			return badStream("record %q is not session %q's", k, name)
		}
		if p.recVal != nil {
			return badStream("two session records")
		}
		if err := json.Unmarshal(v, &p.rec); err != nil || p.rec.Name != name {
			return badStream("session record of %q does not decode as it", name)
		}
		p.recVal = bytes.Clone(v)
		return nil
	case "sexec":
		id, err := sessRest()
		if err != nil {
			return err
		}
		if err := checkName("exec", id); err != nil {
			return badStream("exec id: %v", err)
		}
		p.execs[id] = true
	case ownerExec:
		if err := execOf(rest); err != nil {
			return err
		}
		var e Exec
		if err := json.Unmarshal(v, &e); err != nil || e.ID != rest || e.Session != name {
			return badStream("exec record %q is not session %q's", rest, name)
		}
		p.execRec[rest] = e
	case "outstate":
		if err := execOf(rest); err != nil {
			return err
		}
		var st outState
		if err := json.Unmarshal(v, &st); err != nil {
			return badStream("output state of %q: %v", rest, err)
		}
	case ownerOut, "outtrim":
		id, seq, ok := strings.Cut(rest, "/")
		if !ok || len(seq) != 8 {
			return badStream("record key %q", k)
		}
		if err := execOf(id); err != nil {
			return err
		}
		if owner == ownerOut {
			if _, err := decodeChunk(v); err != nil {
				return badStream("chunk %q: %v", k, err)
			}
		}
	case "outuse":
		if rest != name || len(v) != 8 {
			return badStream("record %q", k)
		}
		p.use = int64(binary.BigEndian.Uint64(v))
		if p.use < 0 {
			return badStream("output use %d", p.use)
		}
	case "outorder":
		r, err := sessRest()
		if err != nil {
			return err
		}
		if len(r) < 10 || r[8] != '/' {
			return badStream("record key %q", k)
		}
		id := r[9:]
		if err := execOf(id); err != nil {
			return err
		}
		p.orders = append(p.orders, orderKey{binary.BigEndian.Uint64([]byte(r[:8])), id})
	case ownerEvent:
		r, err := sessRest()
		if err != nil {
			return err
		}
		if len(r) != 8 {
			return badStream("record key %q", k)
		}
	case ownerRun, ownerSchedule:
		if _, err := sessRest(); err != nil {
			return err
		}
	default:
		return badStream("record %q of an unknown kind", k)
	}
	return nil
}

// ImportSession reads a stream ExportSession wrote (on this host or
// another) and stores the session it holds, with everything it had. fix,
// if not nil, may check and adjust the session's record first (paths
// that name the other host's data directory); its error refuses the
// import. It refuses, with nothing written, a session already here, an
// exec id already here, a stream of another schema, and a stream that
// is malformed, truncated or fails its hash (ErrBadStream).
//
// Output data is staged beside the segments and renamed in before the
// records are written; the records go in under a marker that Open reads
// to remove an import a crash interrupted, and the session's own record
// goes last, with the marker's removal, in one transaction: so the
// session appears whole or not at all.
func (s *Store) ImportSession(r io.Reader, fix func(*Session) error) (_ Session, err error) {
	if err := s.enter(); err != nil {
		return Session{}, err
	}
	defer s.closeMu.RUnlock()
	p, err := s.readImport(r)
	defer func() {
		for _, f := range p.segs {
			os.Remove(f) // renamed away unless the import failed
		}
	}()
	if err != nil {
		return Session{}, fmt.Errorf("import session records: %w", err)
	}
	if fix != nil {
		if err := fix(&p.rec); err != nil {
			return Session{}, fmt.Errorf("import session %q: %w", p.name, err)
		}
		if p.rec.Name != p.name {
			return Session{}, fmt.Errorf("import session %q: the record cannot be renamed: %w", p.name, ErrInvalid)
		}
	}
	rec := p.rec.clone()
	recVal, err := json.Marshal(rec)
	if err != nil {
		return Session{}, err
	}
	if err := s.commitImport(p, rec, recVal); err != nil {
		return Session{}, fmt.Errorf("import session %q: %w", p.name, err)
	}
	return rec, nil
}

// readImport parses and verifies the stream, holding its records in
// memory and staging segment data in files.
func (s *Store) readImport(r io.Reader) (*importPlan, error) {
	fr := &frameReader{r: bufio.NewReaderSize(r, 1<<20), h: sha256.New()}
	p := &importPlan{execs: map[string]bool{}, execRec: map[string]Exec{}, segs: map[string]string{}}
	head, err := fr.full(len(recMagic) + 2)
	if err != nil {
		return p, err
	}
	fr.h.Write(head)
	if string(head[:len(recMagic)]) != recMagic {
		return p, badStream("not a session record stream")
	}
	if v := binary.BigEndian.Uint16(head[len(recMagic):]); v != recVersion {
		return p, badStream("stream version %d, this berth reads %d: run the same berth on both hosts", v, recVersion)
	}
	kind, b, err := fr.next()
	if err != nil {
		return p, err
	}
	var hdr recHeader
	if kind != frameHeader || json.Unmarshal(b, &hdr) != nil {
		return p, badStream("no header")
	}
	if err := checkName("session", hdr.Session); err != nil {
		return p, badStream("session name: %v", err)
	}
	p.name = hdr.Session
	for _, o := range owners {
		if hdr.Schemas[o] != knownVersion(o) {
			return p, fmt.Errorf("the sending store's %s records are schema v%d, this store's v%d: run the same berth version on both hosts: %w", o, hdr.Schemas[o], knownVersion(o), ErrInvalid)
		}
	}
	if err := s.refuseExisting(p.name); err != nil {
		return p, err
	}
	var seg struct {
		id   string
		f    *os.File
		size int64
	}
	// Staged segments are synced only once the stream has verified
	// (commitImport): a refused stream costs no fsync.
	closeSeg := func() error {
		if seg.f == nil {
			return nil
		}
		err := seg.f.Close()
		seg.f = nil
		return err
	}
	defer closeSeg()
	segsStarted := false
	for {
		kind, b, err := fr.next()
		if err != nil {
			return p, err
		}
		switch kind {
		case frameRecord:
			if segsStarted {
				return p, badStream("a record after output data")
			}
			if len(b) < 2 {
				return p, badStream("short record")
			}
			kl := int(binary.BigEndian.Uint16(b))
			if kl == 0 || kl > maxKey || len(b) < 2+kl {
				return p, badStream("record key of %d bytes", kl)
			}
			k, v := b[2:2+kl], b[2+kl:]
			if err := p.checkKey(k, v); err != nil {
				return p, err
			}
			if p.size += int64(len(k) + len(v)); p.size > maxImportRecords {
				return p, badStream("records exceed %d bytes", maxImportRecords)
			}
			if !bytes.Equal(k, sessionKey(p.name)) {
				p.keys = append(p.keys, bytes.Clone(k))
				p.vals = append(p.vals, bytes.Clone(v))
			}
		case frameSegSize:
			segsStarted = true
			id, rest, err := cutID(b)
			if err != nil {
				return p, err
			}
			if !p.execs[id] || p.segs[id] != "" || len(rest) != 8 {
				return p, badStream("output of exec %q: undeclared or repeated", id)
			}
			size := int64(binary.BigEndian.Uint64(rest))
			if size < 0 || size > maxSegSize {
				return p, badStream("output of exec %q: %d bytes", id, size)
			}
			if err := closeSeg(); err != nil {
				return p, err
			}
			if err := os.MkdirAll(s.seg.dir, 0o700); err != nil {
				return p, err
			}
			// Not *.seg: Open removes any such file a crash left.
			path := filepath.Join(s.seg.dir, id+".import.seg")
			p.segs[id] = path
			f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
			if err != nil {
				return p, err
			}
			if err := f.Truncate(size); err != nil {
				f.Close()
				return p, err
			}
			seg.id, seg.f, seg.size = id, f, size
		case frameSegData:
			id, rest, err := cutID(b)
			if err != nil {
				return p, err
			}
			if seg.f == nil || id != seg.id || len(rest) < 8 {
				return p, badStream("output data of exec %q out of place", id)
			}
			off, data := int64(binary.BigEndian.Uint64(rest)), rest[8:]
			if off < 0 || off > seg.size || int64(len(data)) > seg.size-off {
				return p, badStream("output data of exec %q at %d+%d beyond its %d bytes", id, off, len(data), seg.size)
			}
			if _, err := seg.f.WriteAt(data, off); err != nil {
				return p, err
			}
		case frameEnd:
			if !bytes.Equal(b, fr.h.Sum(nil)) {
				return p, badStream("hash mismatch")
			}
			if _, err := fr.r.ReadByte(); err != io.EOF {
				return p, badStream("data after the end")
			}
			if p.recVal == nil {
				return p, badStream("no session record")
			}
			for id := range p.execs {
				if _, ok := p.execRec[id]; !ok {
					return p, badStream("exec %q listed without its record", id)
				}
			}
			return p, closeSeg()
		default:
			return p, badStream("frame kind %q", kind)
		}
	}
}

// refuseExisting refuses to import a session that is here, or whose
// import is under way.
func (s *Store) refuseExisting(name string) error {
	s.sessMu.RLock()
	_, ok := s.sessions[name]
	s.sessMu.RUnlock()
	if ok {
		return fmt.Errorf("session %q exists here: %w", name, ErrExists)
	}
	return s.db.View(func(txn *badger.Txn) error {
		if _, err := txn.Get(importMarkerKey(name)); err == nil {
			return fmt.Errorf("session %q is being imported here: %w", name, ErrExists)
		}
		return nil
	})
}

// commitImport writes a verified plan: marker, segments, records, then
// the session's record with the marker's removal.
func (s *Store) commitImport(p *importPlan, rec Session, recVal []byte) error {
	mu := s.stripe(p.name)
	mu.Lock()
	defer mu.Unlock()
	if err := s.refuseExisting(p.name); err != nil {
		return err
	}
	ids := make([]string, 0, len(p.execs))
	for id := range p.execs {
		ids = append(ids, id)
	}
	marker, _ := json.Marshal(ids)
	err := s.update(func(txn *badger.Txn) error {
		for _, id := range ids {
			if _, err := txn.Get(execKey(id)); err == nil {
				return fmt.Errorf("exec %q exists here: %w", id, ErrExists)
			}
			if _, err := os.Stat(s.seg.path(id)); err == nil {
				return fmt.Errorf("output of exec %q exists here: %w", id, ErrExists)
			}
		}
		return txn.Set(importMarkerKey(p.name), marker)
	})
	if err == nil {
		err = s.db.Sync()
	}
	if err != nil {
		return err
	}
	// From here a failure undoes what was written; so does Open after a
	// crash, from the marker.
	undo := func(err error) error {
		if derr := s.abandonImport(p.name, ids); derr != nil {
			s.log.Warn("undo an interrupted session import", "session", p.name, "err", derr)
		}
		return err
	}
	if err := s.space.room(p.size); err != nil {
		return undo(err)
	}
	for id, f := range p.segs {
		if err := syncFile(f); err != nil {
			return undo(err)
		}
		if err := os.Rename(f, s.seg.path(id)); err != nil {
			return undo(err)
		}
	}
	if err := syncDir(s.seg.dir); len(p.segs) > 0 && err != nil {
		return undo(err)
	}
	wb := s.db.NewWriteBatch()
	defer wb.Cancel()
	for i, k := range p.keys {
		if err := wb.Set(k, p.vals[i]); err != nil {
			return undo(err)
		}
	}
	if err := wb.Flush(); err != nil {
		return undo(err)
	}
	err = s.update(func(txn *badger.Txn) error {
		if err := txn.Set(sessionKey(p.name), recVal); err != nil {
			return err
		}
		return txn.Delete(importMarkerKey(p.name))
	})
	if err == nil {
		err = s.db.Sync()
	}
	if err != nil {
		return undo(err)
	}
	s.sessMu.Lock()
	s.sessions[p.name] = rec.clone()
	s.sessMu.Unlock()
	for _, id := range ids {
		s.execSession.Store(id, p.name)
	}
	for _, o := range p.orders {
		s.budget.add(o.id, orderEntry{session: p.name, order: o.order, finished: finished(p.execRec[o.id].State)})
	}
	s.budget.total.Add(p.use)
	return nil
}

// abandonImport removes what an import of name that did not finish
// wrote: its records (those of the execs listed as well, in case their
// listing was not written) and their output, then the marker. The caller
// holds the session's stripe, or is Open.
func (s *Store) abandonImport(name string, ids []string) error {
	_, use, err := s.deleteRecords(name, ids)
	if err != nil {
		return err
	}
	for _, id := range ids {
		s.budget.remove(id)
		if err := s.seg.remove(id); err != nil {
			return err
		}
	}
	// loadOutput counted what it found of the import at Open.
	s.budget.total.Add(-use)
	if err := s.update(func(txn *badger.Txn) error { return txn.Delete(importMarkerKey(name)) }); err != nil {
		return err
	}
	return s.db.Sync()
}

// abandonImports, at Open, removes what interrupted imports left.
func (s *Store) abandonImports() error {
	type left struct {
		name string
		ids  []string
	}
	var all []left
	err := s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(importMarkerPrefix)})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			l := left{name: string(it.Item().Key()[len(importMarkerPrefix):])}
			if err := it.Item().Value(func(v []byte) error { return json.Unmarshal(v, &l.ids) }); err != nil {
				return fmt.Errorf("import marker of %q: %w", l.name, err)
			}
			all = append(all, l)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, l := range all {
		s.log.Info("removing an interrupted session import", "session", l.name)
		if err := s.abandonImport(l.name, l.ids); err != nil {
			return fmt.Errorf("remove the interrupted import of session %q: %w", l.name, err)
		}
	}
	return nil
}

func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

package store

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// chunkHeader is the stream and time before an inline chunk's data (the
// format before segments; see segment.go).
const chunkHeader = 9

// maxAppendChunks keeps one AppendOutput within a badger transaction (see
// badgerOptions) with room left for trimming: even with 128-byte ids, 4096
// segment records and as many deletions stay under 1.5 MB.
const maxAppendChunks = 4096

// trimBudget bounds the chunks one transaction deletes; trimming beyond it
// continues in further transactions.
const trimBudget = 4096

// outState is an exec's output progress, stored apart from its record (see
// Exec) and updated in the same transaction as the chunks it describes.
type outState struct {
	StdoutBytes  int64  `json:"stdout_bytes,omitempty"`
	StderrBytes  int64  `json:"stderr_bytes,omitempty"`
	StdoutOffset int64  `json:"stdout_offset,omitempty"`
	StderrOffset int64  `json:"stderr_offset,omitempty"`
	NextSeq      uint64 `json:"next_seq,omitempty"`
	TrimmedSeq   uint64 `json:"trimmed_seq,omitempty"`
	TrimmedBytes int64  `json:"trimmed_bytes,omitempty"`
	// TrimLogStart is the first seq whose size the trim log still holds.
	TrimLogStart uint64 `json:"trim_log_start,omitempty"`
	// SegEnd is where the exec's segment file ends: the next append writes
	// there, over anything a failed append left behind.
	SegEnd int64 `json:"seg_end,omitempty"`
	// Order is the exec's position in outorder, fixed when it was indexed;
	// Indexed is true while it has stored chunks.
	Order   uint64 `json:"order,omitempty"`
	Indexed bool   `json:"indexed,omitempty"`
}

func (st *outState) applyTo(e *Exec) {
	e.StdoutBytes, e.StderrBytes = st.StdoutBytes, st.StderrBytes
	e.StdoutOffset, e.StderrOffset = st.StdoutOffset, st.StderrOffset
	e.NextSeq = st.NextSeq
	e.TrimmedSeq, e.TrimmedBytes = st.TrimmedSeq, st.TrimmedBytes
}

func getOutState(txn *badger.Txn, id string) (*outState, error) {
	st := new(outState)
	err := getJSON(txn, outStateKey(id), st)
	if err != nil && !errors.Is(err, badger.ErrKeyNotFound) {
		return nil, fmt.Errorf("output state of exec %q: %w", id, err)
	}
	return st, nil
}

func putOutState(txn *badger.Txn, id string, st *outState) error {
	v, err := json.Marshal(st)
	if err != nil {
		return err
	}
	return txn.Set(outStateKey(id), v)
}

func getUse(txn *badger.Txn, session string) (int64, error) {
	item, err := txn.Get(outUseKey(session))
	if errors.Is(err, badger.ErrKeyNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	var n int64
	err = item.Value(func(v []byte) error {
		if len(v) != 8 {
			return fmt.Errorf("output total of session %q: %d bytes, want 8", session, len(v))
		}
		n = int64(binary.BigEndian.Uint64(v))
		return nil
	})
	return n, err
}

func putUse(txn *badger.Txn, session string, n int64) error {
	return txn.Set(outUseKey(session), binary.BigEndian.AppendUint64(nil, uint64(n)))
}

// AppendOutput stores chunks (their Exec and Seq are ignored) as the exec's
// next sequence numbers and records the agent offsets that the stored
// output now reaches. The chunks' data goes to the exec's segment file
// first; their index records, byte counts, offsets and NextSeq are then
// committed in one transaction, so after a crash the stored output and the
// offsets to resume from agree. Offsets may not go backwards. If the
// session's output then exceeds its retention, or all sessions' output
// the budget (SetOutputBudget), the oldest is trimmed before AppendOutput
// returns. It returns the updated exec.
//
// An error means nothing of the call was stored, so the caller may retry
// it as it was. When the disk is too full (see Store) the error wraps
// syscall.ENOSPC: the caller should stop acknowledging output to the agent
// and retry later.
//
// Each call is one pwritev and one badger commit with a fixed cost, so a
// caller that passes all chunks that arrived while its previous call ran
// gets more throughput than one chunk a call (see BenchmarkAppendOutput).
func (s *Store) AppendOutput(execID string, chunks []Chunk, stdoutOffset, stderrOffset int64) (Exec, error) {
	if err := checkName("exec", execID); err != nil {
		return Exec{}, err
	}
	if len(chunks) > maxAppendChunks {
		return Exec{}, fmt.Errorf("append output to exec %q: %d chunks, at most %d per call: %w",
			execID, len(chunks), maxAppendChunks, ErrInvalid)
	}
	var outBytes, errBytes int64
	for _, c := range chunks {
		switch c.Stream {
		case Stdout:
			outBytes += int64(len(c.Data))
		case Stderr:
			errBytes += int64(len(c.Data))
		default:
			return Exec{}, fmt.Errorf("append output to exec %q: stream %d: %w", execID, c.Stream, ErrInvalid)
		}
	}
	if err := s.enter(); err != nil {
		return Exec{}, err
	}
	defer s.closeMu.RUnlock()
	for {
		session, err := s.sessionOf(execID)
		if err != nil {
			return Exec{}, fmt.Errorf("append output: %w", err)
		}
		e, err := s.appendLocked(session, execID, chunks, outBytes, errBytes, stdoutOffset, stderrOffset)
		if errors.Is(err, errWrongSession) {
			s.execSession.Delete(execID)
			continue
		}
		if err != nil {
			return Exec{}, fmt.Errorf("append output to exec %q: %w", execID, err)
		}
		// The output is stored: from here on, failing would make the caller
		// store it twice. Trimming that fails is retried by the next append.
		trimmed, err := s.enforceBudget(execID)
		if err != nil {
			s.log.Warn("trim output for the budget", "exec", execID, "err", err)
		}
		if trimmed {
			if err := s.db.View(func(txn *badger.Txn) error {
				e, _, err = loadExec(txn, execID)
				return err
			}); err != nil {
				s.log.Warn("reload exec after trimming", "exec", execID, "err", err)
			}
		}
		return e, nil
	}
}

// errWrongSession means the cached session of an exec is stale (its id was
// deleted and reused); AppendOutput looks it up again.
var errWrongSession = errors.New("exec moved to another session")

func (s *Store) appendLocked(session, execID string, chunks []Chunk, outBytes, errBytes, stdoutOffset, stderrOffset int64) (Exec, error) {
	mu := s.stripe(session)
	mu.Lock()
	defer mu.Unlock()
	limit := s.retention(session)
	now := time.Now()
	data := outBytes + errBytes
	recs := make([]byte, 0, len(chunks)*segRecordLen)
	var e Exec
	var st *outState
	var t *trimmer
	var delta int64
	var more, indexed bool
	err := s.updateNeed(session, data, func(txn *badger.Txn) error {
		var err error
		e, st, err = loadExec(txn, execID)
		if err != nil {
			return err
		}
		if e.Session != session {
			return errWrongSession
		}
		if stdoutOffset < st.StdoutOffset || stderrOffset < st.StderrOffset {
			return fmt.Errorf("offsets stdout %d stderr %d go back from %d %d: %w",
				stdoutOffset, stderrOffset, st.StdoutOffset, st.StderrOffset, ErrInvalid)
		}
		// Write where the index ends; a retried transaction writes the
		// same bytes again.
		if data > 0 {
			if err := s.seg.write(execID, st.SegEnd, chunks); err != nil {
				return err
			}
		}
		recs = recs[:0]
		off := st.SegEnd
		for _, c := range chunks {
			tm := c.Time
			if tm.IsZero() {
				tm = now
			}
			start := len(recs)
			recs = appendSegRecord(recs, c.Stream, tm, off, int64(len(c.Data)))
			if err := txn.Set(chunkKey(execID, st.NextSeq), recs[start:len(recs):len(recs)]); err != nil {
				return err
			}
			st.NextSeq++
			off += int64(len(c.Data))
		}
		st.SegEnd = off
		st.StdoutBytes += outBytes
		st.StderrBytes += errBytes
		st.StdoutOffset, st.StderrOffset = stdoutOffset, stderrOffset
		indexed = false
		if len(chunks) > 0 && !st.Indexed {
			st.Order = orderOf(e.StartedAt)
			st.Indexed = true
			indexed = true
			if err := txn.Set(outOrderKey(session, st.Order, execID), nil); err != nil {
				return err
			}
		}
		use, err := getUse(txn, session)
		if err != nil {
			return err
		}
		was := use
		use += data
		t = newTrimmer(txn, session)
		t.states[execID] = st
		if more, err = t.trim(&use, limit); err != nil {
			return err
		}
		if err := t.flush(); err != nil {
			return err
		}
		if err := putUse(txn, session, use); err != nil {
			return err
		}
		delta = use - was
		st.applyTo(&e)
		return nil
	})
	if err != nil {
		return Exec{}, err
	}
	s.budget.total.Add(delta)
	if indexed {
		s.budget.add(execID, orderEntry{session: session, order: st.Order, finished: finished(e.State)})
	}
	s.afterTrim(t)
	if !more {
		return e, nil
	}
	if err := s.trimLocked(session, limit); err != nil {
		s.log.Warn("trim output", "session", session, "err", err)
	}
	if err := s.db.View(func(txn *badger.Txn) error {
		e, _, err = loadExec(txn, execID)
		return err
	}); err != nil {
		s.log.Warn("reload exec after trimming", "exec", execID, "err", err)
	}
	return e, nil
}

// afterTrim frees what a committed trim deleted: it punches the segment
// ranges whose index is gone and removes the segments of emptied execs.
// The caller holds the session's stripe, so no append races with it. A
// failure leaks space until the next Open (see reconcile), so it is logged.
func (s *Store) afterTrim(t *trimmer) {
	if t == nil {
		return
	}
	emptied := make(map[string]bool, len(t.emptied))
	for _, id := range t.emptied {
		emptied[id] = true
		s.budget.remove(id)
		if err := s.seg.remove(id); err != nil {
			s.log.Warn("remove output segment", "exec", id, "err", err)
		}
	}
	for id, sp := range t.freed {
		if emptied[id] {
			continue
		}
		if err := s.seg.punch(id, sp.off, sp.end-sp.off); err != nil {
			s.log.Warn("free trimmed output", "exec", id, "err", err)
		}
	}
}

// orderOf places execs in outorder by start time, so retention trims the
// oldest execs first.
func orderOf(started time.Time) uint64 {
	if started.IsZero() || started.UnixNano() < 0 {
		return 0
	}
	return uint64(started.UnixNano())
}

// trimLocked trims the session's output down to limit, in as many
// transactions as it takes; the caller holds the session's stripe.
func (s *Store) trimLocked(session string, limit int64) error {
	var use int64
	if err := s.db.View(func(txn *badger.Txn) (err error) {
		use, err = getUse(txn, session)
		return err
	}); err != nil || use <= limit {
		return err
	}
	for {
		var more bool
		var t *trimmer
		var delta int64
		err := s.update(func(txn *badger.Txn) error {
			t, delta = nil, 0
			use, err := getUse(txn, session)
			if err != nil || use <= limit {
				more = false
				return err
			}
			was := use
			t = newTrimmer(txn, session)
			if more, err = t.trim(&use, limit); err != nil {
				return err
			}
			if err := t.flush(); err != nil {
				return err
			}
			delta = use - was
			return putUse(txn, session, use)
		})
		if err != nil {
			return fmt.Errorf("trim output of session %q: %w", session, err)
		}
		s.budget.total.Add(delta)
		s.afterTrim(t)
		if !more {
			return nil
		}
	}
}

// MaxReadBytes bounds the data one ReadOutput returns (at least one chunk
// is returned whatever its size): a page of output is read into memory and
// sent as one answer.
const MaxReadBytes = 16 << 20

// ReadOutput returns up to limit chunks (all if limit <= 0, within
// MaxReadBytes) of the exec's output, starting at seq from. gap is the size of chunks at or after from
// that retention trimmed, which lie before the first chunk returned; next is
// the seq to read from next time.
//
// gap is exact for from = 0 and for any from among the exec's last 65,536
// trimmed chunks; a reader further behind gets all trimmed bytes as an
// upper bound, because the sizes of older trimmed chunks are forgotten to
// keep retention a bound on space.
func (s *Store) ReadOutput(execID string, from uint64, limit int) (chunks []Chunk, gap int64, next uint64, err error) {
	if err := checkName("exec", execID); err != nil {
		return nil, 0, 0, err
	}
	if err := s.enter(); err != nil {
		return nil, 0, 0, err
	}
	defer s.closeMu.RUnlock()
	// Held from before the transaction until the data is read: a trim that
	// commits meanwhile punches its ranges only after we are done.
	l := s.seg.lock(execID)
	l.RLock()
	defer l.RUnlock()
	var reads []segRead
	err = s.db.View(func(txn *badger.Txn) error {
		if _, err := txn.Get(execKey(execID)); errors.Is(err, badger.ErrKeyNotFound) {
			return fmt.Errorf("exec %q: %w", execID, ErrNotFound)
		} else if err != nil {
			return err
		}
		st, err := getOutState(txn, execID)
		if err != nil {
			return err
		}
		if gap, err = gapBytes(txn, execID, st, from); err != nil {
			return err
		}
		next = max(from, st.TrimmedSeq)
		opts := badger.DefaultIteratorOptions
		opts.Prefix = chunkPrefix(execID)
		if limit > 0 {
			opts.PrefetchSize = min(limit, opts.PrefetchSize)
		}
		it := txn.NewIterator(opts)
		defer it.Close()
		var bytes int64
		for it.Seek(chunkKey(execID, next)); it.Valid(); it.Next() {
			if limit > 0 && len(chunks) >= limit || bytes >= MaxReadBytes {
				break
			}
			item := it.Item()
			c := Chunk{Exec: execID, Seq: binary.BigEndian.Uint64(item.Key()[len(opts.Prefix):])}
			if err := item.Value(func(v []byte) error {
				r, err := decodeChunk(v)
				if err != nil {
					return fmt.Errorf("chunk %d of exec %q: %w", c.Seq, execID, err)
				}
				c.Stream = r.stream
				c.Time = time.Unix(0, r.time)
				if r.seg {
					reads = append(reads, segRead{i: len(chunks), off: r.off, n: r.n})
					bytes += int64(r.n)
				} else {
					c.Data = append([]byte(nil), r.data...)
					bytes += int64(len(r.data))
				}
				return nil
			}); err != nil {
				return err
			}
			chunks = append(chunks, c)
			next = c.Seq + 1
		}
		return nil
	})
	if err == nil {
		err = s.seg.read(execID, chunks, reads)
	}
	if err != nil {
		return nil, 0, 0, fmt.Errorf("read output: %w", err)
	}
	return chunks, gap, next, nil
}

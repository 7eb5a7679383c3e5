package store

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/dgraph-io/badger/v4"
)

// Retention trims whole chunks from the front of the oldest exec's output
// (by start time, via the outorder index), so what an exec has lost is
// always a prefix: Seq < TrimmedSeq, TrimmedBytes in total. To report the
// gap for a reader that resumes inside that prefix, the sizes of trimmed
// chunks are kept in a trim log: blocks of trimBlockSeqs consecutive seqs,
// each "uvarint bytes trimmed before the block, uvarint size per chunk".
// Only the last trimLogBlocks blocks are kept (at most ~3 bytes a chunk), so
// retention still bounds space however long an exec runs.
const trimBlockSeqs = 256

// trimLogBlocks is a variable so tests can exercise forgetting.
var trimLogBlocks uint64 = 256

// trimmer deletes a session's oldest chunks within one transaction, keeping
// the output states and trim-log blocks it touches until flush, and the
// segment ranges it frees until the commit (see Store.afterTrim).
type trimmer struct {
	txn     *badger.Txn
	session string
	states  map[string]*outState
	blocks  map[string][]byte
	budget  int
	// freed is, per exec, the segment range of the chunks deleted;
	// emptied are the execs left without stored chunks.
	freed   map[string]span
	emptied []string
}

// span is a byte range [off, end) of a segment.
type span struct{ off, end int64 }

func newTrimmer(txn *badger.Txn, session string) *trimmer {
	return &trimmer{
		txn:     txn,
		session: session,
		states:  make(map[string]*outState),
		blocks:  make(map[string][]byte),
		budget:  trimBudget,
		freed:   make(map[string]span),
	}
}

// trim deletes the oldest chunks until *use <= limit, and reports whether
// it stopped at its budget with more to do.
func (t *trimmer) trim(use *int64, limit int64) (more bool, err error) {
	for *use > limit {
		if t.budget <= 0 {
			return true, nil
		}
		id, ok, err := t.oldest()
		if err != nil {
			return false, err
		}
		if !ok {
			// The running total claims output that no exec holds. The index
			// changes in the same transactions as the chunks, so believe it:
			// recomputing the total would need the full scan it exists to
			// avoid.
			*use = 0
			return false, nil
		}
		st, err := t.state(id)
		if err != nil {
			return false, err
		}
		if err := t.trimExec(id, st, use, limit); err != nil {
			return false, err
		}
	}
	return false, nil
}

// oldest returns the session's oldest exec that still has stored chunks.
func (t *trimmer) oldest() (string, bool, error) {
	p := outOrderPrefix(t.session)
	it := t.txn.NewIterator(badger.IteratorOptions{Prefix: p})
	defer it.Close()
	it.Rewind()
	if !it.Valid() {
		return "", false, nil
	}
	return outOrderExec(t.session, it.Item().Key()), true, nil
}

func (t *trimmer) state(id string) (*outState, error) {
	if st, ok := t.states[id]; ok {
		return st, nil
	}
	st, err := getOutState(t.txn, id)
	if err != nil {
		return nil, err
	}
	t.states[id] = st
	return st, nil
}

func (t *trimmer) trimExec(id string, st *outState, use *int64, limit int64) error {
	it := t.txn.NewIterator(badger.IteratorOptions{Prefix: chunkPrefix(id)})
	defer it.Close()
	for it.Seek(chunkKey(id, st.TrimmedSeq)); it.Valid() && *use > limit && t.budget > 0; it.Next() {
		item := it.Item()
		k := item.KeyCopy(nil)
		seq := binary.BigEndian.Uint64(k[len(k)-8:])
		var n int64
		if err := item.Value(func(v []byte) error {
			r, err := decodeChunk(v)
			if err != nil {
				return fmt.Errorf("chunk %d of exec %q: %w", seq, id, err)
			}
			n = r.n
			if r.seg {
				sp, ok := t.freed[id]
				if !ok {
					sp.off = r.off
				}
				sp.end = max(sp.end, r.off+r.n)
				t.freed[id] = sp
			}
			return nil
		}); err != nil {
			return err
		}
		if err := t.txn.Delete(k); err != nil {
			return err
		}
		// Seqs are contiguous; a hole (which only a bug could make) is
		// logged as empty chunks so the log stays aligned.
		for ; st.TrimmedSeq < seq; st.TrimmedSeq++ {
			if err := t.logTrim(id, st, st.TrimmedSeq, 0); err != nil {
				return err
			}
		}
		if err := t.logTrim(id, st, seq, n); err != nil {
			return err
		}
		st.TrimmedSeq = seq + 1
		st.TrimmedBytes += n
		*use -= n
		t.budget--
	}
	if it.Valid() && st.TrimmedSeq < st.NextSeq {
		return nil
	}
	// Nothing stored any more: leave the trim order until new output.
	st.TrimmedSeq = st.NextSeq
	st.Indexed = false
	t.emptied = append(t.emptied, id)
	return t.txn.Delete(outOrderKey(t.session, st.Order, id))
}

// logTrim records that chunk seq of exec id, n bytes long, was trimmed;
// st.TrimmedBytes must not yet include it.
func (t *trimmer) logTrim(id string, st *outState, seq uint64, n int64) error {
	if seq < st.TrimLogStart {
		return nil
	}
	blk := seq / trimBlockSeqs
	k := string(trimKey(id, blk))
	b, ok := t.blocks[k]
	if !ok {
		if seq%trimBlockSeqs == 0 {
			b = binary.AppendUvarint(nil, uint64(st.TrimmedBytes))
		} else {
			item, err := t.txn.Get([]byte(k))
			if errors.Is(err, badger.ErrKeyNotFound) {
				// The block's start is missing; the log resumes at the next
				// block and earlier readers get the upper bound.
				st.TrimLogStart = (blk + 1) * trimBlockSeqs
				return nil
			}
			if err != nil {
				return err
			}
			if b, err = item.ValueCopy(nil); err != nil {
				return err
			}
		}
	}
	t.blocks[k] = binary.AppendUvarint(b, uint64(n))
	if first := st.TrimLogStart / trimBlockSeqs; blk >= first+trimLogBlocks {
		keep := blk - trimLogBlocks + 1
		for old := first; old < keep; old++ {
			dk := trimKey(id, old)
			delete(t.blocks, string(dk))
			if err := t.txn.Delete(dk); err != nil {
				return err
			}
		}
		st.TrimLogStart = keep * trimBlockSeqs
	}
	return nil
}

// flush writes the states and trim-log blocks changed in this transaction.
func (t *trimmer) flush() error {
	for id, st := range t.states {
		if err := putOutState(t.txn, id, st); err != nil {
			return err
		}
	}
	for k, b := range t.blocks {
		if err := t.txn.Set([]byte(k), b); err != nil {
			return err
		}
	}
	return nil
}

// gapBytes returns the bytes trimmed from chunks with seq in [from, TrimmedSeq).
func gapBytes(txn *badger.Txn, id string, st *outState, from uint64) (int64, error) {
	if from >= st.TrimmedSeq {
		return 0, nil
	}
	if from == 0 || from < st.TrimLogStart {
		return st.TrimmedBytes, nil
	}
	item, err := txn.Get(trimKey(id, from/trimBlockSeqs))
	if errors.Is(err, badger.ErrKeyNotFound) {
		return st.TrimmedBytes, nil
	}
	if err != nil {
		return 0, err
	}
	var before uint64
	err = item.Value(func(b []byte) error {
		skip := int(from % trimBlockSeqs)
		for i := 0; i <= skip; i++ {
			v, n := binary.Uvarint(b)
			if n <= 0 {
				return fmt.Errorf("trim log of exec %q: truncated block", id)
			}
			before += v
			b = b[n:]
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return st.TrimmedBytes - int64(before), nil
}

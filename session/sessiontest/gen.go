package sessiontest

import (
	"strconv"
	"time"

	"github.com/berthvm/berth/session"
)

// Lines returns a generator for AddGenerated: chunk seq of execution id
// holds perChunk numbered lines ("line 0000042 the quick brown fox
// jumps"), every stderrEvery-th chunk on stderr (0: none), stamped a
// millisecond apart from t0. Line k (0-based) is in chunk k/perChunk+1, so
// a test can compute what any screen must show.
func Lines(id string, perChunk, stderrEvery int, t0 time.Time) func(seq uint64) session.Chunk {
	return func(seq uint64) session.Chunk {
		c := session.Chunk{Exec: id, Seq: seq, Stream: session.Stdout, Time: t0.Add(time.Duration(seq) * time.Millisecond)}
		if stderrEvery > 0 && seq%uint64(stderrEvery) == 0 {
			c.Stream = session.Stderr
		}
		buf := make([]byte, 0, perChunk*40)
		first := (seq - 1) * uint64(perChunk)
		for i := range uint64(perChunk) {
			buf = appendLine(buf, first+i)
			buf = append(buf, '\n')
		}
		c.Data = buf
		return c
	}
}

// LineText is the text of line k as Lines generates it.
func LineText(k uint64) string { return string(appendLine(nil, k)) }

func appendLine(buf []byte, k uint64) []byte {
	buf = append(buf, "line "...)
	n := strconv.AppendUint(nil, k, 10)
	for range 7 - len(n) {
		buf = append(buf, '0')
	}
	buf = append(buf, n...)
	return append(buf, " the quick brown fox jumps"...)
}

package fakesvc

import (
	"strconv"
	"time"

	"github.com/berthvm/berth/session"
)

// Lines returns a generator of chunks holding perChunk numbered lines
// each ("line 0000042 …"), every stderrEvery-th chunk on stderr (0: none),
// for AddGenerated. Line k (0-based) is in chunk k/perChunk+1, so tests
// can compute what any screen must show.
func Lines(id string, perChunk, stderrEvery int, t0 time.Time) func(seq uint64) session.Chunk {
	return func(seq uint64) session.Chunk {
		c := session.Chunk{Exec: id, Seq: seq, Stream: session.Stdout, Time: t0.Add(time.Duration(seq) * time.Millisecond)}
		if stderrEvery > 0 && seq%uint64(stderrEvery) == 0 {
			c.Stream = session.Stderr
		}
		buf := make([]byte, 0, perChunk*40)
		first := (seq - 1) * uint64(perChunk)
		for i := range uint64(perChunk) {
			buf = append(buf, "line "...)
			n := strconv.AppendUint(nil, first+i, 10)
			for range 7 - len(n) {
				buf = append(buf, '0')
			}
			buf = append(buf, n...)
			buf = append(buf, " the quick brown fox jumps\n"...)
		}
		c.Data = buf
		return c
	}
}

// LineText is the text of line k as Lines generates it.
func LineText(k uint64) string {
	n := strconv.FormatUint(k, 10)
	for len(n) < 7 {
		n = "0" + n
	}
	return "line " + n + " the quick brown fox jumps"
}

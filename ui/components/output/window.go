package output

import (
	"bytes"
	"strings"

	"github.com/charmbracelet/x/ansi"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/ui/common"
)

// line is one output line, sanitised once when it enters the window.
type line struct {
	text    string
	seq     uint64 // chunk the line starts in
	endSeq  uint64 // chunk the line ends in
	unix    int64  // time of its first chunk, ns
	width   int32  // display width of text
	stream  session.Stream
	partial bool // its last chunk ended without a newline
	marker  bool // a synthetic line (e.g. "output trimmed by retention")
}

// window holds the lines of the contiguous chunk range [lo, next) of one
// execution's output. It is the only output the view keeps in memory: it
// grows at either end as pages are read from the store or live chunks
// arrive, and is trimmed at whole-chunk boundaries on the side away from
// the viewport, so the chunk range it covers stays exact.
type window struct {
	lines   []line
	lo      uint64 // first chunk in the window
	next    uint64 // chunk after the last one in the window
	atStart bool   // nothing precedes lo
	bytes   int
	// rawTail is the raw text of the last line while it is partial, so
	// the continuation is sanitised together with it (an escape sequence
	// or "\r" split across chunks is then handled as one).
	rawTail []byte
}

func (w *window) empty() bool { return w.lo == w.next }

func (w *window) reset(at uint64) {
	w.lines = nil
	w.lo, w.next = at, at
	w.atStart = at <= 1
	w.bytes = 0
	w.rawTail = nil
}

func newLine(text string, c *session.Chunk) line {
	return line{text: text, seq: c.Seq, endSeq: c.Seq, unix: c.Time.UnixNano(), width: int32(ansi.StringWidth(text)), stream: c.Stream}
}

// appendChunk adds a chunk at the end and returns how many lines were
// added. The caller ensures c.Seq >= next (a larger seq is a gap the store
// reported, e.g. retention).
func (w *window) appendChunk(c *session.Chunk) int {
	if c.Seq < w.next && !w.empty() {
		return 0 // already have it
	}
	if w.empty() {
		w.lo = c.Seq
	}
	data := c.Data
	added := 0
	if n := len(w.lines); n > 0 && w.lines[n-1].partial && w.lines[n-1].stream == c.Stream && c.Seq == w.next {
		last := &w.lines[n-1]
		i := bytes.IndexByte(data, '\n')
		piece := data
		if i >= 0 {
			piece, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
		if w.rawTail == nil {
			// Trimming dropped the raw text; continue from the shown
			// text, without the reset that ends it (sanitising puts it
			// back at the new end if colours are still set).
			w.rawTail = []byte(strings.TrimSuffix(last.text, common.SGRReset))
		}
		// Bound the raw tail: a line that never ends must not grow without limit.
		if len(w.rawTail) < 2*common.MaxLineBytes {
			w.rawTail = append(w.rawTail, piece...)
		}
		w.bytes -= len(last.text)
		last.text = common.SanitizeOutputLine(string(w.rawTail))
		last.width = int32(ansi.StringWidth(last.text))
		w.bytes += len(last.text)
		last.endSeq = c.Seq
		last.partial = i < 0
		if !last.partial {
			w.rawTail = nil
		}
	}
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		var piece []byte
		partial := i < 0
		if partial {
			piece, data = data, nil
		} else {
			piece, data = data[:i], data[i+1:]
		}
		ln := newLine(common.SanitizeOutputLine(string(piece)), c)
		ln.partial = partial
		if partial {
			w.rawTail = append(w.rawTail[:0], piece[:min(len(piece), 2*common.MaxLineBytes)]...)
		}
		w.lines = append(w.lines, ln)
		w.bytes += len(ln.text)
		added++
	}
	w.next = c.Seq + 1
	return added
}

// addMarker appends a synthetic line that belongs to no chunk.
func (w *window) addMarker(text string, seq uint64) {
	w.lines = append(w.lines, line{text: text, seq: seq, endSeq: seq, width: int32(ansi.StringWidth(text)), marker: true})
}

// prepend adds chunks that precede lo (in order) and returns how many
// lines now precede the old first line, so the caller can keep its
// scroll position.
func (w *window) prepend(chunks []session.Chunk, atStart bool, gap int64) int {
	var t window
	if len(chunks) == 0 {
		w.atStart = atStart
		return 0
	}
	t.reset(chunks[0].Seq)
	if gap > 0 {
		t.addMarker("… "+session.FormatBytes(gap)+" of earlier output trimmed by retention", chunks[0].Seq)
	}
	for i := range chunks {
		t.appendChunk(&chunks[i])
	}
	before := len(t.lines)
	if n := len(t.lines); n > 0 && len(w.lines) > 0 && t.lines[n-1].partial && !w.lines[0].marker &&
		t.lines[n-1].stream == w.lines[0].stream && t.next == w.lo {
		// The old first line continues the new last one.
		last := &t.lines[n-1]
		last.text += w.lines[0].text
		last.width += w.lines[0].width
		last.endSeq = w.lines[0].endSeq
		last.partial = w.lines[0].partial
		w.lines = w.lines[1:]
		before--
	}
	w.lines = append(t.lines, w.lines...)
	w.bytes += t.bytes
	w.lo = t.lo
	w.atStart = atStart
	return before
}

// trimFront drops at least n lines from the front, ending at a chunk
// boundary, and returns how many it dropped.
func (w *window) trimFront(n int) int {
	if n <= 0 || len(w.lines) == 0 {
		return 0
	}
	i := min(n, len(w.lines))
	for i < len(w.lines) && w.lines[i].seq == w.lines[i-1].endSeq && !w.lines[i].marker {
		i++
	}
	for _, l := range w.lines[:i] {
		w.bytes -= len(l.text)
	}
	if i < len(w.lines) {
		w.lo = w.lines[i].seq
	} else {
		w.lo = w.next
		w.rawTail = nil
	}
	// Copy when the dropped head is large, so its memory is released
	// rather than pinned under the slice.
	if i > len(w.lines)/2 {
		w.lines = append([]line(nil), w.lines[i:]...)
	} else {
		w.lines = w.lines[i:]
	}
	w.atStart = false
	return i
}

// trimBack drops at least n lines from the end, at a chunk boundary, and
// returns how many it dropped.
func (w *window) trimBack(n int) int {
	if n <= 0 || len(w.lines) == 0 {
		return 0
	}
	j := max(0, len(w.lines)-n)
	for j > 0 && w.lines[j].seq == w.lines[j-1].endSeq && !w.lines[j].marker {
		j--
	}
	dropped := len(w.lines) - j
	for _, l := range w.lines[j:] {
		w.bytes -= len(l.text)
	}
	if j < len(w.lines) {
		w.next = w.lines[j].seq
	}
	if j == 0 {
		w.lo = w.next
	}
	w.lines = w.lines[:j:j]
	w.rawTail = nil
	return dropped
}

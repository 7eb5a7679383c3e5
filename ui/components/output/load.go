package output

import (
	"bytes"
	"context"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"

	"github.com/berthvm/berth/session"
)

type pageKind int

const (
	kindTail   pageKind = iota // the last page; follow from there
	kindBefore                 // the page before the window
	kindAfter                  // the page after the window
	kindAt                     // a page around a seq (top, search hit)
)

// pageMsg carries a page read from the store.
type pageMsg struct {
	gen    int
	kind   pageKind
	from   uint64
	limit  int
	page   session.OutputPage
	last   uint64 // kindTail: the last seq at the time of the read
	target uint64 // kindAt: the seq to show
	search int    // kindAt: continue a search in this direction (0: none)
	err    error
}

// chunksMsg carries a batch of live chunks.
type chunksMsg struct {
	gen    int
	chunks []session.Chunk
	closed bool
}

// attachedMsg reports the live follower for a running execution.
type attachedMsg struct {
	gen  int
	proc session.Process
	err  error
}

// scanMsg reports a search through the store beyond the window.
type scanMsg struct {
	gen   int
	seq   uint64
	found bool
	dir   int
	wrap  bool // continue from the other end if not found
	err   error
}

// execMsg refreshes the execution record.
type execMsg struct {
	gen  int
	exec session.Execution
}

// drainedMsg reports that an abandoned stream ended.
type drainedMsg struct{}

const (
	// linger is how long a pump waits for more chunks after the first,
	// so a chatty command (10,000 lines/s) costs one render per frame,
	// not one per chunk.
	linger         = 16 * time.Millisecond
	maxBatchChunks = 4096
	scanPage       = 256
	scanTimeout    = 15 * time.Second
)

// pump reads the next batch of chunks from a stream. The model re-arms it
// after each batch, so at most one read is outstanding per stream.
func pump(gen int, ch <-chan session.Chunk) tea.Cmd {
	return func() tea.Msg {
		c, ok := <-ch
		if !ok {
			return chunksMsg{gen: gen, closed: true}
		}
		batch := []session.Chunk{c}
		timer := time.NewTimer(linger)
		defer timer.Stop()
		for len(batch) < maxBatchChunks {
			select {
			case c, ok := <-ch:
				if !ok {
					return chunksMsg{gen: gen, chunks: batch, closed: true}
				}
				batch = append(batch, c)
			case <-timer.C:
				return chunksMsg{gen: gen, chunks: batch}
			}
		}
		return chunksMsg{gen: gen, chunks: batch}
	}
}

// drain reads an abandoned stream to its end, so the service is never
// blocked on a reader the view no longer has. It ends with the execution
// or the program's lifetime, whichever comes first.
func drain(ch <-chan session.Chunk) tea.Cmd {
	return func() tea.Msg {
		for range ch {
		}
		return drainedMsg{}
	}
}

// lastSeq finds an execution's last chunk seq with O(log n) one-chunk
// reads: Output(s, 1) is non-empty exactly when s <= last, holes from
// retention included, so an exponential then binary search finds it
// without reading the output.
func lastSeq(ctx context.Context, svc session.Execer, id string) (uint64, error) {
	nonEmpty := func(s uint64) (bool, error) {
		p, err := svc.Output(ctx, id, s, 1)
		return len(p.Chunks) > 0, err
	}
	ok, err := nonEmpty(1)
	if err != nil || !ok {
		return 0, err
	}
	lo, hi := uint64(1), uint64(2)
	for {
		ok, err := nonEmpty(hi)
		if err != nil {
			return 0, err
		}
		if !ok {
			break
		}
		lo, hi = hi, hi*2
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		ok, err := nonEmpty(mid)
		if err != nil {
			return 0, err
		}
		if ok {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo, nil
}

// scan looks for needle in the store from seq in direction dir and
// returns the first chunk (in that direction) containing it, ignoring
// escape sequences. Matches split across chunks are not found; the window
// search finds those.
func scan(ctx context.Context, svc session.Execer, id string, from uint64, dir int, needle []byte, fold bool) (uint64, bool, error) {
	has := func(data []byte) bool {
		if bytes.IndexByte(data, ansi.ESC) >= 0 {
			// Match the text, not its colours: "\x1b[32mok\x1b[0m" has "ok".
			data = []byte(ansi.Strip(string(data)))
		}
		if fold {
			data = bytes.ToLower(data)
		}
		return bytes.Contains(data, needle)
	}
	if dir > 0 {
		for seq := from; ; {
			p, err := svc.Output(ctx, id, seq, scanPage)
			if err != nil {
				return 0, false, err
			}
			if len(p.Chunks) == 0 {
				return 0, false, nil
			}
			for _, c := range p.Chunks {
				if has(c.Data) {
					return c.Seq, true, nil
				}
			}
			if p.Next <= seq {
				return 0, false, nil
			}
			seq = p.Next
		}
	}
	for hi := from; hi >= 1; {
		lo := uint64(1)
		if hi > scanPage {
			lo = hi - scanPage + 1
		}
		p, err := svc.Output(ctx, id, lo, int(hi-lo+1))
		if err != nil {
			return 0, false, err
		}
		for j := len(p.Chunks) - 1; j >= 0; j-- {
			if c := p.Chunks[j]; c.Seq <= hi && has(c.Data) {
				return c.Seq, true, nil
			}
		}
		if lo == 1 {
			break
		}
		hi = lo - 1
	}
	return 0, false, nil
}

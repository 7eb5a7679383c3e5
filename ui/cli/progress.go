package cli

import (
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/berthvm/berth/session"
)

// progress shows a transfer's progress on a terminal's stderr. Its
// goroutine runs from startProgress until stop.
type progress struct {
	w     io.Writer
	label string
	total int64 // -1 when unknown
	n     atomic.Int64
	quit  chan struct{} // nil when progress is not shown
	done  chan struct{}
	shown bool // owned by the goroutine until done is closed
}

// startProgress shows progress when stderr is a terminal and the transfer
// is (or, when total < 0 is unknown, grows) over progressThreshold.
func (c *Call) startProgress(label string, total int64) *progress {
	p := &progress{w: c.env.Stderr, label: label, total: total}
	if !c.env.StderrTTY || (total >= 0 && total <= progressThreshold) {
		return p
	}
	p.quit, p.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(p.done)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				p.draw()
			case <-p.quit:
				return
			}
		}
	}()
	return p
}

// reader counts what passes through r.
func (p *progress) reader(r io.Reader) io.Reader {
	if p.quit == nil {
		return r
	}
	return countingReader{r: r, n: &p.n}
}

func (p *progress) draw() {
	n := p.n.Load()
	if n <= progressThreshold {
		return
	}
	if p.total > 0 {
		fmt.Fprintf(p.w, "\r%s: %s of %s (%d%%)\x1b[K", p.label, session.FormatBytes(n), session.FormatBytes(p.total), n*100/p.total)
	} else {
		fmt.Fprintf(p.w, "\r%s: %s\x1b[K", p.label, session.FormatBytes(n))
	}
	p.shown = true
}

// stop ends the display; on success it shows the final figure.
func (p *progress) stop(ok bool) {
	if p.quit == nil {
		return
	}
	close(p.quit)
	<-p.done
	if ok {
		p.draw()
	}
	if p.shown {
		fmt.Fprintln(p.w)
	}
}

type countingReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n.Add(int64(n))
	return n, err
}

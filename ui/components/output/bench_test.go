package output

import (
	"bufio"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/colorprofile"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/sessiontest"
	"github.com/berthvm/berth/ui/common"
	"github.com/berthvm/berth/ui/internal/uitest"
)

// BenchmarkOutputView1M measures frames (Update + View) of the Output view
// on a running execution that already has 1,000,000 lines while 10,000
// lines/s stream in (167 lines per 60 fps frame), with the operator
// following, scrolling back through old output page by page, jumping to
// the top, wrapping, and returning to the end. Each op is one frame.
// Page reads (Cmds, off the UI goroutine in a program) run between frames
// and are not timed; folding their results in is. The fake serves the
// output as computed pages: nothing holds the million lines but the
// store stand-in's generator.
//
// Reported: p99-ms per frame (60 fps budget 16.7 ms, target ≤ 8 ms),
// peak-heap-MB (sampled), peak-rss-MB (VmHWM, whole test process) and
// window-lines (lines the view held at most).
func BenchmarkOutputView1M(b *testing.B) {
	const (
		perChunk   = 10
		initial    = 1_000_000 / perChunk // chunks
		rate       = 10_000               // lines/s
		fps        = 60
		cycle      = 600 // frames in one operator scenario (10 s)
		w, h       = 120, 40
		sampleHeap = 50
	)
	f := sessiontest.New(sessiontest.Options{})
	defer f.Close()
	if err := f.AddSession(session.Session{Name: "s", State: session.StateRunning}); err != nil {
		b.Fatal(err)
	}
	x := session.Execution{ID: "big", Session: "s", Argv: []string{"gen"}, State: session.ExecRunning, StartedAt: time.Now()}
	gen := sessiontest.Lines(x.ID, perChunk, 7, time.Now())
	if err := f.AddGenerated(x, initial, gen); err != nil {
		b.Fatal(err)
	}
	c := &common.Common{Ctx: b.Context(), Styles: common.NewStyles(true, colorprofile.TrueColor), Now: time.Now}
	m := New(c, f)
	m.SetSize(w, h)

	// Open: the tail page and the attach run before timing starts.
	pending := runAll(m.Open(x, nil))
	for len(pending) > 0 {
		var next []tea.Msg
		for _, msg := range pending {
			if _, ok := msg.(attachedMsg); ok {
				m.Update(msg) // the pump Cmd it returns is replaced by direct chunks below
				continue
			}
			next = append(next, runAll(m.Update(msg))...)
		}
		pending = next
	}
	if m.WindowLines() == 0 {
		b.Fatal("nothing loaded")
	}
	// The live chunks are fed directly below, so the pump is not re-armed.
	m.follower = nil

	seq := uint64(initial)
	linesPerFrame := float64(rate) / fps
	owed := 0.0
	frames := make([]time.Duration, 0, b.N)
	var peakHeap uint64
	var ms runtime.MemStats
	maxWindow := 0
	k := uitest.Key

	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		// Live chunks for this frame.
		owed += linesPerFrame
		var chunks []session.Chunk
		for owed >= perChunk {
			seq++
			chunks = append(chunks, gen(seq))
			owed -= perChunk
		}
		var key tea.Msg
		switch p := i % cycle; {
		case p >= 100 && p < 300:
			key = k("ctrl+u") // read back through old output
		case p == 300:
			key = k("g") // the very beginning (a page from seq 1)
		case p > 300 && p < 400:
			key = k("ctrl+d")
		case p == 400:
			key = k("w")
		case p > 400 && p < 450:
			key = k("j")
		case p == 450:
			key = k("w")
		case p == 500:
			key = k("G") // back to the end: tail reload, follow
		}

		start := time.Now()
		var cmds []tea.Cmd
		for _, msg := range pending {
			cmds = append(cmds, m.Update(msg))
		}
		cmds = append(cmds, m.Update(chunksMsg{gen: m.gen, chunks: chunks}))
		if key != nil {
			cmds = append(cmds, m.Update(key))
		}
		_ = m.View()
		frames = append(frames, time.Since(start))
		if d := frames[len(frames)-1]; d > 20*time.Millisecond && os.Getenv("BENCH_DEBUG") != "" {
			b.Logf("frame %d (cycle %d) took %v, key %v, pending %d, window %d", i, i%cycle, d, key, len(pending), m.WindowLines())
		}

		// Off the clock: what the program would run in Cmd goroutines.
		pending = pending[:0]
		for _, cmd := range cmds {
			for _, msg := range runAll(cmd) {
				if _, ok := msg.(chunksMsg); !ok { // the live pump: fed above
					pending = append(pending, msg)
				}
			}
		}
		maxWindow = max(maxWindow, m.WindowLines())
		if i%sampleHeap == 0 {
			runtime.ReadMemStats(&ms)
			peakHeap = max(peakHeap, ms.HeapInuse)
		}
	}
	b.StopTimer()
	runtime.ReadMemStats(&ms)
	peakHeap = max(peakHeap, ms.HeapInuse)
	report(b, frames)
	b.ReportMetric(float64(peakHeap)/(1<<20), "peak-heap-MB")
	b.ReportMetric(peakRSS(), "peak-rss-MB")
	b.ReportMetric(float64(maxWindow), "window-lines")
	if maxWindow > maxLines+20_000 {
		b.Errorf("window grew to %d lines", maxWindow)
	}
}

// runAll runs a Cmd and its batches synchronously, skipping Cmds that
// block (the live pump waits for chunks that this benchmark feeds
// directly, so it is never run).
func runAll(cmd tea.Cmd) []tea.Msg {
	if cmd == nil {
		return nil
	}
	return uitest.Run(cmd, 50*time.Millisecond)
}

func report(b *testing.B, frames []time.Duration) {
	if len(frames) == 0 {
		return
	}
	s := slices.Clone(frames)
	slices.Sort(s)
	p := func(q float64) float64 {
		return float64(s[min(len(s)-1, int(q*float64(len(s))))].Microseconds()) / 1000
	}
	b.ReportMetric(p(0.99), "p99-ms")
	b.ReportMetric(p(0.50), "p50-ms")
	b.ReportMetric(float64(s[len(s)-1].Microseconds())/1000, "max-ms")
}

// peakRSS returns the process's peak resident set (VmHWM) in MB, or 0
// where /proc is not available.
func peakRSS() float64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")))
			return float64(kb) / 1024
		}
	}
	return 0
}

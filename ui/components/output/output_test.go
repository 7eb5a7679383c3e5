package output

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/colorprofile"
	"github.com/charmbracelet/x/ansi"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/sessiontest"
	"github.com/berthvm/berth/ui/common"
	"github.com/berthvm/berth/ui/internal/uitest"
)

var keys uitest.Coverage

func TestMain(m *testing.M) {
	uitest.Main(m, &keys, map[string]any{"output.KeyMap": DefaultKeyMap()})
}

var t0 = time.Date(2026, 3, 14, 15, 0, 0, 0, time.UTC)

type env struct {
	t *testing.T
	f *sessiontest.Fake
	m *Model
	d *uitest.Driver
}

// newEnv returns an Output view (w x h) over a fake with one session.
func newEnv(t *testing.T, w, h int) *env {
	t.Helper()
	f := sessiontest.New(sessiontest.Options{Now: func() time.Time { return t0 }})
	t.Cleanup(func() { f.Close() })
	if err := f.AddSession(session.Session{Name: "s", State: session.StateRunning}); err != nil {
		t.Fatal(err)
	}
	c := &common.Common{Ctx: t.Context(), Styles: common.NewStyles(true, colorprofile.Ascii), Now: func() time.Time { return t0 }}
	m := New(c, f)
	m.SetSize(w, h)
	d := uitest.NewDriver(&uitest.Component{C: m})
	d.Quiet = 5 * time.Millisecond
	t.Cleanup(d.Close)
	return &env{t: t, f: f, m: m, d: d}
}

func (e *env) press(names ...string) {
	for _, n := range names {
		e.d.Send(keys.Key(n))
	}
}

func (e *env) open(x session.Execution) {
	e.t.Helper()
	e.d.Exec(e.m.Open(x, nil))
	if !e.d.WaitFor(func() bool { return !e.m.loading }, 3*time.Second) {
		e.t.Fatal("output did not load")
	}
}

// rows returns the text rows on screen (without header and status bar),
// as plain text without the gutter.
func (e *env) rows() []string {
	lines := strings.Split(ansi.Strip(e.m.View()), "\n")
	var out []string
	for _, l := range lines[1 : len(lines)-1] {
		out = append(out, strings.TrimRight(l[min(len(l), gutterBytes(l)):], " "))
	}
	return out
}

// gutterBytes is the byte length of the 2-cell gutter of a plain row.
func gutterBytes(l string) int {
	n, w := 0, 0
	for _, r := range l {
		if w == gutterWidth {
			break
		}
		n += len(string(r))
		w++
	}
	return n
}

func (e *env) grow(id string, n uint64) {
	e.t.Helper()
	if err := e.f.Grow(id, n); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) add(x session.Execution, chunks ...session.Chunk) {
	e.t.Helper()
	if err := e.f.AddExecution(x, chunks...); err != nil {
		e.t.Fatal(err)
	}
}

func generated(e *env, id string, chunks uint64, perChunk int, st session.ExecState) session.Execution {
	x := session.Execution{ID: id, Session: "s", Argv: []string{"gen"}, State: st, StartedAt: t0}
	if err := e.f.AddGenerated(x, chunks, sessiontest.Lines(id, perChunk, 7, t0)); err != nil {
		e.t.Fatal(err)
	}
	return x
}

func TestWindowJoinsPartialLinesAndSplitEscapes(t *testing.T) {
	var w window
	w.reset(1)
	for i, d := range []string{"hel", "lo\nwor", "ld\nabc\x1b[3", "1mred\x1b[0m\n", "10%\r", "20%\r100%\n"} {
		w.appendChunk(&session.Chunk{Seq: uint64(i + 1), Stream: session.Stdout, Data: []byte(d)})
	}
	// The colour split across chunks is kept whole.
	want := []string{"hello", "world", "abc\x1b[31mred\x1b[0m", "100%"}
	if len(w.lines) != len(want) {
		t.Fatalf("lines %d: %+v", len(w.lines), w.lines)
	}
	for i, l := range w.lines {
		if l.text != want[i] {
			t.Errorf("line %d = %q, want %q", i, l.text, want[i])
		}
	}
	if w.lines[0].seq != 1 || w.lines[0].endSeq != 2 || w.lo != 1 || w.next != 7 {
		t.Fatalf("seqs: %+v lo %d next %d", w.lines[0], w.lo, w.next)
	}
	// Interleaved streams do not join.
	w.appendChunk(&session.Chunk{Seq: 7, Stream: session.Stdout, Data: []byte("out")})
	w.appendChunk(&session.Chunk{Seq: 8, Stream: session.Stderr, Data: []byte("err\n")})
	if n := len(w.lines); w.lines[n-2].text != "out" || w.lines[n-1].text != "err" {
		t.Fatalf("interleaved: %+v", w.lines[n-2:])
	}
}

func TestWindowPrependAndTrimKeepChunkBoundaries(t *testing.T) {
	var w window
	gen := sessiontest.Lines("x", 3, 0, t0)
	w.reset(11)
	for s := uint64(11); s <= 20; s++ {
		c := gen(s)
		w.appendChunk(&c)
	}
	var before []session.Chunk
	for s := uint64(1); s <= 10; s++ {
		before = append(before, gen(s))
	}
	if n := w.prepend(before, true, 0); n != 30 || len(w.lines) != 60 || w.lo != 1 || !w.atStart {
		t.Fatalf("prepend: n %d lines %d lo %d", n, len(w.lines), w.lo)
	}
	if d := w.trimFront(4); d != 6 || w.lo != 3 || w.lines[0].text != sessiontest.LineText(6) {
		t.Fatalf("trimFront: dropped %d lo %d first %q", d, w.lo, w.lines[0].text)
	}
	if d := w.trimBack(2); d != 3 || w.next != 20 || w.lines[len(w.lines)-1].text != sessiontest.LineText(56) {
		t.Fatalf("trimBack: dropped %d next %d last %q", d, w.next, w.lines[len(w.lines)-1].text)
	}
	// A partial line split by the page boundary is joined on prepend.
	var p window
	p.reset(2)
	p.appendChunk(&session.Chunk{Seq: 2, Stream: session.Stdout, Data: []byte("world\n")})
	p.prepend([]session.Chunk{{Seq: 1, Stream: session.Stdout, Data: []byte("hello ")}}, true, 0)
	if len(p.lines) != 1 || p.lines[0].text != "hello world" {
		t.Fatalf("join on prepend: %+v", p.lines)
	}
}

func TestLastSeqProbe(t *testing.T) {
	e := newEnv(t, 80, 20)
	for _, n := range []uint64{0, 1, 2, 3, 17, 1000, 10007} {
		x := generated(e, "g"+itoa(n), n, 1, session.ExecExited)
		got, err := lastSeq(t.Context(), e.f, x.ID)
		if err != nil || got != n {
			t.Errorf("lastSeq(%d chunks) = %d, %v", n, got, err)
		}
	}
}

func itoa(n uint64) string { return strings.TrimSpace(strings.Repeat(" ", 0) + fmtU(n)) }

func fmtU(n uint64) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

func TestOpensAtTheEndAndScrollsBackThroughPages(t *testing.T) {
	e := newEnv(t, 80, 22)                                   // 20 text rows
	x := generated(e, "big", 10_000, 10, session.ExecExited) // 100,000 lines
	e.open(x)
	rows := e.rows()
	if last := rows[len(rows)-1]; last != sessiontest.LineText(99_999) {
		t.Fatalf("last row %q", last)
	}
	// Scroll up 5,000 rows in half pages; pages load as needed and the
	// rows stay contiguous.
	for range 500 {
		e.press("ctrl+u")
	}
	e.d.Settle()
	if got, want := e.rows()[0], sessiontest.LineText(99_980-5_000); got != want {
		t.Fatalf("after scrolling up: top %q, want %q", got, want)
	}
	if n := e.m.WindowLines(); n > maxLines {
		t.Fatalf("window holds %d lines", n)
	}
	if e.m.Following() {
		t.Fatal("still following after scrolling up")
	}
	// g goes to the very top, G back to the end.
	e.press("g")
	if got := e.rows()[0]; got != sessiontest.LineText(0) {
		t.Fatalf("top %q", got)
	}
	e.press("j", "down", "ctrl+d", "pgdown", "k", "up", "pgup", "home")
	if got := e.rows()[0]; got != sessiontest.LineText(0) {
		t.Fatalf("top after nav %q", got)
	}
	e.press("G")
	if rows := e.rows(); rows[len(rows)-1] != sessiontest.LineText(99_999) || !e.m.Following() {
		t.Fatalf("G: last row %q following %v", rows[len(rows)-1], e.m.Following())
	}
	e.press("end")
}

func TestFollowPausesOnScrollAndCountsNewLines(t *testing.T) {
	e := newEnv(t, 80, 12)
	x := generated(e, "live", 50, 2, session.ExecRunning)
	e.open(x)
	if !e.d.WaitFor(func() bool { return e.m.live }, time.Second) {
		t.Fatal("not attached")
	}
	e.grow(x.ID, 5)
	if !e.d.WaitFor(func() bool { return e.rows()[len(e.rows())-1] == sessiontest.LineText(109) }, 2*time.Second) {
		t.Fatalf("did not follow: %q", e.rows())
	}
	e.press("k")
	if e.m.Following() {
		t.Fatal("scrolling up did not pause following")
	}
	top := e.rows()[0]
	e.grow(x.ID, 3)
	if !e.d.WaitFor(func() bool { return e.m.NewLines() == 6 }, 2*time.Second) {
		t.Fatalf("new lines %d", e.m.NewLines())
	}
	if e.rows()[0] != top {
		t.Fatal("view moved while paused")
	}
	if !strings.Contains(ansi.Strip(e.m.View()), "6 new lines · G") {
		t.Fatalf("no badge:\n%s", ansi.Strip(e.m.View()))
	}
	e.press("G")
	if !e.m.Following() || e.m.NewLines() != 0 || e.rows()[len(e.rows())-1] != sessiontest.LineText(115) {
		t.Fatalf("G: following %v new %d last %q", e.m.Following(), e.m.NewLines(), e.rows()[len(e.rows())-1])
	}
	// Scrolling back down to the end resumes following too.
	e.press("k", "j")
	if !e.m.Following() {
		t.Fatal("reaching the end did not resume following")
	}
	e.d.Send(tea.MouseWheelMsg{Button: tea.MouseWheelUp})
	if e.m.Following() {
		t.Fatal("wheel up did not pause")
	}
	e.d.Send(tea.MouseWheelMsg{Button: tea.MouseWheelDown})
	if !e.m.Following() {
		t.Fatal("wheel down to the end did not resume")
	}
}

func TestStreamsWrapTimestamps(t *testing.T) {
	e := newEnv(t, 40, 12)
	x := session.Execution{ID: "w", Session: "s", State: session.ExecExited, StartedAt: t0}
	e.add(x,
		session.Chunk{Stream: session.Stdout, Time: t0, Data: []byte("out one\n")},
		session.Chunk{Stream: session.Stderr, Time: t0.Add(time.Second), Data: []byte("err one\n")},
		session.Chunk{Stream: session.Stdout, Time: t0.Add(2 * time.Second), Data: []byte(strings.Repeat("abcdefghij", 8) + "\n")},
	)
	e.open(x)
	if got := len(e.rows()); got != 10 {
		t.Fatalf("rows %d", got)
	}
	if r := e.rows(); r[2] != "out one" && r[0] != "out one" {
		t.Fatalf("rows %q", r)
	}
	e.press("s")
	if e.m.Streams() != StdoutOnly || strings.Contains(strings.Join(e.rows(), "\n"), "err one") {
		t.Fatalf("stdout only: %q", e.rows())
	}
	e.press("s")
	if e.m.Streams() != StderrOnly || strings.Contains(strings.Join(e.rows(), "\n"), "out one") {
		t.Fatalf("stderr only: %q", e.rows())
	}
	e.press("s", "w")
	if !e.m.Wrap() {
		t.Fatal("w did not wrap")
	}
	joined := strings.Join(e.rows(), "")
	if !strings.Contains(joined, strings.Repeat("abcdefghij", 8)) {
		t.Fatalf("wrapped rows lost text: %q", e.rows())
	}
	e.press("t")
	if !e.m.Timestamps() || !strings.Contains(strings.Join(e.rows(), "\n"), "15:00:01.000 err one") {
		t.Fatalf("timestamps: %q", e.rows())
	}
}

func TestSearchInWindowAndInStore(t *testing.T) {
	e := newEnv(t, 80, 22)
	x := generated(e, "s", 10_000, 10, session.ExecExited)
	e.open(x)
	e.press("/")
	e.d.Send(toMsgs(uitest.Type("line 0099990"))...)
	e.press("enter")
	if l, ok := e.m.Match(); !ok || e.m.win.lines[l].text != sessiontest.LineText(99_990) {
		t.Fatalf("match %d %v", l, ok)
	}
	// Far outside the window: found by scanning the store.
	e.press("/")
	e.d.Send(toMsgs(uitest.Type("line 0000042"))...)
	e.press("enter")
	if !e.d.WaitFor(func() bool {
		l, ok := e.m.Match()
		return ok && e.m.win.lines[l].text == sessiontest.LineText(42)
	}, 3*time.Second) {
		t.Fatalf("store search did not land: %q", e.m.status)
	}
	if !strings.Contains(strings.Join(e.rows(), "\n"), sessiontest.LineText(42)) {
		t.Fatal("match not on screen")
	}
	// N finds no other occurrence above, wraps around from the end and
	// lands on the same, only, match.
	e.press("N")
	if !e.d.WaitFor(func() bool {
		l, ok := e.m.Match()
		return ok && e.m.win.lines[l].text == sessiontest.LineText(42) && strings.Contains(e.m.status, "search hit the top")
	}, 3*time.Second) {
		t.Fatalf("N: %q", e.m.status)
	}
	e.m.SetQuery("no such text")
	e.press("n")
	if !e.d.WaitFor(func() bool { return e.m.status == "no match" }, 3*time.Second) {
		t.Fatalf("n without matches: %q", e.m.status)
	}
	e.m.SetQuery("fox")
	e.press("n")
	l1, _ := e.m.Match()
	e.press("n")
	l2, _ := e.m.Match()
	e.press("N")
	l3, _ := e.m.Match()
	if l2 != l1+1 || l3 != l1 {
		t.Fatalf("n/N: %d %d %d", l1, l2, l3)
	}
	e.press("esc")
	if e.m.Query() != "" {
		t.Fatal("esc did not clear the search")
	}
	e.press("/")
	e.d.Send(toMsgs(uitest.Type("abc"))...)
	e.press("esc")
	if e.m.searching || e.m.Query() != "" {
		t.Fatal("esc did not cancel typing a search")
	}
}

func toMsgs(ks []tea.KeyPressMsg) []tea.Msg {
	out := make([]tea.Msg, len(ks))
	for i, k := range ks {
		out[i] = k
	}
	return out
}

func TestHostileOutputCannotBreakTheLayout(t *testing.T) {
	e := newEnv(t, 60, 10)
	x := session.Execution{ID: "evil", Session: "s", State: session.ExecExited, StartedAt: t0}
	e.add(x, session.Chunk{Stream: session.Stdout, Data: []byte(
		"\x1b[2J\x1b[H\x1b]0;pwned\x07\x1b[?1049lclear\n" +
			"tab\there\x07bell\x00nul\n" +
			"\x1bP+q544e\x1b\\dcs gone\n" +
			"wide: 日本語日本語日本語日本語日本語日本語日本語日本語日本語日本語日本語日本語\n" +
			"\xff\xfeinvalid\n" +
			"\u202eevil bidi\n" +
			strings.Repeat("x", 100_000) + "\n")})
	e.open(x)
	v := e.m.View()
	for _, bad := range []string{"\x1b]", "\x1b[2J", "\x1b[H", "\x1b[?1049", "\x1bP", "\x07", "\x00", "\u202e"} {
		if strings.Contains(v, bad) {
			t.Errorf("view contains %q", bad)
		}
	}
	lines := strings.Split(v, "\n")
	if len(lines) != 10 {
		t.Fatalf("%d lines", len(lines))
	}
	for i, l := range lines {
		if w := ansi.StringWidth(l); w != 60 {
			t.Errorf("line %d width %d: %q", i, w, ansi.Strip(l))
		}
	}
	p := ansi.Strip(v)
	for _, want := range []string{"clear", "tab     here␇bell␀nul", "dcs gone", "\ufffd\ufffdinvalid", "evil bidi"} {
		if !strings.Contains(p, want) {
			t.Errorf("missing %q in\n%s", want, p)
		}
	}
}

func TestOwnedProcessIsDrainedWhenAbandoned(t *testing.T) {
	e := newEnv(t, 60, 10)
	hold := make(chan struct{})
	e.f.Handle("x", func(ctx context.Context, p *sessiontest.Proc) (int, error) {
		for i := range 100 {
			io.WriteString(p.Stdout, "chunk "+itoa(uint64(i))+"\n")
		}
		select {
		case <-hold:
		case <-ctx.Done():
		}
		return 0, nil
	})
	p, err := e.f.Exec(context.Background(), "s", session.ExecRequest{Argv: []string{"x"}})
	if err != nil {
		t.Fatal(err)
	}
	e.d.Exec(e.m.Open(session.Execution{ID: p.ID(), Session: "s", State: session.ExecRunning, StartedAt: t0}, p))
	if !e.d.WaitFor(func() bool { return e.m.WindowLines() == 100 }, 2*time.Second) {
		t.Fatalf("lines %d", e.m.WindowLines())
	}
	cmd := e.m.Close()
	if cmd == nil {
		t.Fatal("Close returned no drain")
	}
	done := make(chan tea.Msg)
	go func() { done <- cmd() }()
	close(hold)
	select {
	case msg := <-done:
		if _, ok := msg.(drainedMsg); !ok {
			t.Fatalf("drain returned %T", msg)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("drain did not end with the execution")
	}
}

package output

import (
	"regexp"
	"strings"
	"testing"

	"github.com/charmbracelet/colorprofile"
	"github.com/charmbracelet/x/ansi"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/ui/common"
)

var sgrRE = regexp.MustCompile(`\x1b\[[0-9;:]*m`)

// openAtEnd reports whether s leaves a style set: its last SGR sequence
// is not a full reset.
func openAtEnd(s string) bool {
	all := sgrRE.FindAllString(s, -1)
	if len(all) == 0 {
		return false
	}
	last := all[len(all)-1]
	return strings.Trim(last[2:len(last)-1], "0") != ""
}

// insideSequence reports whether byte offset o of s falls inside an
// escape sequence (after its ESC, up to its final byte).
func insideSequence(s string, o int) bool {
	for _, loc := range sgrRE.FindAllStringIndex(s, -1) {
		if o > loc[0] && o < loc[1] {
			return true
		}
	}
	return false
}

func TestWrapAndCutIgnoreEscapes(t *testing.T) {
	red, green, reset := "\x1b[31m", "\x1b[38:2::0:200:0m", "\x1b[0m"
	for _, c := range []struct {
		name  string
		text  string
		width int
		rows  []string // the rows' visible text
	}{
		{"plain", "abcdefghij", 4, []string{"abcd", "efgh", "ij"}},
		{"colour at a boundary", "abcd" + red + "efgh" + reset + "ij", 4, []string{"abcd", "efgh", "ij"}},
		{"colour inside a row", "ab" + red + "cdef" + green + "gh" + reset + "ij", 4, []string{"abcd", "efgh", "ij"}},
		{"many sequences", strings.Repeat(red+"x"+reset, 10), 3, []string{"xxx", "xxx", "xxx", "x"}},
		{"wide", red + "日本語" + reset + "ab", 4, []string{"日本", "語ab"}},
		{"wide at edge", "a" + red + "日本" + reset, 4, []string{"a日", "本"}},
		{"fits", red + "abcd" + reset, 4, []string{"abcd"}},
		{"escape at end", "abcd" + reset, 4, []string{"abcd"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if w := ansi.StringWidth(c.text); w != ansi.StringWidth(ansi.Strip(c.text)) {
				t.Fatalf("width %d counts escapes", w)
			}
			offs := wrapOffsets(c.text, c.width)
			var rows []string
			for i, o := range offs {
				if insideSequence(c.text, o) {
					t.Fatalf("row %d starts inside a sequence: %d in %q", i, o, c.text)
				}
				end := len(c.text)
				if i+1 < len(offs) {
					end = offs[i+1]
				}
				rows = append(rows, ansi.Strip(c.text[o:end]))
			}
			if strings.Join(rows, "|") != strings.Join(c.rows, "|") {
				t.Fatalf("rows %q, want %q", rows, c.rows)
			}
			// Cutting at each width ends on a character, never in a sequence.
			for w := 0; w <= ansi.StringWidth(c.text); w++ {
				n := cutWidth(c.text, w)
				if insideSequence(c.text, n) {
					t.Fatalf("cut at width %d inside a sequence: %d", w, n)
				}
				if got := ansi.StringWidth(c.text[:n]); got > w || got < w-1 {
					t.Fatalf("cut at width %d has width %d", w, got)
				}
			}
		})
	}
}

func TestColouredOutputRows(t *testing.T) {
	e := newEnv(t, 30, 12) // 28 text columns
	// Colours as the renderer would get them; the view must not depend on
	// lipgloss emitting any itself for this test.
	x := session.Execution{ID: "c", Session: "s", State: session.ExecExited, StartedAt: t0}
	long := strings.Repeat("r", 40)
	e.add(x,
		session.Chunk{Stream: session.Stdout, Time: t0, Data: []byte(
			"\x1b[32mok\x1b[0m plain\n" +
				"\x1b[1;31m" + long + "\x1b[0m tail\n" + // wraps: red on both rows
				"\x1b[41mbleed\n" + // never reset by the command
				"\x1b]8;;http://x\x1b\\\x1b[2J\x1b[34mlink\x1b[0m\n")},
	)
	e.open(x)
	check := func(what string) []string {
		t.Helper()
		v := e.m.View()
		lines := strings.Split(v, "\n")
		for i, l := range lines {
			if openAtEnd(l) {
				t.Fatalf("%s: row %d leaves a style set: %q", what, i, l)
			}
			if w := ansi.StringWidth(l); w != 30 {
				t.Fatalf("%s: row %d width %d: %q", what, i, w, l)
			}
		}
		for _, bad := range []string{"\x1b]", "\x1b[2J"} {
			if strings.Contains(v, bad) {
				t.Fatalf("%s: view contains %q", what, bad)
			}
		}
		return lines[1 : len(lines)-1]
	}
	rows := check("cut")
	if !strings.Contains(rows[0], "\x1b[32mok\x1b[0m plain") {
		t.Fatalf("green lost: %q", rows[0])
	}
	// Cut with an ellipsis: the colour ends before it.
	if !strings.Contains(rows[1], "\x1b[1;31m"+long[:27]) || !strings.HasSuffix(ansi.Strip(rows[1]), long[:27]+"…") {
		t.Fatalf("cut row %q", rows[1])
	}
	if !strings.Contains(rows[2], "\x1b[41mbleed") || !strings.Contains(rows[3], "\x1b[34mlink") {
		t.Fatalf("rows %q", rows[2:4])
	}
	e.press("w")
	rows = check("wrapped")
	if ansi.Strip(rows[1]) != "  "+long[:28] || strings.TrimRight(ansi.Strip(rows[2]), " ") != "  "+long[28:]+" tail" {
		t.Fatalf("wrapped rows %q", rows[1:3])
	}
	// The second row starts in the colour the first ended in.
	if !strings.HasPrefix(rows[2], "  \x1b[1;31m"+long[28:]) {
		t.Fatalf("wrapped row lost its colour: %q", rows[2])
	}
	e.press("t")
	check("timestamps")
}

func TestColouredStderrKeepsItsStyle(t *testing.T) {
	e := newEnv(t, 40, 6)
	e.m.c.Styles = common.NewStyles(true, colorprofile.ANSI256)
	x := session.Execution{ID: "c", Session: "s", State: session.ExecExited, StartedAt: t0}
	e.add(x, session.Chunk{Stream: session.Stderr, Time: t0, Data: []byte("\x1b[1mfile.go:3\x1b[0m: boom\n")})
	e.open(x)
	open := styleOpen(e.m.c.Styles.Stderr)
	if open == "" {
		t.Fatal("stderr style has no colour")
	}
	row := strings.Split(e.m.View(), "\n")[1]
	// The stream's colour, the line's bold, and the stream's colour again
	// after the line's reset.
	if !strings.Contains(row, open+"\x1b[1mfile.go:3\x1b[0m"+open+": boom"+common.SGRReset) || openAtEnd(row) {
		t.Fatalf("row %q", row)
	}
}

func TestSearchMatchesTextAcrossColours(t *testing.T) {
	e := newEnv(t, 40, 8)
	x := session.Execution{ID: "c", Session: "s", State: session.ExecExited, StartedAt: t0}
	e.add(x, session.Chunk{Stream: session.Stdout, Time: t0, Data: []byte(
		"first\n" +
			"--- \x1b[32mPA\x1b[1mSS\x1b[0m: TestParse\n" +
			"\x1b[31m--- FAIL\x1b[0m: TestFlush\n")})
	e.open(x)
	e.m.SetQuery("pass: test")
	e.press("n")
	l, ok := e.m.Match()
	if !ok || l != 1 {
		t.Fatalf("match %d %v: %q", l, ok, e.m.status)
	}
	rows := strings.Split(e.m.View(), "\n")
	// The matched line is shown without its own colours, with the match
	// highlighted; the other lines keep theirs.
	if strings.Contains(rows[2], "\x1b[32m") || ansi.Strip(rows[2]) != "  --- PASS: TestParse"+strings.Repeat(" ", 19) {
		t.Fatalf("matched row %q", rows[2])
	}
	if !strings.Contains(rows[3], "\x1b[31m--- FAIL") {
		t.Fatalf("unmatched row lost its colour: %q", rows[3])
	}
	// A match cannot begin inside an escape sequence.
	e.m.SetQuery("32m")
	e.press("n")
	if _, ok := e.m.Match(); ok {
		t.Fatal("matched the bytes of an escape sequence")
	}
}

func TestStoreScanMatchesTextAcrossColours(t *testing.T) {
	e := newEnv(t, 40, 8)
	x := session.Execution{ID: "c", Session: "s", State: session.ExecExited, StartedAt: t0}
	e.add(x,
		session.Chunk{Stream: session.Stdout, Time: t0, Data: []byte("nothing here\n")},
		session.Chunk{Stream: session.Stdout, Time: t0, Data: []byte("--- \x1b[32mPA\x1b[1mSS\x1b[0m\n")},
	)
	for _, c := range []struct {
		needle string
		fold   bool
		seq    uint64
		found  bool
	}{{"PASS", false, 2, true}, {"pass", true, 2, true}, {"32m", false, 0, false}} {
		for _, dir := range []int{1, -1} {
			from := uint64(1)
			if dir < 0 {
				from = 2
			}
			seq, ok, err := scan(t.Context(), e.f, x.ID, from, dir, []byte(c.needle), c.fold)
			if err != nil || ok != c.found || seq != c.seq {
				t.Errorf("scan %q dir %d: %d %v %v", c.needle, dir, seq, ok, err)
			}
		}
	}
}

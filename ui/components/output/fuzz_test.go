package output

import (
	"bytes"
	"testing"
	"unicode/utf8"

	"github.com/charmbracelet/x/ansi"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/ui/common"
)

// FuzzOutputWindow feeds arbitrary command output to the Output tab's
// window, cut into chunks at arbitrary points and, for some, alternating
// between stdout and stderr. Property: every line it holds keeps the
// sanitiser's policy (valid UTF-8, no control characters, no C1, no
// bidi controls, bounded length), its width is what it shows, its bytes
// add up; and for one stream, how the output was cut into chunks does
// not change the lines (an escape sequence or "\r" split across chunks
// is handled as one): they are those of the output sanitised line by
// line.
func FuzzOutputWindow(f *testing.F) {
	f.Add([]byte("hello\nworld\n"), []byte{3}, false)
	f.Add([]byte("\x1b[31mred\x1b[0m\n10%\r20%\r30%\n"), []byte{2, 1, 5}, false)
	f.Add([]byte("\x1b]0;title\x07after\n\u009b31mx\n"), []byte{1, 1, 1, 1}, true)
	f.Add([]byte("a\tb\bc\xff\xfe\u202eevil\n"), []byte{7}, false)
	f.Add([]byte("no newline at the end\x1b["), []byte{4, 9}, true)
	f.Fuzz(func(t *testing.T, data, cuts []byte, mixed bool) {
		if len(data) > 4*common.MaxLineBytes {
			return
		}
		var w window
		w.reset(1)
		seq := uint64(1)
		rest := data
		for i := 0; len(rest) > 0; i++ {
			n := len(rest)
			if i < len(cuts) && int(cuts[i]) < n {
				n = max(1, int(cuts[i]))
			}
			st := session.Stdout
			if mixed && i%2 == 1 {
				st = session.Stderr
			}
			w.appendChunk(&session.Chunk{Seq: seq, Stream: st, Data: rest[:n]})
			rest = rest[n:]
			seq++
		}
		total := 0
		for i, l := range w.lines {
			checkLine(t, data, l.text)
			if int(l.width) != ansi.StringWidth(l.text) {
				t.Fatalf("line %d %q: width %d, shows %d", i, l.text, l.width, ansi.StringWidth(l.text))
			}
			if l.seq > l.endSeq || (i > 0 && l.seq < w.lines[i-1].endSeq) {
				t.Fatalf("line %d spans chunks %d..%d after one ending at %d", i, l.seq, l.endSeq, w.lines[i-1].endSeq)
			}
			total += len(l.text)
		}
		if total != w.bytes {
			t.Fatalf("lines hold %d bytes, window counts %d", total, w.bytes)
		}
		if mixed {
			return
		}
		// One stream: the lines are those of the whole output.
		pieces := bytes.Split(data, []byte("\n"))
		if len(pieces[len(pieces)-1]) == 0 {
			pieces = pieces[:len(pieces)-1]
		}
		if len(pieces) != len(w.lines) {
			t.Fatalf("%d lines from %q cut at %v, want %d", len(w.lines), data, cuts, len(pieces))
		}
		for i, p := range pieces {
			if len(p) > common.MaxLineBytes {
				continue // a long partial line is kept from a bounded tail
			}
			if want := common.SanitizeLine(string(p)); ansi.Strip(w.lines[i].text) != want {
				t.Fatalf("line %d of %q cut at %v is %q, want %q", i, data, cuts, w.lines[i].text, want)
			}
		}
	})
}

func checkLine(t *testing.T, in []byte, s string) {
	t.Helper()
	if !utf8.ValidString(s) {
		t.Fatalf("line %q of %q: invalid UTF-8", s, in)
	}
	// Colours (SGR) are kept; nothing else that escapes is.
	for i := 0; i < len(s); i++ {
		if s[i] != 0x1b {
			continue
		}
		j := i + 2
		for j < len(s) && (s[j] >= '0' && s[j] <= '9' || s[j] == ';' || s[j] == ':') {
			j++
		}
		if i+1 >= len(s) || s[i+1] != '[' || j >= len(s) || s[j] != 'm' {
			t.Fatalf("line %q of %q holds an escape that is no colour at %d", s, in, i)
		}
	}
	for _, r := range ansi.Strip(s) {
		if r < 0x20 || r == 0x7f || r >= 0x80 && r <= 0x9f || r >= 0x202a && r <= 0x202e || r >= 0x2066 && r <= 0x2069 {
			t.Fatalf("line %q of %q holds control %#x", s, in, r)
		}
	}
	if len(s) > common.MaxLineBytes+64 {
		t.Fatalf("line of %d bytes from %q", len(s), in)
	}
}

package uitest

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Golden compares got with testdata/<name>.golden, rewriting the file when
// update is set. Trailing spaces are trimmed per line (views pad lines to
// the full width, editors strip them) and escape characters are shown as
// ␛ so colour goldens read in a diff.
func Golden(t *testing.T, name, got string, update bool) {
	t.Helper()
	got = normalize(got)
	path := filepath.Join("testdata", name+".golden")
	if update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if string(want) != got {
		t.Errorf("%s differs (run with -update to accept):\n%s", path, diff(string(want), got))
	}
}

func normalize(s string) string {
	s = strings.ReplaceAll(s, "\x1b", "␛")
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimRight(l, " ")
	}
	return strings.Join(lines, "\n") + "\n"
}

// diff is a minimal line diff: it shows the differing lines with their
// numbers, enough to review a changed screen.
func diff(want, got string) string {
	wl, gl := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for i := 0; i < max(len(wl), len(gl)); i++ {
		var w, g string
		if i < len(wl) {
			w = wl[i]
		}
		if i < len(gl) {
			g = gl[i]
		}
		if w != g {
			b.WriteString("  line " + itoa(i+1) + "\n    want: " + w + "\n    got:  " + g + "\n")
		}
	}
	return b.String()
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var d []byte
	for ; n > 0; n /= 10 {
		d = append([]byte{byte('0' + n%10)}, d...)
	}
	return string(d)
}

// Main is a UI package's TestMain: it runs the tests, then fails them when
// a binding of any key map was never pressed (unless -run selected a
// subset of tests).
func Main(m *testing.M, c *Coverage, keymaps map[string]any) {
	flag.Parse()
	code := m.Run()
	if code == 0 {
		code = checkCoverage(c, flag.Lookup("test.run").Value.String(), keymaps)
	}
	os.Exit(code)
}

func checkCoverage(c *Coverage, run string, keymaps map[string]any) int {
	if run != "" {
		return 0
	}
	code := 0
	for name, km := range keymaps {
		if missing := c.Missing(km); len(missing) > 0 {
			os.Stderr.WriteString("FAIL: keys in " + name + " that no test presses: " + strings.Join(missing, ", ") + "\n")
			code = 1
		}
	}
	return code
}

package app

import (
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestDoctor: one line per check, three columns each, and the last line
// ends like the others.
func TestDoctor(t *testing.T) {
	code, out, errb := run(t, t.TempDir(), "", "doctor")
	if code != 0 || errb != "" {
		t.Fatalf("berth doctor: exit %d, stderr %q", code, errb)
	}
	if !strings.HasSuffix(out, "\n") {
		t.Errorf("the output does not end with a newline: %q", out)
	}
	line := regexp.MustCompile(`^(\S+(?: \S+)?) +(yes|no)  `)
	var names []string
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		m := line.FindStringSubmatch(l)
		if m == nil {
			t.Errorf("line %q is not: check, yes or no, detail", l)
			continue
		}
		names = append(names, m[1])
	}
	want := []string{"qemu", "image mini", "kvm", "tcg", "cloud-hypervisor", "mkfs.ext4", "apt-get", "dpkg-deb", "berth-agent", "daemon", "data directory"}
	if !slices.Equal(names, want) {
		t.Errorf("checks %q, want %q", names, want)
	}
}

// TestVersion: berth version and berth --version print the same line.
func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}, {"--data", "x", "version"}} {
		if code, out, errb := run(t, t.TempDir(), "", args...); code != 0 || out != "berth test\n" || errb != "" {
			t.Errorf("berth %q: exit %d, stdout %q, stderr %q; want 0, %q", args, code, out, errb, "berth test\n")
		}
	}
}

// TestTUINeedsTerminal: without a command and without a terminal, berth
// says what to do instead of starting the TUI (or a daemon).
func TestTUINeedsTerminal(t *testing.T) {
	dir := t.TempDir()
	code, out, errb := run(t, dir, "")
	want := "berth: the terminal UI needs a terminal; use 'berth help' for the CLI\n"
	if code != 2 || out != "" || errb != want {
		t.Errorf("berth: exit %d, stdout %q, stderr %q; want 2, stderr %q", code, out, errb, want)
	}
}

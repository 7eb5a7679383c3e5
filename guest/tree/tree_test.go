package tree

import (
	"errors"
	"testing"
)

func TestLinkInside(t *testing.T) {
	for _, c := range []struct {
		entry, target string
		want          bool
	}{
		{"a/link", "b", true},
		{"a/link", "../b", true},
		{"a/b/link", "../../c", true},
		{"a/link", "../../c", false},
		{"link", "..", false},
		{"link", ".", true},
		{"link", "/etc/passwd", false},
		{"link", "", false},
		{"a/link", "x/../../../y", false},
		{"link", "a\x00b", false},
	} {
		if got := LinkInside(c.entry, c.target); got != c.want {
			t.Errorf("LinkInside(%q, %q) = %v, want %v", c.entry, c.target, got, c.want)
		}
	}
}

func TestEntryPath(t *testing.T) {
	for _, c := range []struct {
		name, want string
		escape     bool
	}{
		{"a/b", "a/b", false},
		{"./a//b/", "a/b", false},
		{".", ".", false},
		{"a/../b", "b", false},
		{"../a", "", true},
		{"a/../../b", "", true},
		{"/etc/passwd", "", true},
		{"a\x00", "", true},
	} {
		got, err := entryPath(c.name)
		if c.escape != errors.Is(err, ErrEscape) || (!c.escape && got != c.want) {
			t.Errorf("entryPath(%q) = %q, %v; want %q escape=%v", c.name, got, err, c.want, c.escape)
		}
	}
}

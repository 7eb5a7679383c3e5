package app

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// The log rotates past its size, keeps its last copies, and stays the
// process's stderr after each rotation (a SIGQUIT's dump lands in the
// current file).
func TestLogFileRotates(t *testing.T) {
	saved, err := syscall.Dup(2)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { syscall.Dup2(saved, 2); syscall.Close(saved) }()
	path := filepath.Join(t.TempDir(), "daemon.log")
	lf, err := openLogFile(path, 1000, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	for i := range 50 {
		fmt.Fprintf(lf, "line %02d %s\n", i, strings.Repeat("x", 90)) // 99 bytes: ten a file
	}
	os.Stderr.WriteString("from fd 2\n")
	cur, _ := os.ReadFile(path)
	one, _ := os.ReadFile(path + ".1")
	two, _ := os.ReadFile(path + ".2")
	if _, err := os.Stat(path + ".3"); err == nil {
		t.Error("a third old copy was kept")
	}
	if len(cur) > 1000+len("from fd 2\n") || len(one) != 990 || len(two) != 990 {
		t.Errorf("sizes %d, %d, %d", len(cur), len(one), len(two))
	}
	if !strings.HasPrefix(string(cur), "line 40") || !strings.HasSuffix(string(cur), "from fd 2\n") {
		t.Errorf("current log %q: want lines 40 on and what fd 2 got", cur)
	}
	if !strings.HasPrefix(string(one), "line 30") || !strings.HasPrefix(string(two), "line 20") {
		t.Errorf("old copies start %.8q and %.8q", one, two)
	}
}

// A log already past its size at start is rotated before the first line.
func TestLogFileRotatesAtOpen(t *testing.T) {
	saved, _ := syscall.Dup(2)
	defer func() { syscall.Dup2(saved, 2); syscall.Close(saved) }()
	path := filepath.Join(t.TempDir(), "daemon.log")
	os.WriteFile(path, []byte(strings.Repeat("o", 2000)), 0o644)
	lf, err := openLogFile(path, 1000, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	fmt.Fprintln(lf, "new")
	if b, _ := os.ReadFile(path); string(b) != "new\n" {
		t.Errorf("current log %q", b)
	}
	if b, _ := os.ReadFile(path + ".1"); len(b) != 2000 {
		t.Errorf("old log has %d bytes", len(b))
	}
}

package vmm

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestPidFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, PidFile)
	if err := WritePidFile(path, os.Getpid()); err != nil {
		t.Fatal(err)
	}
	if pid, err := ReadPidFile(path); err != nil || pid != os.Getpid() {
		t.Fatalf("ReadPidFile = %d, %v", pid, err)
	}
	st, _ := StartTime(os.Getpid())
	for content, want := range map[string]string{
		"":              "does not hold a pid",
		"abc 1":         "does not hold a pid",
		"1 5":           "does not hold a pid", // init is never a VMM
		"1 2 3":         "does not hold a pid",
		"4194300 12345": "", // a pid that is gone is returned as it is
	} {
		os.WriteFile(path, []byte(content), 0o644)
		_, err := ReadPidFile(path)
		if (err == nil) != (want == "") || (err != nil && !strings.Contains(err.Error(), want)) {
			t.Errorf("ReadPidFile(%q) = %v, want %q", content, err, want)
		}
	}
	os.WriteFile(path, []byte(strings.Join([]string{strconv.Itoa(os.Getpid()), st + "1"}, " ")), 0o644)
	if _, err := ReadPidFile(path); !errors.Is(err, ErrNotRunning) {
		t.Errorf("a reused pid: %v, want ErrNotRunning", err)
	}
}

package vmm

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
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

// KillStrays kills what works in a VM's directory, also once that
// directory is gone, and nothing working elsewhere.
func TestKillStrays(t *testing.T) {
	start := func(dir string) *exec.Cmd {
		c := exec.Command("sleep", "300")
		c.Dir = dir
		c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Process.Kill(); c.Wait() })
		return c
	}
	vmDir, gone, other := t.TempDir(), filepath.Join(t.TempDir(), "vm"), t.TempDir()
	os.Mkdir(gone, 0o755)
	stray, deleted, bystander := start(vmDir), start(gone), start(other)
	os.Remove(gone)
	for _, tt := range []struct {
		dir  string
		want *exec.Cmd
	}{{vmDir, stray}, {gone, deleted}} {
		if got := KillStrays(tt.dir); !slices.Equal(got, []int{tt.want.Process.Pid}) {
			t.Errorf("KillStrays(%s) = %v, want [%d]", tt.dir, got, tt.want.Process.Pid)
		}
		if err := tt.want.Wait(); err == nil {
			t.Errorf("the process in %s was not killed", tt.dir)
		}
	}
	if err := bystander.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("a process working elsewhere was killed: %v", err)
	}
	if got := KillStrays(vmDir); len(got) != 0 {
		t.Errorf("a second KillStrays found %v", got)
	}
}

package engine_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// buildVMs are the pids of the VMMs running in a template build's
// directory under data: templates/.KEY-N/vm.
func buildVMs(data string) []int {
	prefix, err := filepath.EvalSymlinks(filepath.Join(data, "templates"))
	if err != nil {
		return nil
	}
	var pids []int
	procs, _ := filepath.Glob("/proc/[0-9]*/cwd")
	for _, p := range procs {
		cwd, err := os.Readlink(p)
		if err != nil || !strings.HasPrefix(cwd, prefix+"/.") || filepath.Base(cwd) != "vm" {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p))); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// A daemon killed while it builds a template leaves the template's VM
// running (a VMM outlives its daemon, as sessions' VMs must); the next
// daemon kills it and removes the build.
func TestTemplateBuildLeftover(t *testing.T) {
	e, data := newImageEnv(t, true)
	create := e.Cmd("create", "t1")
	if err := create.Start(); err != nil {
		t.Fatal(err)
	}
	var pids []int
	for deadline := time.Now().Add(60 * time.Second); len(pids) == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no template build's VM within 60 s")
		}
		pids = buildVMs(data)
	}
	e.KillDaemon()
	create.Wait()
	time.Sleep(200 * time.Millisecond)
	for _, pid := range pids {
		if syscall.Kill(pid, 0) != nil {
			t.Fatalf("the build's VM (pid %d) ended with its daemon: nothing to check", pid)
		}
	}
	// The sweep leaves a build younger than 5 s to the builder it may
	// still have.
	time.Sleep(5 * time.Second)
	e.StartDaemon()
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); err == nil {
			// A zombie is dead, if not yet reaped by its parent (init).
			if st, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); !strings.Contains(string(st), ") Z ") {
				t.Errorf("the left build's VM (pid %d) still runs after the daemon started again", pid)
			}
		}
	}
	if left, _ := filepath.Glob(filepath.Join(data, "templates", ".*")); len(left) > 0 {
		t.Errorf("the left build's directory is still there: %v", left)
	}
	// And templates still work.
	e.OK("create", "t2")
	if s := e.Info("t2"); !strings.Contains(s.Cause, "restored from a template") {
		t.Errorf("t2: %q", s.Cause)
	}
}

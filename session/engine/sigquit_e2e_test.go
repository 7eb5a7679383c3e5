package engine_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// SIGQUIT to berth serve writes every goroutine to its log, as README
// tells a bug reporter, and a new daemon comes up on the same data.
func TestServeSIGQUITWritesGoroutines(t *testing.T) {
	e := newEnv(t)
	e.StartDaemon()
	if err := e.Daemon.Process.Signal(syscall.SIGQUIT); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- e.Daemon.Wait() }()
	select {
	case <-done:
		e.Daemon = nil
	case <-time.After(30 * time.Second):
		t.Fatal("berth serve did not exit on SIGQUIT")
	}
	b, _ := os.ReadFile(filepath.Join(e.Data, "test-daemon.log"))
	log := string(b)
	if !strings.Contains(log, "SIGQUIT") || !strings.Contains(log, "goroutine ") || !strings.Contains(log, "berth/session") {
		t.Fatalf("the log has no goroutine dump:\n%.3000s", log)
	}
	e.StartDaemon()
	e.OK("ls")
}

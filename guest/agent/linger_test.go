package agent

import (
	"testing"
	"time"

	"github.com/berthvm/berth/guest"
)

func TestLingeringChildDoesNotHoldExec(t *testing.T) {
	_, c := connect(t, t.TempDir())
	start := time.Now()
	r := run(t, c, guest.ExecRequest{Argv: []string{"sh", "-c", "setsid sleep 3 & echo up"}}, "")
	if r.err != nil || string(r.stdout) != "up\n" {
		t.Fatalf("%v %q", r.err, r.stdout)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("exec held by a background child for %s", d)
	}
}

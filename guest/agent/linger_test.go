package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
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

// Output the command wrote before it exited is never cut by the grace its
// background children get, however long the host takes to acknowledge it:
// here the host holds back its acks until the command has long exited
// with 4 MiB in the agent's ring and the rest in the pipe.
func TestSlowHostGetsEveryByteWrittenBeforeExit(t *testing.T) {
	dir := t.TempDir()
	_, c := connect(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const size = 5_000_000 // the ring (4 MiB) and most of the 1 MiB pipe
	e, err := c.Exec(ctx, guest.ExecRequest{ID: "slowhost", Cwd: dir,
		Argv: []string{"sh", "-c", fmt.Sprintf("head -c %d /dev/zero && touch wrote", size)}}, guest.ManualAck())
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "wrote")); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the command never finished writing")
		case <-time.After(10 * time.Millisecond):
		}
	}
	time.Sleep(5 * drainGrace) // the leader is gone; its grace runs out with nothing acknowledged
	var got int64
	for o := range e.Output() {
		if o.Offset != got {
			t.Fatalf("output jumps from %d to %d", got, o.Offset)
		}
		got += int64(len(o.Data))
		e.Ack(got, 0) // fails only once the stream has ended

	}
	ex, err := e.Wait(ctx)
	if err != nil || ex.ExitCode != 0 {
		t.Fatalf("exit %+v %v", ex, err)
	}
	if got != size {
		t.Fatalf("got %d of the %d bytes the command wrote before it exited 0", got, size)
	}
}

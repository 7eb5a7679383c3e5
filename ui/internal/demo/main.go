// Command demo runs the TUI against the in-memory fake service, with a few
// sessions whose figures change and a command that keeps printing, so the
// UI can be tried (and checked in tmux) without a daemon or VMs:
//
//	go run ./ui/internal/demo [-n SESSIONS] [-lines N] [-ro]
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/sessiontest"
	"github.com/berthvm/berth/ui"
)

func main() {
	n := flag.Int("n", 12, "sessions")
	lines := flag.Int("lines", 1_000_000, "lines of recorded output in the big execution")
	ro := flag.Bool("ro", false, "read-only")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	f := sessiontest.New(sessiontest.Options{})
	defer f.Close()
	states := []session.State{session.StateRunning, session.StateRunning, session.StatePaused, session.StateStopped, session.StateSleeping, session.StateCrashed}
	now := time.Now()
	for i := range *n {
		st := states[i%len(states)]
		seed(f.AddSession(session.Session{Name: "session-" + strconv.Itoa(i), State: st, CPUs: 1 + i%4, MemoryMiB: 512 << (i % 3),
			DiskBytes: 10 << 30, Image: "mini", VMM: "qemu", Accel: "tcg", Pid: 4000 + i, StartedAt: now.Add(-time.Duration(i) * time.Hour),
			LastActivity: now.Add(-time.Duration(i) * time.Minute), WorkspaceUsed: int64(i+1) << 28, DirtyBytes: int64(i) << 20}))
	}
	seed(f.AddFile("session-0", "README.md", []byte("# demo\n\nA file in /workspace.\n"), now))
	seed(f.AddFile("session-0", "src/main.go", []byte("package main\n\nfunc main() {}\n"), now))
	seed(f.AddFile("session-0", "bin/tool", []byte("\x7fELF\x00\x00binary"), now))
	const per = 10
	big := session.Execution{ID: "x-big-output", Session: "session-0", Argv: []string{"/bin/sh", "-c", "yes | nl"}, By: "demo",
		State: session.ExecRunning, StartedAt: now.Add(-time.Hour)}
	seed(f.AddGenerated(big, uint64(*lines/per), sessiontest.Lines(big.ID, per, 7, now.Add(-time.Hour))))
	// Every command the TUI runs (as /bin/sh -c LINE) prints 20 steps.
	f.Handle("sh", func(ctx context.Context, p *sessiontest.Proc) (int, error) {
		for i := range 20 {
			fmt.Fprintf(p.Stdout, "step %d of %v\n", i, p.Args)
			if i%5 == 4 {
				fmt.Fprint(p.Stderr, "warning: demo\n")
			}
			select {
			case <-time.After(200 * time.Millisecond):
			case <-ctx.Done():
				return 0, sessiontest.Signal("SIGKILL")
			}
		}
		return 0, nil
	})
	go func() {
		// Live figures and 10,000 lines/s into the big execution.
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			f.Grow(big.ID, 1000/per)
			if i%10 == 0 {
				name := "session-" + strconv.Itoa(rand.IntN(*n))
				f.Update(name, func(s *session.Session) {
					s.DirtyBytes = int64(rand.IntN(64 << 20))
					s.LastActivity = time.Now()
				})
			}
		}
	}()
	err := ui.Run(session.WithActor(ctx, "tui"), f, ui.Options{ReadOnly: *ro, Who: os.Getenv("USER") + "@demo", DaemonStatus: func() string { return "fake" }})
	if err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func seed(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

package engine_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/api"
	"github.com/berthvm/berth/session/engine/diskcopy"
)

// manifestCmd prints a hash manifest of the workspace, by path.
const manifestCmd = "cd /workspace && find . -type f | sort | xargs sha256sum"

// TestMoveEndToEnd moves a stopped and a sleeping session between two
// daemons on data directories of their own (one host mode: the commit
// step is nothing), through their sockets' Mover calls: the workspace's
// files, the executions and their output, the runs and checkpoints are
// the same on the target, the sleeping one wakes there with its
// processes, and the source has nothing left.
func TestMoveEndToEnd(t *testing.T) {
	needImports(t)
	t.Setenv("BERTH_NO_TEMPLATES", "1") // each boot is one the test asks for
	src, dst := newEnvAt(t, imageDataDir(t)), newEnvAt(t, imageDataDir(t))
	src.StartDaemon()
	dst.StartDaemon()
	srcC, dstC := api.Dial(filepath.Join(src.Data, "berth.sock")), api.Dial(filepath.Join(dst.Data, "berth.sock"))
	defer srcC.Close()
	defer dstC.Close()
	ctx := t.Context()
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))

	// A stopped session with 120 MiB of real data in a 1 GiB workspace,
	// recorded output, a run, a checkpoint.
	src.OK("create", "cold", "--disk", "1G", "--memory", "256M")
	src.OK("exec", "cold", "--", "sh", "-c", "head -c 125829120 /dev/urandom > big.bin; mkdir -p d; seq 1 3000 > d/seq.txt")
	src.OK("exec", "cold", "--", "sh", "-c", "echo out; echo err >&2")
	src.Run("exec", "cold", "--", "sh", "-c", "exit 7")
	if _, err := srcC.StartRun(ctx, "cold", session.RunOptions{Title: "before the move"}); err != nil {
		t.Fatal(err)
	}
	coldManifest := src.OK("exec", "cold", "--", "sh", "-c", manifestCmd)
	// Running: refused, with what to do, and nothing staged.
	_, err := session.Move(ctx, srcC, dstC, "cold", nil, log)
	if !errors.Is(err, session.ErrInvalidState) || !strings.Contains(err.Error(), "stop") {
		t.Errorf("move of a running session: %v; want ErrInvalidState saying to stop it", err)
	}
	src.OK("stop", "cold")
	src.OK("checkpoint", "cold", "--label", "moved along")

	// A sleeping session with a process outside berth's coordination.
	src.OK("create", "warm", "--disk", "256M", "--memory", "256M")
	src.OK("exec", "warm", "--", "sh", "-c", "echo hello > hi.txt; setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $! > /tmp/sleeper")
	warmManifest := src.OK("exec", "warm", "--", "sh", "-c", manifestCmd)
	src.OK("sleep", "warm")

	type before struct {
		execs []session.Execution
		out   map[string]string
		runs  []session.Run
		ckpts []session.Checkpoint
	}
	record := func(c *api.Client, name string) before {
		t.Helper()
		var b before
		var err error
		if b.execs, err = c.Executions(ctx, name, true); err != nil {
			t.Fatal(err)
		}
		b.out = map[string]string{}
		for _, x := range b.execs {
			page, err := c.Output(ctx, x.ID, 0, 1000)
			if err != nil {
				t.Fatal(err)
			}
			var s strings.Builder
			for _, ch := range page.Chunks {
				fmt.Fprintf(&s, "%d:%s|", ch.Stream, ch.Data)
			}
			b.out[x.ID] = s.String()
		}
		if b.runs, err = c.Runs(ctx, name); err != nil {
			t.Fatal(err)
		}
		if b.ckpts, err = c.Checkpoints(ctx, name); err != nil {
			t.Fatal(err)
		}
		return b
	}
	same := func(name string, a, b before) {
		t.Helper()
		key := func(xs []session.Execution) []string {
			var out []string
			for _, x := range xs {
				code := "-"
				if x.ExitCode != nil {
					code = fmt.Sprint(*x.ExitCode)
				}
				out = append(out, fmt.Sprintf("%s %q %s %s %s %s %d/%d", x.ID, x.Argv, x.State, code, x.StartedAt.UTC().Format(time.RFC3339Nano), x.EndedAt.UTC().Format(time.RFC3339Nano), x.StdoutBytes, x.StderrBytes))
			}
			return out
		}
		if !slices.Equal(key(a.execs), key(b.execs)) {
			t.Errorf("%s: executions differ:\n got %v\nwant %v", name, key(b.execs), key(a.execs))
		}
		for id, o := range a.out {
			if b.out[id] != o {
				t.Errorf("%s: output of %s differs", name, id)
			}
		}
		if len(a.runs) != len(b.runs) || (len(a.runs) > 0 && a.runs[0].ID != b.runs[0].ID) {
			t.Errorf("%s: runs %+v, want %+v", name, b.runs, a.runs)
		}
		if len(a.ckpts) != len(b.ckpts) || (len(a.ckpts) > 0 && a.ckpts[0].ID != b.ckpts[0].ID) {
			t.Errorf("%s: checkpoints %+v, want %+v", name, b.ckpts, a.ckpts)
		}
	}

	if _, err := session.Move(ctx, srcC, dstC, "nosuch", nil, log); !errors.Is(err, session.ErrNotFound) {
		t.Errorf("move of a missing session: %v", err)
	}

	for _, name := range []string{"cold", "warm"} {
		want := record(srcC, name)
		srcDir := filepath.Join(src.Data, "sessions", name)
		allocated := diskcopy.Allocated(filepath.Join(srcDir, "workspace.img"))
		var cpTook time.Duration
		if name == "cold" {
			cpTook = cpSparse(t, srcDir, filepath.Join(src.Data, "cp-"+name))
		}
		res, err := session.Move(ctx, srcC, dstC, name, func(ctx context.Context, s session.MoveStaged) error { return nil }, log)
		if err != nil {
			t.Fatalf("move %s: %v\nsource log:\n%s\ntarget log:\n%s", name, err, src.DaemonLog(), dst.DaemonLog())
		}
		mb := float64(res.Staged.Bytes) / (1 << 20)
		t.Logf("moved %s (%s): %d files, %.1f MiB of data, %d B of records in %s (send+receive %s): %.0f MiB/s",
			name, res.Staged.State, res.Staged.Files, mb, res.Staged.Records, res.Took.Round(time.Millisecond), res.Sent.Round(time.Millisecond), mb/res.Took.Seconds())
		if cpTook > 0 {
			t.Logf("cp --sparse=always of the same files on the same disk: %s: %.0f MiB/s (the move takes %.2f× as long)",
				cpTook.Round(time.Millisecond), mb/cpTook.Seconds(), res.Took.Seconds()/cpTook.Seconds())
		}
		if got := diskcopy.Allocated(filepath.Join(dst.Data, "sessions", name, "workspace.img")); got > allocated+(4<<20) {
			t.Errorf("%s: the target's workspace holds %d bytes, the source's %d: holes were filled", name, got, allocated)
		}
		if _, err := srcC.Get(ctx, name); !errors.Is(err, session.ErrNotFound) {
			t.Errorf("%s: the source still has it: %v", name, err)
		}
		if _, err := os.Stat(srcDir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: the source's directory remains: %v", name, err)
		}
		same(name, want, record(dstC, name))
	}
	if left, _ := os.ReadDir(filepath.Join(dst.Data, "moves")); len(left) != 0 {
		t.Errorf("staging left on the target: %v", left)
	}

	// The stopped one starts there on the same files.
	dst.OK("start", "cold")
	if got := dst.OK("exec", "cold", "--", "sh", "-c", manifestCmd); got != coldManifest {
		t.Errorf("cold: workspace manifest differs after the move:\n got %s\nwant %s", got, coldManifest)
	}
	dst.OK("stop", "cold")

	// The sleeping one wakes there with its process.
	if s := dst.Info("warm"); s.State != session.StateSleeping {
		t.Fatalf("warm is %s on the target, want sleeping", s.State)
	}
	start := time.Now()
	dst.OK("resume", "warm")
	t.Logf("warm woke on the target in %s", time.Since(start).Round(time.Millisecond))
	if got := dst.OK("exec", "warm", "--", "sh", "-c", manifestCmd); got != warmManifest {
		t.Errorf("warm: workspace manifest differs:\n got %s\nwant %s", got, warmManifest)
	}
	out := dst.OK("exec", "warm", "--", "sh", "-c", "p=$(cat /tmp/sleeper); kill -0 $p && tr '\\0' ' ' < /proc/$p/cmdline")
	if !strings.Contains(out, "sleep 1000") {
		t.Errorf("the process started before the move is gone after waking on the target: %q", out)
	}
	dst.OK("stop", "warm")
}

// cpSparse copies dir's files as cp --sparse=always does, synced, as the
// move's receiver syncs them, and returns how long it took.
func cpSparse(t *testing.T, dir, to string) time.Duration {
	t.Helper()
	var files []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if d != nil && d.IsDir() && d.Name() == "vm" {
			return filepath.SkipDir
		}
		if err == nil && d.Type().IsRegular() {
			files = append(files, p)
		}
		return nil
	})
	start := time.Now()
	for _, f := range files {
		rel, _ := filepath.Rel(dir, f)
		dst := filepath.Join(to, rel)
		os.MkdirAll(filepath.Dir(dst), 0o755)
		if out, err := exec.Command("cp", "--sparse=always", f, dst).CombinedOutput(); err != nil {
			t.Fatalf("cp: %v: %s", err, out)
		}
		if out, err := exec.Command("sync", dst).CombinedOutput(); err != nil {
			t.Fatalf("sync: %v: %s", err, out)
		}
	}
	took := time.Since(start)
	os.RemoveAll(to)
	return took
}

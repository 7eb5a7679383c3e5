package vmmtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/vmm"
)

// Booted is a VM started for a test, with a connected agent client.
type Booted struct {
	VM     vmm.VM
	Agent  *guest.Client
	Config vmm.Config
	UUID   string
}

// Boot starts a VM on the workspace image ws (created if missing) in dir
// and waits for its agent.
func Boot(t testing.TB, d vmm.Driver, dir, ws, uuid string) *Booted {
	t.Helper()
	im := Image(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := os.Stat(ws); err != nil {
		if err := vmm.CreateWorkspace(ctx, ws, 256<<20, uuid); err != nil {
			t.Fatal(err)
		}
	}
	cfg := vmm.Config{
		Dir: dir, Kernel: im.Kernel, Initramfs: im.Initramfs, Cmdline: "berth.ws=" + uuid,
		CPUs: 2, MemoryMiB: 512, Workspace: ws, Accel: vmm.AccelAuto,
	}
	vm, err := d.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("start VM: %v", err)
	}
	t.Cleanup(func() {
		vm.Kill(context.Background())
		vm.Close()
	})
	c, err := guest.Dial(ctx, vm.DialAgent)
	if err != nil {
		t.Fatalf("agent: %v\nconsole: %s", err, readFile(filepath.Join(dir, "console.log")))
	}
	t.Cleanup(func() { c.Close() })
	h, err := c.Hello(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !h.Workspace.Mounted {
		t.Fatalf("workspace not mounted: %s", h.Workspace.Error)
	}
	return &Booted{VM: vm, Agent: c, Config: cfg, UUID: uuid}
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// Result is a finished command.
type Result struct {
	Stdout, Stderr []byte
	Exit           guest.ExecInfo
	Err            error
}

// Run runs argv in the guest and collects its output.
func Run(t testing.TB, c *guest.Client, stdin string, argv ...string) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var id [6]byte
	rand.Read(id[:])
	e, err := c.Exec(ctx, guest.ExecRequest{ID: fmt.Sprintf("t%x", id), Argv: argv, Stdin: stdin != ""})
	if err != nil {
		return Result{Err: err}
	}
	if stdin != "" {
		go func() { e.Write([]byte(stdin)); e.CloseStdin() }()
	}
	var r Result
	for o := range e.Output() {
		if o.Stream == guest.FrameStdout {
			r.Stdout = append(r.Stdout, o.Data...)
		} else {
			r.Stderr = append(r.Stderr, o.Data...)
		}
	}
	r.Exit, r.Err = e.Wait(ctx)
	return r
}

func sum(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// DriverSuite is the behaviour every vmm.Driver must show with a real
// hypervisor: exec, reattach, files, durability across a VMM kill,
// pause/resume, the exclusive writer and shutdown through the agent.
func DriverSuite(t *testing.T, d vmm.Driver) {
	dir := t.TempDir()
	ws := filepath.Join(dir, "ws.img")
	uuid := vmm.NewUUID()
	b := Boot(t, d, filepath.Join(dir, "vm1"), ws, uuid)
	c := b.Agent
	ctx := context.Background()

	t.Run("exec", func(t *testing.T) {
		tests := []struct {
			name           string
			argv           []string
			stdin          string
			stdout, stderr string
			code           int
			signal         string
		}{
			{"echo", []string{"echo", "hello"}, "", "hello\n", "", 0, ""},
			{"streams apart", []string{"sh", "-c", "echo out; echo err >&2"}, "", "out\n", "err\n", 0, ""},
			{"exit 1", []string{"sh", "-c", "exit 1"}, "", "", "", 1, ""},
			{"exit 137", []string{"sh", "-c", "exit 137"}, "", "", "", 137, ""},
			{"killed", []string{"sh", "-c", "kill -9 $$"}, "", "", "", -1, "SIGKILL"},
			{"stdin", []string{"sh", "-c", "tr a-z A-Z"}, "typed\n", "TYPED\n", "", 0, ""},
			{"cwd", []string{"pwd"}, "", "/workspace\n", "", 0, ""},
			{"home not durable", []string{"sh", "-c", "echo $HOME"}, "", "/root\n", "", 0, ""},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				r := Run(t, c, tt.stdin, tt.argv...)
				if r.Err != nil {
					t.Fatal(r.Err)
				}
				if string(r.Stdout) != tt.stdout || string(r.Stderr) != tt.stderr {
					t.Errorf("stdout %q stderr %q, want %q %q", r.Stdout, r.Stderr, tt.stdout, tt.stderr)
				}
				if r.Exit.ExitCode != tt.code || r.Exit.Signal != tt.signal {
					t.Errorf("exit %d %q, want %d %q", r.Exit.ExitCode, r.Exit.Signal, tt.code, tt.signal)
				}
			})
		}
	})

	t.Run("50MB stdout byte-exact", func(t *testing.T) {
		r := Run(t, c, "", "sh", "-c", "head -c 50000000 /dev/urandom > big.bin && sha256sum big.bin >&2 && cat big.bin && rm big.bin")
		if r.Err != nil || r.Exit.ExitCode != 0 {
			t.Fatalf("%v %+v %s", r.Err, r.Exit, r.Stderr)
		}
		if len(r.Stdout) != 50000000 || !bytes.HasPrefix(r.Stderr, []byte(sum(r.Stdout))) {
			t.Fatalf("got %d bytes, hash %s, guest says %.64s", len(r.Stdout), sum(r.Stdout), r.Stderr)
		}
	})

	t.Run("kill process tree", func(t *testing.T) {
		e, err := c.Exec(ctx, guest.ExecRequest{ID: "tree", Argv: []string{"sh", "-c", "sleep 1001 & (sleep 1002 &) ; setsid sleep 1003 & echo up; wait"}})
		if err != nil {
			t.Fatal(err)
		}
		<-e.Output()
		if err := c.Signal(ctx, "tree", int(syscall.SIGKILL)); err != nil {
			t.Fatal(err)
		}
		for range e.Output() {
		}
		if ex, err := e.Wait(ctx); err != nil || ex.Signal != "SIGKILL" {
			t.Fatalf("exit %+v %v", ex, err)
		}
		time.Sleep(200 * time.Millisecond)
		r := Run(t, c, "", "ps", "-o", "args")
		if bytes.Contains(r.Stdout, []byte("sleep 100")) {
			t.Fatalf("survivors:\n%s", r.Stdout)
		}
	})

	t.Run("pty and resize", func(t *testing.T) {
		e, err := c.Exec(ctx, guest.ExecRequest{ID: "pty", TTY: true, Rows: 24, Cols: 80, Stdin: true,
			Argv: []string{"sh", "-c", "[ -t 0 ] && [ -t 1 ] && echo is-a-tty; stty size; read x; stty size"}})
		if err != nil {
			t.Fatal(err)
		}
		var got []byte
		for o := range e.Output() {
			got = append(got, o.Data...)
			if bytes.Contains(got, []byte("24 80")) {
				e.Resize(33, 111)
				time.Sleep(100 * time.Millisecond)
				e.Write([]byte("x\n"))
				break
			}
		}
		for o := range e.Output() {
			got = append(got, o.Data...)
		}
		if !bytes.Contains(got, []byte("is-a-tty")) || !bytes.Contains(got, []byte("33 111")) {
			t.Fatalf("pty output %q", got)
		}
	})

	t.Run("reattach after channel loss", func(t *testing.T) {
		// The channel takes one host at a time: drop the suite's client
		// first, as a restarted daemon would have.
		c.Close()
		dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		c1, err := guest.Dial(dctx, b.VM.DialAgent)
		if err != nil {
			t.Fatal(err)
		}
		e, err := c1.Exec(ctx, guest.ExecRequest{ID: "reattach", Argv: []string{"sh", "-c",
			"head -c 30000000 /dev/urandom > r.bin; sha256sum r.bin >&2; cat r.bin; i=0; while [ $i -lt 50 ]; do echo tick $i; i=$((i+1)); sleep 0.02; done"}}, guest.ManualAck())
		if err != nil {
			t.Fatal(err)
		}
		var out, errb []byte
		for o := range e.Output() {
			if o.Stream == guest.FrameStderr {
				errb = append(errb, o.Data...)
				continue
			}
			out = append(out, o.Data...)
			e.Ack(int64(len(out)), int64(len(errb))) // as the daemon does once stored
			if len(out) > 8<<20 {
				break // drop the channel mid-transfer: stale bytes stay queued
			}
		}
		c1.Close()
		c2, err := guest.Dial(dctx, b.VM.DialAgent)
		if err != nil {
			t.Fatal(err)
		}
		c = c2
		b.Agent = c2
		e2, err := c2.Attach(ctx, "reattach", int64(len(out)), int64(len(errb)))
		if err != nil {
			t.Fatal(err)
		}
		for o := range e2.Output() {
			if o.Stream == guest.FrameStderr {
				if o.Offset != int64(len(errb)) {
					t.Fatalf("stderr offset %d, have %d", o.Offset, len(errb))
				}
				errb = append(errb, o.Data...)
				continue
			}
			if o.Offset != int64(len(out)) {
				t.Fatalf("stdout offset %d, have %d: lost or duplicated output", o.Offset, len(out))
			}
			out = append(out, o.Data...)
		}
		if _, err := e2.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		data, ticks := out[:30000000], out[30000000:]
		if !bytes.HasPrefix(errb, []byte(sum(data))) {
			t.Fatalf("30 MB differ after reattach")
		}
		if !bytes.HasPrefix(ticks, []byte("tick 0\n")) || !bytes.HasSuffix(ticks, []byte("tick 49\n")) {
			t.Fatalf("ticks %q", ticks)
		}
		Run(t, c, "", "rm", "r.bin")
	})

	t.Run("files", func(t *testing.T) {
		data := make([]byte, 20<<20)
		for i := range data {
			data[i] = byte(i * 7 / 3)
		}
		if _, err := c.WriteFile(ctx, "dir/twenty.bin", bytes.NewReader(data), 0); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("write into a missing dir: %v, want ENOENT", err)
		}
		if err := c.Mkdir(ctx, "dir", false); err != nil {
			t.Fatal(err)
		}
		if _, err := c.WriteFile(ctx, "dir/twenty.bin", bytes.NewReader(data), 0); err != nil {
			t.Fatal(err)
		}
		r, err := c.ReadFile(ctx, "/workspace/dir/twenty.bin")
		if err != nil {
			t.Fatal(err)
		}
		back, err := io.ReadAll(r)
		r.Close()
		if err != nil || sum(back) != sum(data) {
			t.Fatalf("round trip: %d bytes, %v", len(back), err)
		}
		if gr := Run(t, c, "", "sha256sum", "dir/twenty.bin"); !bytes.HasPrefix(gr.Stdout, []byte(sum(data))) {
			t.Fatalf("guest sees %s", gr.Stdout)
		}
		Run(t, c, "", "ln", "-s", "/etc", "etc-link")
		for _, p := range []string{"../etc/passwd", "/etc/passwd", "dir/../../x", "etc-link/passwd"} {
			if _, err := c.ReadFile(ctx, p); !errors.Is(err, guest.ErrEscape) {
				t.Errorf("read %q: %v, want ErrEscape", p, err)
			}
			if _, err := c.WriteFile(ctx, p, strings.NewReader("x"), 0); !errors.Is(err, guest.ErrEscape) {
				t.Errorf("write %q: %v, want ErrEscape", p, err)
			}
		}
	})

	t.Run("ENOSPC keeps old content", func(t *testing.T) {
		if _, err := c.WriteFile(ctx, "keep.txt", strings.NewReader("precious\n"), 0); err != nil {
			t.Fatal(err)
		}
		// Fill the volume, leaving less room than the next write needs.
		Run(t, c, "", "sh", "-c", "dd if=/dev/zero of=fill bs=1M 2>/dev/null; sync")
		_, err := c.WriteFile(ctx, "keep.txt", bytes.NewReader(make([]byte, 8<<20)), 0)
		if !errors.Is(err, syscall.ENOSPC) {
			t.Errorf("write on a full volume: %v, want ENOSPC", err)
		}
		r, err := c.ReadFile(ctx, "keep.txt")
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(r)
		r.Close()
		if string(got) != "precious\n" {
			t.Errorf("after a failed write: %q", got)
		}
		if err := c.Remove(ctx, "fill", false); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("pause stops output, resume continues", func(t *testing.T) {
		e, err := c.Exec(ctx, guest.ExecRequest{ID: "ticker", Argv: []string{"sh", "-c", "i=0; while [ $i -lt 40 ]; do echo $i; i=$((i+1)); sleep 0.05; done"}})
		if err != nil {
			t.Fatal(err)
		}
		<-e.Output()
		if err := b.VM.Pause(ctx); err != nil {
			t.Fatal(err)
		}
		if st, _ := b.VM.Status(ctx); st != vmm.StatePaused {
			t.Fatalf("status %s after pause", st)
		}
		// Drain what was in flight, then expect silence.
		drain := time.After(300 * time.Millisecond)
	loop:
		for {
			select {
			case <-e.Output():
			case <-drain:
				break loop
			}
		}
		select {
		case o := <-e.Output():
			t.Fatalf("output while paused: %q", o.Data)
		case <-time.After(time.Second):
		}
		if err := b.VM.Resume(ctx); err != nil {
			t.Fatal(err)
		}
		var last []byte
		for o := range e.Output() {
			last = o.Data
		}
		if ex, err := e.Wait(ctx); err != nil || ex.ExitCode != 0 || !bytes.HasSuffix(last, []byte("39\n")) {
			t.Fatalf("after resume: %+v %v %q", ex, err, last)
		}
	})

	t.Run("reconnect after the host left a paused VM", func(t *testing.T) {
		// A daemon that dies while its VM is paused (mid-sleep) leaves a
		// channel that a new connection may find mute from the guest; the
		// agent must still be reachable, quickly, every time.
		for i := range 20 {
			if _, err := c.Hello(ctx); err != nil {
				t.Fatal(err)
			}
			if err := b.VM.Pause(ctx); err != nil {
				t.Fatal(err)
			}
			c.Close()
			if err := b.VM.Resume(ctx); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			nc, err := guest.Dial(dctx, b.VM.DialAgent)
			cancel()
			if err != nil {
				t.Fatalf("round %d: %v", i, err)
			}
			if d := time.Since(start); d > 500*time.Millisecond {
				t.Logf("round %d: the agent answered after %s", i, d.Round(time.Millisecond))
			}
			c = nc
			b.Agent = nc
		}
	})

	t.Run("second writer refused", func(t *testing.T) {
		cfg := b.Config
		cfg.Dir = filepath.Join(dir, "vm-second")
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		vm2, err := d.Start(sctx, cfg)
		if err == nil {
			vm2.Kill(ctx)
			t.Fatal("a second VM attached the workspace")
		}
		if !errors.Is(err, vmm.ErrInUse) {
			t.Fatalf("err = %v, want ErrInUse", err)
		}
		if !strings.Contains(err.Error(), fmt.Sprint(b.VM.Pid())) {
			t.Errorf("error does not name the holder pid %d: %v", b.VM.Pid(), err)
		}
	})

	t.Run("durability across kill -9", func(t *testing.T) {
		data := bytes.Repeat([]byte("durable\n"), 1<<17)
		if _, err := c.WriteFile(ctx, "api.txt", bytes.NewReader(data), 0); err != nil {
			t.Fatal(err)
		}
		Run(t, c, "", "sh", "-c", "head -c 1000000 /dev/urandom > flushed.bin; sha256sum flushed.bin > flushed.sum")
		if _, err := c.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		if r := Run(t, c, "", "sh", "-c", "echo maybe > unflushed.txt"); r.Err != nil {
			t.Fatal(r.Err)
		}
		st, err := c.Stats(ctx)
		if err != nil || st.Dirty+st.Writeback == 0 {
			t.Logf("dirty after unflushed write: %+v %v", st, err)
		}
		// kill -9 of the VMM, not a clean stop.
		syscall.Kill(b.VM.Pid(), syscall.SIGKILL)
		select {
		case <-b.VM.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("VMM did not die")
		}
		if ex := b.VM.Exit(); ex.Signal != "SIGKILL" {
			t.Errorf("exit = %+v, want SIGKILL", ex)
		}
		b2 := Boot(t, d, filepath.Join(dir, "vm2"), ws, uuid)
		r, err := b2.Agent.ReadFile(ctx, "api.txt")
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(r)
		r.Close()
		if sum(got) != sum(data) {
			t.Fatalf("file API write lost by kill -9: %d bytes", len(got))
		}
		if r := Run(t, b2.Agent, "", "sha256sum", "-c", "flushed.sum"); r.Exit.ExitCode != 0 {
			t.Fatalf("flushed file lost by kill -9: %s %s", r.Stdout, r.Stderr)
		}

		t.Run("shutdown through the agent", func(t *testing.T) {
			if _, err := b2.Agent.Shutdown(ctx, time.Second); err != nil {
				t.Fatal(err)
			}
			select {
			case <-b2.VM.Done():
			case <-time.After(20 * time.Second):
				t.Fatal("VM did not power off")
			}
			if ex := b2.VM.Exit(); ex.Code != 0 {
				t.Errorf("exit after shutdown = %+v", ex)
			}
		})
	})
}

package app_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/berthvm/berth/session/api"
)

// soakDaemon supervises `berth serve` on the soak's data directory as a
// separate process: it starts it, kills it with SIGKILL and starts it
// again, as an operator's crash would, and notices when it dies by
// itself.
//
// Every kill bumps the epoch before the signal is sent, so an operation
// that saw an error and a different epoch than it started with knows the
// daemon went away under it.
//
// The CLI starts a daemon of its own in the background when none answers
// (as tmux does). A CLI process started while the supervised daemon is
// down would do that, and its daemon, not the supervisor's, would own the
// data directory. So CLI processes run holding gate shared, and a kill
// and its restart hold it exclusively: a kill never lands while a CLI
// process may be finding the daemon. (API clients and ssh never start a
// daemon; kills land during theirs at any moment.)
type soakDaemon struct {
	berth, data, cache string
	sshAddr            string
	env                []string
	logPath            string

	gate sync.RWMutex

	epoch atomic.Int64

	mu   sync.Mutex
	proc *daemonProc
	up   chan struct{} // closed while a started daemon answers
	// starts records where each start's log begins (offsets into
	// logPath), to read one start's log apart.
	starts []int64
	// unexpected are exits the supervisor did not cause.
	unexpected []string
	restarts   []time.Duration
}

// daemonProc is one `berth serve` process; done is closed when it has
// exited and been waited for.
type daemonProc struct {
	cmd    *exec.Cmd
	done   chan struct{}
	killed atomic.Bool
	err    error // Wait's result, set before done is closed
}

func newSoakDaemon(berth, data, cache, sshAddr string, env []string) *soakDaemon {
	return &soakDaemon{
		berth: berth, data: data, cache: cache, sshAddr: sshAddr, env: env,
		logPath: filepath.Join(data, "soak-daemon.log"),
		up:      make(chan struct{}),
	}
}

func (d *soakDaemon) socket() string { return filepath.Join(d.data, "berth.sock") }

// start runs a new daemon and waits until it answers on its socket and its
// SSH port. The caller holds gate exclusively or runs before any worker.
func (d *soakDaemon) start(ctx context.Context) error { return d.startWith(ctx, nil) }

// startWith is start with more environment for this start only (a crash
// point).
func (d *soakDaemon) startWith(ctx context.Context, env []string) error {
	began := time.Now()
	logf, err := os.OpenFile(d.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("daemon log: %w", err)
	}
	defer logf.Close()
	off, _ := logf.Seek(0, 2)
	fmt.Fprintf(logf, "=== soak: start %d at %s\n", len(d.starts)+1, began.Format(time.RFC3339Nano))
	c := exec.Command(d.berth, "--data", d.data, "--cache", d.cache, "serve", "--ssh", d.sshAddr)
	c.Env = append(slices.Clip(d.env), env...)
	c.Stdout, c.Stderr = logf, logf
	if err := c.Start(); err != nil {
		return fmt.Errorf("start the daemon: %w", err)
	}
	p := &daemonProc{cmd: c, done: make(chan struct{})}
	// The waiter ends with the process, which stop and kill make sure of.
	go func() {
		p.err = c.Wait()
		close(p.done)
	}()
	d.mu.Lock()
	d.proc = p
	d.starts = append(d.starts, off)
	d.mu.Unlock()

	client := api.Dial(d.socket())
	defer client.Close()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := client.Ping(pctx)
		cancel()
		if err == nil {
			break
		}
		select {
		case <-p.done:
			return fmt.Errorf("the daemon exited at start (%v): %s", p.err, d.tail(off, 1500))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the daemon did not answer within 2m: %s", d.tail(off, 1500))
		}
	}
	for {
		c, err := net.DialTimeout("tcp", d.sshAddr, time.Second)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the daemon's SSH server did not listen within 2m: %s", d.tail(off, 1500))
		}
		select {
		case <-p.done:
			return fmt.Errorf("the daemon exited at start (%v): %s", p.err, d.tail(off, 1500))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	d.mu.Lock()
	d.restarts = append(d.restarts, time.Since(began))
	close(d.up)
	d.mu.Unlock()
	return nil
}

// kill sends SIGKILL to the daemon and waits for it to be gone; its VMs
// run on. The caller holds gate exclusively.
func (d *soakDaemon) kill() {
	d.mu.Lock()
	p := d.proc
	d.epoch.Add(1)
	select {
	case <-d.up:
		d.up = make(chan struct{})
	default:
	}
	d.mu.Unlock()
	if p == nil {
		return
	}
	p.killed.Store(true)
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// exited returns a channel closed when the current daemon has exited.
func (d *soakDaemon) exited() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.proc == nil {
		return nil
	}
	return d.proc.done
}

// died reports a daemon exit the supervisor did not cause, with its log's
// tail, and marks it down (a new epoch: what was under way lost it).
func (d *soakDaemon) died() string {
	d.mu.Lock()
	p := d.proc
	off := d.starts[len(d.starts)-1]
	d.epoch.Add(1)
	select {
	case <-d.up:
		d.up = make(chan struct{})
	default:
	}
	d.mu.Unlock()
	if p.killed.Load() {
		return ""
	}
	msg := fmt.Sprintf("the daemon exited by itself (%v); its log ends:\n%s", p.err, d.tail(off, 4000))
	d.mu.Lock()
	d.unexpected = append(d.unexpected, msg)
	d.mu.Unlock()
	return msg
}

// waitUp waits until a daemon answers, and returns the epoch it is in.
func (d *soakDaemon) waitUp(ctx context.Context) (int64, error) {
	for {
		d.mu.Lock()
		up, e := d.up, d.epoch.Load()
		d.mu.Unlock()
		select {
		case <-up:
			return e, nil
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// isUp reports whether the daemon answers now (without waiting).
func (d *soakDaemon) isUp() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	select {
	case <-d.up:
		return true
	default:
		return false
	}
}

// stop kills the daemon for good (the end of the soak, or a failure).
func (d *soakDaemon) stop() {
	d.gate.Lock()
	defer d.gate.Unlock()
	d.kill()
}

// log returns the daemon log from byte offset off on.
func (d *soakDaemon) log(off int64) string {
	b, _ := os.ReadFile(d.logPath)
	if off > int64(len(b)) {
		return ""
	}
	return string(b[off:])
}

func (d *soakDaemon) tail(off int64, n int) string {
	s := d.log(off)
	if len(s) > n {
		s = "…" + s[len(s)-n:]
	}
	return s
}

// lastStart is the log offset where the latest start's log begins.
func (d *soakDaemon) lastStart() int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.starts[len(d.starts)-1]
}

// filler fills the data directory's filesystem to leave keep bytes free,
// holds it there, and empties it: the soak's one full disk.
//
// It fills to keep and tops up only once free space is back above refill
// (a restarted daemon's store gives back what it had preallocated, a
// checkpoint is deleted): topping up while the daemon copies a disk it
// found room for would race it to a completely full filesystem, which
// the store's own guard cannot survive (see store.Store) and which is
// not the full disk the soak means to test.
type filler struct {
	dir, path    string
	keep, refill int64

	mu         sync.Mutex
	start, end time.Time // the window; zero until it happens
	minFree    int64
}

// fillFor fills at once, tops the filesystem up every 250 ms (the
// sessions and the store free and take space meanwhile) for d, then
// removes its file. It returns early, emptied, when ctx ends. It fills
// holding quiet exclusively.
func (f *filler) fillFor(ctx context.Context, d time.Duration, quiet *sync.RWMutex) error {
	f.mu.Lock()
	f.start, f.minFree = time.Now(), -1
	f.mu.Unlock()
	defer func() {
		os.Remove(f.path)
		f.mu.Lock()
		f.end = time.Now()
		f.mu.Unlock()
	}()
	file, err := os.OpenFile(f.path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("filler: %w", err)
	}
	defer file.Close()
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i) | 1 // tmpfs keeps zero pages too, but be plain about it
	}
	first := true
	stop := time.After(d)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		free, err := freeSpace(f.dir)
		if err != nil {
			return err
		}
		if first || free > f.refill {
			first = false
			if err := f.fill(file, buf, quiet); err != nil {
				return err
			}
		}
		if free, err = freeSpace(f.dir); err == nil {
			f.mu.Lock()
			if f.minFree < 0 || free < f.minFree {
				f.minFree = free
			}
			f.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-stop:
			return nil
		case <-tick.C:
		}
	}
}

// fill writes until keep bytes are left.
func (f *filler) fill(file *os.File, buf []byte, quiet *sync.RWMutex) error {
	quiet.Lock()
	defer quiet.Unlock()
	free, err := freeSpace(f.dir)
	if err != nil {
		return err
	}
	for n := free - f.keep; n > 0; {
		k := min(int64(len(buf)), n)
		if _, err := file.Write(buf[:k]); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				return nil
			}
			return fmt.Errorf("filler: %w", err)
		}
		n -= k
	}
	return nil
}

// overlaps reports whether [from, to] meets the fill window, widened by
// grace after it: the daemon notices space returning within a second or
// two, and a session paused for it resumes after that.
func (f *filler) overlaps(from, to time.Time, grace time.Duration) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.start.IsZero() || to.Before(f.start) {
		return false
	}
	return f.end.IsZero() || !from.After(f.end.Add(grace))
}

func (f *filler) window() (start, end time.Time, minFree int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.start, f.end, f.minFree
}

func freeSpace(dir string) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return int64(st.Bavail) * st.Bsize, nil
}

// vmms lists the QEMU processes running for a session of the data
// directory: session name → pids. QEMU runs in the VM's directory,
// sessions/NAME/vm (its command line need not name the session: a VM
// restored from a template gets its workspace hot-plugged).
func vmms(data string) map[string][]int {
	out := map[string][]int{}
	ents, _ := os.ReadDir("/proc")
	prefix := filepath.Join(data, "sessions") + "/"
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(b) == 0 {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if !strings.Contains(filepath.Base(args[0]), "qemu-system") || !alive(pid) {
			continue
		}
		cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd"))
		if err != nil {
			continue
		}
		rest, ok := strings.CutPrefix(cwd, prefix)
		if !ok {
			continue
		}
		name, _, _ := strings.Cut(rest, "/")
		out[name] = append(out[name], pid)
	}
	return out
}

// alive reports whether pid is a live process (a zombie is not).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z' && s[i+2] != 'X'
	}
	return true
}

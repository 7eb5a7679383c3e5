package app_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berthvm/berth/session/api"
	"github.com/berthvm/berth/vmm/vmmtest"
)

// TestSoak runs sessions on real VMs under a seeded random mix of what
// users do — commands with output through the API, the CLI and SSH, puts
// and tree copies, pause and resume, sleep and wake, checkpoints and
// restores, port-forward traffic, network policy changes — while the
// daemon, a separate `berth serve` built with -race and the lock-order
// checker, is killed with SIGKILL at random moments and started again,
// and the data directory's filesystem (a tmpfs of its own) fills and
// empties once. Then it checks every promise that must survive that:
// see soakWorld.check.
//
// It drives the daemon only as a front end does: the berth command, the
// socket API's client and ssh, with the session package's contract
// types.
//
// BERTH_SOAK_SEED replays a seed (every session's operations and the
// kills come from it; how they interleave depends on timing),
// BERTH_SOAK_TIME sets how long the random mix runs (default 30s: the
// short version in make test; make soak runs it for minutes), and
// BERTH_SOAK_SESSIONS how many sessions (8).
func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("boots VMs")
	}
	cfg := soakConfigFromEnv(t)
	t.Logf("soak: seed %d (replay with BERTH_SOAK_SEED=%d), %s of operations on %d sessions", cfg.seed, cfg.seed, cfg.chaos, cfg.sessions)
	w := newSoakWorld(t, cfg)
	w.setup()
	w.chaos()
	w.settle()
	w.check()
	w.report()
	if t.Failed() {
		w.histories()
		t.Logf("soak: failed with seed %d (replay with BERTH_SOAK_SEED=%d BERTH_SOAK_TIME=%s); the daemon's log is kept at %s", cfg.seed, cfg.seed, cfg.chaos, w.keptLog())
	}
}

type soakConfig struct {
	seed     uint64
	chaos    time.Duration
	sessions int
	// Kills come every killMin to killMax, one in five sooner (while the
	// daemon is still reconnecting its sessions).
	killMin, killMax time.Duration
	fillFor          time.Duration
	maxLoop, maxSeq  int // sizes of commands' output
	maxPut           int
	opTimeout        time.Duration
	fsSize           int64
}

func soakConfigFromEnv(t *testing.T) soakConfig {
	c := soakConfig{
		seed: uint64(time.Now().UnixNano()), chaos: 30 * time.Second, sessions: 8,
		killMin: 5 * time.Second, killMax: 12 * time.Second,
		maxLoop: 300, maxSeq: 20000, maxPut: 256 << 10,
		opTimeout: 4 * time.Minute, fsSize: 1536 << 20,
	}
	if s := os.Getenv("BERTH_SOAK_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("BERTH_SOAK_SEED=%q: %v", s, err)
		}
		c.seed = n
	}
	if s := os.Getenv("BERTH_SOAK_TIME"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d < 10*time.Second {
			t.Fatalf("BERTH_SOAK_TIME=%q: want a duration of at least 10s, such as 10m", s)
		}
		c.chaos = d
	}
	if s := os.Getenv("BERTH_SOAK_SESSIONS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 32 {
			t.Fatalf("BERTH_SOAK_SESSIONS=%q: want 1 to 32", s)
		}
		c.sessions = n
	}
	if c.chaos > 2*time.Minute {
		c.killMin, c.killMax = 10*time.Second, 45*time.Second
	}
	c.fillFor = min(max(c.chaos/6, 8*time.Second), 30*time.Second)
	return c
}

// soakWorld is the soak: the daemon under test, its clients, and what
// the soak knows each session must hold.
type soakWorld struct {
	t   *testing.T
	cfg soakConfig

	berth, data, cache, mnt, tmp string
	env                          []string
	d                            *soakDaemon
	client                       *api.Client
	http                         *http.Client
	fill                         *filler

	sshAddr, sshKey, knownHosts string
	hostPort                    string

	sessions []*soakSession
	byName   map[string]*soakSession
	fwds     []*forwarder

	stats statBook

	mu       sync.Mutex
	crashes  []string
	kills    int
	quick    int // kills soon after a start
	began    time.Time
	chaosEnd time.Time
	checked  map[string]int
	blamed   map[string]bool
	events   []string
	abort    context.CancelFunc
	// fullStarts counts starts refused for want of room.
	fullStarts int

	// bigOps is held shared by operations that write a lot at once and
	// exclusively by the filler while it fills: filling under a memory
	// snapshot or disk copy the daemon found room for before would run
	// the filesystem out completely, racing it (the daemon cannot guard
	// against another process taking the space it checked).
	bigOps sync.RWMutex
}

func newSoakWorld(t *testing.T, cfg soakConfig) *soakWorld {
	return &soakWorld{t: t, cfg: cfg, byName: map[string]*soakSession{}, checked: map[string]int{}, blamed: map[string]bool{},
		http: &http.Client{Timeout: 2 * time.Minute}}
}

// fail reports a broken promise; safe from any goroutine. The sessions
// it names get their history printed at the end.
func (w *soakWorld) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	w.mu.Lock()
	for _, n := range sessionRE.FindAllString(msg, -1) {
		w.blamed[n] = true
	}
	w.mu.Unlock()
	w.t.Errorf("soak: %s", msg)
}

var sessionRE = regexp.MustCompile(`\bs[0-9]+\b`)

// event notes what the soak did to the daemon or the disk, for the
// histories of a failing run.
func (w *soakWorld) event(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.events = append(w.events, fmt.Sprintf("%7.2fs ", time.Since(w.began).Seconds())+fmt.Sprintf(format, args...))
}

func (w *soakWorld) crash(name, cause string) {
	w.mu.Lock()
	w.crashes = append(w.crashes, name+": "+cause)
	w.mu.Unlock()
	w.fail("session %s crashed: %s", name, cause)
}

func (w *soakWorld) setup() {
	t := w.t
	w.berth = raceBerth(t)
	w.cache = vmmtest.CacheDir()
	w.tmp = t.TempDir()
	if os.Geteuid() == 0 {
		w.mnt = t.TempDir()
		if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", w.cfg.fsSize), "tmpfs", w.mnt).CombinedOutput(); err != nil {
			t.Fatalf("mount a tmpfs for the data directory: %v %s", err, out)
		}
		t.Cleanup(func() {
			if err := syscall.Unmount(w.mnt, syscall.MNT_DETACH); err != nil {
				t.Errorf("unmount %s: %v", w.mnt, err)
			}
		})
		w.data = vmmtest.DataDirIn(t, filepath.Join(w.mnt, "data"))
		// Full: below the floor (96M, config.toml below), so what needs
		// space is refused, and below the store's output reserve (64M),
		// so every command's output is held; above half of it, so records
		// are still written.
		w.fill = &filler{dir: w.mnt, path: filepath.Join(w.mnt, "filler"), keep: 56 << 20, refill: 112 << 20}
	} else {
		t.Log("soak: not root, so no filesystem of its own: the full disk is left out")
		w.data = vmmtest.DataDir(t)
	}
	// Small VMs and disks (eight fit the tmpfs with their sleeps and
	// checkpoints); no idle sleep, so every sleep is the soak's; output
	// kept whole, so every replay can be compared.
	cfgFile := "memory = \"128M\"\ndisk = \"64M\"\nidle_timeout = \"0\"\nretention = \"1G\"\nfree_space_floor = \"96M\"\noutput_budget = \"0\"\ncheckpoint_limit = 8\n"
	if err := os.WriteFile(filepath.Join(w.data, "config.toml"), []byte(cfgFile), 0o644); err != nil {
		t.Fatal(err)
	}
	w.env = append(os.Environ(), "BERTH_DATA=", "NO_COLOR=1")

	// Host side of policy checks: allowed only when a policy names it.
	host := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(rw, "host says %s", r.URL.Path)
	}))
	t.Cleanup(host.Close)
	_, w.hostPort, _ = net.SplitHostPort(host.Listener.Addr().String())

	// SSH: a key of the admin role, the host key learnt on first use (it
	// is kept in the data directory, so it stays across restarts).
	w.sshKey = filepath.Join(w.tmp, "id")
	w.knownHosts = filepath.Join(w.tmp, "known_hosts")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "soak", "-f", w.sshKey).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v %s", err, out)
	}
	if out, err := w.berthCmd("ssh", "add-key", "--role", "admin", w.sshKey+".pub").CombinedOutput(); err != nil {
		t.Fatalf("ssh add-key: %v %s", err, out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	w.sshAddr = l.Addr().String()
	l.Close()

	w.d = newSoakDaemon(w.berth, w.data, w.cache, w.sshAddr, w.env)
	t.Cleanup(w.cleanupVMs)
	t.Cleanup(w.d.stop)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := w.d.start(ctx); err != nil {
		t.Fatal(err)
	}
	w.client = api.Dial(w.d.socket(), api.WithActor("soak"))
	t.Cleanup(func() { w.client.Close() })

	// The sessions are made at once, as a fleet's users would.
	began := time.Now()
	w.sessions = make([]*soakSession, w.cfg.sessions)
	errs := make([]error, w.cfg.sessions)
	var wg sync.WaitGroup
	for i := range w.cfg.sessions {
		wg.Go(func() { w.sessions[i], errs[i] = w.newSession(ctx, i) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("%v\n%s", err, w.d.tail(0, 3000))
	}
	for _, ss := range w.sessions {
		w.byName[ss.name] = ss
	}
	t.Logf("soak: %d sessions created and forwarded in %s", len(w.sessions), time.Since(began).Round(time.Millisecond))
}

// newSession creates session s<i> with the directories the operations use
// and its port forward.
func (w *soakWorld) newSession(ctx context.Context, i int) (*soakSession, error) {
	name := fmt.Sprintf("s%d", i)
	if _, errb, code, err := w.cli(ctx, nil, "create", name); err != nil || code != 0 {
		return nil, fmt.Errorf("berth create %s: exit %d %v: %s", name, code, err, errb)
	}
	ss := &soakSession{name: name, rng: w.rng(uint64(i) + 1), files: model{}, ckpts: map[string]model{}, policy: map[string]bool{"none": true}}
	for _, dir := range []string{"put", "cp", "www"} {
		if err := w.client.Mkdir(ctx, name, dir); err != nil {
			return nil, fmt.Errorf("mkdir %s in %s: %w", dir, name, err)
		}
	}
	f, err := w.portForward(ctx, name)
	if err != nil {
		return nil, err
	}
	ss.fwdAddr = f.addr
	return ss, nil
}

// rng is the seed's random stream number stream: each session's, the
// killer's and the filler's are apart, so one replays whatever the others
// do.
func (w *soakWorld) rng(stream uint64) *rand.Rand {
	return rand.New(rand.NewChaCha8(sha256.Sum256(fmt.Appendf(nil, "berth soak %d %d", w.cfg.seed, stream))))
}

func (w *soakWorld) berthCmd(args ...string) *exec.Cmd {
	c := exec.Command(w.berth, append([]string{"--data", w.data, "--cache", w.cache}, args...)...)
	c.Env = w.env
	return c
}

// forwarder is a running `berth port-forward NAME 0:8080`, for the whole
// soak: its client must outlive the daemon's restarts.
type forwarder struct {
	cmd     *exec.Cmd
	addr    string
	drained chan struct{} // its output read to the end
	mu      sync.Mutex
	stderr  strings.Builder
}

func (w *soakWorld) portForward(ctx context.Context, name string) (*forwarder, error) {
	c := w.berthCmd("port-forward", name, "0:8080")
	out, err := c.StdoutPipe()
	if err != nil {
		return nil, err
	}
	f := &forwarder{cmd: c, drained: make(chan struct{})}
	c.Stderr = &lockedWriter{mu: &f.mu, w: &f.stderr}
	if err := c.Start(); err != nil {
		return nil, fmt.Errorf("port-forward %s: %w", name, err)
	}
	w.mu.Lock()
	w.fwds = append(w.fwds, f)
	w.mu.Unlock()
	w.t.Cleanup(func() {
		c.Process.Kill()
		<-f.drained
		c.Wait()
	})
	sc := bufio.NewScanner(out)
	if !sc.Scan() {
		close(f.drained)
		return nil, fmt.Errorf("port-forward %s printed nothing: %s", name, f.errors())
	}
	// "forwarding 127.0.0.1:PORT -> NAME:8080"
	fields := strings.Fields(sc.Text())
	if len(fields) < 2 {
		close(f.drained)
		return nil, fmt.Errorf("port-forward %s printed %q", name, sc.Text())
	}
	f.addr = fields[1]
	// Reads to the end, which is the process's exit (cleanup kills it).
	go func() {
		defer close(f.drained)
		for sc.Scan() {
		}
	}()
	return f, nil
}

func (f *forwarder) errors() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stderr.String()
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *strings.Builder
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// cleanupVMs kills every VMM left on the data directory: VMs outlive
// daemons by design, and the soak must not leak them.
func (w *soakWorld) cleanupVMs() {
	for _, pids := range vmms(w.data) {
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	// And by the pid files, as the other end-to-end tests do, should a
	// VMM have left its directory.
	files, _ := filepath.Glob(filepath.Join(w.data, "sessions", "*", "vm", "vmm.pid"))
	for _, p := range files {
		b, _ := os.ReadFile(p)
		if f := strings.Fields(string(b)); len(f) > 0 {
			pid, err := strconv.Atoi(f[0])
			if err != nil || pid <= 0 {
				continue
			}
			// Only a QEMU: the pid may have been reused since.
			if cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); strings.Contains(string(cmd), "qemu-system") {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	for _, pid := range w.strayDaemons() {
		syscall.Kill(pid, syscall.SIGKILL)
	}
}

// strayDaemons are berth serve processes on the data directory other than
// the supervised one: a CLI process that found no daemon starts one.
func (w *soakWorld) strayDaemons() []int {
	var own int
	w.d.mu.Lock()
	if w.d.proc != nil && w.d.proc.cmd.Process != nil {
		own = w.d.proc.cmd.Process.Pid
	}
	w.d.mu.Unlock()
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == own {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(args) > 0 && args[0] == w.berth && slices.Contains(args, "serve") && slices.Contains(args, w.data) && alive(pid) {
			out = append(out, pid)
		}
	}
	return out
}

// chaos runs the random mix: a worker per session, the killer and the
// filler, until cfg.chaos has passed.
func (w *soakWorld) chaos() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// A daemon that cannot be started again ends the soak early.
	w.abort = cancel
	w.began = time.Now()
	deadline := w.began.Add(w.cfg.chaos)
	var workers sync.WaitGroup
	for _, ss := range w.sessions {
		workers.Go(func() { w.worker(ctx, ss, deadline) })
	}
	var helpers sync.WaitGroup
	helpers.Go(func() { w.killer(ctx, deadline) })
	if w.fill != nil {
		helpers.Go(func() {
			r := w.rng(1 << 32)
			at := time.Duration(float64(w.cfg.chaos) * (0.2 + 0.4*r.Float64()))
			if sleepCtx(ctx, at) != nil {
				return
			}
			w.event("filling the data directory's filesystem")
			if err := w.fill.fillFor(ctx, w.cfg.fillFor, &w.bigOps); err != nil {
				w.fail("%v", err)
			}
			w.event("emptied the data directory's filesystem")
		})
	}
	workers.Wait()
	w.chaosEnd = time.Now()
	cancel()
	helpers.Wait()
}

func (w *soakWorld) worker(ctx context.Context, ss *soakSession, deadline time.Time) {
	for time.Now().Before(deadline) && ctx.Err() == nil {
		k := pickOp(ss.rng)
		think := time.Duration(ss.rng.IntN(400)) * time.Millisecond
		octx, cancel := context.WithTimeout(ctx, w.cfg.opTimeout)
		e0, err := w.d.waitUp(octx)
		ss.epoch = e0
		began := time.Now()
		if err == nil {
			if err = w.ready(octx, ss); err == nil {
				if k.big {
					w.bigOps.RLock()
				}
				err = k.run(octx, w, ss)
				if k.big {
					w.bigOps.RUnlock()
				}
			}
		}
		timedOut := octx.Err() == context.DeadlineExceeded
		cancel()
		if ctx.Err() != nil {
			return // aborted: the failure that did it is reported
		}
		w.judge(k.name, ss, e0, began, err, timedOut)
		sleepCtx(ctx, think)
	}
}

// judge counts an operation's outcome and reports it when nothing
// excuses its failure: a kill of the daemon while it ran, or the full
// disk's refusals.
func (w *soakWorld) judge(kind string, ss *soakSession, e0 int64, began time.Time, err error, timedOut bool) {
	took := time.Since(began)
	var f func(*opStats)
	switch {
	case err == nil:
		f = func(s *opStats) { s.ok++ }
	case errorsIs(err, errSkipped):
		f = func(s *opStats) { s.skipped++ }
	case timedOut:
		w.fail("%s on %s hung for %s: %v", kind, ss.name, w.cfg.opTimeout, err)
		f = func(s *opStats) { s.failed++ }
	case errorsIs(err, errWrong):
		w.fail("%s on %s: %v", kind, ss.name, err)
		f = func(s *opStats) { s.failed++ }
	case w.d.epoch.Load() != e0:
		f = func(s *opStats) { s.interrupted++ }
	case w.fill != nil && w.fill.overlaps(began, time.Now(), 15*time.Second) && noSpace(err):
		f = func(s *opStats) { s.refused++ }
	default:
		w.fail("%s on %s (after %s): %v", kind, ss.name, took.Round(time.Millisecond), err)
		f = func(s *opStats) { s.failed++ }
	}
	w.stats.add(kind, func(s *opStats) { f(s); s.took += took })
	line := fmt.Sprintf("%7.2fs %-12s %6.2fs", began.Sub(w.began).Seconds(), kind, took.Seconds())
	if err != nil {
		line += ": " + err.Error()
	}
	ss.hist = append(ss.hist, line)
}

// killer kills the daemon with SIGKILL at random moments and starts it
// again; it also notices a daemon that died by itself.
func (w *soakWorld) killer(ctx context.Context, deadline time.Time) {
	r := w.rng(1 << 33)
	for {
		gap := w.cfg.killMin + time.Duration(r.Int64N(int64(w.cfg.killMax-w.cfg.killMin)))
		quick := r.IntN(5) == 0
		if quick {
			gap = 300*time.Millisecond + time.Duration(r.Int64N(int64(2700*time.Millisecond)))
		}
		down := time.Duration(r.Int64N(int64(1500 * time.Millisecond)))
		timer := time.NewTimer(gap)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-w.d.exited():
			timer.Stop()
			if msg := w.d.died(); msg != "" {
				w.fail("%s", msg)
			}
			w.d.gate.Lock()
			err := w.restart(ctx)
			w.d.gate.Unlock()
			if err != nil && ctx.Err() == nil {
				w.fail("restart after the daemon died: %v", err)
				w.abort()
				return
			}
			continue
		case <-timer.C:
		}
		if time.Now().After(deadline) {
			return
		}
		w.d.gate.Lock()
		w.event("kill -9 of the daemon")
		w.d.kill()
		w.mu.Lock()
		w.kills++
		if quick {
			w.quick++
		}
		w.mu.Unlock()
		sleepCtx(ctx, down)
		err := w.restart(context.WithoutCancel(ctx))
		w.event("daemon answers again")
		w.d.gate.Unlock()
		if err != nil {
			w.fail("restart after kill %d: %v", w.kills, err)
			w.abort()
			return
		}
	}
}

// restart starts the daemon again. On the full disk it may refuse to (its
// store needs some room to open): that is its promise, so the soak tries
// again every second, as an operator would, until space returns.
func (w *soakWorld) restart(ctx context.Context) error {
	for {
		err := w.d.start(ctx)
		if err == nil || !noSpace(err) || w.fill == nil || !w.fill.overlaps(time.Now(), time.Now(), 30*time.Second) {
			return err
		}
		w.mu.Lock()
		w.fullStarts++
		w.mu.Unlock()
		w.event("the daemon did not start on the full disk: %s", strings.TrimSpace(lastLine(err.Error())))
		if err := sleepCtx(ctx, time.Second); err != nil {
			return err
		}
	}
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	return s[strings.LastIndexByte(s, '\n')+1:]
}

// settle ends the chaos: one more kill -9 and start (whose store must open
// clean), every session back to running or asleep, and every command
// finished.
func (w *soakWorld) settle() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	w.d.gate.Lock()
	w.d.kill()
	err := w.d.start(ctx)
	w.d.gate.Unlock()
	if err != nil {
		w.t.Fatalf("soak: the last start: %v", err)
	}
	for _, ss := range w.sessions {
		if err := w.ready(ctx, ss); err != nil {
			w.fail("after the soak, session %s: %v", ss.name, err)
		}
	}
	deadline := time.Now().Add(5 * time.Minute)
	for _, ss := range w.sessions {
		for {
			l, err := w.client.Executions(ctx, ss.name, false)
			if err != nil {
				w.fail("executions of %s: %v", ss.name, err)
				break
			}
			if len(l) == 0 {
				break
			}
			if time.Now().After(deadline) {
				for _, x := range l {
					w.fail("execution %s of %s still %s 5 minutes after the soak: %q", x.ID, ss.name, x.State, strings.Join(x.Argv, " "))
				}
				break
			}
			sleepCtx(ctx, 500*time.Millisecond)
		}
	}
}

// keptLog copies the daemon's log out of the data directory (which goes
// with the test) for a failing run.
func (w *soakWorld) keptLog() string {
	dst := filepath.Join(os.TempDir(), fmt.Sprintf("berth-soak-%d.log", w.cfg.seed))
	b, err := os.ReadFile(w.d.logPath)
	if err != nil || os.WriteFile(dst, b, 0o644) != nil {
		return "(not kept)"
	}
	return dst
}

// raceBerth builds the berth command with the race detector and the
// lock-order checker (the daemon under test), the agent next to it.
func raceBerth(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	dir := t.TempDir()
	agent, err := vmmtest.AgentBinary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(agent)
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "berth-agent"), b, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []struct{ out, pkg string }{{"berth", "."}, {"berth-host", "./ui/app/cmd/berth-host"}} {
		cmd := exec.CommandContext(ctx, "go", "build", "-race", "-tags", "lockcheck", "-o", filepath.Join(dir, b.out), b.pkg)
		cmd.Dir = vmmtest.RepoRoot()
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build %s -race: %v\n%s", b.out, err, out)
		}
	}
	return filepath.Join(dir, "berth")
}

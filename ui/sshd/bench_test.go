package sshd

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/sessiontest"
)

// The benchmark runs the server in a child process (this test binary,
// running TestSSHBenchServerHelper) so its CPU time and RSS are the
// daemon side's alone; the clients run here.
const benchServerEnv = "BERTH_SSHD_BENCH_SERVER"

// TestSSHBenchServerHelper is the benchmark's server process: a Server in
// front of a fake with 20 sessions, plus an echo subsystem as the SSH
// round-trip baseline. It prints ADDR and HOSTKEY, answers "stats" on
// stdin with "STATS <cpu ns> <rss bytes>", and exits at EOF.
func TestSSHBenchServerHelper(t *testing.T) {
	dir := os.Getenv(benchServerEnv)
	if dir == "" {
		t.Skip("only runs as the child of TestBenchSSHTUI")
	}
	fake := sessiontest.New(sessiontest.Options{})
	defer fake.Close()
	for i := range 20 {
		if _, err := fake.Create(context.Background(), session.CreateOptions{Name: fmt.Sprintf("bench-%02d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	srv, err := New(fake, Options{Dir: dir, MaxConns: 1000, RatePerIP: -1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	srv.srv.SubsystemHandlers["bench-echo"] = func(s ssh.Session) { io.Copy(s, s) }
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	fmt.Printf("ADDR %s\nHOSTKEY %s", ln.Addr(), gossh.MarshalAuthorizedKey(srv.HostKey()))
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if in.Text() == "heap" {
			if f, err := os.Create(os.Getenv("BERTH_BENCH_HEAPPROFILE")); err == nil {
				runtime.GC()
				pprof.WriteHeapProfile(f)
				f.Close()
			}
			fmt.Printf("STATS 0 0\n")
		}
		if in.Text() == "stats" {
			var ru syscall.Rusage
			syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
			cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
			fmt.Printf("STATS %d %d\n", cpu.Nanoseconds(), rss())
		}
	}
	cancel()
	<-served
}

// rss reads this process's resident set size.
func rss() int64 {
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// benchServer is the child process.
type benchServer struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	out     *bufio.Scanner
	addr    string
	hostKey gossh.PublicKey
}

func startBenchServer(t *testing.T, k testKey) *benchServer {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, AuthorizedKeysFile), []byte(k.line()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSSHBenchServerHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), benchServerEnv+"="+dir)
	cmd.Stderr = os.Stderr
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	b := &benchServer{cmd: cmd, stdin: stdin, out: bufio.NewScanner(stdout)}
	t.Cleanup(func() {
		stdin.Close()
		cmd.Wait()
	})
	for b.addr == "" || b.hostKey == nil {
		if !b.out.Scan() {
			t.Fatal("the bench server exited before it listened")
		}
		f := strings.SplitN(b.out.Text(), " ", 2)
		switch f[0] {
		case "ADDR":
			b.addr = f[1]
		case "HOSTKEY":
			pk, _, _, _, err := gossh.ParseAuthorizedKey([]byte(f[1]))
			if err != nil {
				t.Fatal(err)
			}
			b.hostKey = pk
		}
	}
	return b
}

// stats returns the server's CPU time and RSS.
func (b *benchServer) stats(t *testing.T) (time.Duration, int64) { return b.stats2(t, "stats") }

func (b *benchServer) stats2(t *testing.T, req string) (time.Duration, int64) {
	io.WriteString(b.stdin, req+"\n")
	for b.out.Scan() {
		f := strings.Fields(b.out.Text())
		if len(f) == 3 && f[0] == "STATS" {
			cpu, _ := strconv.ParseInt(f[1], 10, 64)
			rss, _ := strconv.ParseInt(f[2], 10, 64)
			return time.Duration(cpu), rss
		}
	}
	t.Fatal("the bench server stopped answering")
	return 0, 0
}

func (b *benchServer) dial(t *testing.T, k testKey) *gossh.Client {
	c, err := gossh.Dial("tcp", b.addr, &gossh.ClientConfig{
		User: "bench", Auth: []gossh.AuthMethod{gossh.PublicKeys(k.signer)},
		HostKeyCallback: gossh.FixedHostKey(b.hostKey), Timeout: 30 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// notifyScreen is a screen that signals every read, for latency.
type notifyScreen struct {
	*screen
	read chan struct{}
}

func newNotifyScreen(r io.Reader) *notifyScreen {
	ns := &notifyScreen{read: make(chan struct{}, 1)}
	pr, pw := io.Pipe()
	ns.screen = newScreen(pr)
	go func() { // ends when r does
		b := make([]byte, 32<<10)
		for {
			n, err := r.Read(b)
			if n > 0 {
				pw.Write(b[:n])
				select {
				case ns.read <- struct{}{}:
				default:
				}
			}
			if err != nil {
				pw.CloseWithError(err)
				return
			}
		}
	}()
	return ns
}

// TestBenchSSHTUI: 50 SSH TUI sessions, each pressing a key every 100 ms
// (j and k in turn, which moves the selection and redraws two rows); the
// latency is from the key's write to the first output that redraws a
// row. Baseline: an echo over the same SSH server (the transport's round
// trip). Also reports the server process's CPU time and RSS growth.
//
//	BERTH_BENCH=1 go test -run TestBenchSSHTUI -v ./ui/sshd/
//
// BERTH_BENCH_SESSIONS and BERTH_BENCH_SECONDS override 50 and 10;
// BERTH_BENCH_HEAPPROFILE=FILE writes the server's heap profile at the end.
// The TUI renders at most 60 frames a second, so a key waits for the next
// frame: about 8 ms on average is the renderer's own floor.
func TestBenchSSHTUI(t *testing.T) {
	if os.Getenv("BERTH_BENCH") == "" {
		t.Skip("set BERTH_BENCH=1 to run the SSH TUI benchmark")
	}
	sessions, seconds := 50, 10
	if n, err := strconv.Atoi(os.Getenv("BERTH_BENCH_SESSIONS")); err == nil && n > 0 {
		sessions = n
	}
	if n, err := strconv.Atoi(os.Getenv("BERTH_BENCH_SECONDS")); err == nil && n > 0 {
		seconds = n
	}
	k := newKey(t, "bench", Operator)
	srv := startBenchServer(t, k)
	_, rss0 := srv.stats(t)

	// Baseline: echo round trips on one connection.
	c := srv.dial(t, k)
	es, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	ein, _ := es.StdinPipe()
	eout, _ := es.StdoutPipe()
	if err := es.RequestSubsystem("bench-echo"); err != nil {
		t.Fatal(err)
	}
	var echo []time.Duration
	one := make([]byte, 1)
	for range 300 {
		t0 := time.Now()
		ein.Write([]byte("x"))
		if _, err := io.ReadFull(eout, one); err != nil {
			t.Fatal(err)
		}
		echo = append(echo, time.Since(t0))
	}
	es.Close()

	// The TUI sessions, all on screen before the clock starts.
	type client struct {
		in io.Writer
		sc *notifyScreen
	}
	clients := make([]client, sessions)
	var wg sync.WaitGroup
	for i := range clients {
		conn := srv.dial(t, k)
		s, err := conn.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		if err := s.RequestPty("xterm-256color", 30, 110, gossh.TerminalModes{}); err != nil {
			t.Fatal(err)
		}
		in, _ := s.StdinPipe()
		out, _ := s.StdoutPipe()
		sc := newNotifyScreen(out)
		if err := s.Shell(); err != nil {
			t.Fatal(err)
		}
		clients[i] = client{in, sc}
	}
	for _, cl := range clients {
		cl.sc.waitFor(t, 0, "bench-19", 60*time.Second)
	}
	time.Sleep(500 * time.Millisecond)
	cpu1, _ := srv.stats(t)

	var mu sync.Mutex
	var lat []time.Duration
	missed := 0
	end := time.Now().Add(time.Duration(seconds) * time.Second)
	for i, cl := range clients {
		wg.Go(func() {
			// Spread the sessions over the 100 ms period.
			time.Sleep(time.Duration(i) * 100 * time.Millisecond / time.Duration(sessions))
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			var mine []time.Duration
			miss := 0
			for n := 0; time.Now().Before(end); n++ {
				<-tick.C
				select { // forget reads before the key
				case <-cl.sc.read:
				default:
				}
				mark := cl.sc.len()
				key := "j"
				if n%2 == 1 {
					key = "k"
				}
				t0 := time.Now()
				io.WriteString(cl.in, key)
				deadline := time.After(2 * time.Second)
			wait:
				for {
					select {
					case <-cl.sc.read:
						// The screen copies through a pipe: give it a moment.
						for range 20 {
							if strings.Contains(stripANSI(cl.sc.since(mark)), "bench-0") {
								mine = append(mine, time.Since(t0))
								break wait
							}
							time.Sleep(50 * time.Microsecond)
						}
					case <-deadline:
						miss++
						break wait
					}
				}
			}
			mu.Lock()
			lat = append(lat, mine...)
			missed += miss
			mu.Unlock()
		})
	}
	wg.Wait()
	cpu2, rss2 := srv.stats(t)
	if os.Getenv("BERTH_BENCH_HEAPPROFILE") != "" {
		srv.stats2(t, "heap")
	}

	pct := func(d []time.Duration, q float64) time.Duration {
		s := slices.Clone(d)
		slices.Sort(s)
		if len(s) == 0 {
			return 0
		}
		return s[min(len(s)-1, int(q*float64(len(s))))]
	}
	name := fmt.Sprintf("ssh TUI key→frame, %d sessions", sessions)
	p50, p99 := pct(lat, 0.5), pct(lat, 0.99)
	e50, e99 := pct(echo, 0.5), pct(echo, 0.99)
	t.Logf("BENCH %-40s %10s vs echo %10s  ratio %.2fx  (p50, frame every 16.7 ms; %d keys, %d missed)", name, p50.Round(time.Microsecond), e50.Round(time.Microsecond), float64(p50)/float64(e50), len(lat), missed)
	t.Logf("BENCH %-40s %10s vs echo %10s  ratio %.2fx  (p99; target ≤ 50 ms)", name, p99.Round(time.Microsecond), e99.Round(time.Microsecond), float64(p99)/float64(e99))
	cpu := cpu2 - cpu1
	t.Logf("BENCH %-40s %10s in %ds = %.0f%% of a core, %.2f%% per session", "ssh TUI daemon CPU", cpu.Round(time.Millisecond), seconds,
		100*cpu.Seconds()/float64(seconds), 100*cpu.Seconds()/float64(seconds)/float64(sessions))
	t.Logf("BENCH %-40s %8.1f MB total, %.0f KB per session", "ssh TUI daemon RSS growth", float64(rss2-rss0)/(1<<20), float64(rss2-rss0)/1024/float64(sessions))
	if missed > len(lat)/100 {
		t.Errorf("%d of %d keys got no frame within 2s", missed, len(lat)+missed)
	}
}

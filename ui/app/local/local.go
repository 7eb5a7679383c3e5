// Package local is what a client command of the berth command needs on
// its host and no more: the global flags' defaults, the process's
// terminal, and finding or starting the daemon. It links no engine, so
// that berth, which runs the client commands (exec, ls, …) itself, starts
// as a small program does; every other command it hands to berth-host,
// next to it, which links the daemon (ui/app). Linked into one binary, the
// daemon's packages (gVisor's stack, badger, etcd's client, prometheus)
// made every command's start about 7 ms slower: berth version took 12 ms,
// berth exec --help without them 4.
package local

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/term"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/api"
	"github.com/berthvm/berth/ui/cli"
)

// Host is the name of the binary next to berth that runs the commands
// of the daemon's host.
const Host = "berth-host"

// Main runs a berth command line (args without the program name) on the
// process's terminal and returns the exit code. Command lines that are
// not one of ui/cli's commands become berth-host, which knows them all;
// Main returns only when that fails. SIGINT and SIGTERM end its context.
func Main(args []string) int {
	if !cli.Handles(args) {
		return ExecHost(args)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return cli.Run(ctx, CLIEnv(Globals()), args)
}

// Globals are the global flags' defaults from the environment.
func Globals() *cli.Globals {
	return &cli.Globals{Data: DataDir(), Cache: CacheDir(), Host: os.Getenv("BERTH_HOST"), CertDir: os.Getenv("BERTH_CERT_DIR")}
}

// HostBinary is berth-host's path: next to the running executable, as
// berth-agent is.
func HostBinary() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find %s: %w", Host, err)
	}
	return filepath.Join(filepath.Dir(exe), Host), nil
}

// ExecHost replaces the process with berth-host running args. It returns
// only when it cannot, with the exit code after saying why on stderr.
func ExecHost(args []string) int {
	path, err := HostBinary()
	if err == nil {
		err = syscall.Exec(path, append([]string{"berth"}, args...), os.Environ())
		err = fmt.Errorf("run %s (%s, next to berth; make build or make install puts it there): %w", Host, path, err)
	}
	fmt.Fprintf(os.Stderr, "berth: %v\n", err)
	return cli.ExitFailed
}

// DataDir is the data directory when --data is not given: BERTH_DATA,
// else $XDG_DATA_HOME/berth, else ~/.local/share/berth.
func DataDir() string {
	if d := os.Getenv("BERTH_DATA"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "berth")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".local", "share", "berth")
}

// CacheDir is the cache directory when --cache is not given:
// BERTH_CACHE, else the user's cache directory's berth.
func CacheDir() string {
	if d := os.Getenv("BERTH_CACHE"); d != "" {
		return d
	}
	d, err := os.UserCacheDir()
	if err != nil {
		d = os.TempDir()
	}
	return filepath.Join(d, "berth")
}

// Connect finds the daemon on the data directory's socket, starting it in
// the background first when none answers (as tmux does).
func Connect(ctx context.Context, g cli.Globals, who string, quiet bool) (*api.Client, error) {
	if g.Host != "" {
		return connectHost(ctx, g, who)
	}
	sock := api.SocketPath(g.Data)
	c := api.Dial(sock, api.WithActor(who))
	// A connect, not a ping: the first real call is the check, and a
	// command such as exec saves a round trip.
	if c.Reachable(ctx) {
		return c, nil
	}
	var err error
	if err := os.MkdirAll(g.Data, 0o755); err != nil {
		return nil, err
	}
	host, err := HostBinary()
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(g.Data, "daemon.log")
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	d := exec.Command(host, "--data", g.Data, "--cache", g.Cache, "serve", "--log", logPath)
	d.Args[0] = "berth" // as ps shows it, and as berth serve's would be
	d.Stdout, d.Stderr = logf, logf
	d.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := d.Start(); err != nil {
		return nil, fmt.Errorf("start the daemon (%s): %w", host, err)
	}
	pid := d.Process.Pid
	d.Process.Release()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err = c.Ping(pctx)
		cancel()
		if err == nil {
			if !quiet {
				fmt.Fprintf(os.Stderr, "berth: started the daemon in the background (pid %d, log %s)\n", pid, logPath)
			}
			return c, nil
		}
		if syscall.Kill(pid, 0) != nil {
			return nil, fmt.Errorf("the daemon exited at start: %s", lastLine(logPath))
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil, fmt.Errorf("the daemon did not answer on %s within 15s (log: %s)", sock, logPath)
}

func lastLine(path string) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

// isDevNull reports whether f is /dev/null (scripts and harnesses run
// commands with it as stdin).
func isDevNull(f *os.File) bool {
	fi, err := f.Stat()
	if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return false
	}
	null, err := os.Stat(os.DevNull)
	return err == nil && os.SameFile(fi, null)
}

// CLIEnv is the process's terminal for cli.Run, connecting to the daemon
// of g's data directory (once Run has parsed the global flags into g).
func CLIEnv(g *cli.Globals) cli.Env {
	in, out, errf := int(os.Stdin.Fd()), int(os.Stdout.Fd()), int(os.Stderr.Fd())
	env := cli.Env{
		Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
		StdinTTY: term.IsTerminal(in), StdoutTTY: term.IsTerminal(out), StderrTTY: term.IsTerminal(errf),
		Term: os.Getenv("TERM"), Who: "cli", Globals: g,
	}
	env.StdinNull = isDevNull(os.Stdin)
	env.Connect = func(ctx context.Context) (session.Service, error) { return Connect(ctx, *g, "cli", false) }
	if os.Getenv("BERTH_TRACE") != "" {
		env.Trace = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	env.ConnectRunning = func(ctx context.Context) (session.Service, error) {
		var c *api.Client
		if g.Host != "" {
			var err error
			if c, err = dialHost(*g, "cli"); err != nil {
				return nil, err
			}
		} else {
			c = api.Dial(api.SocketPath(g.Data), api.WithActor("cli"))
		}
		if _, err := c.Ping(ctx); err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	}
	if w, h, err := term.GetSize(out); err == nil {
		env.Size = cli.TermSize{Rows: h, Cols: w}
	}
	env.MakeRaw = func() (func(), error) {
		st, err := term.MakeRaw(in)
		if err != nil {
			return nil, err
		}
		return func() { term.Restore(in, st) }, nil
	}
	env.SizeChanges = func(ctx context.Context) <-chan cli.TermSize {
		ch := make(chan cli.TermSize, 1)
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGWINCH)
		go func() {
			defer signal.Stop(sig)
			defer close(ch)
			for {
				select {
				case <-ctx.Done():
					return
				case <-sig:
					if w, h, err := term.GetSize(out); err == nil {
						select {
						case ch <- cli.TermSize{Rows: h, Cols: w}:
						default:
						}
					}
				}
			}
		}()
		return ch
	}
	return env
}

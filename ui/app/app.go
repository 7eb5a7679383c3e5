// Package app is the berth command's local side, its wiring: the global
// flags' defaults, finding or starting the daemon, and the commands that
// only make sense on the daemon's host (the TUI, serve, image build,
// doctor, ssh add-key, version), which it adds to ui/cli's table.
package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/term"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/api"
	"github.com/berthvm/berth/session/daemon"
	"github.com/berthvm/berth/ui"
	"github.com/berthvm/berth/ui/cli"
)

// Main runs the berth command line (args without the program name) on
// the process's terminal and returns the exit code. SIGINT and SIGTERM
// end its context.
func Main(args []string, version string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	g := &cli.Globals{Data: dataDir(), Cache: cacheDir()}
	return cli.Run(ctx, CLIEnv(g), args, Commands(version)...)
}

// Commands are the commands only the daemon's host runs, for cli.Run's
// table. They read the global flags from Env.Globals, which must be set.
func Commands(version string) []*cli.Command {
	return []*cli.Command{tuiCmd(), serveCmd(version), portForwardCmd(), imageBuildCmd(), imageImportCmd(), imageCommitCmd(), imageExportCmd(), imageLsCmd(), imageRmCmd(), hostLsCmd(), hostQuarantineCmd(), etcdCmd(), fleetInitCmd(), doctorCmd(), sshAddKeyCmd(), versionCmd(version)}
}

// The daemon's log in the background is rotated at logMax, logKeep old
// ones kept.
const (
	logMax  = 16 << 20
	logKeep = 3
)

// local is the group the overview lists these commands under.
const local = "This host"

// globals are the parsed global flags of c's command line.
func globals(c *cli.Call) cli.Globals { return *c.Env().Globals }

func dataDir() string {
	if d := os.Getenv("BERTH_DATA"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "berth")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".local", "share", "berth")
}

func cacheDir() string {
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
	sock := daemon.SocketPath(g.Data)
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
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(g.Data, "daemon.log")
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	d := exec.Command(exe, "--data", g.Data, "--cache", g.Cache, "serve", "--log", logPath)
	d.Stdout, d.Stderr = logf, logf
	d.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := d.Start(); err != nil {
		return nil, fmt.Errorf("start the daemon: %w", err)
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

// CLIEnv is the process's terminal for cli.Run, connecting to the daemon
// of g's data directory (once Run has parsed the global flags into g).
func CLIEnv(g *cli.Globals) cli.Env {
	in, out, errf := int(os.Stdin.Fd()), int(os.Stdout.Fd()), int(os.Stderr.Fd())
	env := cli.Env{
		Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
		StdinTTY: term.IsTerminal(in), StdoutTTY: term.IsTerminal(out), StderrTTY: term.IsTerminal(errf),
		Term: os.Getenv("TERM"), Who: "cli", Globals: g,
	}
	env.Connect = func(ctx context.Context) (session.Service, error) { return Connect(ctx, *g, "cli", false) }
	if os.Getenv("BERTH_TRACE") != "" {
		env.Trace = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	env.ConnectRunning = func(ctx context.Context) (session.Service, error) {
		c := api.Dial(daemon.SocketPath(g.Data), api.WithActor("cli"))
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

func tuiCmd() *cli.Command {
	return &cli.Command{
		Name: "", Summary: "open the TUI (starts the daemon if none answers)",
		Setup: func(*flag.FlagSet) cli.RunFunc {
			return func(ctx context.Context, c *cli.Call, _ []string) error {
				if !c.Env().StdoutTTY {
					return cli.Exit(cli.ExitUsage, "the terminal UI needs a terminal; use 'berth help' for the CLI")
				}
				// Its changes are recorded as the TUI's, not the CLI's
				// that Run's context names.
				ctx = session.WithActor(ctx, "tui")
				g := globals(c)
				client, err := Connect(ctx, g, "tui", true)
				if err != nil {
					return err
				}
				defer client.Close()
				sock := daemon.SocketPath(g.Data)
				err = ui.Run(ctx, client, ui.Options{ReadOnly: g.ReadOnly, Who: "tui", DaemonStatus: func() string { return sock }})
				if err != nil && !errors.Is(err, context.Canceled) {
					return err
				}
				return nil
			}
		},
	}
}

func serveCmd(version string) *cli.Command {
	return &cli.Command{
		Name: "serve", Group: local, Usage: "[--ssh ADDR] [--metrics ADDR [--metrics-public]] [--fleet URLS --host-id H [--listen ADDR] [--fleet-ca DIR]] [--ch-binary PATH] [--log FILE] [-v]",
		Summary: "run the daemon in the foreground",
		Help:    "Runs the daemon in the foreground: it owns the store and the VMs and serves\nthe API on <data>/berth.sock. SIGTERM stops it; VMs keep running. SIGQUIT\nwrites every goroutine's stack to its log and exits (VMs keep running): attach it\nto a bug report about a daemon that stopped answering.\nWith --metrics it also serves /metrics (Prometheus text format: per-session CPU,\nmemory, disk and execution figures, and the daemon's own) and /healthz over HTTP.\nWith --fleet it joins the fleet whose etcd answers there as host --host-id (in\nprogress: registration and berth host ls; sessions stay on the host they are made on).",
		Example: "berth serve --ssh :2222",
		Setup: func(fs *flag.FlagSet) cli.RunFunc {
			sshAddr := fs.String("ssh", "", "also serve the TUI, commands and sftp over SSH on `ADDR` (e.g. :2222)")
			metricsAddr := fs.String("metrics", "", "serve /metrics and /healthz on `ADDR` (a bare port such as 9464 means 127.0.0.1)")
			metricsPublic := fs.Bool("metrics-public", false, "allow a --metrics address other hosts can reach (every session's name and figures are shown)")
			ch := fs.String("ch-binary", "", "run cloud-hypervisor from `PATH` (default: cloud-hypervisor on PATH)")
			verbose := fs.Bool("v", false, "debug logging, and a line with the holder's stack for every engine lock held over 1 s")
			logPath := fs.String("log", "", "write the log to `FILE`, also the process's stderr, rotated at 16 MiB with three old ones kept (FILE.1 …)")
			var fc daemon.FleetConfig
			fs.StringVar(&fc.Endpoints, "fleet", "", "join the fleet whose etcd answers on `URLS` (comma-separated; or fleet in config.toml)")
			fs.StringVar(&fc.HostID, "host-id", "", "this host's `ID` in the fleet (or host_id in config.toml)")
			fs.StringVar(&fc.Listen, "listen", "", "the `ADDR` (HOST:PORT) recorded for other hosts to reach this one (or listen in config.toml)")
			fs.StringVar(&fc.CA, "fleet-ca", "", "reach etcd over mutual TLS with a certificate issued from (or loaded beside) the fleet CA in `DIR` (or fleet_ca in config.toml)")
			fs.DurationVar(&fc.TTL, "fleet-ttl", 0, "the host lease's time to live, `D` (default 10s; or fleet_ttl in config.toml)")
			return func(ctx context.Context, c *cli.Call, _ []string) error {
				g, stderr := globals(c), c.Env().Stderr
				if *logPath != "" {
					lf, err := openLogFile(*logPath, logMax, logKeep)
					if err != nil {
						return cli.Exit(cli.ExitFailed, err.Error())
					}
					defer lf.Close()
					stderr = lf
				}
				level := slog.LevelInfo
				var lockWatch time.Duration
				if *verbose {
					level, lockWatch = slog.LevelDebug, time.Second
				}
				log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
				o := daemon.Options{
					DataDir: g.Data, CacheDir: g.Cache, CHBinary: *ch, Version: version, Logger: log, Out: stderr,
					Metrics: *metricsAddr, MetricsPublic: *metricsPublic, LockWatch: lockWatch, Fleet: fc,
					// The end-to-end tests set these on the berth serve they start.
					CrashAt: os.Getenv("BERTH_CRASH_AT"), NoTemplates: os.Getenv("BERTH_NO_TEMPLATES") != "",
					Hosts: os.Getenv("BERTH_TEST_HOSTS"),
				}
				if *sshAddr != "" {
					if _, p, err := net.SplitHostPort(*sshAddr); err == nil {
						if n, err := strconv.Atoi(p); err == nil {
							o.Forbidden = append(o.Forbidden, n) // no session's egress reaches it
						}
					}
					o.Extra = append(o.Extra, sshServer(g, *sshAddr, log, stderr))
				}
				if err := daemon.Run(ctx, o); err != nil {
					// All of it: the shutdown's errors come joined, a line each.
					return cli.Exit(cli.ExitFailed, strings.ReplaceAll(err.Error(), "\n", "; "))
				}
				return nil
			}
		},
	}
}

func versionCmd(version string) *cli.Command {
	return &cli.Command{
		Name: "version", Aliases: []string{"--version"}, Group: local,
		Summary: "print berth's version",
		Example: "berth version",
		Setup: func(*flag.FlagSet) cli.RunFunc {
			return func(_ context.Context, c *cli.Call, _ []string) error {
				_, err := fmt.Fprintln(c.Env().Stdout, "berth", version)
				return err
			}
		},
	}
}

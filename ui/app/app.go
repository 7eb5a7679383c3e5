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
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/api"
	"github.com/berthvm/berth/session/daemon"
	"github.com/berthvm/berth/ui"
	"github.com/berthvm/berth/ui/app/local"
	"github.com/berthvm/berth/ui/cli"
	"github.com/berthvm/berth/ui/mcpserver"
)

// Main runs the berth command line (args without the program name) on
// the process's terminal and returns the exit code. SIGINT and SIGTERM
// end its context.
func Main(args []string, version string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	g := local.Globals()
	env := local.CLIEnv(g)
	env.MCP = mcpserver.Stdio
	return cli.Run(ctx, env, args, Commands(version)...)
}

// Commands are the commands only the daemon's host runs, for cli.Run's
// table. They read the global flags from Env.Globals, which must be set.
func Commands(version string) []*cli.Command {
	return []*cli.Command{tuiCmd(), serveCmd(version), portForwardCmd(), imageBuildCmd(), imageImportCmd(), imageCommitCmd(), imageExportCmd(), imageLsCmd(), imageRmCmd(), hostLsCmd(), hostDrainCmd(), hostUndrainCmd(), hostQuarantineCmd(), etcdCmd(), fleetInitCmd(), fleetCertCmd(), doctorCmd(), sshAddKeyCmd(), versionCmd(version)}
}

// The daemon's log in the background is rotated at logMax, logKeep old
// ones kept.
const (
	logMax  = 16 << 20
	logKeep = 3
)

// hostGroup is the group the overview lists these commands under.
const hostGroup = "This host"

// globals are the parsed global flags of c's command line.
func globals(c *cli.Call) cli.Globals { return *c.Env().Globals }

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
				client, err := local.Connect(ctx, g, "tui", true)
				if err != nil {
					return err
				}
				defer client.Close()
				sock := api.SocketPath(g.Data)
				if g.Host != "" {
					sock = g.Host
				}
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
		Name: "serve", Group: hostGroup, Usage: "[--ssh ADDR] [--metrics ADDR [--metrics-public]] [--fleet URLS --host-id H [--listen ADDR] [--fleet-ca DIR]] [--ch-binary PATH] [--log FILE] [-v]",
		Summary: "run the daemon in the foreground",
		Help:    "Runs the daemon in the foreground: it owns the store and the VMs and serves\nthe API on <data>/berth.sock. SIGTERM stops it; VMs keep running. SIGQUIT\nwrites every goroutine's stack to its log and exits (VMs keep running): attach it\nto a bug report about a daemon that stopped answering.\nWith --metrics it also serves /metrics (Prometheus text format: per-session CPU,\nmemory, disk and execution figures, and the daemon's own) and /healthz over HTTP.\nWith --fleet it joins the fleet whose etcd answers there as host --host-id and is one\nof its front doors: every session of the fleet is reached through it, served by its\nowner; new sessions are placed. --listen serves the API to other hosts and operators\n(berth --host): mutual TLS with --fleet-ca, else plain text on loopback only.",
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
			fs.StringVar(&fc.Listen, "listen", "", "serve the API to the fleet's hosts and operators on `ADDR` (HOST:PORT; port 0 takes one), and record it (or listen in config.toml)")
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
					ForwardViaAgent: os.Getenv("BERTH_FORWARD_VIA_AGENT") != "",
					Hosts:           os.Getenv("BERTH_TEST_HOSTS"),
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
		Name: "version", Aliases: []string{"--version"}, Group: hostGroup,
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

// Package app is the berth command's local side: global flags, finding
// or starting the daemon, and the commands that only make sense on the
// daemon's host (serve, image, doctor, the TUI). main dispatches to it and
// to ui/cli.
package app

import (
	"context"
	"errors"
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

	"github.com/berthvm/berth/guest/image"
	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/api"
	"github.com/berthvm/berth/session/daemon"
	"github.com/berthvm/berth/ui"
	"github.com/berthvm/berth/ui/cli"
)

// Globals are the flags valid before any command.
type Globals struct {
	Data, Cache string
	ReadOnly    bool // TUI: hide and refuse every change
}

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

// ParseGlobals takes --data DIR, --cache DIR and --readonly from the front.
func ParseGlobals(args []string) (Globals, []string, error) {
	g := Globals{Data: dataDir(), Cache: cacheDir()}
	for len(args) > 0 {
		a := args[0]
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		switch {
		case !strings.HasPrefix(a, "-"):
			g.absData()
			return g, args, nil
		case name == "readonly" && !hasVal:
			g.ReadOnly = true
			args = args[1:]
			continue
		case name == "data" || name == "cache":
			if !hasVal {
				if len(args) < 2 {
					return g, nil, fmt.Errorf("--%s needs a directory", name)
				}
				val, args = args[1], args[1:]
			}
			if name == "data" {
				g.Data = val
			} else {
				g.Cache = val
			}
			args = args[1:]
			continue
		}
		g.absData()
		return g, args, nil
	}
	g.absData()
	return g, args, nil
}

// ExtraHelp lists the commands main handles itself.
const ExtraHelp = `
Also:
  berth                      open the terminal UI (starts the daemon if needed)
  berth serve [--ssh ADDR]   run the daemon in the foreground
  berth image build [mini]   build the guest image
  berth doctor               which hypervisors and accelerators work here
  berth version

Global flags (before the command): --data DIR (or BERTH_DATA), --cache DIR
(or BERTH_CACHE), --readonly (TUI: no changes).
`

// Connect finds the daemon on the data directory's socket, starting it in
// the background first when none answers (as tmux does).
func Connect(ctx context.Context, g Globals, who string, quiet bool) (*api.Client, error) {
	sock := daemon.SocketPath(g.Data)
	c := api.Dial(sock, api.WithActor(who))
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, err := c.Ping(pctx)
	cancel()
	if err == nil {
		return c, nil
	}
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
	d := exec.Command(exe, "--data", g.Data, "--cache", g.Cache, "serve")
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

func CLIEnv(g Globals) cli.Env {
	in, out, errf := int(os.Stdin.Fd()), int(os.Stdout.Fd()), int(os.Stderr.Fd())
	env := cli.Env{
		Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
		StdinTTY: term.IsTerminal(in), StdoutTTY: term.IsTerminal(out), StderrTTY: term.IsTerminal(errf),
		Term: os.Getenv("TERM"), Who: "cli",
	}
	env.Connect = func(ctx context.Context) (session.Service, error) { return Connect(ctx, g, "cli", false) }
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

func TUI(ctx context.Context, g Globals) int {
	if !term.IsTerminal(int(os.Stdout.Fd())) {
		fmt.Fprintln(os.Stderr, "berth: the terminal UI needs a terminal; use 'berth help' for the CLI")
		return 2
	}
	c, err := Connect(ctx, g, "tui", true)
	if err != nil {
		fmt.Fprintln(os.Stderr, "berth:", err)
		return 1
	}
	defer c.Close()
	sock := daemon.SocketPath(g.Data)
	err = ui.Run(ctx, c, ui.Options{ReadOnly: g.ReadOnly, Who: "tui", DaemonStatus: func() string { return sock }})
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "berth:", err)
		return 1
	}
	return 0
}

func Serve(ctx context.Context, g Globals, args []string, version string) int {
	fs := newFlagSet("serve", "berth serve [--ssh ADDR] [--ch-binary PATH]\n\nRuns the daemon in the foreground: it owns the store and the VMs and serves\nthe API on <data>/berth.sock. SIGTERM stops it; VMs keep running.")
	sshAddr := fs.String("ssh", "", "also serve the TUI, commands and sftp over SSH on `ADDR` (e.g. :2222)")
	ch := fs.String("ch-binary", "", "cloud-hypervisor binary (default: cloud-hypervisor on PATH)")
	verbose := fs.Bool("v", false, "debug logging")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	o := daemon.Options{
		DataDir: g.Data, CacheDir: g.Cache, CHBinary: *ch, Version: version, Logger: log, Out: os.Stderr,
		// The end-to-end tests set these on the berth serve they start.
		CrashAt: os.Getenv("BERTH_CRASH_AT"), NoTemplates: os.Getenv("BERTH_NO_TEMPLATES") != "",
	}
	if *sshAddr != "" {
		o.Extra = append(o.Extra, sshServer(g, *sshAddr, log))
	}
	if err := daemon.Run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "berth:", err)
		return 1
	}
	return 0
}

func Image(ctx context.Context, g Globals, args []string) int {
	if len(args) == 0 || args[0] != "build" {
		fmt.Fprintln(os.Stderr, "berth: usage: berth image build [NAME]   (images: "+strings.Join(image.Names(), ", ")+")")
		return 2
	}
	fs := newFlagSet("image build", "berth image build [--agent PATH] [NAME]\n\nBuilds a guest image (default mini): the Debian kernel, fetched with apt-get\ndownload and unpacked into the cache (never installed), and an initramfs with\nthe berth agent, busybox and the kernel modules the agent needs. A second run\nwith the same inputs does nothing.")
	agent := fs.String("agent", daemon.DefaultAgent(), "the static guest agent binary")
	if code, ok := parse(fs, args[1:]); !ok {
		return code
	}
	name := "mini"
	if fs.NArg() > 1 {
		fmt.Fprintln(os.Stderr, "berth: image build takes one image name")
		return 2
	}
	if fs.NArg() == 1 {
		name = fs.Arg(0)
	}
	_, _, err := image.Build(ctx, image.Options{Name: name, ImagesDir: filepath.Join(g.Data, "images"), CacheDir: g.Cache, Agent: *agent, Progress: os.Stdout})
	if err != nil {
		fmt.Fprintln(os.Stderr, "berth:", err)
		return 1
	}
	return 0
}

// absData makes the data directory absolute: the daemon and the VMs it
// starts run in other working directories.
func (g *Globals) absData() {
	if abs, err := filepath.Abs(g.Data); err == nil {
		g.Data = abs
	}
}

// Command berth-agent is the init process (PID 1) of every berth VM. Built
// static (CGO_ENABLED=0) and placed at /init in the guest image.
//
// Run as any other pid it serves a directory over a unix socket, which
// tests use to exercise the real binary without a VM:
//
//	berth-agent -workspace DIR -listen SOCKET
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/guest/agent"
)

// build is set by the image builder through -ldflags.
var build = "dev"

func main() {
	if os.Getpid() == 1 {
		initVM()
		return
	}
	if err := serveDev(); err != nil {
		fmt.Fprintln(os.Stderr, "berth-agent:", err)
		os.Exit(1)
	}
}

func serveDev() error {
	ws := flag.String("workspace", "", "directory to serve as /workspace")
	listen := flag.String("listen", "", "unix socket to serve the agent protocol on")
	flag.Parse()
	if *listen == "" {
		return fmt.Errorf("not PID 1: pass -listen SOCKET (and -workspace DIR) to serve a directory")
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	a, err := agent.New(agent.Config{Workspace: *ws, Build: build, Logger: log})
	if err != nil {
		return err
	}
	os.Remove(*listen)
	l, err := net.Listen("unix", *listen)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	context.AfterFunc(ctx, func() { l.Close() })
	for {
		c, err := l.Accept()
		if err != nil {
			return nil
		}
		go a.ServeConn(ctx, c)
	}
}

// initVM brings the VM up. Failures to mount the workspace do not stop the
// agent: it serves and answers every call with the reason, so the host
// sees a clear error instead of a VM that never answers.
func initVM() {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	// The kernel starts init without PATH; commands are looked up in it.
	os.Setenv("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
	if err := agent.MountBase(); err != nil {
		log.Error("base mounts", "err", err)
	}
	b, _ := os.ReadFile("/proc/cmdline")
	cmdline := agent.ParseCmdline(string(b))
	if _, ok := cmdline["berth.probe"]; ok {
		// The trivial init used to measure bare boot time and to probe
		// whether KVM works: up, then straight off.
		agent.PowerOff()
	}
	start := time.Now()
	if err := agent.LoadModules(log); err != nil {
		log.Error("modules", "err", err)
	}
	log.Info("modules loaded", "took", time.Since(start))

	cfg := agent.Config{PID1: true, Build: build, Logger: log, Home: "/root", PowerOff: agent.PowerOff}
	// Root filesystem images: the read-only layers are the same for every
	// session of the image, so they are mounted at boot, templates
	// included; the system disk is the session's own.
	var layers []string
	if l := cmdline["berth.layers"]; l != "" {
		var err error
		if layers, err = agent.MountLayers(strings.Split(l, ","), 5*time.Second); err != nil {
			log.Error("image layers", "err", err)
			cfg.SystemInfo.Error = err.Error()
		}
	}
	switchRoot := func(uuid string) (*os.File, string, error) {
		if layers == nil {
			return nil, "", fmt.Errorf("cannot mount the system disk: %s", orElse(cfg.SystemInfo.Error, "this image has no root layers"))
		}
		return agent.SwitchRoot(layers, uuid, 5*time.Second)
	}
	var system *os.File
	cfg.Mount = func(spec guest.MountSpec) (agent.Mounted, error) {
		var m agent.Mounted
		start := time.Now()
		if spec.System != "" && system == nil {
			sys, dev, err := switchRoot(spec.System)
			if err != nil {
				return m, err
			}
			system, m.System, m.SystemDevice = sys, sys, dev
		}
		rooted := time.Since(start)
		if err := agent.SetIdentity(spec.Hostname, spec.MachineID); err != nil {
			log.Warn("identity", "err", err)
		}
		if spec.NICMAC != "" {
			// A template's NIC came with the template's MAC.
			if err := agent.SetNICMAC(spec.NICMAC); err != nil {
				log.Warn("network", "err", err)
			}
		}
		if err := agent.SetupNet(); err != nil {
			log.Warn("network", "err", err)
		}
		named := time.Since(start)
		dev, err := agent.MountWorkspace(spec.Workspace, agent.WorkspaceDir, 10*time.Second)
		m.Workspace, m.Device = agent.WorkspaceDir, dev
		log.Info("mounted", "root", rooted, "identity", named, "workspace", time.Since(start))
		return m, err
	}
	rootOK := true
	if uuid := cmdline["berth.sys"]; uuid != "" && uuid != "none" {
		sys, dev, err := switchRoot(uuid)
		if err != nil {
			log.Error("system disk not mounted", "err", err)
			cfg.SystemInfo = guest.Workspace{UUID: uuid, Error: err.Error()}
			rootOK = false
		} else {
			system, cfg.System = sys, sys
			cfg.SystemInfo = guest.Workspace{Mounted: true, Device: dev, UUID: uuid}
		}
	}
	cfg.Hostname = cmdline["berth.name"]
	if err := agent.SetIdentity(cfg.Hostname, cmdline["berth.mid"]); err != nil {
		log.Warn("identity", "err", err)
	}
	if err := agent.SetupNet(); err != nil {
		log.Warn("network", "err", err)
	}
	cfg.Proxy, cfg.DNS = guest.ProxyAddr, guest.DNSAddr
	if uuid := cmdline["berth.ws"]; !rootOK {
		// Nothing may run on the initramfs as if it were the session's
		// system: the host sees why and names berth replace.
		cfg.WorkspaceError = "the system disk is not mounted: " + cfg.SystemInfo.Error
	} else if uuid != "" && uuid != "none" {
		dev, err := agent.MountWorkspace(uuid, agent.WorkspaceDir, 5*time.Second)
		if err != nil {
			log.Error("workspace not mounted", "err", err)
			cfg.WorkspaceError = err.Error()
		} else {
			cfg.Workspace, cfg.Device, cfg.UUID = agent.WorkspaceDir, dev, uuid
		}
	} else {
		cfg.WorkspaceError = "no workspace volume attached yet"
	}
	a, err := agent.New(cfg)
	if err != nil {
		log.Error("agent", "err", err)
		cfg.Workspace, cfg.WorkspaceError = "", err.Error()
		a, _ = agent.New(cfg)
	}

	ctx := context.Background()
	sigchld := make(chan os.Signal, 1)
	signal.Notify(sigchld, syscall.SIGCHLD)
	go a.Reap(ctx, sigchld)
	// PID 1 must not die of a stray signal (the kernel would panic), but it
	// must not ignore them either: ignored signals stay ignored in the
	// commands it starts. Catching them is both.
	caught := make(chan os.Signal, 8)
	signal.Notify(caught, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	go func() {
		for range caught {
		}
	}()

	go func() {
		if err := a.ServeNet(ctx); err != nil {
			log.Error("network services", "err", err)
		}
	}()
	served := false
	if port, err := agent.FindPort(guest.PortName, 2*time.Second); err == nil {
		f, err := os.OpenFile(port, os.O_RDWR, 0)
		if err != nil {
			log.Error("open agent port", "port", port, "err", err)
		} else {
			served = true
			go a.ServePort(ctx, f)
		}
	}
	if l, err := agent.ListenVsock(); err == nil {
		served = true
		go a.ServeVsock(ctx, l)
	}
	if !served {
		log.Error("no agent channel: neither a virtio-serial port named " + guest.PortName + " nor vsock")
	}
	log.Info("agent ready", "boot", time.Since(start))
	select {}
}

func orElse(s, alt string) string {
	if s == "" {
		return alt
	}
	return s
}

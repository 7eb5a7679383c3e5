package chfake

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Environment variables that shape the fake when it runs as a process.
const (
	// EnvFake set to "1" tells a test binary's TestMain to run Main
	// instead of the tests.
	EnvFake = "BERTH_FAKE_CH"
	// EnvFail makes the VMM fail: "start" exits with status 1 before the
	// API is up, "hang" never binds the API socket, "boot" dies with
	// status 101 (a Rust panic) when vm.boot arrives.
	EnvFail = "BERTH_FAKE_CH_FAIL"
	// EnvStartDelay delays binding the API socket (a slow VMM start).
	EnvStartDelay = "BERTH_FAKE_CH_START_DELAY"
	// EnvBootDelay makes vm.boot take this long, holding the API thread.
	EnvBootDelay = "BERTH_FAKE_CH_BOOT_DELAY"
	// EnvGuestDelay is how long after boot or restore the guest agent
	// starts listening on AgentPort.
	EnvGuestDelay = "BERTH_FAKE_CH_GUEST_DELAY"
)

// AgentPort is where the process-mode guest runs EchoGuest; it matches
// cloudhypervisor.AgentPort (which this package cannot import).
const AgentPort = 1024

// Greeting is the line EchoGuest sends first, before echoing. A dialer
// that reads past the OK line would swallow it.
const Greeting = "chfake guest ready\n"

// EchoGuest is a guest service: it sends Greeting, then echoes every
// byte until the connection closes.
func EchoGuest(c net.Conn) {
	if _, err := io.WriteString(c, Greeting); err != nil {
		return
	}
	io.Copy(c, c)
}

// Main runs the fake as a stand-in for the cloud-hypervisor binary and
// returns its exit status. args are the command-line arguments after the
// program name: "--api-socket path=P" (or a bare P); other flags are
// accepted and ignored. It serves until vmm.shutdown or a guest poweroff
// (status 0) or until killed. The Env* variables select misbehaviour.
func Main(args []string) int {
	logf := func(format string, a ...any) {
		fmt.Fprintf(os.Stderr, "chfake: "+format+"\n", a...)
	}
	sock := apiSocketArg(args)
	if sock == "" {
		logf("Error: --api-socket is required")
		return 1
	}
	logf("cloud-hypervisor %s pid %d", Version, os.Getpid())
	switch os.Getenv(EnvFail) {
	case "start":
		logf("Error starting VMM: simulated failure before the API came up")
		return 1
	case "hang":
		logf("simulating a VMM that never binds its API socket")
		for {
			time.Sleep(time.Hour) // until killed; select{} would trip the deadlock detector
		}
	}
	if d := envDuration(EnvStartDelay); d > 0 {
		time.Sleep(d) // the slow start being simulated
	}

	opts := Options{
		Logf:   logf,
		Delays: map[string]time.Duration{"vm.boot": envDuration(EnvBootDelay)},
		OnRunning: func(s *Server) {
			// Like an agent started by init some time after boot.
			time.AfterFunc(envDuration(EnvGuestDelay), func() { s.Listen(AgentPort, EchoGuest) })
		},
	}
	if os.Getenv(EnvFail) == "boot" {
		opts.BeforeAction = func(op string) {
			if op == "vm.boot" {
				logf("thread 'vmm' panicked: simulated crash while booting the VM")
				os.Exit(101)
			}
		}
	}
	s := New(opts)
	if err := s.Serve(sock); err != nil {
		logf("Error starting VMM: %v", err)
		return 1
	}
	<-s.Exited()
	s.Close()
	logf("VMM exiting with status %d", s.ExitCode())
	return s.ExitCode()
}

// WriteLauncher writes an executable script into dir that runs the
// current executable as the fake (EnvFake=1) with env ("KEY=VALUE") set,
// and returns its path: point the driver's binary at it. The current
// executable must be a test binary whose TestMain runs Main when EnvFake
// is "1". A script keeps the behaviour per launcher, so tests need no
// process-wide Setenv.
func WriteLauncher(dir string, env ...string) (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString("#!/bin/sh\n")
	fmt.Fprintf(&b, "export %s=1\n", EnvFake)
	for _, e := range env {
		k, v, _ := strings.Cut(e, "=")
		fmt.Fprintf(&b, "export %s=%s\n", k, shellQuote(v))
	}
	fmt.Fprintf(&b, "exec %s \"$@\"\n", shellQuote(exe))
	path := filepath.Join(dir, "cloud-hypervisor")
	if err := os.WriteFile(path, []byte(b.String()), 0o755); err != nil {
		return "", err
	}
	return path, nil
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func apiSocketArg(args []string) string {
	for i, a := range args {
		v, ok := strings.CutPrefix(a, "--api-socket=")
		if !ok && a == "--api-socket" && i+1 < len(args) {
			v, ok = args[i+1], true
		}
		if ok {
			// "path=P", possibly with more comma-separated options, or a
			// bare path.
			for _, part := range strings.Split(v, ",") {
				if p, ok := strings.CutPrefix(part, "path="); ok {
					return p
				}
			}
			return v
		}
	}
	return ""
}

func envDuration(key string) time.Duration {
	d, _ := time.ParseDuration(os.Getenv(key))
	return d
}

package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/ui/app/local"
	"github.com/berthvm/berth/ui/cli"
	"github.com/berthvm/berth/ui/portfwd"
)

func portForwardCmd() *cli.Command {
	return &cli.Command{
		Name: "port-forward", Action: session.ActionNet, Group: hostGroup, Usage: "NAME [LOCAL:]REMOTE...", Args: []string{"NAME", "PORT..."},
		Summary: "forward host loopback ports into a session's VM",
		Help: "Listens on 127.0.0.1:LOCAL on this host (LOCAL defaults to REMOTE; 0 picks a free port)\n" +
			"and carries each connection over the agent channel to 127.0.0.1:REMOTE inside the VM, so\n" +
			"it needs no network policy and reaches servers bound to the guest's loopback. A sleeping\n" +
			"session is woken by the first connection; a connection to a port nobody listens on is\n" +
			"closed and reported while the forward stays up. Ctrl-C stops it.\n" +
			"Over berth's SSH server use ssh -L instead: ssh -L 8080:localhost:8080 -p 2222 NAME@HOST.",
		Example: "berth port-forward demo 8080\nberth port-forward demo 9000:8000 5432",
		Setup: func(fs *flag.FlagSet) cli.RunFunc {
			return func(ctx context.Context, c *cli.Call, args []string) error {
				return runPortForward(ctx, c, args)
			}
		},
	}
}

func runPortForward(ctx context.Context, c *cli.Call, args []string) error {
	name := args[0]
	var specs []portfwd.Spec
	for _, a := range args[1:] {
		sp, err := portfwd.ParseSpec(a)
		if err != nil {
			return cli.Exit(cli.ExitUsage, err.Error())
		}
		specs = append(specs, sp)
	}
	client, err := local.Connect(ctx, globals(c), "cli", true)
	if err != nil {
		return err
	}
	defer client.Close()
	if _, err := client.Get(ctx, name); err != nil {
		return err
	}
	return forward(ctx, client, name, specs, c.Env().Stdout, c.Env().Stderr)
}

// forward listens, says where, and serves until ctx ends.
func forward(ctx context.Context, svc portfwd.Forwarder, name string, specs []portfwd.Spec, stdout, stderr io.Writer) error {
	ls, err := portfwd.Listen(specs)
	if err != nil {
		return err
	}
	for _, l := range ls {
		fmt.Fprintf(stdout, "forwarding %s -> %s:%d\n", l.Addr, name, l.Remote)
	}
	var mu sync.Mutex
	portfwd.Serve(ctx, svc, name, ls, func(ev portfwd.Event) {
		if ev.Err == nil {
			return
		}
		msg := ev.Err.Error()
		if errors.Is(ev.Err, session.ErrNotFound) || errors.Is(ev.Err, session.ErrInvalidState) {
			msg += " (the forward stays up)"
		}
		mu.Lock()
		fmt.Fprintf(stderr, "berth: port %d: %s\n", ev.Spec.Local, strings.TrimSpace(msg))
		mu.Unlock()
	})
	return nil
}

// Command berth runs persistent, VM-isolated work sessions: a microVM plus
// a durable /workspace volume each, watched and steered from a terminal UI,
// the CLI, or SSH. This file only dispatches subcommands.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/berthvm/berth/ui/app"
	"github.com/berthvm/berth/ui/cli"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() { os.Exit(run()) }

func run() int {
	g, args, err := app.ParseGlobals(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "berth:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	cmd := ""
	if len(args) > 0 {
		cmd = args[0]
	}
	switch cmd {
	case "":
		return app.TUI(ctx, g)
	case "serve":
		return app.Serve(ctx, g, args[1:], version)
	case "image":
		return app.Image(ctx, g, args[1:])
	case "doctor":
		return app.Doctor(ctx, g)
	case "ssh":
		return app.SSH(ctx, g, args[1:])
	case "version", "--version":
		fmt.Println("berth", version)
		return 0
	case "help", "-h", "--help":
		defer fmt.Print(app.ExtraHelp)
	}
	return cli.Run(ctx, app.CLIEnv(g), args)
}

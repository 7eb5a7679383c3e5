// Command berth runs persistent, VM-isolated work sessions: a microVM plus
// a durable /workspace volume each, watched and steered from a terminal UI,
// the CLI, or SSH. Its commands are one table, in ui/cli, which ui/app
// completes with the commands of the daemon's host.
package main

import (
	"os"

	"github.com/berthvm/berth/ui/app"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() { os.Exit(app.Main(os.Args[1:], version)) }

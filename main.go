// Command berth runs persistent, VM-isolated work sessions: a microVM plus
// a durable /workspace volume each, watched and steered from a terminal UI,
// the CLI, or SSH. Its commands are one table, in ui/cli, which ui/app
// completes with the commands of the daemon's host. This binary runs
// ui/cli's commands itself and links no daemon, so that they start fast;
// it becomes berth-host, next to it, for every other command line.
package main

import (
	"os"

	"github.com/berthvm/berth/ui/app/local"
)

func main() { os.Exit(local.Main(os.Args[1:])) }

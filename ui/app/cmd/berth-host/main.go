// Command berth-host runs every berth command line, the daemon's (serve,
// image build, doctor, …) among them; berth, next to it, becomes it for
// those, and runs the client commands itself without the daemon's
// start-up cost (see ui/app/local).
package main

import (
	"os"

	"github.com/berthvm/berth/ui/app"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() { os.Exit(app.Main(os.Args[1:], version)) }

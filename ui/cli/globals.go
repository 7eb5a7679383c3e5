package cli

import (
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"
)

// Globals are the flags that go before the command on the daemon's host:
// berth [--data DIR] [--cache DIR] [--host tcp://HOST:PORT [--cert-dir DIR]] [--readonly] [COMMAND].
type Globals struct {
	Data, Cache string
	// Host, when set, is a fleet host's API address (tcp://HOST:PORT)
	// to reach instead of the data directory's socket; CertDir holds
	// the client certificate it takes (berth fleet cert).
	Host, CertDir string
	ReadOnly      bool // TUI: hide and refuse every change
}

// globalFlags binds the global flags to g, its values the defaults.
func globalFlags(g *Globals) *flag.FlagSet {
	fs := flag.NewFlagSet("berth", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fs.StringVar(&g.Data, "data", g.Data, "keep sessions, images and the socket in `DIR` (or BERTH_DATA; default $XDG_DATA_HOME/berth)")
	fs.StringVar(&g.Cache, "cache", g.Cache, "keep downloads and build caches in `DIR` (or BERTH_CACHE)")
	fs.StringVar(&g.Host, "host", g.Host, "reach the berth of a fleet's host at `tcp://HOST:PORT` instead of the local socket (or BERTH_HOST)")
	fs.StringVar(&g.CertDir, "cert-dir", g.CertDir, "the client certificate for --host, from berth fleet cert, in `DIR` (or BERTH_CERT_DIR)")
	fs.BoolVar(&g.ReadOnly, "readonly", g.ReadOnly, "the TUI: hide and refuse every change")
	return fs
}

// parseGlobals takes the global flags from the front of args into g and
// returns the rest, from the first argument that is not one ("ls",
// "--version", "--help"). It makes g.Data absolute: the daemon and the
// VMs it starts run in other working directories.
func parseGlobals(g *Globals, args []string) ([]string, error) {
	fs := globalFlags(g)
	for len(args) > 0 && strings.HasPrefix(args[0], "-") {
		name, _, hasValue := strings.Cut(strings.TrimLeft(args[0], "-"), "=")
		f := fs.Lookup(name)
		if f == nil {
			break
		}
		n := 1 // one flag at a time: the next argument may be a command
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !hasValue && !(ok && b.IsBoolFlag()) {
			if len(args) < 2 {
				what := "a directory"
				if name == "host" {
					what = "an address, tcp://HOST:PORT"
				}
				return nil, fmt.Errorf("--%s needs %s", name, what)
			}
			n = 2
		}
		if err := fs.Parse(args[:n]); err != nil {
			return nil, err
		}
		args = args[n:]
	}
	if abs, err := filepath.Abs(g.Data); err == nil {
		g.Data = abs
	}
	return args, nil
}

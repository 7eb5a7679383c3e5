package cli

import (
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"
)

// Globals are the flags that go before the command on the daemon's host:
// berth [--data DIR] [--cache DIR] [--readonly] [COMMAND].
type Globals struct {
	Data, Cache string
	ReadOnly    bool // TUI: hide and refuse every change
}

// globalFlags binds the global flags to g, its values the defaults.
func globalFlags(g *Globals) *flag.FlagSet {
	fs := flag.NewFlagSet("berth", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fs.StringVar(&g.Data, "data", g.Data, "keep sessions, images and the socket in `DIR` (or BERTH_DATA; default $XDG_DATA_HOME/berth)")
	fs.StringVar(&g.Cache, "cache", g.Cache, "keep downloads and build caches in `DIR` (or BERTH_CACHE)")
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
				return nil, fmt.Errorf("--%s needs a directory", name)
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

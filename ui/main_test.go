package ui

import (
	"flag"
	"os"
	"testing"

	"github.com/berthvm/berth/ui/internal/uitest"
)

// TestMain runs the tests, then fails if a key of the root key maps (and
// therefore of the help) was never pressed by any of them.
func TestMain(m *testing.M) {
	flag.Parse()
	code := m.Run()
	if code == 0 {
		code = uitest.CheckCoverage(&keys, flag.Lookup("test.run").Value.String(), map[string]any{
			"ui.KeyMap":     DefaultKeyMap(),
			"ui.ActionKeys": DefaultActionKeys(),
			"ui.CmdKeys":    DefaultCmdKeys(),
		})
	}
	os.Exit(code)
}

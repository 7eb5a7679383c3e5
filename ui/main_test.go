package ui

import (
	"testing"

	"github.com/berthvm/berth/ui/internal/uitest"
)

// TestMain runs the tests, then fails if a key of the root key maps (and
// therefore of the help) was never pressed by any of them.
func TestMain(m *testing.M) {
	uitest.Main(m, &keys, map[string]any{
		"ui.KeyMap":     DefaultKeyMap(),
		"ui.ActionKeys": actionKeys(),
		"ui.CmdKeys":    DefaultCmdKeys(),
		"ui.HelpKeys":   DefaultHelpKeys(),
	})
}

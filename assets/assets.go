// Package assets holds berth's embedded defaults: the guest image recipes
// (which kernel modules the agent needs) and the documented default
// configuration file.
package assets

import (
	_ "embed"
	"strings"
)

//go:embed modules.txt
var modulesTxt string

//go:embed config.toml
var defaultConfig string

// Modules returns the kernel modules the mini image's agent needs, by name.
// Their dependencies are resolved from the kernel at build time.
func Modules() []string {
	var out []string
	for _, line := range strings.Split(modulesTxt, "\n") {
		line, _, _ = strings.Cut(line, "#")
		if line = strings.TrimSpace(line); line != "" {
			out = append(out, line)
		}
	}
	return out
}

// DefaultConfig is the commented default config.toml.
func DefaultConfig() string { return defaultConfig }

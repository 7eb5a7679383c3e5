// Package assets holds berth's embedded defaults: the guest image recipes
// (which kernel modules the agent needs, the shipped root filesystem
// images) and the documented default configuration file.
package assets

import (
	"embed"
	"sort"
	"strings"
)

//go:embed modules.txt
var modulesTxt string

//go:embed config.toml
var defaultConfig string

//go:embed images/*.toml
var images embed.FS

// Modules returns the kernel modules the agent needs, by name. Their
// dependencies are resolved from the kernel at build time.
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

// RootModules are the extra modules an image with a root filesystem needs:
// overlayfs, which stacks the session's system disk on the read-only
// layers.
func RootModules() []string { return []string{"overlay"} }

// DefaultConfig is the commented default config.toml.
func DefaultConfig() string { return defaultConfig }

// ImageRecipe returns the shipped recipe of the named image.
func ImageRecipe(name string) ([]byte, bool) {
	b, err := images.ReadFile("images/" + name + ".toml")
	return b, err == nil
}

// ImageRecipes lists the shipped recipes' names.
func ImageRecipes() []string {
	ents, _ := images.ReadDir("images")
	var out []string
	for _, e := range ents {
		out = append(out, strings.TrimSuffix(e.Name(), ".toml"))
	}
	sort.Strings(out)
	return out
}

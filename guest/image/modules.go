package image

import (
	"bytes"
	"debug/elf"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// modName normalises a module name: the kernel treats '-' and '_' alike.
func modName(s string) string {
	s = strings.TrimSuffix(filepath.Base(s), ".ko")
	return strings.ReplaceAll(s, "-", "_")
}

// moduleIndex maps module names to their paths under a kernel's module
// directory, with dependencies from modules.dep when the package has one,
// else from each module's .modinfo "depends=" (what depmod reads too;
// Debian's package leaves modules.dep to its postinst).
type moduleIndex struct {
	dir  string
	path map[string]string   // name → path relative to dir
	deps map[string][]string // name → dependency names, from modules.dep
}

func loadModuleIndex(dir string) (*moduleIndex, error) {
	ix := &moduleIndex{dir: dir, path: map[string]string{}}
	err := filepath.WalkDir(filepath.Join(dir, "kernel"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".ko") {
			rel, _ := filepath.Rel(dir, p)
			ix.path[modName(p)] = rel
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("index kernel modules in %s: %w", dir, err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "modules.dep")); err == nil {
		ix.deps = map[string][]string{}
		for _, line := range strings.Split(string(b), "\n") {
			mod, deps, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			var names []string
			for _, d := range strings.Fields(deps) {
				names = append(names, modName(d))
			}
			ix.deps[modName(mod)] = names
		}
	}
	return ix, nil
}

func (ix *moduleIndex) depends(name string) ([]string, error) {
	if ix.deps != nil {
		return ix.deps[name], nil
	}
	f, err := elf.Open(filepath.Join(ix.dir, ix.path[name]))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, nil
	}
	data, err := sec.Data()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, kv := range bytes.Split(data, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("depends=")); ok && len(v) > 0 {
			for _, d := range strings.Split(string(v), ",") {
				out = append(out, modName(d))
			}
		}
	}
	sort.Strings(out)
	return out, nil
}

// resolve returns module paths in load order: every module after its
// dependencies, the wanted ones in the order given.
func (ix *moduleIndex) resolve(wanted []string) ([]string, error) {
	var order []string
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(name, from string) error
	visit = func(name, from string) error {
		switch state[name] {
		case 2:
			return nil
		case 1:
			return fmt.Errorf("module dependency cycle at %s", name)
		}
		if _, ok := ix.path[name]; !ok {
			if from != "" {
				return fmt.Errorf("module %s (needed by %s) is not in the kernel package", name, from)
			}
			return fmt.Errorf("module %s is not in the kernel package (built in, or renamed?)", name)
		}
		state[name] = 1
		deps, err := ix.depends(name)
		if err != nil {
			return fmt.Errorf("read dependencies of %s: %w", name, err)
		}
		for _, d := range deps {
			if err := visit(d, name); err != nil {
				return err
			}
		}
		state[name] = 2
		order = append(order, ix.path[name])
		return nil
	}
	for _, w := range wanted {
		if err := visit(modName(w), ""); err != nil {
			return nil, err
		}
	}
	return order, nil
}

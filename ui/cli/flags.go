package cli

import (
	"flag"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/berthvm/berth/session"
)

// parseInterleaved parses flags anywhere among the positional arguments,
// as in "berth ls --json" or "berth files demo -l". "--" ends the flags.
// Once stopAfter positional arguments are seen (stopAfter >= 0), the rest
// is taken as is: "berth exec demo ls -la".
func parseInterleaved(fs *flag.FlagSet, args []string, stopAfter int) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		consumed := len(args) - len(rest)
		if consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			return pos, nil
		}
		if stopAfter >= 0 && len(pos) >= stopAfter {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// checkName refuses what the service would refuse, before connecting.
func checkName(name string) error {
	if !nameRE.MatchString(name) {
		return &exitError{code: ExitUsage, msg: fmt.Sprintf(
			"invalid session name %q: use 1-63 lowercase letters, digits and dashes, starting with a letter or digit", name)}
	}
	return nil
}

// parseSize reads 512M, 4G, 1.5G, 1024K, 4GiB or plain bytes.
func parseSize(s string) (int64, error) { return session.ParseSize(s) }

// sizeFlag is a flag holding a byte size.
type sizeFlag struct{ n int64 }

func (f *sizeFlag) String() string {
	if f == nil || f.n == 0 {
		return ""
	}
	return humanBytes(f.n)
}

func (f *sizeFlag) Set(s string) error {
	n, err := parseSize(s)
	if err != nil {
		return err
	}
	f.n = n
	return nil
}

// envFlag collects repeated --env K=V.
type envFlag map[string]string

func (f envFlag) String() string {
	keys := make([]string, 0, len(f))
	for k := range f {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return strings.Join(keys, ",")
}

func (f envFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" || strings.ContainsAny(k, " \t\x00") {
		return fmt.Errorf("want NAME=VALUE")
	}
	f[k] = v
	return nil
}

// choiceFlag is a string flag limited to some values.
type choiceFlag struct {
	value   string
	choices []string
}

func (f *choiceFlag) String() string {
	if f == nil {
		return ""
	}
	return f.value
}

func (f *choiceFlag) Set(s string) error {
	for _, c := range f.choices {
		if s == c {
			f.value = s
			return nil
		}
	}
	return fmt.Errorf("want %s", strings.Join(f.choices, " or "))
}
